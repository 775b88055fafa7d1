//! What a sandbox's policy lets the DNS listener say about a name, before any port is known:
//! whether a name rule could allow the name on some port, whether only address rules could,
//! or neither; and which resolved addresses may appear in an answer. No I/O.
//!
//! The listener answers a name only when a connection to it could then be allowed, so DNS
//! carries nothing a connection could not: names no rule allows never leave the proxy, and
//! addresses the guard or a deny rule would refuse never reach the sandbox.

use std::net::IpAddr;
use std::sync::Arc;

use super::{CompiledPolicy, Decision, Mode, Reason, Rule};
use crate::policy::guard::{address_forms, Guard, GuardVerdict};

/// What the policy says about a name, for DNS.
#[derive(Debug, Clone)]
pub enum NameView {
    /// A name rule allows the name on at least one port (the first such rule).
    Named(Arc<Rule>),
    /// `network.mode: allow-all`.
    AllowAll,
    /// No name rule, but address rules could allow what the name resolves to: answer only
    /// when every address is covered by one.
    AddressRules,
    /// Nothing could allow a connection to the name (before report mode relaxes it).
    Refused(Decision),
}

impl CompiledPolicy {
    /// What this policy says about `name` (normalised) on any port. A deny rule refuses the
    /// name here only when it covers every port: `x.example:22` in `network.deny` still lets
    /// `x.example` be answered for `x.example:443`.
    pub fn name_view(&self, name: &str) -> NameView {
        match self.own_name_view(name) {
            v @ NameView::Refused(_) => v,
            // A name a layer denies, or no ceiling could admit, is not even resolved: the
            // query itself would carry data to whoever serves the name's zone.
            v => super::layer::name_refusal(self.layers(), name).map_or(v, NameView::Refused),
        }
    }

    /// [`CompiledPolicy::name_view`] by the sandbox's own lists.
    fn own_name_view(&self, name: &str) -> NameView {
        if let Some(r) = self.deny.names.first(name, |r| r.ports.is_any()) {
            return NameView::Refused(Decision::deny(Reason::DeniedByRule, Some(r.clone())));
        }
        match self.mode {
            Mode::DenyAll => return NameView::Refused(Decision::deny(Reason::DenyAllMode, None)),
            Mode::AllowAll => return NameView::AllowAll,
            Mode::Restricted => {}
        }
        if let Some(r) = self.allow.names.first(name, |_| true) {
            return NameView::Named(r.clone());
        }
        // A name only some processes may reach is answered: DNS cannot say which process
        // asks, and the connection that follows is decided with its process.
        if let Some(r) = self
            .scoped
            .iter()
            .find_map(|(_, s)| s.names.first(name, |_| true))
        {
            return NameView::Named(r.clone());
        }
        if !self.allow.addrs.is_empty() {
            return NameView::AddressRules;
        }
        NameView::Refused(Decision::deny(Reason::NoRuleMatched, None))
    }

    /// Whether an address rule of `network.egress` covers `ip` on some port.
    pub fn covers_address(&self, ip: IpAddr) -> bool {
        self.allow.covers_any_port(ip)
    }

    /// Whether `ip` may appear in an answer to this sandbox: no deny rule refuses it on every
    /// port, and the guard would let a connection reach it (private, metadata and reserved
    /// addresses only when an address rule of the sandbox covers them).
    pub fn answerable(&self, ip: IpAddr, guard: &Guard) -> bool {
        let denied =
            address_forms(ip).any(|f| self.deny.addrs.matches(f).any(|r| r.ports.is_any()));
        !denied && guard.check(ip, 0, |a| self.allow.covering(a)) == GuardVerdict::Permit
    }
}

#[cfg(test)]
mod tests {
    use super::super::entry::parse_entry;
    use super::super::ports::PortSet;
    use super::super::{Enforcement, NetworkSpec};
    use super::*;

    fn policy(mode: Mode, egress: &[&str], deny: &[&str]) -> CompiledPolicy {
        let p = |v: &[&str]| {
            v.iter()
                .map(|s| (s.to_string(), parse_entry(s).unwrap()))
                .collect::<Vec<_>>()
        };
        let spec = NetworkSpec {
            mode,
            egress: p(egress),
            deny: p(deny),
            resolve_for_address_rules: false,
            http: Default::default(),
            scoped: Vec::new(),
            layers: Default::default(),
            flows: None,
        };
        CompiledPolicy::compile(
            "t",
            "t.yaml",
            &spec,
            Enforcement::Enforce,
            &PortSet::from_ports(&[443]).unwrap(),
        )
        .unwrap()
    }

    fn kind(v: NameView) -> String {
        match v {
            NameView::Named(r) => format!("named {}", r.text),
            NameView::AllowAll => "allow-all".into(),
            NameView::AddressRules => "addresses".into(),
            NameView::Refused(d) => format!("refused {}", d.reason.code()),
        }
    }

    #[test]
    fn names_are_answered_when_some_port_could_be_allowed() {
        let p = policy(
            Mode::Restricted,
            &["github.com:22", "*.example.com", "10.0.0.0/8"],
            &["bad.example.com", "ssh.example.com:22"],
        );
        assert_eq!(kind(p.name_view("github.com")), "named github.com:22");
        assert_eq!(kind(p.name_view("a.example.com")), "named *.example.com");
        // A deny rule on every port refuses the name; one on a single port does not.
        assert_eq!(
            kind(p.name_view("bad.example.com")),
            "refused denied_by_rule"
        );
        assert_eq!(kind(p.name_view("ssh.example.com")), "named *.example.com");
        // No name rule, but an address rule could allow what it resolves to.
        assert_eq!(kind(p.name_view("db.internal")), "addresses");
        let names_only = policy(Mode::Restricted, &["a.test"], &[]);
        assert_eq!(
            kind(names_only.name_view("b.test")),
            "refused no_rule_matched"
        );
        let all = policy(Mode::AllowAll, &[], &["x.test"]);
        assert_eq!(kind(all.name_view("y.test")), "allow-all");
        assert_eq!(kind(all.name_view("x.test")), "refused denied_by_rule");
        let none = policy(Mode::DenyAll, &["a.test"], &[]);
        assert_eq!(kind(none.name_view("a.test")), "refused deny_all_mode");
    }

    #[test]
    fn answers_keep_only_what_a_connection_could_reach() {
        let p = policy(
            Mode::Restricted,
            &["a.test", "10.1.0.0/16"],
            &["8.8.4.0/24", "1.1.1.7:22"],
        );
        let g = Guard::default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(p.answerable(ip("93.184.216.34"), &g));
        assert!(!p.answerable(ip("169.254.169.254"), &g), "metadata");
        assert!(!p.answerable(ip("10.2.0.1"), &g), "private, not covered");
        assert!(
            p.answerable(ip("10.1.2.3"), &g),
            "private, covered by a rule"
        );
        assert!(!p.answerable(ip("8.8.4.9"), &g), "denied on every port");
        assert!(p.answerable(ip("1.1.1.7"), &g), "denied on port 22 only");
        assert!(!p.answerable(ip("::ffff:169.254.169.254"), &g));
    }
}
