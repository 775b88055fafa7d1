//! `egress-proxy policy diff OLD NEW` and the widening check of `?require_simulation`
//! (DESIGN §7.6): what changed between two configurations, per sandbox and per layer —
//! entries added, removed, widened (a new entry covers an old one and more) and narrowed (a
//! new entry lies within an old one) — with each sandbox's effective view (its chain of
//! layers). Containment is the layers' own ([`Layer::admits_entry`]): an entry is within
//! another when every name and port it matches is matched by the other.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use crate::config::{Binding, Config};
use crate::policy::entry::Entry;
use crate::policy::layer::Layer;
use crate::policy::ports::PortSet;
use crate::policy::Mode;

/// The changes of one list.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct ListDiff {
    /// Entries only in the new list that neither cover nor lie within an old one.
    pub added: Vec<String>,
    /// Entries only in the old list that no new entry covers or narrows.
    pub removed: Vec<String>,
    /// `new (was old)`: a new entry covering an old one.
    pub widened: Vec<String>,
    /// `new (was old)`: a new entry within an old one.
    pub narrowed: Vec<String>,
}

impl ListDiff {
    fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.widened.is_empty()
            && self.narrowed.is_empty()
    }

    /// Whether the new list reaches further than the old one.
    pub fn widens(&self) -> bool {
        !self.added.is_empty() || !self.widened.is_empty()
    }
}

/// One sandbox's or layer's changes.
#[derive(Debug, Serialize)]
pub struct Changed {
    /// `sandbox s1` or `layer org`.
    pub what: String,
    /// `added`, `removed` or `changed`.
    pub how: &'static str,
    /// Per list (`network.egress`, `network.deny`, `ceiling`, …).
    pub lists: Vec<(String, ListDiff)>,
    /// Other changes in words (mode, layer membership, http rules).
    pub notes: Vec<String>,
    /// The effective view: the layers that bound it, root first.
    pub layers: Vec<String>,
    /// Whether the change reaches further than before.
    pub widens: bool,
}

/// Whether `inner` lies within `outer` (names and ports).
fn within(inner: &Entry, outer: &(String, Entry), ports: &PortSet) -> bool {
    Layer::compile("-", "-", Some(vec![outer.clone()]), Vec::new(), ports)
        .is_ok_and(|l| l.admits_entry(inner))
}

/// Compare two lists of entries. `allow`: a list that allows (else one that refuses, where
/// an added entry narrows reach and a removed one widens it).
pub fn list_diff(old: &[(String, Entry)], new: &[(String, Entry)], ports: &PortSet) -> ListDiff {
    let olds: BTreeSet<&str> = old.iter().map(|(t, _)| t.as_str()).collect();
    let news: BTreeSet<&str> = new.iter().map(|(t, _)| t.as_str()).collect();
    let gone: Vec<&(String, Entry)> = old
        .iter()
        .filter(|(t, _)| !news.contains(t.as_str()))
        .collect();
    let mut d = ListDiff::default();
    let mut paired: BTreeSet<&str> = BTreeSet::new();
    for n in new.iter().filter(|(t, _)| !olds.contains(t.as_str())) {
        if let Some(o) = gone.iter().find(|o| within(&o.1, n, ports)) {
            d.widened.push(format!("{} (was {})", n.0, o.0));
            paired.insert(&o.0);
        } else if let Some(o) = gone.iter().find(|o| within(&n.1, o, ports)) {
            d.narrowed.push(format!("{} (was {})", n.0, o.0));
            paired.insert(&o.0);
        } else {
            d.added.push(n.0.clone());
        }
    }
    d.removed = gone
        .iter()
        .filter(|o| !paired.contains(o.0.as_str()))
        .map(|o| o.0.clone())
        .collect();
    d
}

fn mode(b: &Binding) -> Mode {
    b.network.mode
}

fn chain(b: &Binding) -> Vec<String> {
    b.network.layers.iter().map(|l| l.id.to_string()).collect()
}

/// One sandbox's changes (`None` when nothing that decides changed).
pub fn sandbox_diff(
    old: Option<&Binding>,
    new: Option<&Binding>,
    ports: &PortSet,
) -> Option<Changed> {
    let (id, how) = match (old, new) {
        (Some(b), None) => (b.id.to_string(), "removed"),
        (None, Some(b)) => (b.id.to_string(), "added"),
        (Some(b), Some(_)) => (b.id.to_string(), "changed"),
        (None, None) => return None,
    };
    let list =
        |b: Option<&Binding>, f: fn(&Binding) -> Vec<(String, Entry)>| b.map(f).unwrap_or_default();
    let egress: fn(&Binding) -> Vec<(String, Entry)> = |b| b.network.egress.clone();
    let deny: fn(&Binding) -> Vec<(String, Entry)> = |b| b.network.deny.clone();
    let scoped: fn(&Binding) -> Vec<(String, Entry)> = |b| {
        (b.network.scoped.iter())
            .flat_map(|s| s.egress.clone())
            .collect()
    };
    let allow = list_diff(&list(old, egress), &list(new, egress), ports);
    let refuse = list_diff(&list(old, deny), &list(new, deny), ports);
    let scoped = list_diff(&list(old, scoped), &list(new, scoped), ports);
    let mut widens = allow.widens() || !refuse.removed.is_empty() || scoped.widens();
    let mut lists = Vec::new();
    let named = [
        ("network.egress", allow),
        ("network.deny", refuse),
        ("network.scoped", scoped),
    ];
    for (name, d) in named {
        if !d.is_empty() {
            lists.push((name.to_string(), d));
        }
    }
    let mut notes = Vec::new();
    if let (Some(o), Some(n)) = (old, new) {
        widens |= other_changes(o, n, &mut notes);
    }
    widens |= how == "added";
    if how == "changed" && lists.is_empty() && notes.is_empty() {
        return None;
    }
    Some(Changed {
        what: format!("sandbox {id}"),
        how,
        lists,
        notes,
        layers: new.or(old).map(chain).unwrap_or_default(),
        widens,
    })
}

/// Mode, layers, http rules and enforcement: each change as a note; whether any widens.
fn other_changes(o: &Binding, n: &Binding, notes: &mut Vec<String>) -> bool {
    let mut widens = false;
    if mode(o) != mode(n) {
        notes.push(format!(
            "network.mode {} → {}",
            mode(o).as_str(),
            mode(n).as_str()
        ));
        widens |= mode(n) == Mode::AllowAll || mode(o) == Mode::DenyAll;
    }
    if chain(o) != chain(n) {
        let (a, b) = (chain(o).join(" ⊇ "), chain(n).join(" ⊇ "));
        notes.push(format!("layers [{a}] → [{b}]"));
        widens |= !chain(o).iter().all(|l| chain(n).contains(l));
    }
    let http = |b: &Binding| {
        (b.network.http.iter())
            .map(|r| (r.text.clone(), r.host.text()))
            .collect::<BTreeSet<_>>()
    };
    let (ho, hn) = (http(o), http(n));
    for (r, host) in hn.difference(&ho) {
        notes.push(format!("network.http added: {r}"));
        // Another rule on a host already judged by rules lets more requests through.
        widens |= ho.iter().any(|(_, h)| h == host);
    }
    for (r, _) in ho.difference(&hn) {
        notes.push(format!("network.http removed: {r}"));
        widens = true;
    }
    if o.enforcement != n.enforcement {
        let (a, b) = (o.enforcement.as_str(), n.enforcement.as_str());
        notes.push(format!("enforcement {a} → {b}"));
        widens |= n.enforcement == crate::policy::Enforcement::Report;
    }
    widens
}

/// One layer's changes (its ceiling and deny, its limits and http rules).
pub fn layer_diff(
    id: &str,
    old: Option<&Arc<Layer>>,
    new: Option<&Arc<Layer>>,
    ports: &PortSet,
) -> Option<Changed> {
    let how = match (old, new) {
        (Some(_), None) => "removed",
        (None, Some(_)) => "added",
        _ => "changed",
    };
    let ceiling = |l: Option<&Arc<Layer>>| l.and_then(|l| l.ceiling.clone());
    let deny = |l: Option<&Arc<Layer>>| l.map(|l| l.deny.clone()).unwrap_or_default();
    let mut lists = Vec::new();
    let mut notes = Vec::new();
    let mut widens = how == "removed";
    match (ceiling(old), ceiling(new)) {
        (Some(o), Some(n)) => {
            let d = list_diff(&o, &n, ports);
            widens |= d.widens();
            if !d.is_empty() {
                lists.push(("ceiling".to_string(), d));
            }
        }
        (Some(_), None) if how == "changed" => {
            notes.push("ceiling removed (no bound of its own)".into());
            widens = true;
        }
        (None, Some(_)) if how == "changed" => notes.push("ceiling set".into()),
        _ => {}
    }
    let d = list_diff(&deny(old), &deny(new), ports);
    widens |= !d.removed.is_empty();
    if !d.is_empty() {
        lists.push(("deny".to_string(), d));
    }
    if let (Some(o), Some(n)) = (old, new) {
        widens |= super::policy_diff_layer::limits_and_rules(o, n, &mut notes);
    }
    if how == "changed" && lists.is_empty() && notes.is_empty() {
        return None;
    }
    Some(Changed {
        what: format!("layer {id}"),
        how,
        lists,
        notes,
        layers: Vec::new(),
        widens,
    })
}

/// Every change between two configurations: layers first, then sandboxes, by id.
pub fn diff(old: &Config, new: &Config) -> Vec<Changed> {
    let ports = &new.defaults.ports;
    let mut out = Vec::new();
    let ids: BTreeSet<&String> = old.layers.keys().chain(new.layers.keys()).collect();
    for id in ids {
        let o = old.layers.get(id).and_then(|c| c.last());
        let n = new.layers.get(id).and_then(|c| c.last());
        out.extend(layer_diff(id, o, n, ports));
    }
    let ids: BTreeSet<&str> = old
        .bindings
        .iter()
        .chain(&new.bindings)
        .map(|b| b.id.as_str())
        .collect();
    for id in ids {
        let o = old.bindings.iter().find(|b| b.id == id);
        let n = new.bindings.iter().find(|b| b.id == id);
        out.extend(sandbox_diff(o, n, ports));
    }
    out
}

/// The changes as text.
pub fn render(changes: &[Changed]) -> String {
    if changes.is_empty() {
        return "no change to what any sandbox or layer may reach\n".into();
    }
    let mut out = String::new();
    for c in changes {
        let widens = if c.widens { " — widens reach" } else { "" };
        out.push_str(&format!("{} ({}){widens}\n", c.what, c.how));
        if !c.layers.is_empty() {
            out.push_str(&format!(
                "  effective: bounded by layers {}\n",
                c.layers.join(" ⊇ ")
            ));
        }
        for (list, d) in &c.lists {
            let rows = [
                ("+", &d.added),
                ("-", &d.removed),
                ("widened", &d.widened),
                ("narrowed", &d.narrowed),
            ];
            for (sign, items) in rows {
                for e in items {
                    out.push_str(&format!("  {list} {sign} {e}\n"));
                }
            }
        }
        for n in &c.notes {
            out.push_str(&format!("  {n}\n"));
        }
    }
    out
}
