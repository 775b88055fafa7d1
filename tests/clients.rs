//! What real clients see: the reason phrase of a refused CONNECT in the exception text of
//! Python's urllib and requests, the 400 for requests the proxy cannot parse (with
//! Proxy-Status and a body), deny bodies that keep the port and read well for origin-form
//! requests, and refusals that name the policy rather than the resolver.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;

fn proxy(dir: &std::path::Path, upstream: SocketAddr) -> Proxy {
    ProxyConfig::new()
        .dns_server(&upstream.to_string())
        .dns("timeout_ms", "1000")
        .dns("address_rule_zones", "[svc.test]")
        .host("denied.test", "127.0.0.1")
        .sandbox(
            SandboxSpec::new("agent1")
                .token("tok-agent1")
                .allow("allowed.test")
                .allow("10.0.0.0/8:5432"),
        )
        .start(dir)
}

/// What agent1 gets for `CONNECT denied.test:443`: the response head (and body).
fn refused_connect(p: &Proxy) -> String {
    let auth = basic("agent1", "tok-agent1");
    raw_exchange(
        p.proxy,
        format!("CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\nProxy-Authorization: {auth}\r\n\r\n")
            .as_bytes(),
        Duration::from_secs(5),
    )
}

/// Run a Python snippet with the proxy in `HTTPS_PROXY`; its stdout.
fn python(proxy: SocketAddr, code: &str) -> String {
    let url = format!("http://agent1:tok-agent1@{proxy}");
    let out = Command::new("python3")
        .args(["-c", code])
        .env("HTTPS_PROXY", &url)
        .env("https_proxy", &url)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn a_refused_connect_says_why_in_the_status_line_and_in_python_errors() {
    let dir = tempfile::tempdir().unwrap();
    let up = SlowDns::start(Duration::ZERO, &[]);
    let p = proxy(dir.path(), up.addr);
    let head = refused_connect(&p);
    let status = head.lines().next().unwrap_or("");
    assert!(
        status.starts_with("HTTP/1.1 403 egress-proxy [no_rule_matched]: refused denied.test:443: not in network.egress of sandbox agent1"),
        "{head}"
    );
    assert!(
        head.contains("proxy-status: egress-proxy; error=http_request_denied"),
        "{head}"
    );

    let urllib = python(
        p.proxy,
        "import urllib.request\ntry:\n urllib.request.urlopen('https://denied.test/', timeout=10)\nexcept Exception as e:\n print(repr(e))",
    );
    assert!(
        urllib.contains("not in network.egress of sandbox agent1"),
        "urllib: {urllib}"
    );
    let requests = python(
        p.proxy,
        "import requests\ntry:\n requests.get('https://denied.test/', timeout=10)\nexcept Exception as e:\n print(repr(e))",
    );
    assert!(
        requests.contains("not in network.egress of sandbox agent1"),
        "requests: {requests}"
    );
}

/// A reason far longer than a status line may be (the policy file sits deep in a long path:
/// over 400 bytes) is cut, but never loses its `[reason]` code (it comes first) nor where to
/// ask (the explanation is cut before it).
#[test]
fn a_400_byte_reason_keeps_its_code_in_the_status_line() {
    let top = tempfile::tempdir().unwrap();
    let deep = top
        .path()
        .join("policies-of-a-very-large-organisation-".repeat(5))
        .join("team-with-a-long-name-and-a-longer-subteam-".repeat(4));
    std::fs::create_dir_all(&deep).unwrap();
    let up = SlowDns::start(Duration::ZERO, &[]);
    let p = proxy(&deep, up.addr);
    let head = refused_connect(&p);
    let status = head.lines().next().unwrap_or("");
    // The whole reason, as the Proxy-Status header carries it, is over 400 bytes.
    let details = head
        .lines()
        .find(|l| l.starts_with("proxy-status:"))
        .unwrap_or_default();
    assert!(details.len() > 400, "{details}");
    assert!(
        status.starts_with("HTTP/1.1 403 egress-proxy [no_rule_matched]: refused denied.test:443"),
        "{status}"
    );
    assert!(
        status.len() <= "HTTP/1.1 403 ".len() + 240,
        "{}",
        status.len()
    );
    // Cut before where to ask, which survives whole.
    assert!(
        status.ends_with("... (ask: POST http://egress-proxy.local/v1/requests via HTTP_PROXY)"),
        "{status}"
    );
}

#[test]
fn unparseable_and_origin_form_requests_get_a_full_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let up = SlowDns::start(Duration::ZERO, &[]);
    let p = proxy(dir.path(), up.addr);
    // What httpx sends for http://[::1]:18082/: not a URI.
    let r = raw_exchange(
        p.proxy,
        b"GET http://::1:18082/ HTTP/1.1\r\nHost: [::1]:18082\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(
        r.starts_with("HTTP/1.1 400 egress-proxy [invalid_target]: refused"),
        "{r}"
    );
    assert!(
        r.contains("proxy-status: egress-proxy; error=http_request_error"),
        "{r}"
    );
    assert!(r.contains("IPv6 literals need brackets"), "{r}");
    // Not HTTP at all.
    let r = raw_exchange(
        p.proxy,
        b"\x16\x03\x01 junk\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    assert!(r.contains("proxy-status: "), "{r}");
    assert!(r.contains("not valid HTTP/1.1"), "{r}");
    // Each refusal has its record (the two connections may end in either order).
    for detail in ["not a valid URI", "not valid HTTP/1.1"] {
        p.wait_audit("end", |r| {
            r["mode"] == "http"
                && r["reason"] == "invalid_target"
                && r["detail"].as_str().is_some_and(|d| d.contains(detail))
        });
    }

    // Origin-form: says what was asked, not `?://?`.
    let r = raw_exchange(
        p.proxy,
        b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(r.contains("refused GET /status"), "{r}");
    assert!(!r.contains("?://?"), "{r}");
    // The port stays in the description; credentials in the URI never show.
    let auth = basic("agent1", "tok-agent1");
    let r = raw_exchange(
        p.proxy,
        format!("GET http://u:secret@denied.test:18080/x?q=1 HTTP/1.1\r\nHost: denied.test:18080\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    );
    assert!(r.contains("refused GET http://denied.test:18080/x"), "{r}");
    assert!(!r.contains("secret") && !r.contains("q=1"), "{r}");
}

#[test]
fn names_no_rule_allows_are_refused_by_policy_not_by_the_resolver() {
    let dir = tempfile::tempdir().unwrap();
    let up = SlowDns::start(Duration::ZERO, &[]);
    let p = proxy(dir.path(), up.addr);
    let auth = basic("agent1", "tok-agent1");
    let connect = |target: &str| {
        raw_exchange(
            p.proxy,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes(),
            Duration::from_secs(5),
        )
    };
    // No address rule allows port 9999: refused without a query.
    let r = connect("no-such-host.svc.test:9999");
    assert!(r.starts_with("HTTP/1.1 403 "), "{r}");
    assert!(r.contains("[no_rule_matched]"), "{r}");
    assert_eq!(up.queries.load(Ordering::SeqCst), 0);
    // An address rule allows 5432 in this zone: resolved, the name does not exist — still the
    // policy's refusal (403 no_rule_matched), not 502 destination_not_found.
    let r = connect("no-such-host.svc.test:5432");
    assert!(r.starts_with("HTTP/1.1 403 "), "{r}");
    assert!(r.contains("[no_rule_matched]"), "{r}");
    assert!(up.queries.load(Ordering::SeqCst) >= 1);
    // Unknown sandbox id: the answer of a wrong token, and the id is never echoed.
    let bad = basic("nobody-here", "x");
    let r = raw_exchange(
        p.proxy,
        format!("CONNECT allowed.test:443 HTTP/1.1\r\nProxy-Authorization: {bad}\r\n\r\n")
            .as_bytes(),
        Duration::from_secs(5),
    );
    assert!(r.starts_with("HTTP/1.1 407 "), "{r}");
    assert!(!r.contains("nobody-here"), "{r}");
}

/// An agent that asks for JSON (`Accept: application/json`) gets its refusal as an object it
/// can act on — reason, rule, host, port, sandbox, hint — for a forwarded request (curl) and
/// for a CONNECT; without it, the text refusal as before.
#[test]
fn a_refusal_is_json_for_a_client_that_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let up = SlowDns::start(Duration::ZERO, &[]);
    let p = proxy(dir.path(), up.addr);
    let px = format!("http://agent1:tok-agent1@{}", p.proxy);
    let out = curl(&[
        "-x",
        &px,
        "-H",
        "Accept: application/json",
        "http://denied.test:8080/x?secret=1",
    ]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.text()));
    assert_eq!(v["reason"], "no_rule_matched", "{v}");
    assert_eq!(
        (v["host"].as_str(), v["port"].as_u64()),
        (Some("denied.test"), Some(8080))
    );
    assert_eq!(v["sandbox"], "agent1");
    assert!(v["rule"].is_null(), "{v}");
    assert!(
        v["hint"].as_str().unwrap().contains("network.egress"),
        "{v}"
    );
    assert!(
        !out.text().contains("secret=1"),
        "the query is never echoed: {v}"
    );
    // A CONNECT that asks for JSON.
    let auth = basic("agent1", "tok-agent1");
    let head = raw_exchange(
        p.proxy,
        format!("CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\nAccept: application/json\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    );
    assert!(
        head.starts_with("HTTP/1.1 403 egress-proxy [no_rule_matched]"),
        "{head}"
    );
    let body = head.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {head}"));
    assert_eq!(
        (v["host"].as_str(), v["port"].as_u64()),
        (Some("denied.test"), Some(443))
    );
    // Without Accept: the text body.
    let out = curl(&["-x", &px, "http://denied.test:8080/"]);
    assert!(
        out.text()
            .starts_with("egress-proxy refused GET http://denied.test:8080/"),
        "{}",
        out.text()
    );
}
