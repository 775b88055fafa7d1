//! Flow rules (`network.flows`): policy over the *order* of a sandbox's requests. An operator
//! names sets of destinations — **labels** (`private`: reading `*.corp.example`; `untrusted`:
//! anything outside `private`) — and a response from a labelled destination *arms* the label
//! on the sandbox ([`state`]). **Rules** over armed labels then refuse what would close the
//! lethal trifecta: after `private`, writes anywhere but `private`; after `untrusted`, any
//! request to `private`; after both, every write.
//!
//! Pure: the compiled labels and rules ([`Flows`]), what a destination is ([`Dest`]), what a
//! request does to it ([`Act`]) and the one judgement ([`Flows::refusing`]). The live label
//! state of a sandbox and its waivers are in [`state`]; where the proxy asks is
//! `crate::pipeline::flow`.
//!
//! Membership is three-valued ([`In`]): a label member written with `methods` or `paths`
//! cannot say whether a connection it cannot read (opaque, a DNS query) is a member. Unknown
//! is resolved toward refusal every time: it arms a label, it puts a destination under a
//! rule's `to`, and it never exempts one by `except`.

pub mod state;

use std::sync::Arc;

use super::http_rules::{BoundHost, HttpRule};

/// A set of labels, by their index in [`Flows`] (at most [`Flows::MAX_LABELS`]).
pub type LabelSet = u32;

/// Whether a destination is in a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum In {
    /// It is not.
    No,
    /// It may be: a member names methods or paths, and the request's are not known.
    Maybe,
    /// It is.
    Yes,
}

impl In {
    fn not(self) -> In {
        match self {
            In::No => In::Yes,
            In::Maybe => In::Maybe,
            In::Yes => In::No,
        }
    }
}

/// Where a request goes, as far as the proxy read it: the host and port, and for HTTP the
/// method and path (`None`: an opaque connection or a DNS query).
#[derive(Debug, Clone, Copy)]
pub struct Dest<'a> {
    /// The host name (normalised, lowercase).
    pub host: &'a str,
    /// The port (`None`: any — a DNS query names no port).
    pub port: Option<u16>,
    /// The method and path, when the request was read.
    pub request: Option<(&'a str, &'a str)>,
}

/// What a request does to its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Reads only: `GET`, `HEAD` or `OPTIONS` with no body, a short path and a short query.
    Read,
    /// Can carry data out: any other method, a body, a long query, a WebSocket message,
    /// client bytes on an opaque connection, a DNS query.
    Write,
}

impl Act {
    /// What an HTTP request does: a write unless it is `GET`, `HEAD` or `OPTIONS` with no
    /// body, a path of at most `bounds.path` bytes and a query of at most `bounds.query`.
    pub fn of_request(
        method: &str,
        has_body: bool,
        (path, query): (&str, Option<&str>),
        bounds: Bounds,
    ) -> Act {
        let reading = matches!(method, "GET" | "HEAD" | "OPTIONS");
        let long = query.is_some_and(|q| q.len() > bounds.query) || path.len() > bounds.path;
        if reading && !has_body && !long {
            Act::Read
        } else {
            Act::Write
        }
    }
}

/// How much a read may carry in its target: a longer path or query makes it a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `path_bytes`.
    pub path: usize,
    /// `query_bytes`.
    pub query: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            path: Flows::PATH_BYTES,
            query: Flows::QUERY_BYTES,
        }
    }
}

/// One member of a label: a host (any port, or one), and optionally the methods and paths
/// that make a request to it a member.
#[derive(Debug, Clone)]
pub struct Member {
    /// The host.
    pub host: BoundHost,
    /// `tcp://host:port`: that port only.
    pub port: Option<u16>,
    /// `methods` / `paths` (an HTTP rule's matcher; `None`: every request to the host).
    pub requests: Option<HttpRule>,
}

impl Member {
    fn contains(&self, d: &Dest<'_>) -> In {
        if !self.host.matches(d.host) {
            return In::No;
        }
        if let (Some(p), Some(q)) = (self.port, d.port) {
            if p != q {
                return In::No;
            }
        }
        match (&self.requests, d.request) {
            (None, _) => In::Yes,
            (Some(_), None) => In::Maybe,
            (Some(r), Some((method, path))) if r.allows(method, path) => In::Yes,
            (Some(_), Some(_)) => In::No,
        }
    }
}

/// One label: its members, and the labels it is the outside of.
#[derive(Debug, Clone)]
pub struct Label {
    /// Its name.
    pub name: Arc<str>,
    /// Its members.
    pub members: Vec<Member>,
    /// `outside: [..]`: every destination in none of these labels is in this one.
    pub outside: LabelSet,
}

/// What a rule refuses once its labels are armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// Writes ([`Act::Write`]).
    Writes,
    /// Every request, reads too.
    All,
}

/// One flow rule.
#[derive(Debug, Clone)]
pub struct FlowRule {
    /// Its name (`name:`, or `network.flows.rules[i]`).
    pub name: Arc<str>,
    /// `after`: it applies once every one of these labels is armed.
    pub after: LabelSet,
    /// What it refuses.
    pub refuse: Refuse,
    /// `to`: only requests to these labels (`None`: to any destination).
    pub to: Option<LabelSet>,
    /// `except`: never requests to these labels.
    pub except: LabelSet,
}

/// Why a flow rule refuses a request: the rule (its index) and the labels that armed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusing {
    /// The rule's index in [`Flows::rules`].
    pub rule: usize,
    /// The armed labels the rule is after.
    pub labels: LabelSet,
}

/// A sandbox's compiled flow rules.
#[derive(Debug, Clone)]
pub struct Flows {
    /// The labels, by index.
    pub labels: Vec<Label>,
    /// The rules, in file order (the first that refuses is named).
    pub rules: Vec<FlowRule>,
    /// The longest path and query a read may carry (`path_bytes`, `query_bytes`).
    pub bounds: Bounds,
    /// `scope: exec`: labels are armed per process (its vouched exec, else its observed
    /// executable); a request is judged with its own process's labels and the sandbox's, a
    /// request of no known process with every process's.
    pub per_exec: bool,
}

impl PartialEq for Flows {
    fn eq(&self, other: &Self) -> bool {
        self.describe() == other.describe()
    }
}

impl Flows {
    /// The most labels a sandbox may name.
    pub const MAX_LABELS: usize = 32;
    /// `query_bytes` unless written: a query longer than this is a write.
    pub const QUERY_BYTES: usize = 128;
    /// `path_bytes` unless written: a path longer than this is a write.
    pub const PATH_BYTES: usize = 256;

    /// The index of label `name`.
    pub fn label(&self, name: &str) -> Option<usize> {
        self.labels.iter().position(|l| &*l.name == name)
    }

    /// Whether `d` is in label `i` (its `outside` labels resolved; a cycle through `outside`
    /// is refused when compiled, and each level consumes one label, so this ends).
    pub fn contains(&self, i: usize, d: &Dest<'_>) -> In {
        self.contains_within(i, d, Self::MAX_LABELS)
    }

    fn contains_within(&self, i: usize, d: &Dest<'_>, depth: usize) -> In {
        let Some(label) = self.labels.get(i) else {
            return In::No;
        };
        let mut best = label
            .members
            .iter()
            .map(|m| m.contains(d))
            .max()
            .unwrap_or(In::No);
        if label.outside != 0 && depth > 0 {
            let inside = bits(label.outside)
                .map(|j| self.contains_within(j, d, depth - 1))
                .max()
                .unwrap_or(In::No);
            best = best.max(inside.not());
        }
        best
    }

    /// The labels a response from `d` arms: every label `d` is or may be in.
    pub fn arms(&self, d: &Dest<'_>) -> LabelSet {
        (0..self.labels.len())
            .filter(|&i| self.contains(i, d) != In::No)
            .fold(0, |set, i| set | 1 << i)
    }

    /// Whether `d` is in a label of `set`, at least as surely as `at_least`.
    fn in_any(&self, set: LabelSet, d: &Dest<'_>, at_least: In) -> bool {
        bits(set).any(|i| self.contains(i, d) >= at_least)
    }

    /// The first rule that refuses `act` to `d` with `armed` labels in force, if one does.
    pub fn refusing(&self, armed: LabelSet, d: &Dest<'_>, act: Act) -> Option<Refusing> {
        self.rules.iter().enumerate().find_map(|(i, r)| {
            let applies = r.after != 0
                && armed & r.after == r.after
                && (r.refuse == Refuse::All || act == Act::Write)
                && r.to.is_none_or(|to| self.in_any(to, d, In::Maybe))
                && !self.in_any(r.except, d, In::Yes);
            applies.then_some(Refusing {
                rule: i,
                labels: r.after,
            })
        })
    }

    /// The names of the labels in `set`, joined by `,`.
    pub fn names(&self, set: LabelSet) -> String {
        let names: Vec<&str> = bits(set)
            .filter_map(|i| self.labels.get(i).map(|l| &*l.name))
            .collect();
        names.join(",")
    }

    /// A rule in words: `after private: refuse writes except private`.
    pub fn explain(&self, rule: &FlowRule) -> String {
        let what = match rule.refuse {
            Refuse::Writes => "writes",
            Refuse::All => "requests",
        };
        let mut s = format!("after {}: refuse {what}", self.names(rule.after));
        if let Some(to) = rule.to {
            s.push_str(&format!(" to {}", self.names(to)));
        }
        if rule.except != 0 {
            s.push_str(&format!(" except to {}", self.names(rule.except)));
        }
        s
    }

    /// Everything that decides, as text (the policy digest and equality).
    pub fn describe(&self) -> String {
        let mut s = format!("bounds={:?};per_exec={};", self.bounds, self.per_exec);
        for l in &self.labels {
            s.push_str(&format!("label {} outside {}:", l.name, l.outside));
            for m in &l.members {
                let req = m.requests.as_ref().map(|r| r.text.as_str()).unwrap_or("");
                s.push_str(&format!(" {}:{:?}:{req}", m.host.text(), m.port));
            }
            s.push(';');
        }
        for r in &self.rules {
            s.push_str(&format!("rule {}: {};", r.name, self.explain(r)));
        }
        s
    }
}

/// The indices of the labels in `set`.
pub fn bits(set: LabelSet) -> impl Iterator<Item = usize> {
    (0..LabelSet::BITS as usize).filter(move |i| set & (1 << i) != 0)
}

#[cfg(test)]
mod tests;
