//! `suggest`'s per-process proposals: where the records name the process behind each
//! connection (`process.exe` observed, or `process.exec` vouched), a destination that only
//! one executable (or one exec) ever asked for is proposed under `network.scoped` for it,
//! instead of for every process of the sandbox. A destination also reached by another
//! process, or by a connection of unknown process, stays in `network.egress`.

use std::collections::{BTreeMap, BTreeSet};

use super::suggest::Proposed;
use crate::policy::entry::{parse_entry, HostPattern};

/// Who asked for each host: the processes named, and whether any connection named none.
#[derive(Debug, Default)]
pub struct Askers {
    by_host: BTreeMap<String, (BTreeSet<Who>, bool)>,
}

/// A process as a scope would name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Who {
    /// `binaries: [path]`.
    Binary(String),
    /// `execs: [name]`.
    Exec(String),
}

impl Askers {
    /// Count record `v` (for `host`, lower case).
    pub fn add(&mut self, host: &str, v: &serde_json::Value) {
        let p = &v["process"];
        let who = match (p["exe"].as_str(), p["exec"].as_str()) {
            (Some(exe), _) => Some(Who::Binary(exe.to_string())),
            (None, Some(exec)) => Some(Who::Exec(exec.to_string())),
            _ => None,
        };
        let slot = self.by_host.entry(host.to_string()).or_default();
        match who {
            Some(w) => {
                slot.0.insert(w);
            }
            None => slot.1 = true,
        }
    }

    /// The exact entries of `entries` only one process asked for, taken out and grouped by
    /// that process; the rest stay.
    pub fn split(&self, entries: &mut Vec<Proposed>) -> BTreeMap<Who, Vec<Proposed>> {
        let mut out: BTreeMap<Who, Vec<Proposed>> = BTreeMap::new();
        entries.retain(|e| {
            let Some(who) = self.only_asker(e) else {
                return true;
            };
            out.entry(who).or_default().push(e.clone());
            false
        });
        out
    }

    fn only_asker(&self, e: &Proposed) -> Option<Who> {
        if !e.names.is_empty() {
            return None;
        }
        let HostPattern::Exact(name) = parse_entry(&e.entry).ok()?.host else {
            return None;
        };
        let (who, unknown) = self.by_host.get(name.as_str())?;
        match (who.len(), unknown) {
            (1, false) => who.iter().next().cloned(),
            _ => None,
        }
    }
}

/// The `scoped:` block of the proposal.
pub fn render(scoped: &BTreeMap<Who, Vec<Proposed>>) -> String {
    if scoped.is_empty() {
        return String::new();
    }
    let mut s = String::from("  scoped:    # destinations only one process asked for\n");
    for (who, entries) in scoped {
        match who {
            Who::Binary(b) => s.push_str(&format!("    - binaries: [\"{b}\"]\n")),
            Who::Exec(e) => s.push_str(&format!("    - execs: [\"{e}\"]\n")),
        }
        s.push_str("      egress:\n");
        for e in entries {
            s.push_str(&format!(
                "        - \"{}\"    # {} connection(s)\n",
                e.entry, e.connections
            ));
        }
    }
    s
}
