//! `audit.format: ocsf` with the real binary: connections (allowed, denied, reported, a
//! forwarded request) and DNS listener queries (answered, refused) are written as OCSF
//! Network Activity (4001) and DNS Activity (4003) records, and every one validates against
//! the JSON Schemas in `tests/data/ocsf/` (generated from the OCSF schema's definition files,
//! tag 1.8.0, by `tests/data/ocsf/generate.py`) with Python's `jsonschema`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn schema(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/ocsf")
        .join(name)
        .display()
        .to_string()
}

/// Validate every line of `records` with the schema its class names; returns the errors.
fn validate(records: &[serde_json::Value]) -> String {
    let script = r#"
import json, sys
from jsonschema import Draft202012Validator
schemas = {4001: Draft202012Validator(json.load(open(sys.argv[1]))),
           4003: Draft202012Validator(json.load(open(sys.argv[2])))}
errors = []
for i, line in enumerate(sys.stdin):
    rec = json.loads(line)
    v = schemas.get(rec.get("class_uid"))
    if v is None:
        errors.append(f"record {i}: class_uid {rec.get('class_uid')} has no schema")
        continue
    for e in v.iter_errors(rec):
        errors.append(f"record {i}: {list(e.absolute_path)}: {e.message}")
print("\n".join(errors))
"#;
    let mut child = Command::new("python3")
        .args([
            "-c",
            script,
            &schema("network_activity.schema.json"),
            &schema("dns_activity.schema.json"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (with jsonschema: .ci/run installs it)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        for r in records {
            writeln!(stdin, "{r}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the validator did not run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn connections_and_dns_queries_are_ocsf_records_that_validate() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let audit = dir.path().join("audit.jsonl");
    let entry = format!("api.test:{port}");
    let mut proxy = ProxyConfig::new()
        .listen("dns")
        .audit("format: ocsf, chain: true")
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("seen.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("agent")
                .source("127.0.0.1/32")
                .allow(&entry),
        )
        .sandbox(
            SandboxSpec::new("watcher")
                .token("watcher-secret")
                .report()
                .allow(&entry),
        )
        .start(dir.path());
    let px = format!("http://{}", proxy.proxy);
    // Allowed (forwarded), denied, and reported.
    assert_eq!(
        curl(&["-x", &px, &format!("http://api.test:{port}/ok")]).code,
        0
    );
    assert_eq!(
        curl(&["-x", &px, &format!("http://denied.test:{port}/")]).code,
        0
    );
    let watcher = format!("http://watcher:watcher-secret@{}", proxy.proxy);
    assert_eq!(
        curl(&["-x", &watcher, &format!("http://seen.test:{port}/r")]).code,
        0
    );
    // An access request from inside the sandbox (its record is an approval step).
    let ask = r#"{"host": "wanted.test", "port": 443, "reason": "ocsf"}"#;
    let out = curl(&[
        "-x",
        &px,
        "--data-binary",
        ask,
        "http://egress-proxy.local/v1/requests",
    ]);
    assert!(out.text().contains("pending"), "{}", out.text());
    // DNS: an answer and a refusal.
    let dns = proxy.dns.unwrap();
    assert!(dig(dns, &["api.test", "A"])
        .answers
        .iter()
        .any(|a| a.3 == "127.0.0.1"));
    dig(dns, &["other.test", "A"]);
    proxy.terminate();

    let text = std::fs::read_to_string(&audit).unwrap();
    // The chain holds over OCSF lines too.
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["audit", "verify"])
        .arg(&audit)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The records (run_start has no class; seq and chain are the trail's, not OCSF's).
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("class_uid").is_some())
        .map(|mut v| {
            let m = v.as_object_mut().unwrap();
            m.remove("seq");
            m.remove("chain");
            v
        })
        .collect();
    let errors = validate(&records);
    assert!(errors.is_empty(), "{errors}");

    let find = |pred: &dyn Fn(&serde_json::Value) -> bool| {
        records
            .iter()
            .find(|r| pred(r))
            .unwrap_or_else(|| panic!("no such record in {records:#?}"))
            .clone()
    };
    let allowed = find(&|r| {
        r["class_uid"] == 4001
            && r["dst_endpoint"]["hostname"] == "api.test"
            && r["activity_id"] == 2
    });
    assert_eq!(allowed["disposition_id"], 1);
    assert_eq!(allowed["device"]["name"], "agent");
    assert_eq!(allowed["firewall_rule"]["name"], format!("api.test:{port}"));
    assert_eq!(allowed["dst_endpoint"]["ip"], "127.0.0.1");
    assert!(allowed["traffic"]["bytes_in"].as_u64().unwrap() > 0);
    assert_eq!(allowed["type_uid"], 400102);
    let denied = find(&|r| r["dst_endpoint"]["hostname"] == "denied.test");
    assert_eq!(denied["disposition_id"], 2);
    assert_eq!(denied["activity_id"], 5);
    assert_eq!(denied["status_detail"], "no_rule_matched");
    let reported = find(&|r| r["dst_endpoint"]["hostname"] == "seen.test" && r["activity_id"] == 2);
    assert_eq!(reported["disposition_id"], 15);
    assert_eq!(reported["device"]["name"], "watcher");
    let answered = find(&|r| r["class_uid"] == 4003 && r["query"]["hostname"] == "api.test");
    assert_eq!(answered["rcode_id"], 0);
    assert_eq!(answered["answers"][0]["rdata"], "127.0.0.1");
    assert_eq!(answered["disposition_id"], 1);
    let asked = find(&|r| r["unmapped"]["approval"]["step"] == "requested");
    assert_eq!(asked["activity_id"], 99);
    assert_eq!(asked["dst_endpoint"]["hostname"], "wanted.test");
    assert_eq!(asked["unmapped"]["approval"]["text"], "ocsf");
    let refused = find(&|r| r["class_uid"] == 4003 && r["query"]["hostname"] == "other.test");
    assert_eq!(refused["disposition_id"], 2);
    assert_eq!(refused["rcode_id"], 3);
}

#[test]
fn the_schemas_refuse_what_ocsf_refuses() {
    // The validator is not a rubber stamp: a record without its required fields, with an
    // invented field, or of a class with no schema fails.
    let errors = validate(&[
        serde_json::json!({"class_uid": 4001, "category_uid": 4}),
        serde_json::json!({"class_uid": 4001, "category_uid": 4, "activity_id": 2, "type_uid": 400102,
            "severity_id": 1, "time": 1, "metadata": {"version": "1.8.0", "product": {"name": "x"}},
            "sandbox": "invented"}),
        serde_json::json!({"class_uid": 9999}),
    ]);
    assert!(
        errors.contains("record 0") && errors.contains("'activity_id' is a required property"),
        "{errors}"
    );
    assert!(
        errors.contains("record 1") && errors.contains("sandbox"),
        "{errors}"
    );
    assert!(errors.contains("record 2: class_uid 9999"), "{errors}");
}
