//! One sandbox's flow state: the labels armed on it (each with the request that armed it and
//! when) and the waivers a person gave. Pure data with the three things done to it: judge a
//! request ([`Labels::judge`], which spends a `once` waiver), arm labels ([`Labels::arm`]),
//! waive or reset a label ([`Labels::waive`]). Kept by names, not indices, so that a reload
//! that reorders or adds labels keeps what was armed; a label the new rules do not name is
//! kept (a later reload may name it again) but has no effect.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{bits, Act, Dest, Flows, LabelSet};

/// A label armed on the sandbox: the first request whose response armed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Armed {
    /// The label.
    pub label: String,
    /// When (RFC 3339, UTC).
    pub at: String,
    /// The arming request: `GET git.corp.example/doc` (no query), or `tcp db.corp:5432`.
    pub by: String,
    /// The `conn_id` of its record.
    pub conn: u64,
}

/// How long a waiver lasts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Lasts {
    /// One request the label would refuse goes through.
    Once,
    /// The label is not in force until this time (Unix seconds).
    Until(u64),
}

/// A person's waiver of a label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Waiver {
    /// The label.
    pub label: String,
    /// For how long.
    pub lasts: Lasts,
    /// Who gave it (the admin caller or the CLI user).
    pub by: String,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// A flow rule's refusal, in words for the record and the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRefusal {
    /// The rule's name.
    pub rule: Arc<str>,
    /// The label whose arming is named (the first of the rule's `after`).
    pub label: Arc<str>,
    /// The record's detail: the rule, what it says, the label and the request that armed it.
    pub detail: String,
}

/// What a person does to a label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waive {
    /// Let one request through.
    Once,
    /// Take it out of force until (Unix seconds).
    Until(u64),
    /// Disarm it (a later response from its destinations arms it again).
    Reset,
}

/// One sandbox's flow state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Labels {
    /// Armed labels, one entry each, in the order they were armed.
    #[serde(default)]
    pub armed: Vec<Armed>,
    /// Waivers in force.
    #[serde(default)]
    pub waivers: Vec<Waiver>,
}

impl Labels {
    /// The armed labels `flows` names, less those a timed waiver takes out of force at `now`
    /// (Unix seconds).
    pub fn in_force(&self, flows: &Flows, now: u64) -> LabelSet {
        let waived = |name: &str| {
            self.waivers
                .iter()
                .any(|w| w.label == name && matches!(w.lasts, Lasts::Until(t) if t > now))
        };
        self.armed
            .iter()
            .filter(|a| !waived(&a.label))
            .filter_map(|a| flows.label(&a.label))
            .fold(0, |set, i| set | 1 << i)
    }

    /// Judge `act` to `d`: `Err` when a rule refuses it. A `once` waiver of one of the
    /// refusing rule's labels is spent instead (and the request goes on); with several
    /// labels armed, the rule is judged again without the waived one.
    pub fn judge(
        &mut self,
        flows: &Flows,
        d: &Dest<'_>,
        act: Act,
        now: u64,
    ) -> Result<(), FlowRefusal> {
        let mut armed = self.in_force(flows, now);
        loop {
            let Some(r) = flows.refusing(armed, d, act) else {
                return Ok(());
            };
            let once = bits(r.labels).find_map(|i| {
                let name = &flows.labels[i].name;
                self.waivers
                    .iter()
                    .position(|w| *w.label == **name && w.lasts == Lasts::Once)
                    .map(|at| (i, at))
            });
            match once {
                Some((i, at)) => {
                    self.waivers.remove(at);
                    armed &= !(1 << i);
                }
                None => return Err(self.refusal(flows, r.rule, r.labels)),
            }
        }
    }

    fn refusal(&self, flows: &Flows, rule: usize, labels: LabelSet) -> FlowRefusal {
        let r = &flows.rules[rule];
        let first = bits(labels).next().unwrap_or(0);
        let label = flows.labels[first].name.clone();
        let armed = self.armed.iter().find(|a| *a.label == *label);
        let how = match armed {
            Some(a) => format!("armed at {} by {} (conn {})", a.at, a.by, a.conn),
            None => "armed".into(),
        };
        FlowRefusal {
            detail: format!(
                "flow rule {} ({}): label {label} {how}",
                r.name,
                flows.explain(r)
            ),
            rule: r.name.clone(),
            label,
        }
    }

    /// Whether every label of `set` is armed already.
    pub fn armed_all(&self, flows: &Flows, set: LabelSet) -> bool {
        bits(set).all(|i| {
            flows
                .labels
                .get(i)
                .is_none_or(|l| self.armed.iter().any(|a| *a.label == *l.name))
        })
    }

    /// Arm the labels of `set` not armed yet, naming `by` (conn `conn`) at `at`: `true` when
    /// one was newly armed (then the state must be kept before the response is relayed).
    pub fn arm(&mut self, flows: &Flows, set: LabelSet, by: &str, conn: u64, at: &str) -> bool {
        let mut changed = false;
        for i in bits(set) {
            let Some(l) = flows.labels.get(i) else {
                continue;
            };
            if self.armed.iter().all(|a| *a.label != *l.name) {
                self.armed.push(Armed {
                    label: l.name.to_string(),
                    at: at.into(),
                    by: by.into(),
                    conn,
                });
                changed = true;
            }
        }
        changed
    }

    /// Waive (or reset) `label` for `by` at `at`; `now` (Unix seconds) drops expired
    /// waivers. `false` when the label is not armed (nothing to waive).
    pub fn waive(&mut self, label: &str, how: Waive, by: &str, at: &str, now: u64) -> bool {
        if self.armed.iter().all(|a| a.label != label) {
            return false;
        }
        if how == Waive::Reset {
            self.armed.retain(|a| a.label != label);
            self.waivers.retain(|w| w.label != label);
            return true;
        }
        self.add_waiver(label, how, by, at, now);
        true
    }

    /// Add a waiver of `label` (once, or until a time; a reset adds none) whether or not it
    /// is armed here (with `scope: exec` a process's track holds the arming); `now` (Unix
    /// seconds) drops expired waivers.
    pub fn add_waiver(&mut self, label: &str, how: Waive, by: &str, at: &str, now: u64) {
        self.waivers
            .retain(|w| !matches!(w.lasts, Lasts::Until(t) if t <= now));
        let lasts = match how {
            Waive::Reset => return,
            Waive::Once => Lasts::Once,
            Waive::Until(t) => Lasts::Until(t),
        };
        self.waivers.push(Waiver {
            label: label.to_string(),
            lasts,
            by: by.into(),
            at: at.into(),
        });
    }

    /// The armed labels' names, joined by `,` (the record's `labels`), or `None`.
    pub fn names(&self) -> Option<String> {
        if self.armed.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.armed.iter().map(|a| a.label.as_str()).collect();
        Some(names.join(","))
    }
}

/// What another replica did to a sandbox's labels (shared through etcd), applied here.
impl Labels {
    /// A label another replica armed: taken unless armed here already (the first arming is
    /// kept). `true` when it changed anything.
    pub fn adopt_armed(&mut self, a: Armed) -> bool {
        if self.armed.iter().any(|x| x.label == a.label) {
            return false;
        }
        self.armed.push(a);
        true
    }

    /// A label another replica reset.
    pub fn disarm(&mut self, label: &str) -> bool {
        let before = self.armed.len();
        self.armed.retain(|a| a.label != label);
        before != self.armed.len()
    }

    /// A waiver another replica gave (it replaces this label's).
    pub fn adopt_waiver(&mut self, w: Waiver) -> bool {
        if self.waivers.contains(&w) {
            return false;
        }
        self.waivers.retain(|x| x.label != w.label);
        self.waivers.push(w);
        true
    }

    /// A label's waiver another replica spent or ended.
    pub fn unwaive(&mut self, label: &str) -> bool {
        let before = self.waivers.len();
        self.waivers.retain(|w| w.label != label);
        before != self.waivers.len()
    }
}
