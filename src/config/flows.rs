//! `network.flows` as written: labels (named sets of destinations) and the rules over them
//! ([`crate::policy::flows`]). The shape:
//!
//! ```yaml
//! flows:
//!   query_bytes: 128               # a longer query makes a GET a write
//!   labels:
//!     private:
//!       - "*.corp.example"                                      # a host, any port
//!       - "tcp://db.corp.example:5432"                          # a host on one port
//!       - { host: api.github.com, paths: ["/repos/acme/**"] }   # some requests to a host
//!     untrusted:
//!       - outside: [private]                                    # everything else
//!   rules:
//!     - { name: no-exfil, after: [private], refuse: writes, except: [private] }
//!     - { name: no-private-after-web, after: [untrusted], refuse: requests, to: [private] }
//!     - { name: lockdown, after: [private, untrusted], refuse: writes }
//! ```
//!
//! Every error names its line, the label or rule, and what to write instead.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::block::BlockCtx;
use super::error::Sink;
use crate::policy::flows::{FlowRule, Flows, Label, LabelSet, Member, Refuse};
use crate::policy::http_rules::{BoundHost, HttpRule};

/// `network.flows` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawFlows {
    /// The longest query a read may carry, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_bytes: Option<usize>,
    /// The longest path a read may carry, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_bytes: Option<usize>,
    /// `sandbox` (the default) or `exec`: whose labels a request arms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The labels, by name.
    #[serde(default)]
    pub labels: BTreeMap<String, Vec<RawMember>>,
    /// The rules, in order.
    #[serde(default)]
    pub rules: Vec<RawRule>,
}

/// One member of a label as written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum RawMember {
    /// `"*.corp.example"`, `"tcp://db.corp.example:5432"`.
    Host(String),
    /// `{ host, methods, paths }`: the requests to a host these name.
    Requests {
        /// The host.
        host: String,
        /// Methods (any when empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        methods: Vec<String>,
        /// Path globs (any when empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        paths: Vec<String>,
    },
    /// `{ outside: [labels] }`: every destination in none of them.
    Outside {
        /// The labels.
        outside: Vec<String>,
    },
}

/// One rule as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Its name, for records and refusals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The labels that must all be armed.
    pub after: Vec<String>,
    /// `writes` or `requests`.
    pub refuse: String,
    /// Only requests to these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<String>>,
    /// Never requests to these labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<String>,
}

/// `network.flows` compiled; `None` when anything in it is wrong (the errors are in `sink`).
pub(crate) fn parse(raw: &RawFlows, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) -> Option<Flows> {
    let before = sink.errors.len();
    if raw.labels.len() > Flows::MAX_LABELS {
        let why = format!("at most {} labels", Flows::MAX_LABELS);
        ctx.err(sink, "network.flows.labels", why, Some("labels:"));
    }
    let names: Vec<&str> = raw.labels.keys().map(String::as_str).collect();
    let mut labels = Vec::with_capacity(names.len());
    for (name, members) in &raw.labels {
        let field = format!("network.flows.labels.{name}");
        labels.push(label(name, members, &names, (&field, ctx), sink));
    }
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, r) in raw.rules.iter().enumerate() {
        let field = format!("network.flows.rules[{i}]");
        rules.push(rule(i, r, &names, (&field, ctx), sink));
    }
    if let Some(0) = raw.query_bytes {
        let why = "`query_bytes: 0` makes every query a write; write at least 1";
        ctx.err(sink, "network.flows.query_bytes", why, Some("query_bytes:"));
    }
    if let Some(0) = raw.path_bytes {
        let why = "`path_bytes: 0` makes every request a write; write at least 1";
        ctx.err(sink, "network.flows.path_bytes", why, Some("path_bytes:"));
    }
    let per_exec = match raw.scope.as_deref() {
        None | Some("sandbox") => false,
        Some("exec") => true,
        Some(other) => {
            let why = format!("`scope: {other}`: write `sandbox` or `exec`");
            ctx.err(sink, "network.flows.scope", why, Some("scope:"));
            false
        }
    };
    let flows = Flows {
        per_exec,
        labels,
        rules,
        bounds: crate::policy::flows::Bounds {
            path: raw.path_bytes.unwrap_or(Flows::PATH_BYTES),
            query: raw.query_bytes.unwrap_or(Flows::QUERY_BYTES),
        },
    };
    if let Some(cycle) = outside_cycle(&flows) {
        let why = format!("label {cycle} is (through `outside`) the outside of itself");
        ctx.err(
            sink,
            format!("network.flows.labels.{cycle}"),
            why,
            Some(&format!("{cycle}:")),
        );
    }
    (sink.errors.len() == before).then_some(flows)
}

/// The set of `list` (label names) in `names`; unknown names are errors at `field`.
fn set_of(
    list: &[String],
    names: &[&str],
    (field, ctx): (&str, &BlockCtx<'_>),
    sink: &mut Sink<'_>,
) -> LabelSet {
    let mut set = 0;
    for l in list {
        match names.iter().position(|n| n == l) {
            Some(i) if i < Flows::MAX_LABELS => set |= 1 << i,
            Some(_) => {}
            None => {
                let why = format!("no label `{l}` (labels: {})", names.join(", "));
                ctx.err(sink, field, why, Some(l));
            }
        }
    }
    set
}

fn label(
    name: &str,
    members: &[RawMember],
    names: &[&str],
    (field, ctx): (&str, &BlockCtx<'_>),
    sink: &mut Sink<'_>,
) -> Label {
    let mut out = Label {
        name: name.into(),
        members: Vec::new(),
        outside: 0,
    };
    if members.is_empty() {
        let why = "a label names at least one host (or `outside: [labels]`)";
        ctx.err(sink, field, why, Some(&format!("{name}:")));
    }
    for (i, m) in members.iter().enumerate() {
        let at = format!("{field}[{i}]");
        match m {
            RawMember::Outside { outside } => {
                out.outside |= set_of(outside, names, (&at, ctx), sink);
            }
            RawMember::Host(text) => match host_member(text) {
                Ok(m) => out.members.push(m),
                Err(why) => ctx.err(sink, &at, why, Some(text)),
            },
            RawMember::Requests {
                host,
                methods,
                paths,
            } => match requests_member(host, methods, paths) {
                Ok(m) => out.members.push(m),
                Err(why) => ctx.err(sink, &at, why, Some(host)),
            },
        }
    }
    out
}

/// `host`, `*.domain`, `**.domain` or `tcp://host:port`.
fn host_member(text: &str) -> Result<Member, String> {
    let scheme = crate::policy::entry::OPAQUE_SCHEME;
    let (host, port) = match text.strip_prefix(scheme) {
        Some(rest) => {
            let Some((h, p)) = rest.rsplit_once(':') else {
                return Err(format!(
                    "`{text}`: a `tcp://` member names its port (`tcp://{rest}:5432`)"
                ));
            };
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("`{text}`: `{p}` is not a port"))?;
            (h, Some(port))
        }
        None => (text, None),
    };
    let host = BoundHost::parse(host).map_err(|e| {
        format!("{e} (a label member is a host name, `*.domain`, `**.domain` or `tcp://host:port`)")
    })?;
    Ok(Member {
        host,
        port,
        requests: None,
    })
}

fn requests_member(host: &str, methods: &[String], paths: &[String]) -> Result<Member, String> {
    let bound = BoundHost::parse(host).map_err(|e| e.to_string())?;
    let requests = if methods.is_empty() && paths.is_empty() {
        None
    } else {
        Some(HttpRule::new(host, methods, paths).map_err(|e| e.to_string())?)
    };
    Ok(Member {
        host: bound,
        port: None,
        requests,
    })
}

fn rule(
    i: usize,
    raw: &RawRule,
    names: &[&str],
    (field, ctx): (&str, &BlockCtx<'_>),
    sink: &mut Sink<'_>,
) -> FlowRule {
    let hint = raw.name.as_deref().unwrap_or("after:");
    let refuse = match raw.refuse.as_str() {
        "writes" => Refuse::Writes,
        "requests" => Refuse::All,
        other => {
            let why = format!("`refuse: {other}`: write `writes` or `requests`");
            ctx.err(sink, format!("{field}.refuse"), why, Some(hint));
            Refuse::All
        }
    };
    if raw.after.is_empty() {
        let why = "`after:` names the labels that arm the rule (at least one)";
        ctx.err(sink, format!("{field}.after"), why, Some(hint));
    }
    let after = set_of(&raw.after, names, (&format!("{field}.after"), ctx), sink);
    let to = raw
        .to
        .as_ref()
        .map(|to| set_of(to, names, (&format!("{field}.to"), ctx), sink));
    let except = set_of(&raw.except, names, (&format!("{field}.except"), ctx), sink);
    if to.is_some_and(|to| to & !except == 0) {
        let why = "`to` and `except` leave no destination: the rule would never refuse";
        ctx.err(sink, field, why, Some(hint));
    }
    FlowRule {
        name: Arc::from(
            raw.name
                .clone()
                .unwrap_or_else(|| format!("network.flows.rules[{i}]")),
        ),
        after,
        refuse,
        to,
        except,
    }
}

/// A label that is, through `outside`, the outside of itself, if one is.
fn outside_cycle(flows: &Flows) -> Option<Arc<str>> {
    let n = flows.labels.len();
    for start in 0..n {
        let mut seen: LabelSet = 0;
        let mut frontier = flows.labels[start].outside;
        while frontier & !seen != 0 {
            seen |= frontier;
            frontier = crate::policy::flows::bits(frontier).fold(0, |acc, j| {
                acc | flows.labels.get(j).map_or(0, |l| l.outside)
            });
        }
        if seen & (1 << start) != 0 {
            return Some(flows.labels[start].name.clone());
        }
    }
    None
}
