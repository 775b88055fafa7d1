//! Regression tests for the adversarial review (hardening issue): a sandboxed client trying to
//! rewrite its policy, lock out other sandboxes, reach the proxy itself, widen an allow rule,
//! guess tokens, read secrets through the admin API, keep a tunnel after its token was
//! rotated, or wedge the audit log — each with the real binary on loopback.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const ADMIN_TOKEN: &str = "hardening-admin-token";

/// `config` as `proxy.yaml` in `dir`, the audit file in `dir`, with the admin token when
/// `with_token`.
fn config(dir: &Path, with_token: bool, config: ProxyConfig) {
    let config = if with_token {
        std::fs::write(dir.join("admin.token"), ADMIN_TOKEN).unwrap();
        config.admin_token_file(&dir.join("admin.token"))
    } else {
        config
    };
    std::fs::write(
        dir.join("proxy.yaml"),
        config.yaml(&dir.join("audit.jsonl")),
    )
    .unwrap();
}

/// Sandbox `demo`: every loopback client, reaching `egress`.
fn demo(egress: &[&str]) -> ProxyConfig {
    let demo = egress
        .iter()
        .fold(SandboxSpec::new("demo").source("127.0.0.0/8"), |s, e| {
            s.allow(e)
        });
    ProxyConfig::new().sandbox(demo)
}

/// `host` on loopback, loopback let through the guard, and sandbox `id` (token `token`)
/// reaching it on any port.
fn on_loopback(host: &str, id: &str, token: &str) -> ProxyConfig {
    ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host(host, "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new(id)
                .token(token)
                .allow(&format!("{host}:*")),
        )
}

fn start(dir: &Path) -> Proxy {
    Proxy::start_with(dir.join("proxy.yaml"), dir.join("audit.jsonl"), &[])
}

fn binding(token: &str, extra: &str) -> String {
    format!(
        r#"{{"auth": {{"token_sha256": "{}"}}{extra}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["0.0.0.0/0:*"]}}}}}}"#,
        sha(token)
    )
}

/// A raw request on a fresh connection; the whole response.
fn exchange(p: &Proxy, request: &str) -> String {
    raw_exchange(p.proxy, request.as_bytes(), Duration::from_secs(10))
}

#[test]
fn without_an_admin_token_no_one_can_register_a_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), false, demo(&["example.com"]));
    let p = start(dir.path());
    let body = binding("pwn", r#", "sources": ["127.0.0.1/32"]"#);
    let (status, resp) = admin_req(p.admin, "PUT", "/v1/sandboxes/pwn", &body, None);
    assert_eq!(status, 403, "{resp}");
    assert!(resp.contains("admin_token_file"), "{resp}");
    assert_eq!(admin_req(p.admin, "POST", "/v1/reload", "", None).0, 403);
    assert_eq!(
        admin_req(p.admin, "DELETE", "/v1/sandboxes/demo", "", None).0,
        403
    );
    // Nothing changed: 127.0.0.1 is still `demo`, which may not reach the admin API.
    let resp = exchange(
        &p,
        &format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", p.admin.port()),
    );
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
}

#[test]
fn a_registration_may_not_claim_another_sandboxs_addresses() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), true, demo(&[]));
    let p = start(dir.path());
    for sources in [
        r#"["127.0.0.1/32"]"#,
        r#"["127.0.0.0/8"]"#,
        r#"["0.0.0.0/0"]"#,
    ] {
        let body = binding("pwn", &format!(r#", "sources": {sources}"#));
        let (status, resp) = admin_req(
            p.admin,
            "PUT",
            "/v1/sandboxes/pwn",
            &body,
            Some(ADMIN_TOKEN),
        );
        assert_eq!(status, 409, "{sources}: {resp}");
        assert!(resp.contains("sandbox demo"), "{resp}");
    }
    let body = binding("ok", r#", "sources": ["10.77.0.0/16"]"#);
    let (status, resp) = admin_req(p.admin, "PUT", "/v1/sandboxes/ok", &body, Some(ADMIN_TOKEN));
    assert_eq!(status, 201, "{resp}");
    let body = binding("ok2", r#", "sources": ["10.77.1.0/24"]"#);
    let (status, _) = admin_req(
        p.admin,
        "PUT",
        "/v1/sandboxes/ok2",
        &body,
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 409, "nested inside another registration's range");
}

#[test]
fn overlapping_sources_in_a_config_file_are_reported_with_the_rule_that_decides() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("p.yaml");
    let overlapping = ProxyConfig::new()
        .sandbox(SandboxSpec::new("wide").source("10.0.0.0/8"))
        .sandbox(SandboxSpec::new("narrow").source("10.1.0.0/16"));
    std::fs::write(&cfg, overlapping.yaml(&dir.path().join("audit.jsonl"))).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("warning: sources 10.1.0.0/16 of sandbox narrow lie inside 10.0.0.0/8 of sandbox wide: the longest prefix decides"),
        "{text}"
    );
}

#[test]
fn a_flood_of_silent_connections_does_not_lock_out_other_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    config(
        dir.path(),
        false,
        on_loopback("api.test", "other", "other-secret").raw("max_connections: 40"),
    );
    let p = start(dir.path());
    // 300 connections from 127.0.0.1 that never send a byte: more than max_connections, and
    // more than one address may hold unidentified (admission.unidentified_per_source: 256).
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(p.proxy).unwrap())
        .collect();
    // The flood is in place: the proxy has refused (and recorded) the ones over the limit.
    let refused = p.wait_record(|r| {
        r["reason"] == "connection_limit" && r["client"].as_str().unwrap().starts_with("127.0.0.1:")
    });
    // Another sandbox, from another address, is served every time.
    let url = format!("http://api.test:{}/", origin.addr.port());
    let px = format!("http://other:other-secret@{}", p.proxy);
    for i in 0..20 {
        let out = curl(&["--interface", "127.0.0.2", "-p", "-x", &px, &url]);
        assert_eq!(out.code, 0, "request {i}: {} {}", out.stderr, out.text());
        assert!(out.text().contains("hello from origin"));
    }
    // The flood was held to its own allowance, and the refused connections were recorded.
    assert_eq!(refused["close"], "limit");
    drop(silent);
}

#[test]
fn a_silent_connection_is_closed_after_first_byte_ms() {
    let dir = tempfile::tempdir().unwrap();
    config(
        dir.path(),
        false,
        demo(&[]).raw("admission: { first_byte_ms: 300 }"),
    );
    let p = start(dir.path());
    let started = Instant::now();
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the proxy closed without answering");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed only after {:?} (header_ms is 10 s)",
        started.elapsed()
    );
    let rec = p.wait_record(|r| r["detail"] == "nothing received within admission.first_byte_ms");
    assert_eq!(rec["close"], "idle");
}

#[test]
fn the_proxy_never_dials_itself_by_any_address() {
    let dir = tempfile::tempdir().unwrap();
    config(
        dir.path(),
        false,
        demo(&["0.0.0.0/8:*", "127.0.0.0/8:*", "[::/128]:*", "[::1]:*"]),
    );
    let p = start(dir.path());
    for port in [p.admin.port(), p.proxy.port()] {
        for host in [
            "0.0.0.0",
            "0.0.0.1",
            "[::]",
            "[::ffff:0.0.0.0]",
            "127.0.0.1",
            "127.0.0.2",
        ] {
            let resp = exchange(&p, &format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n"));
            assert!(
                resp.starts_with("HTTP/1.1 403") && resp.contains("proxy_loop"),
                "{host}:{port}: {resp}"
            );
        }
    }
}

#[test]
fn an_allow_rule_for_an_ipv4_address_does_not_allow_ipv6_addresses_embedding_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("p.yaml");
    let a = SandboxSpec::new("a").allow("8.8.8.8:443").deny("9.9.9.9");
    let config = ProxyConfig::new().sandbox(a);
    std::fs::write(&cfg, config.yaml(&dir.path().join("audit.jsonl"))).unwrap();
    let check = |target: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
            .args(["check", "--json", "--sandbox", "a", "--config"])
            .arg(&cfg)
            .arg(target)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            out.status.code().unwrap(),
            v["reason"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(check("8.8.8.8:443"), (0, "rule_matched".into()));
    assert_eq!(check("[::ffff:8.8.8.8]:443"), (0, "rule_matched".into()));
    for embedded in [
        "[2002:808:808::1]:443",          // 6to4
        "[64:ff9b::808:808]:443",         // NAT64
        "[2001:0:808:808::1]:443",        // Teredo server
        "[2001:0:1:2:0:0:f7f7:f7f7]:443", // Teredo client (obfuscated 8.8.8.8)
    ] {
        assert_eq!(check(embedded), (1, "no_rule_matched".into()), "{embedded}");
    }
    // Deny rules still match every embedded form.
    assert_eq!(check("[2002:909:909::1]:443"), (1, "denied_by_rule".into()));
}

#[test]
fn token_guessing_is_throttled_and_cannot_tell_ids_apart() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    config(
        dir.path(),
        false,
        on_loopback("api.test", "real", "real-secret")
            .raw("admission: { auth_failures_per_second_per_source: 0.01, auth_failure_burst: 5 }"),
    );
    let p = start(dir.path());
    let port = origin.addr.port();
    let attempt = |user: &str, pass: &str| {
        exchange(
            &p,
            &format!(
                "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
                basic(user, pass)
            ),
        )
    };
    // An unknown id and a wrong token get the same answer (all but the Date header).
    let without_date = |resp: String| {
        resp.split("\r\n")
            .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
            .collect::<Vec<_>>()
            .join("\r\n")
    };
    let unknown = without_date(attempt("ghost", "x"));
    let wrong = without_date(attempt("real", "x"));
    assert!(unknown.starts_with("HTTP/1.1 407"), "{unknown}");
    assert_eq!(unknown, wrong);
    // The audit keeps the difference.
    p.wait_record(|r| r["reason"] == "unknown_sandbox");
    p.wait_record(|r| r["reason"] == "auth_failed");
    // The burst of 5 failures is spent after 3 more; then 429 with Retry-After, even with
    // the right token, from this address.
    for _ in 0..3 {
        assert!(attempt("real", "nope").starts_with("HTTP/1.1 407"));
    }
    let blocked = attempt("real", "real-secret");
    assert!(blocked.starts_with("HTTP/1.1 429"), "{blocked}");
    assert!(
        blocked.to_ascii_lowercase().contains("retry-after: "),
        "{blocked}"
    );
    // Another address is not affected.
    let px = format!("http://real:real-secret@{}", p.proxy);
    let out = curl(&[
        "--interface",
        "127.0.0.3",
        "-p",
        "-x",
        &px,
        &format!("http://api.test:{port}/"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn runtime_bindings_cannot_name_the_proxys_files_or_grow_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    config(
        dir.path(),
        true,
        ProxyConfig::new().raw("runtime: { max_sandboxes: 2, max_binding_bytes: 4096 }"),
    );
    let p = start(dir.path());
    let put = |id: &str, body: &str| {
        admin_req(
            p.admin,
            "PUT",
            &format!("/v1/sandboxes/{id}"),
            body,
            Some(ADMIN_TOKEN),
        )
    };
    let policy = r#""policy": {"provider": "local", "config": {}}"#;
    let mut answers = Vec::new();
    for auth in [
        r#"{"token_file": "/etc/shadow"}"#,
        r#"{"token_file": "/no/such/file"}"#,
        r#"{"token_env": "HOME"}"#,
        r#"{"token_env": "NO_SUCH_VARIABLE_HERE"}"#,
    ] {
        let (status, resp) = put("x", &format!(r#"{{"auth": {auth}, {policy}}}"#));
        assert_eq!(status, 400, "{auth}: {resp}");
        assert!(resp.contains("`auth.token_sha256` only"), "{resp}");
        answers.push(resp);
    }
    // Whether the file or variable exists makes no difference to the answer.
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[2], answers[3]);
    let big = format!(
        r#"{{"policy": {{"provider": "local", "config": {{}}, "network": {{"egress": [{}]}}}}}}"#,
        (0..500)
            .map(|i| format!("\"h{i}.example.com\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert_eq!(put("big", &big).0, 413);
    assert_eq!(put("a", &binding("a", "")).0, 201);
    assert_eq!(put("b", &binding("b", "")).0, 201);
    let (status, resp) = put("c", &binding("c", ""));
    assert_eq!(status, 429, "{resp}");
    assert_eq!(
        put("a", &binding("a2", "")).0,
        200,
        "replacing stays possible"
    );
    // Bearer is case-insensitive.
    let mut s = TcpStream::connect(p.admin).unwrap();
    write!(s, "GET /v1/sandboxes HTTP/1.1\r\nHost: a\r\nConnection: close\r\nAuthorization: bearer {ADMIN_TOKEN}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[test]
fn rotating_a_token_ends_the_tunnels_opened_with_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let write = |token: &str| config(dir.path(), true, on_loopback("slow.test", "tok", token));
    write("old-token");
    let p = start(dir.path());
    let px = format!("http://tok:old-token@{}", p.proxy);
    let url = format!("http://slow.test:{}/slow", origin.addr.port());
    let client = std::thread::spawn(move || curl(&["-p", "-x", &px, &url]));
    p.wait_audit("open", |r| r["target_host"] == "slow.test");
    write("new-token");
    let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    let rec = p.wait_record(|r| r["target_host"] == "slow.test" && r["mode"] != "http");
    assert_eq!(rec["close"], "revoked", "{rec}");
    assert_ne!(client.join().unwrap().code, 0);
}

#[test]
fn a_stuck_audit_sink_bounds_memory_refuses_new_connections_and_lets_shutdown_finish() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("proxy.yaml");
    // The audit log on stdout, which the test never reads.
    let stuck = ProxyConfig::new()
        .audit("queue_max: 200")
        .defaults("timeouts", "{ shutdown_grace_ms: 1000 }");
    std::fs::write(&cfg, stuck.yaml(Path::new("-"))).unwrap();
    let mut p = Proxy::start_stdout_unread(cfg);
    // Fill the pipe (64 KiB) and then the queue with 407s.
    let mut refused = 0;
    for _ in 0..2000 {
        let resp = exchange(&p, "CONNECT x.test:443 HTTP/1.1\r\n\r\n");
        if resp.starts_with("HTTP/1.1 503") {
            refused += 1;
            if refused >= 20 {
                break;
            }
        }
    }
    assert!(refused >= 20, "the proxy never pushed back");
    let (_, metrics) = p.admin_get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("egress_audit_backpressure_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    let started = Instant::now();
    let status = p.terminate();
    // Records were lost (stdout takes nothing and there is nowhere to spill them): the exit
    // status says so (issue 59), after a bounded wait.
    assert!(!status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(
        p.stderr_text()
            .contains("audit records could not be written"),
        "{}",
        p.stderr_text()
    );
}

#[test]
fn a_forwarded_request_to_an_origin_that_never_answers_idles_out() {
    let dir = tempfile::tempdir().unwrap();
    // An origin that accepts and reads but never answers.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    let _held = std::thread::spawn(move || {
        let mut kept = Vec::new();
        for s in mute.incoming().flatten() {
            kept.push(s);
        }
    });
    config(
        dir.path(),
        false,
        demo(&["mute.test:*"])
            .dns_server("127.0.0.1:9")
            .host("mute.test", "127.0.0.1")
            .guard_allow("127.0.0.1/32")
            .defaults("timeouts", "{ idle_ms: 1000 }"),
    );
    let p = start(dir.path());
    let started = Instant::now();
    let out = curl(&[
        "-x",
        &format!("http://{}", p.proxy),
        &format!("http://mute.test:{port}/"),
    ]);
    assert_ne!(out.code, 0);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the request stayed open {:?} with idle_ms 1000",
        started.elapsed()
    );
    let rec = p.wait_record(|r| r["target_host"] == "mute.test");
    assert_eq!(rec["close"], "idle", "{rec}");
}

#[test]
fn a_forwarded_response_the_client_abandons_is_not_recorded_as_complete() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    config(
        dir.path(),
        false,
        demo(&["slow.test:*"])
            .dns_server("127.0.0.1:9")
            .host("slow.test", "127.0.0.1")
            .guard_allow("127.0.0.1/32"),
    );
    let p = start(dir.path());
    // /slow sends 1 KiB per 100 ms for a minute; the client gives up after a second.
    let out = curl(&[
        "--max-time",
        "1",
        "-x",
        &format!("http://{}", p.proxy),
        &format!("http://slow.test:{}/slow", origin.addr.port()),
    ]);
    assert_eq!(out.code, 28, "{}", out.stderr);
    let rec = p.wait_record(|r| r["target_host"] == "slow.test");
    assert_eq!(rec["close"], "error", "{rec}");
    assert_eq!(
        rec["detail"],
        "the client went away before the response ended"
    );
    assert!(
        rec["run"].as_str().is_some_and(|r| r.contains('-')),
        "{rec}"
    );
}

#[test]
fn a_closed_stderr_does_not_break_the_proxy() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), true, demo(&[]));
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["run", "--config"])
        .arg(dir.path().join("proxy.yaml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("\"listening\""))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&listening).unwrap();
    let admin: std::net::SocketAddr = v["fields"]["admin_addr"].as_str().unwrap().parse().unwrap();
    let proxy: std::net::SocketAddr = v["fields"]["proxy_addr"].as_str().unwrap().parse().unwrap();
    // Whoever read the proxy's log went away.
    drop(lines);
    for _ in 0..3 {
        let (status, body) = admin_req(admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
        assert_eq!(status, 200, "{body}");
        let resp = raw_exchange(
            proxy,
            b"CONNECT x.test:443 HTTP/1.1\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    }
    let _ = child.kill();
    let _ = child.wait();
}
