//! Property tests: random policies and random targets, the compiled matchers against a
//! deliberately naive reference matcher written here from DESIGN §2.

use std::net::{IpAddr, Ipv4Addr};

use egress_proxy::policy::entry::parse_entry;
use egress_proxy::policy::guard::Guard;
use egress_proxy::policy::ports::PortSet;
use egress_proxy::policy::target::Target;
use egress_proxy::policy::{CompiledPolicy, Enforcement, Mode, NetworkSpec, Reason, Verdict};
use proptest::prelude::*;

const LABELS: &[&str] = &["a", "b", "api", "x-y", "ec2"];
const SUFFIXES: &[&str] = &["example.com", "example.org", "b.example.com"];
const PORTS: &[&str] = &["", ":443", ":80", ":8000-8100", ":*"];
const TARGET_PORTS: &[u16] = &[443, 80, 8050, 22];

fn name() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(LABELS), 0..4),
        prop::sample::select(SUFFIXES),
    )
        .prop_map(|(labels, suffix)| {
            let mut parts: Vec<&str> = labels;
            parts.push(suffix);
            parts.join(".")
        })
}

fn name_entry() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        name(),
        prop::sample::select(SUFFIXES).prop_map(|s| format!("*.{s}")),
        prop::sample::select(SUFFIXES).prop_map(|s| format!("**.{s}")),
        (prop::sample::select(LABELS), prop::sample::select(SUFFIXES))
            .prop_map(|(l, s)| format!("{l}.*.{s}")),
        (prop::sample::select(LABELS), prop::sample::select(SUFFIXES))
            .prop_map(|(l, s)| format!("{l}-*.{s}")),
        (prop::sample::select(LABELS), prop::sample::select(SUFFIXES))
            .prop_map(|(l, s)| format!("{l}.**.{s}")),
    ];
    (host, prop::sample::select(PORTS)).prop_map(|(h, p)| format!("{h}{p}"))
}

fn addr_entry() -> impl Strategy<Value = String> {
    (
        any::<[u8; 2]>(),
        prop::sample::select(&[8u8, 16, 24, 32][..]),
        prop::sample::select(PORTS),
    )
        .prop_map(|([a, b], len, p)| format!("{}.{}.0.{}/{len}{p}", 20 + a % 4, b % 4, b % 3))
}

/// Label glob: `*` inside a label matches any characters of that label; `**` matches zero or
/// more whole labels.
fn glob_match(pattern: &[&str], name: &[&str]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((&"**", rest)) => (0..=name.len()).any(|k| glob_match(rest, &name[k..])),
        Some((p, rest)) => match name.split_first() {
            Some((n, nrest)) => label_match(p.as_bytes(), n.as_bytes()) && glob_match(rest, nrest),
            None => false,
        },
    }
}

fn label_match(p: &[u8], n: &[u8]) -> bool {
    match p.split_first() {
        None => n.is_empty(),
        Some((b'*', rest)) => (0..=n.len()).any(|k| label_match(rest, &n[k..])),
        Some((c, rest)) => n.first() == Some(c) && label_match(rest, &n[1..]),
    }
}

fn ports_of(entry: &str, deny: bool) -> (String, PortSet) {
    match entry.split_once(':') {
        Some((h, p)) => (h.to_string(), PortSet::parse(p).unwrap()),
        None if deny => (entry.to_string(), PortSet::any()),
        None => (entry.to_string(), PortSet::from_ports(&[443]).unwrap()),
    }
}

/// The reference: does `entry` match `name:port`?
fn naive_name(entry: &str, name: &str, port: u16, deny: bool) -> Option<bool> {
    let (host, ports) = ports_of(entry, deny);
    if host.contains('/') {
        return None;
    }
    let hit = if let Some(s) = host.strip_prefix("**.") {
        name == s || name.ends_with(&format!(".{s}"))
    } else if let Some(s) = host.strip_prefix("*.").filter(|s| !s.contains('*')) {
        name.ends_with(&format!(".{s}"))
    } else if host.contains('*') {
        let p: Vec<&str> = host.split('.').collect();
        let n: Vec<&str> = name.split('.').collect();
        glob_match(&p, &n)
    } else {
        host == name
    };
    hit.then(|| ports.contains(port))
}

fn naive_addr(entry: &str, ip: Ipv4Addr, port: u16, deny: bool) -> Option<bool> {
    let (host, ports) = ports_of(entry, deny);
    let (net, len) = host.split_once('/')?;
    let net: Ipv4Addr = net.parse().unwrap();
    let len: u32 = len.parse().unwrap();
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    (u32::from(ip) & mask == u32::from(net) & mask).then(|| ports.contains(port))
}

fn compile(egress: &[String], deny: &[String]) -> CompiledPolicy {
    let parse = |v: &[String]| {
        v.iter()
            .map(|s| (s.clone(), parse_entry(s).unwrap()))
            .collect()
    };
    let spec = NetworkSpec {
        mode: Mode::Restricted,
        egress: parse(egress),
        deny: parse(deny),
        resolve_for_address_rules: false,
        http: Default::default(),
        scoped: Vec::new(),
        layers: Default::default(),
        flows: None,
    };
    CompiledPolicy::compile(
        "p",
        "p.yaml",
        &spec,
        Enforcement::Enforce,
        &PortSet::from_ports(&[443]).unwrap(),
    )
    .unwrap()
}

/// Reference verdict from per-rule results: deny rules (port-matched) first, then egress.
fn reference(results_deny: &[Option<bool>], results_allow: &[Option<bool>]) -> Reason {
    if results_deny.contains(&Some(true)) {
        return Reason::DeniedByRule;
    }
    if results_allow.contains(&Some(true)) {
        return Reason::RuleMatched;
    }
    if results_allow.contains(&Some(false)) {
        return Reason::PortNotAllowed;
    }
    Reason::NoRuleMatched
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn names_match_like_the_reference(
        egress in prop::collection::vec(name_entry(), 0..12),
        deny in prop::collection::vec(name_entry(), 0..3),
        target in name(),
        port in prop::sample::select(TARGET_PORTS),
    ) {
        let p = compile(&egress, &deny);
        let want = reference(
            &deny.iter().map(|e| naive_name(e, &target, port, true)).collect::<Vec<_>>(),
            &egress.iter().map(|e| naive_name(e, &target, port, false)).collect::<Vec<_>>(),
        );
        let t = Target::parse(&format!("{target}:{port}"), None).unwrap();
        let got = p.decide(&t, None, &Guard::default()).decision;
        prop_assert_eq!(got.reason, want, "egress={:?} deny={:?} target={}:{}", egress, deny, target, port);
        prop_assert_eq!(got.verdict == Verdict::Allow, want == Reason::RuleMatched);
        if let Some(rule) = got.rule {
            // The reported rule really matches (name) in the reference.
            prop_assert!(naive_name(&rule.text, &target, port, want == Reason::DeniedByRule).is_some());
        }
    }

    #[test]
    fn addresses_match_like_the_reference(
        egress in prop::collection::vec(prop_oneof![addr_entry(), name_entry()], 0..12),
        deny in prop::collection::vec(addr_entry(), 0..3),
        ip in (20u8..24, 0u8..4, 0u8..3).prop_map(|(a, b, c)| Ipv4Addr::new(a, b, 0, c)),
        port in prop::sample::select(TARGET_PORTS),
    ) {
        let p = compile(&egress, &deny);
        let want = reference(
            &deny.iter().map(|e| naive_addr(e, ip, port, true)).collect::<Vec<_>>(),
            &egress.iter().map(|e| naive_addr(e, ip, port, false)).collect::<Vec<_>>(),
        );
        let t = Target { host: egress_proxy::policy::target::Host::Ip(IpAddr::V4(ip)), port };
        let got = p.decide(&t, None, &Guard::default()).decision;
        prop_assert_eq!(got.reason, want, "egress={:?} deny={:?} target={}:{}", egress, deny, ip, port);
    }

    #[test]
    fn arbitrary_strings_never_panic(s in "\\PC{0,80}", port in any::<u16>()) {
        let _ = parse_entry(&s);
        let _ = Target::parse(&s, Some(443));
        let _ = Target::parse(&format!("{s}:{port}"), None);
        if let Ok(t) = Target::parse(&s, Some(443)) {
            let p = compile(&["**.example.com".into(), "10.0.0.0/8".into()], &[]);
            let _ = p.decide(&t, Some(&["10.0.0.1".parse().unwrap()]), &Guard::default());
        }
    }
}
