//! Unit tests of the policy set.

use super::*;
use crate::config::load_str;
use std::path::Path;

#[test]
fn address_rule_zones_match_whole_labels() {
    let text = "dns: { address_rule_zones: [cluster.local, Svc.] }\nsandboxes:\n  - { id: a, policy: { provider: local, config: {}, network: { egress: [10.0.0.0/8] } } }\n";
    let c = load_str(text, "t", Path::new("."), None).unwrap();
    let set = PolicySet::compile(&c, &[], vec![]).unwrap();
    for yes in ["cluster.local", "db.ns.svc.cluster.local", "svc", "api.svc"] {
        assert!(set.in_address_rule_zone(yes), "{yes}");
    }
    for no in [
        "evilcluster.local",
        "cluster.local.evil.example",
        "svc.example",
        "local",
    ] {
        assert!(!set.in_address_rule_zone(no), "{no}");
    }
    // A name outside the zones needs no addresses: refused without a lookup.
    let sb = set.get("a").unwrap();
    let t = |h: &str| Target::parse(h, None).unwrap();
    assert!(
        !set.decide(sb, &t("x.exfil.example:443"), None)
            .needs_addresses
    );
    assert!(
        set.decide(sb, &t("db.svc.cluster.local:443"), None)
            .needs_addresses
    );
}

#[test]
fn compiles_and_identifies_by_source() {
    let text = "sandboxes:\n  - { id: a, sources: [10.0.0.0/8], policy: { provider: local, config: {}, network: { egress: [x.example.com] } } }\n  - { id: b, sources: [10.1.0.0/16], policy: { provider: local, config: {} } }\n";
    let c = load_str(text, "t", Path::new("."), None).unwrap();
    let set = PolicySet::compile(&c, &[], vec![]).unwrap();
    assert_eq!(set.ids(), ["a", "b"]);
    assert_eq!(
        set.by_source("10.2.0.1".parse().unwrap())
            .unwrap()
            .binding
            .id,
        "a"
    );
    assert_eq!(
        set.by_source("10.1.0.1".parse().unwrap())
            .unwrap()
            .binding
            .id,
        "b"
    );
    assert_eq!(
        set.by_source("::ffff:10.1.0.1".parse().unwrap())
            .unwrap()
            .binding
            .id,
        "b"
    );
    assert!(set.by_source("192.168.0.1".parse().unwrap()).is_none());
    assert_eq!(set.version().len(), 12);
    // A different rule set has a different version; the same one the same.
    let again = PolicySet::compile(&c, &[], vec![]).unwrap();
    assert_eq!(again.version(), set.version());
    let c2 = load_str(
        &text.replace("x.example.com", "y.example.com"),
        "t",
        Path::new("."),
        None,
    )
    .unwrap();
    assert_ne!(
        PolicySet::compile(&c2, &[], vec![]).unwrap().version(),
        set.version()
    );
}

#[test]
fn incremental_changes_match_a_full_compile() {
    let a = "  - { id: a, sources: [10.0.0.0/8], policy: { provider: local, config: {}, network: { egress: [x.example.com] } } }\n";
    let b = "  - { id: b, sources: [10.1.0.0/16], auth: { token_sha256: 0000000000000000000000000000000000000000000000000000000000000000 }, policy: { provider: local, config: {}, network: { egress: [y.example.com] } } }\n";
    let load = |text: String| load_str(&text, "t", Path::new("."), None).unwrap();
    let only_a = load(format!("sandboxes:\n{a}"));
    let both = load(format!("sandboxes:\n{a}{b}"));
    let set_a = PolicySet::compile(&only_a, &[], vec![]).unwrap();
    let set_ab = PolicySet::compile(&both, &[], vec![]).unwrap();
    let b_binding = Arc::new(both.bindings.iter().find(|x| x.id == "b").unwrap().clone());
    let grown = set_a.with_binding(&b_binding).unwrap();
    assert_eq!(grown.version(), set_ab.version());
    assert_eq!(grown.ids(), ["a", "b"]);
    assert_eq!(
        grown
            .by_source("10.1.2.3".parse().unwrap())
            .unwrap()
            .binding
            .id,
        "b"
    );
    let shrunk = grown.without("b");
    assert_eq!(shrunk.version(), set_a.version());
    assert_eq!(
        shrunk
            .by_source("10.1.2.3".parse().unwrap())
            .unwrap()
            .binding
            .id,
        "a"
    );
    // Replacing a sandbox with itself changes nothing; the original set is untouched.
    assert_eq!(
        grown.with_binding(&b_binding).unwrap().version(),
        set_ab.version()
    );
    assert_eq!(set_a.ids(), ["a"]);
}

#[test]
fn recompile_compiles_only_what_changed() {
    let sb = |id: &str, extra: &str, host: &str| {
        format!("  - {{ id: {id}{extra}, policy: {{ provider: local, config: {{}}, network: {{ egress: [{host}] }} }} }}\n")
    };
    let load = |defaults: &str, text: String| {
        load_str(
            &format!("{defaults}sandboxes:\n{text}"),
            "t",
            Path::new("."),
            None,
        )
        .unwrap()
    };
    let before = load(
        "",
        format!(
            "{}{}{}",
            sb("a", "", "x.test"),
            sb("b", "", "y.test"),
            sb("c", ", sources: [10.0.0.0/8]", "z.test")
        ),
    );
    let set = PolicySet::compile(&before, &[], vec![]).unwrap();
    let same =
        |next: &PolicySet, id: &str| Arc::ptr_eq(next.get(id).unwrap(), set.get(id).unwrap());

    // b edited, a untouched, d added: only b and d compiled, only their exchanges woken.
    let edited = load(
        "",
        format!(
            "{}{}{}{}",
            sb("a", "", "x.test"),
            sb("b", "", "w.test"),
            sb("c", ", sources: [10.0.0.0/8]", "z.test"),
            sb("d", "", "v.test")
        ),
    );
    let (next, changes) = set.recompile(&edited, &[], vec![]).unwrap();
    assert!(same(&next, "a") && same(&next, "c") && !same(&next, "b"));
    assert_eq!(changes.sandboxes, ["b", "d"]);
    assert!(!changes.set_wide);
    assert_eq!(
        next.version(),
        PolicySet::compile(&edited, &[], vec![]).unwrap().version()
    );

    // Nothing changed: nothing compiled, same version.
    let (again, changes) = set.recompile(&before, &[], vec![]).unwrap();
    assert!(changes.sandboxes.is_empty() && !changes.set_wide);
    assert_eq!(again.version(), set.version());

    // b removed: listed; c's sources changed: every exchange re-checks.
    let moved = load(
        "",
        format!(
            "{}{}",
            sb("a", "", "x.test"),
            sb("c", ", sources: [10.1.0.0/16]", "z.test")
        ),
    );
    let (_, changes) = set.recompile(&moved, &[], vec![]).unwrap();
    assert_eq!(changes.sandboxes, ["b", "c"]);
    assert!(changes.set_wide);

    // Defaults changed: everything recompiled, set-wide.
    let ports = load(
        "defaults: { ports: [8443] }\n",
        format!(
            "{}{}{}",
            sb("a", "", "x.test"),
            sb("b", "", "y.test"),
            sb("c", ", sources: [10.0.0.0/8]", "z.test")
        ),
    );
    let (next, changes) = set.recompile(&ports, &[], vec![]).unwrap();
    assert!(changes.set_wide && !same(&next, "a"));
    assert_eq!(changes.sandboxes.len(), 3);
}

#[test]
fn the_version_covers_http_rules() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.key"), "key").unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&key).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
    let text = "tls_intercept: { ca_cert_file: ca.crt, ca_key_file: ca.key }\nsandboxes:\n  - { id: a, policy: { provider: local, config: {}, network: { egress: [api.test], http: [{ host: api.test, methods: [GET] }] } } }\n";
    let version = |t: &str| {
        let c = load_str(t, "t", dir.path(), None).unwrap();
        PolicySet::compile(&c, &[], vec![])
            .unwrap()
            .version()
            .to_string()
    };
    assert_eq!(version(text), version(text));
    assert_ne!(
        version(text),
        version(&text.replace("[GET]", "[GET, POST]"))
    );
}

/// A grant widens only what the sandbox's own policy refused for want of a rule: deny rules,
/// `deny-all`, and the address guard stay above it — a grant opens no prohibited range, even
/// where an address rule of the sandbox does — and it survives a recompile (a reload) while
/// its sandbox does.
#[test]
fn grants_sit_below_deny_rules_and_the_guard() {
    use crate::policy::granted::{GrantEntry, GrantKind, Granted};
    let text = "sandboxes:\n  - { id: a, policy: { provider: local, config: {}, network: { egress: [\"10.0.0.0/8:5432\"], deny: [denied.example] } } }\n  - { id: z, policy: { provider: local, config: {}, network: { mode: deny-all } } }\n";
    let c = load_str(text, "t", Path::new("."), None).unwrap();
    let set = PolicySet::compile(&c, &[], vec![]).unwrap();
    let t = |h: &str| Target::parse(h, None).unwrap();
    let grant = |sb: &str, host: &str| {
        let target = t(host);
        Arc::new(GrantEntry::new(
            sb,
            &format!("r-{:012x}", host.len()),
            target.host,
            target.port,
            vec![],
            vec![],
            GrantKind::Ttl,
            Some(std::time::SystemTime::now() + std::time::Duration::from_secs(60)),
            "admin",
        ))
    };
    let mut edit = set.edit();
    let a = SandboxId::new("a").unwrap();
    edit.grants(
        &a,
        Granted {
            entries: vec![
                grant("a", "public.example:443"),
                grant("a", "denied.example:443"),
                grant("a", "169.254.169.254:443"),
                grant("a", "inside.example:443"),
            ],
        },
    );
    let z = SandboxId::new("z").unwrap();
    edit.grants(
        &z,
        Granted {
            entries: vec![grant("z", "public.example:443")],
        },
    );
    let granted = edit.finish();
    assert_ne!(
        granted.version(),
        set.version(),
        "grants are part of the version"
    );
    let sa = granted.get("a").unwrap();
    let public = "93.184.216.34".parse().unwrap();
    let o = granted.decide(sa, &t("public.example:443"), Some(&[public]));
    assert_eq!(o.decision.reason, Reason::GrantMatched);
    assert_eq!(o.dial, [public]);
    assert!(o
        .decision
        .rule
        .unwrap()
        .source
        .to_string()
        .contains("grant r-"));
    // Another port of the same host is not granted.
    let o = granted.decide(sa, &t("public.example:8443"), Some(&[public]));
    assert_eq!(o.decision.verdict, Verdict::Deny);
    // network.deny stays above.
    let o = granted.decide(sa, &t("denied.example:443"), None);
    assert_eq!(o.decision.reason, Reason::DeniedByRule);
    // The guard stays above: a metadata address, and a private one inside the sandbox's own
    // address rule (which would open it for a name the rule allowed).
    let o = granted.decide(sa, &t("169.254.169.254:443"), None);
    assert_eq!(o.decision.reason, Reason::DestinationIpProhibited);
    let private = "10.1.2.3".parse().unwrap();
    let o = granted.decide(sa, &t("inside.example:443"), Some(&[private]));
    assert_eq!(o.decision.reason, Reason::DestinationIpProhibited, "{o:?}");
    // (The sandbox's own rule, on its own port, does open it.)
    let o = granted.decide(sa, &t("10.1.2.3:5432"), None);
    assert_eq!(o.decision.reason, Reason::RuleMatched);
    // deny-all stays above.
    let sz = granted.get("z").unwrap();
    let o = granted.decide(sz, &t("public.example:443"), Some(&[public]));
    assert_eq!(o.decision.reason, Reason::DenyAllMode);
    // A reload keeps the grants of the sandboxes it keeps.
    let (reloaded, _) = granted.recompile(&c, &[], vec![]).unwrap();
    let o = reloaded.decide(
        reloaded.get("a").unwrap(),
        &t("public.example:443"),
        Some(&[public]),
    );
    assert_eq!(o.decision.reason, Reason::GrantMatched);
    assert_eq!(reloaded.version(), granted.version());
}
