//! Unit tests of the parent module.

use super::*;
use crate::policy::entry::parse_entry;

fn spec(mode: Mode, egress: &[&str], deny: &[&str]) -> NetworkSpec {
    let p = |v: &[&str]| {
        v.iter()
            .map(|s| (s.to_string(), parse_entry(s).unwrap()))
            .collect::<Vec<_>>()
    };
    NetworkSpec {
        mode,
        egress: p(egress),
        deny: p(deny),
        resolve_for_address_rules: false,
        http: Default::default(),
        scoped: Vec::new(),
        layers: Default::default(),
        flows: None,
    }
}

fn policy(egress: &[&str], deny: &[&str]) -> CompiledPolicy {
    CompiledPolicy::compile(
        "demo",
        "t.yaml",
        &spec(Mode::Restricted, egress, deny),
        Enforcement::Enforce,
        &PortSet::from_ports(&[443]).unwrap(),
    )
    .unwrap()
}

fn t(s: &str) -> Target {
    Target::parse(s, Some(443)).unwrap()
}

fn ips(v: &[&str]) -> Vec<IpAddr> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

fn reason(p: &CompiledPolicy, target: &str, addrs: Option<&[&str]>) -> (Verdict, Reason) {
    let a = addrs.map(ips);
    let o = p.decide(&t(target), a.as_deref(), &Guard::default());
    (o.decision.verdict, o.decision.reason)
}

#[test]
fn names_ports_and_defaults() {
    let p = policy(
        &[
            "api.example.com",
            "*.example.org:8000-8100",
            "**.example.net:*",
        ],
        &[],
    );
    assert_eq!(
        reason(&p, "api.example.com", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "API.EXAMPLE.COM.:443", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "api.example.com:80", None),
        (Verdict::Deny, Reason::PortNotAllowed)
    );
    assert_eq!(
        reason(&p, "x.example.org:8050", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "x.example.org:443", None),
        (Verdict::Deny, Reason::PortNotAllowed)
    );
    assert_eq!(
        reason(&p, "example.org:8050", None),
        (Verdict::Deny, Reason::NoRuleMatched)
    );
    assert_eq!(
        reason(&p, "example.net:22", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "evil.com", None),
        (Verdict::Deny, Reason::NoRuleMatched)
    );
}

#[test]
fn deny_wins() {
    let p = policy(
        &["**.example.com", "10.0.0.0/8:*"],
        &["secret.example.com", "10.1.0.0/16"],
    );
    assert_eq!(
        reason(&p, "a.example.com", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "secret.example.com", None),
        (Verdict::Deny, Reason::DeniedByRule)
    );
    assert_eq!(
        reason(&p, "secret.example.com:8443", None),
        (Verdict::Deny, Reason::DeniedByRule)
    );
    assert_eq!(
        reason(&p, "10.2.0.1:5432", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "10.1.0.1:5432", None),
        (Verdict::Deny, Reason::DeniedByRule)
    );
    // A name allowed by rule that resolves into a denied range is refused.
    assert_eq!(
        reason(&p, "a.example.com", Some(&["10.1.2.3"])),
        (Verdict::Deny, Reason::DeniedByRule)
    );
}

#[test]
fn ip_literals_need_address_rules() {
    let p = policy(&["api.example.com", "8.8.8.8", "[2001:4860::/32]:53"], &[]);
    assert_eq!(
        reason(&p, "8.8.8.8", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "8.8.4.4", None),
        (Verdict::Deny, Reason::NoRuleMatched)
    );
    assert_eq!(
        reason(&p, "[2001:4860::8888]:53", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "[2001:4860::8888]:443", None),
        (Verdict::Deny, Reason::PortNotAllowed)
    );
    assert_eq!(
        reason(&p, "[::ffff:8.8.8.8]", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
}

#[test]
fn names_allowed_by_address_rules_when_every_address_is_covered() {
    let p = policy(&["10.0.0.0/8:5432"], &[]);
    let o = p.decide(&t("db.internal:5432"), None, &Guard::default());
    assert_eq!(o.decision.reason, Reason::NoRuleMatched);
    assert!(o.needs_addresses, "address rules may still allow it");
    assert_eq!(
        reason(&p, "db.internal:5432", Some(&["10.1.1.1", "10.2.2.2"])),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "db.internal:5432", Some(&["10.1.1.1", "8.8.8.8"])),
        (Verdict::Deny, Reason::NoRuleMatched)
    );
    assert_eq!(
        reason(&p, "db.internal:5433", Some(&["10.1.1.1"])),
        (Verdict::Deny, Reason::PortNotAllowed)
    );
    // Without address rules nothing is pending.
    let q = policy(&["api.example.com"], &[]);
    assert!(
        !q.decide(&t("db.internal"), None, &Guard::default())
            .needs_addresses
    );
}

#[test]
fn guard_applies_after_policy() {
    let p = policy(
        &["api.example.com", "10.0.0.0/8:5432", "localhost:8080"],
        &[],
    );
    // Allowed name resolving to metadata / private is prohibited.
    assert_eq!(
        reason(&p, "api.example.com", Some(&["169.254.169.254"])),
        (Verdict::Deny, Reason::DestinationIpProhibited)
    );
    // Mixed answers dial only the permitted addresses.
    let q = policy(&["api.example.com"], &[]);
    let o = q.decide(
        &t("api.example.com"),
        Some(&ips(&["127.0.0.1", "93.184.216.34"])),
        &Guard::default(),
    );
    assert_eq!(o.decision.verdict, Verdict::Allow);
    assert_eq!(o.dial, ips(&["93.184.216.34"]));
    assert_eq!(o.refused.len(), 1);
    // A covered private address passes the guard on any port (the port is policy's job).
    assert_eq!(
        reason(&p, "api.example.com", Some(&["10.3.3.3"])),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "localhost:8080", Some(&["127.0.0.1"])),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "127.0.0.1:8080", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "[::1]:8080", None),
        (Verdict::Allow, Reason::RuleMatched)
    );
    assert_eq!(
        reason(&p, "127.0.0.1:8081", None),
        (Verdict::Deny, Reason::PortNotAllowed)
    );
    // Loop protection beats every rule.
    let g = Guard::new(&[], &[], vec!["127.0.0.1:8080".parse().unwrap()]);
    let o = p.decide(&t("127.0.0.1:8080"), None, &g);
    assert_eq!(o.decision.reason, Reason::ProxyLoop);
}

#[test]
fn modes_and_report() {
    let sp = |m| spec(m, &["api.example.com"], &["evil.example.com"]);
    let ports = PortSet::from_ports(&[443]).unwrap();
    let deny_all =
        CompiledPolicy::compile("d", "f", &sp(Mode::DenyAll), Enforcement::Enforce, &ports)
            .unwrap();
    assert_eq!(
        reason(&deny_all, "api.example.com", None),
        (Verdict::Deny, Reason::DenyAllMode)
    );
    let allow_all =
        CompiledPolicy::compile("a", "f", &sp(Mode::AllowAll), Enforcement::Enforce, &ports)
            .unwrap();
    assert_eq!(
        reason(&allow_all, "anything.example:22", None),
        (Verdict::Allow, Reason::AllowAllMode)
    );
    assert_eq!(
        reason(&allow_all, "evil.example.com", None),
        (Verdict::Deny, Reason::DeniedByRule)
    );
    assert_eq!(
        reason(&allow_all, "anything.example", Some(&["10.0.0.1"])),
        (Verdict::Deny, Reason::DestinationIpProhibited)
    );
    let report =
        CompiledPolicy::compile("r", "f", &sp(Mode::Restricted), Enforcement::Report, &ports)
            .unwrap();
    assert_eq!(
        reason(&report, "other.example", None),
        (Verdict::Report, Reason::NoRuleMatched)
    );
    assert_eq!(
        reason(&report, "evil.example.com", None),
        (Verdict::Report, Reason::DeniedByRule)
    );
    // Report mode never relaxes the guard.
    assert_eq!(
        reason(&report, "other.example", Some(&["127.0.0.1"])),
        (Verdict::Deny, Reason::DestinationIpProhibited)
    );
    let o = report.decide(&t("other.example"), None, &Guard::default());
    assert!(o.needs_addresses);
}

#[test]
fn rule_provenance_is_reported() {
    let p = policy(&["a.example.com", "b.example.com"], &[]);
    let o = p.decide(&t("b.example.com"), None, &Guard::default());
    let r = o.decision.rule.unwrap();
    assert_eq!(r.text, "b.example.com");
    assert_eq!(
        r.source.to_string(),
        "t.yaml: sandbox demo: network.egress[1]"
    );
}
