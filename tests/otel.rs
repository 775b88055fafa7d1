//! OpenTelemetry export through the real binary (issue 45): an OTLP receiver built on the
//! official protobuf definitions (PyPI `opentelemetry-proto`, `grpcio` for gRPC;
//! `tests/data/otlp_receiver.py`) receives the audit records as logs — grouped per sandbox with
//! `sandbox.id` and `service.name` resource attributes — and the usage counters as metrics, over
//! gRPC and over OTLP/HTTP, with the headers of `headers_file`. A collector that is down or
//! never answers costs the exchanges nothing: they are all served, and the lost exports are
//! counted.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use common::*;

const SECRET: &str = "otel-s3cret-token";

fn config(dir: &Path, endpoint: &str, protocol: &str) -> ProxyConfig {
    std::fs::write(
        dir.join("otel.headers"),
        format!("# the collector's token\nAuthorization: Bearer {SECRET}\nX-Tenant: acme\n"),
    )
    .unwrap();
    ProxyConfig::new()
        .raw(&format!(
            "otel: {{ endpoint: \"{endpoint}\", protocol: {protocol}, headers_file: otel.headers, interval_ms: 300, timeout_ms: 1000, service_name: egress-test }}"
        ))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(SandboxSpec::new("a").token("a-secret").allow("api.test:*"))
        .sandbox(SandboxSpec::new("b").token("b-secret").allow("other.test:*"))
}

fn get(proxy: &Proxy, user: &str, port: u16, path: &str) -> CurlOut {
    let via = format!("http://{user}:{user}-secret@{}", proxy.proxy);
    let url = format!("http://api.test:{port}{path}");
    curl(&["-o", "/dev/null", "-w", "%{http_code}", "-x", &via, &url])
}

fn received(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn exports_reach_the_receiver(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("received.jsonl");
    let receiver = ScriptOrigin::start("otlp_receiver.py", &[protocol.as_ref(), out.as_os_str()]);
    let origin = Origin::start(None);
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let proxy = config(dir.path(), &endpoint, protocol).start(dir.path());
    for path in ["/one", "/two"] {
        assert_eq!(get(&proxy, "a", origin.addr.port(), path).text(), "200");
    }
    assert_eq!(get(&proxy, "b", origin.addr.port(), "/no").text(), "403");

    let logs = eventually(Duration::from_secs(15), "logs of a and b", || {
        let got: Vec<_> = received(&out)
            .into_iter()
            .filter(|e| e["signal"] == "logs")
            .collect();
        let of = |id: &str| got.iter().any(|e| e["resource"]["sandbox.id"] == id);
        (of("a") && of("b")).then_some(got)
    });
    for e in &logs {
        assert_eq!(e["resource"]["service.name"], "egress-test", "{e}");
        let id = e["resource"]["sandbox.id"].as_str().unwrap();
        for r in e["records"].as_array().unwrap() {
            assert_eq!(r["attributes"]["sandbox.id"], id, "{r}");
            // The body is the audit record itself.
            let rec: serde_json::Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
            assert_eq!(rec["sandbox"], id);
        }
    }
    let denied = logs
        .iter()
        .flat_map(|e| e["records"].as_array().unwrap().iter())
        .find(|r| r["attributes"]["sandbox.id"] == "b" && r["attributes"]["egress.event"] == "end")
        .expect("b's refusal");
    assert_eq!(denied["attributes"]["egress.decision"], "deny");
    assert_eq!(denied["attributes"]["egress.reason"], "no_rule_matched");
    assert_eq!(denied["severity"], "WARN");

    let point = eventually(Duration::from_secs(15), "a's request counter", || {
        received(&out)
            .into_iter()
            .filter(|e| e["signal"] == "metrics")
            .flat_map(|e| {
                assert_eq!(e["resource"]["service.name"], "egress-test");
                e["points"].as_array().cloned().unwrap_or_default()
            })
            .find(|p| {
                p["name"] == "egress.requests"
                    && p["attributes"]["sandbox.id"] == "a"
                    && p["attributes"]["egress.decision"] == "allow"
                    && p["value"] == 2
            })
    });
    assert_eq!(point["value"], 2);
    // The headers file's headers reach the collector; its token is never logged.
    assert!(received(&out)
        .iter()
        .any(|e| e["signal"] == "header" && e["x-tenant"] == "acme"));
    assert!(!received(&out).iter().any(|e| e["signal"] == "invalid"));
    assert!(!proxy.stderr_text().contains(SECRET));
    let (_, metrics) = proxy.admin_get("/metrics");
    assert!(
        metrics.contains("egress_otel_records_total{outcome=\"exported\"}"),
        "{metrics}"
    );
    drop(receiver);
}

#[test]
fn records_and_counters_reach_an_otlp_receiver_over_grpc() {
    exports_reach_the_receiver("grpc");
}

#[test]
fn records_and_counters_reach_an_otlp_receiver_over_http() {
    exports_reach_the_receiver("http");
}

#[test]
fn a_collector_that_is_down_or_silent_costs_the_exchanges_nothing() {
    for down in ["refusing", "silent"] {
        let dir = tempfile::tempdir().unwrap();
        let origin = Origin::start(None);
        // Refusing: a port nobody listens on. Silent: accepts and never answers.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let refusing = ClosedPort::new();
        let port = match down {
            "refusing" => refusing.port(),
            _ => silent.local_addr().unwrap().port(),
        };
        let endpoint = format!("http://127.0.0.1:{port}");
        let proxy = config(dir.path(), &endpoint, "grpc").start(dir.path());
        for i in 0..40 {
            let out = get(&proxy, "a", origin.addr.port(), &format!("/{i}"));
            assert_eq!(out.text(), "200", "{down}: {}", out.stderr);
        }
        // Every exchange has its record in the audit trail, and the lost exports are counted.
        eventually(Duration::from_secs(10), "40 end records", || {
            let n = proxy
                .audit_records()
                .iter()
                .filter(|r| r["event"] == "end" && r["sandbox"] == "a")
                .count();
            (n >= 40).then_some(())
        });
        eventually(Duration::from_secs(15), "failed exports counted", || {
            let (_, m) = proxy.admin_get("/metrics");
            m.lines()
                .find(|l| l.starts_with("egress_otel_records_total{outcome=\"failed\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .filter(|n| *n >= 1.0)
        });
        assert!(!proxy.stderr_text().contains(SECRET));
    }
}

/// Clients review F9: a dead collector was only counted. Its failure is logged — one WARN when
/// exports start failing (not one per batch), with the endpoint and the error — and one INFO
/// when a collector answers on the endpoint again; the collector's token never.
#[test]
fn a_dead_collector_is_logged_once_and_its_recovery_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("received.jsonl");
    let origin = Origin::start(None);
    let first = ScriptOrigin::start("otlp_receiver.py", &["http".as_ref(), out.as_os_str()]);
    let port = first.port;
    let endpoint = format!("http://127.0.0.1:{port}");
    let proxy = config(dir.path(), &endpoint, "http").start(dir.path());
    assert_eq!(get(&proxy, "a", origin.addr.port(), "/up").text(), "200");
    eventually(Duration::from_secs(15), "the first export", || {
        (!received(&out).is_empty()).then_some(())
    });
    drop(first);
    let failing = "OTLP log export is failing";
    let every = Duration::from_millis(200);
    eventually_every(every, Duration::from_secs(20), "the failure logged", || {
        assert_eq!(get(&proxy, "a", origin.addr.port(), "/down").text(), "200");
        proxy.stderr_text().contains(failing).then_some(())
    });
    // More failing batches, still one warning (the next is due after 60 s at the earliest).
    let failed = "egress_otel_records_total{outcome=\"failed\"}";
    for _ in 0..5 {
        let before = proxy.metric(failed).unwrap_or(0.0);
        get(&proxy, "a", origin.addr.port(), "/down");
        eventually(Duration::from_secs(10), "the batch to fail", || {
            (proxy.metric(failed)? > before).then_some(())
        });
    }
    let log = proxy.stderr_text();
    assert_eq!(log.matches(failing).count(), 1, "{log}");
    assert!(log.contains(&endpoint), "{log}");
    // Back on the same port. The dead one's port is free for anyone meanwhile, and under a
    // loaded run another test's socket can hold it for a moment: the collector tries again.
    let port_arg = port.to_string();
    let _second = eventually(
        Duration::from_secs(20),
        "the collector back on its port",
        || {
            ScriptOrigin::try_start(
                "otlp_receiver.py",
                &["http".as_ref(), out.as_os_str(), port_arg.as_ref()],
            )
        },
    );
    eventually_every(
        every,
        Duration::from_secs(45),
        "the recovery logged",
        || {
            get(&proxy, "a", origin.addr.port(), "/again");
            proxy
                .stderr_text()
                .contains("OTLP log export recovered")
                .then_some(())
        },
    );
    assert!(!proxy.stderr_text().contains(SECRET));
}
