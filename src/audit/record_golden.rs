//! The audit line, byte for byte: records that set every field the contract has (DESIGN
//! §7), with names, paths and details that need escaping, and the exact lines they encode to.
//! The lines were taken from the serde_json encoder the hand-written one replaced, so a
//! consumer that compares bytes (a signed chain, a golden file downstream) sees no change.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::record::*;
use crate::audit::record::Method;
use crate::policy::guard::GuardVerdict;
use crate::policy::ports::PortSet;
use crate::policy::reason::Reason;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::Target;
use crate::policy::{ListKind, Rule, RuleSource, Verdict};

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("a test address")
}

fn entry(record: Record, event: Event, close: Option<Close>) -> Entry {
    Entry {
        event,
        at: UNIX_EPOCH + Duration::from_millis(1_795_345_423_882),
        record,
        bytes_up: 1,
        bytes_down: 20_000_000_000,
        duration_ms: 3,
        close,
    }
}

/// A refused CONNECT whose guard refused an address.
fn connect() -> Entry {
    let mut r = Record::new(7, addr("127.0.0.1:5000"), Mode::Connect, "abc".into());
    r.sandbox = SandboxId::new("demo").ok();
    r.identity = Method::Source;
    r.target = Target::parse("[2001:db8::1]:443", None).ok();
    r.resolved = Some(["10.0.0.1".parse().expect("ip"), "::1".parse().expect("ip")].into());
    r.guard_refused = vec![
        (
            "10.0.0.1".parse().expect("ip"),
            GuardVerdict::Prohibited("10.0.0.0/8"),
        ),
        ("::1".parse().expect("ip"), GuardVerdict::Loop),
    ];
    r.detail = Some("upstream said no".into());
    entry(r, Event::End, Some(Close::Revoked))
}

/// A DNS query's record, and the sum of an unknown source's.
fn dns() -> Entry {
    let mut r = Record::new(u64::MAX, addr("[fd00::2]:53000"), Mode::Dns, "v\"1".into());
    r.verdict = Verdict::Allow;
    r.reason = Reason::RuleMatched;
    r.dns = Some(Box::new(DnsFacts {
        name: "exfil.bench".into(),
        qtype: "TYPE65280".into(),
        rcode: "NOERROR",
        answers: [
            "1.2.3.4".parse().expect("ip"),
            "2001:db8::5".parse().expect("ip"),
        ]
        .into(),
        passed: 2,
        ttl: Some(30),
        transport: "udp",
        summed: Some(Summed {
            count: 5,
            dropped: 2,
            first: "2026-11-22T11:03:43.000Z".into(),
            last: "2026-11-22T11:03:44.999Z".into(),
        }),
    }));
    entry(r, Event::Open, None)
}

/// A request inside a terminated tunnel, with every optional field and text that must be
/// escaped (quotes, backslashes, control characters, non-ASCII).
fn https() -> Entry {
    let mut r = Record::new(42, addr("10.1.2.3:40000"), Mode::Https, "p-7".into());
    r.sandbox = SandboxId::new("sb-1").ok();
    r.identity = Method::Token;
    r.target = Target::parse("api.example.com:8443", None).ok();
    r.sni = Some("a\"b\\c\n\t\u{1}\u{1f}\u{7f}é😀".into());
    r.original_dst = Some(addr("93.184.216.34:443"));
    r.dst_in_resolved = Some(true);
    r.alpn = Some(["h2".into(), "http/1.1".into(), "\u{8}\u{c}\r".into()].into());
    r.ech = Some(false);
    r.resolved = Some(["93.184.216.34".parse().expect("ip")].into());
    r.dialed = Some(addr("93.184.216.34:443"));
    r.verdict = Verdict::Report;
    r.reason = Reason::NoRuleMatched;
    r.rule = Some(Arc::new(Rule {
        text: "*.example.com:8443".into(),
        ports: PortSet::any(),
        source: RuleSource {
            file: "/etc/egress/policy.yaml".into(),
            sandbox: "sb-1".into(),
            list: ListKind::Egress,
            index: 3,
        },
        allows_opaque: false,
    }));
    r.detail = Some("line one\nline two \"quoted\"".into());
    r.http = Some(Box::new(HttpFacts {
        method: http::Method::POST,
        path: "/v1/\"x\"/ü".into(),
        status: 201,
        credential: Some("github".into()),
        secret_reflected: Some("aws\u{0}".into()),
        call: Some("tools/call search".into()),
    }));
    r.decider = Some("deny 403: \"no\"".into());
    r.dlp = Some("dlp: aws-key, 1".into());
    entry(r, Event::End, Some(Close::Eof))
}

/// An access request's step.
fn approval() -> Entry {
    let mut r = Record::new(9, addr("127.0.0.1:1"), Mode::Approval, "g".into());
    r.sandbox = SandboxId::new("demo").ok();
    r.verdict = Verdict::Allow;
    r.reason = Reason::GrantMatched;
    r.approval = Some(Box::new(ApprovalFacts {
        request: "r-1".into(),
        step: "approved",
        by: "admin",
        credential: None,
        grant: Some("host"),
        expires: Some("2026-11-22T12:00:00.000Z".into()),
        text: Some("need \"pypi\"\n".into()),
        checks: vec!["owner".into(), "ttl\t".into()],
    }));
    entry(r, Event::End, Some(Close::Error))
}

/// The lines, as the serde_json encoder wrote them.
const GOLDEN: [&str; 4] = [
    "{\"ts\":\"2026-11-22T11:03:43.882Z\",\"event\":\"end\",\"conn_id\":7,\"sandbox\":\"demo\",\"identity\":\"source\",\"client\":\"127.0.0.1:5000\",\"mode\":\"connect\",\"target_host\":\"[2001:db8::1]\",\"target_port\":443,\"sni\":null,\"original_dst\":null,\"resolved\":[\"10.0.0.1\",\"::1\"],\"dialed\":null,\"decision\":\"deny\",\"reason\":\"invalid_target\",\"rule\":null,\"rule_source\":null,\"policy_version\":\"abc\",\"bytes_up\":1,\"bytes_down\":20000000000,\"duration_ms\":3,\"close\":\"revoked\",\"detail\":\"upstream said no; guard refused 10.0.0.1 (10.0.0.0/8), ::1 (this proxy)\"}\n",
    "{\"ts\":\"2026-11-22T11:03:43.882Z\",\"event\":\"open\",\"conn_id\":18446744073709551615,\"sandbox\":null,\"identity\":\"none\",\"client\":\"[fd00::2]:53000\",\"mode\":\"dns\",\"target_host\":\"exfil.bench\",\"target_port\":null,\"sni\":null,\"original_dst\":null,\"resolved\":[],\"dialed\":null,\"decision\":\"allow\",\"reason\":\"rule_matched\",\"rule\":null,\"rule_source\":null,\"policy_version\":\"v\\\"1\",\"bytes_up\":1,\"bytes_down\":20000000000,\"duration_ms\":3,\"close\":null,\"qtype\":\"TYPE65280\",\"rcode\":\"NOERROR\",\"answers\":[\"1.2.3.4\",\"2001:db8::5\"],\"passed_records\":2,\"count\":5,\"dropped\":2,\"first_ts\":\"2026-11-22T11:03:43.000Z\",\"last_ts\":\"2026-11-22T11:03:44.999Z\",\"ttl\":30,\"transport\":\"udp\"}\n",
    "{\"ts\":\"2026-11-22T11:03:43.882Z\",\"event\":\"end\",\"conn_id\":42,\"sandbox\":\"sb-1\",\"identity\":\"token\",\"client\":\"10.1.2.3:40000\",\"mode\":\"https\",\"target_host\":\"api.example.com\",\"target_port\":8443,\"sni\":\"a\\\"b\\\\c\\n\\t\\u0001\\u001f\u{7f}é😀\",\"original_dst\":\"93.184.216.34:443\",\"dst_in_resolved\":true,\"alpn\":[\"h2\",\"http/1.1\",\"\\b\\f\\r\"],\"ech\":false,\"resolved\":[\"93.184.216.34\"],\"dialed\":\"93.184.216.34:443\",\"decision\":\"report\",\"reason\":\"no_rule_matched\",\"rule\":\"*.example.com:8443\",\"rule_source\":\"/etc/egress/policy.yaml: sandbox sb-1: network.egress[3]\",\"policy_version\":\"p-7\",\"bytes_up\":1,\"bytes_down\":20000000000,\"duration_ms\":3,\"close\":\"eof\",\"detail\":\"line one\\nline two \\\"quoted\\\"\",\"method\":\"POST\",\"path\":\"/v1/\\\"x\\\"/ü\",\"status\":201,\"credential\":\"github\",\"secret_reflected\":\"aws\\u0000\",\"call\":\"tools/call search\",\"decider\":\"deny 403: \\\"no\\\"\",\"dlp\":\"dlp: aws-key, 1\"}\n",
    "{\"ts\":\"2026-11-22T11:03:43.882Z\",\"event\":\"end\",\"conn_id\":9,\"sandbox\":\"demo\",\"identity\":\"none\",\"client\":\"127.0.0.1:1\",\"mode\":\"approval\",\"target_host\":null,\"target_port\":null,\"sni\":null,\"original_dst\":null,\"resolved\":[],\"dialed\":null,\"decision\":\"allow\",\"reason\":\"grant_matched\",\"rule\":null,\"rule_source\":null,\"policy_version\":\"g\",\"bytes_up\":1,\"bytes_down\":20000000000,\"duration_ms\":3,\"close\":\"error\",\"approval\":{\"request\":\"r-1\",\"step\":\"approved\",\"by\":\"admin\",\"grant\":\"host\",\"expires\":\"2026-11-22T12:00:00.000Z\",\"text\":\"need \\\"pypi\\\"\\n\",\"checks\":[\"owner\",\"ttl\\t\"]}}\n",
];

#[test]
fn every_field_encodes_to_the_same_bytes_as_before() {
    for (e, want) in [connect(), dns(), https(), approval()]
        .into_iter()
        .zip(GOLDEN)
    {
        let mut out = b"earlier line\n".to_vec();
        e.encode(&mut out).expect("encodes");
        let line = std::str::from_utf8(&out[b"earlier line\n".len()..]).expect("utf-8");
        assert_eq!(line, want);
        // One line, valid JSON, the escaped texts read back as they were.
        assert_eq!(line.matches('\n').count(), 1);
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        if let Some(sni) = &e.record.sni {
            assert_eq!(v["sni"], **sni);
        }
    }
}

#[test]
fn enum_spellings_are_the_serde_names() {
    let spelt = |json: String, s: &str| assert_eq!(json, format!("\"{s}\""));
    for e in [Event::Open, Event::End] {
        spelt(serde_json::to_string(&e).expect("json"), e.as_str());
    }
    use Close::*;
    for c in [Eof, Idle, Error, Revoked, Shutdown, Limit] {
        spelt(serde_json::to_string(&c).expect("json"), c.as_str());
    }
}

#[test]
fn a_timestamp_past_year_9999_keeps_every_digit() {
    let at = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
    assert_eq!(rfc3339(at), "10000-01-01T00:00:00.000Z");
}

/// A rule's source in the record is its `Display` text, escaped, for every list (the record
/// spells it with no formatter: [`RuleSource::spell`]).
#[test]
fn every_rule_source_is_its_display_text() {
    for list in [
        ListKind::Egress,
        ListKind::Deny,
        ListKind::Grant,
        ListKind::Scoped(3),
        ListKind::LayerDeny,
        ListKind::Ceiling,
    ] {
        let source = RuleSource {
            file: "/etc/p \"1\"\n.yaml".into(),
            sandbox: "sb\\1".into(),
            list,
            index: 12,
        };
        let mut e = https();
        let rule = e.record.rule.as_ref().expect("the https record has a rule");
        let mut rule = Rule::clone(rule);
        rule.source = source.clone();
        e.record.rule = Some(Arc::new(rule));
        let mut out = Vec::new();
        e.encode(&mut out).expect("encodes");
        let line: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(line["rule_source"], source.to_string(), "{list:?}");
    }
}
