//! What `policy diff` says of a layer's `limits` and `network.http` rules: each change as a
//! note, and whether it widens what members may do — a limit raised or removed, a rule
//! removed, or a rule added for a host the layer already judged (another way through).

use crate::policy::layer::Layer;

/// Notes for the changes from `old` to `new`; whether any widens.
pub fn limits_and_rules(old: &Layer, new: &Layer, notes: &mut Vec<String>) -> bool {
    let mut widens = false;
    for ((key, a), (_, b)) in old.limits.values().into_iter().zip(new.limits.values()) {
        if a == b {
            continue;
        }
        let shown = |v: Option<f64>| v.map_or("none".to_string(), |v| v.to_string());
        notes.push(format!("limits.{key} {} → {}", shown(a), shown(b)));
        widens |= match (a, b) {
            (Some(a), Some(b)) => b > a,
            (Some(_), None) => true,
            _ => false,
        };
    }
    let texts = |l: &Layer| l.http.iter().map(|r| r.text.clone()).collect::<Vec<_>>();
    let (was, is) = (texts(old), texts(new));
    for r in was.iter().filter(|r| !is.contains(r)) {
        notes.push(format!("http rule removed: {r}"));
        widens = true;
    }
    for (r, rule) in is.iter().zip(&new.http).filter(|(r, _)| !was.contains(r)) {
        notes.push(format!("http rule added: {r}"));
        let judged_before = old.http.iter().any(|o| o.host == rule.host);
        widens |= judged_before;
    }
    widens
}
