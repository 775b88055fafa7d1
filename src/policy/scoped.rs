//! `network.scoped`: egress entries allowed to some processes only. AIP-36 keeps
//! `network.egress` a list of strings, so an entry for some processes is a sibling list:
//! `network.scoped: [{ binaries: [/usr/bin/git], egress: ["github.com"] }]`.
//!
//! The step runs after the sandbox's own lists refused for want of a rule (deny rules and
//! `deny-all` stay above it): a scoped entry that covers the target allows it when its scope
//! admits the connection's process, and otherwise refuses it as `process_not_allowed`, naming
//! the entry — so the refusal says the destination is allowed, but not to this process.

use std::net::IpAddr;
use std::sync::Arc;

use super::process::{Process, Scope};
use super::reason::Reason;
use super::target::{Host, Target};
use super::{Decision, Rule, RuleSet, Verdict};

/// The scoped entries' say on a target the sandbox's own lists decided as `own` (with
/// `pending`: address rules may still allow it once resolved).
pub(super) fn step(
    scoped: &[(Scope, RuleSet)],
    process: Option<&Process>,
    target: &Target,
    addrs: Option<&[IpAddr]>,
    own: Decision,
    pending: bool,
) -> (Decision, bool) {
    if own.verdict == Verdict::Allow
        || !matches!(own.reason, Reason::NoRuleMatched | Reason::PortNotAllowed)
    {
        return (own, pending);
    }
    let mut outside: Option<Arc<Rule>> = None;
    let mut more = pending;
    for (scope, rules) in scoped {
        let hit = covering_rule(rules, target, addrs);
        if addrs.is_none() && rules.addr_ports.iter().any(|p| p.contains(target.port)) {
            more = true;
        }
        let Some(rule) = hit else {
            continue;
        };
        if scope.admits(process) {
            return (Decision::allow(Reason::RuleMatched, Some(rule)), false);
        }
        outside.get_or_insert(rule);
    }
    match outside {
        Some(rule) => (Decision::deny(Reason::ProcessNotAllowed, Some(rule)), more),
        None => (own, more),
    }
}

/// The rule of `rules` that allows `target`: a name rule with the port, or address rules
/// covering every address (with the port).
fn covering_rule(rules: &RuleSet, target: &Target, addrs: Option<&[IpAddr]>) -> Option<Arc<Rule>> {
    if let Host::Name(name) = &target.host {
        if let Some(r) = rules.names.lookup(name, target.port).with_port {
            return Some(r.clone());
        }
    }
    let addrs = addrs.filter(|a| !a.is_empty())?;
    let mut first = None;
    for ip in addrs {
        let (with_port, _) = rules.addr_lookup(*ip, target.port);
        first.get_or_insert(with_port?.clone());
    }
    first
}

#[cfg(test)]
mod tests {
    use crate::policy::entry::parse_entry;
    use crate::policy::guard::Guard;
    use crate::policy::ports::PortSet;
    use crate::policy::process::{Observed, Process, Scope, Seen};
    use crate::policy::{CompiledPolicy, Enforcement, Mode, NetworkSpec, ScopedSpec, Verdict};
    use std::sync::Arc;

    fn policy() -> CompiledPolicy {
        let entry = |t: &str| (t.to_string(), parse_entry(t).unwrap());
        let spec = NetworkSpec {
            mode: Mode::Restricted,
            egress: vec![entry("pypi.org")],
            deny: vec![entry("evil.github.com")],
            resolve_for_address_rules: false,
            http: Arc::from(vec![]),
            scoped: vec![ScopedSpec {
                scope: Scope::new(&["/usr/bin/git".into()], &[], false)
                    .unwrap()
                    .unwrap(),
                egress: vec![entry("*.github.com")],
            }],
            layers: Default::default(),
            flows: None,
        };
        let ports = PortSet::from_ports(&[443]).unwrap();
        CompiledPolicy::compile("s", "f", &spec, Enforcement::Enforce, &ports).unwrap()
    }

    fn process(exe: &str) -> Process {
        Process {
            vouched: None,
            observed: Some(Observed::Seen(Arc::new(Seen {
                pid: 9,
                exe: exe.into(),
                ancestors: vec![],
                cgroup: None,
                uid: 0,
            }))),
        }
    }

    #[test]
    fn scoped_entries_allow_only_their_processes_and_deny_stays_above() {
        let p = policy();
        let guard = Guard::default();
        let t = |s: &str| crate::policy::target::Target::parse(s, None).unwrap();
        let git = process("/usr/bin/git");
        let py = process("/usr/bin/python3");
        let d = |who: Option<&Process>, target: &str| {
            p.decide_for(who, &t(target), None, &guard).decision
        };
        assert_eq!(d(Some(&git), "api.github.com:443").verdict, Verdict::Allow);
        let refused = d(Some(&py), "api.github.com:443");
        assert_eq!(refused.reason.code(), "process_not_allowed");
        assert!(refused
            .explain("s", "f", 443)
            .contains("network.scoped[0].egress[0]"));
        assert_eq!(
            d(None, "api.github.com:443").reason.code(),
            "process_not_allowed"
        );
        assert_eq!(
            d(Some(&git), "evil.github.com:443").reason.code(),
            "denied_by_rule"
        );
        assert_eq!(d(Some(&py), "pypi.org:443").verdict, Verdict::Allow);
        assert_eq!(
            d(Some(&git), "example.com:443").reason.code(),
            "no_rule_matched"
        );
    }
}
