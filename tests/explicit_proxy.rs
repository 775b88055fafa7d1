//! The explicit proxy end to end: the real binary on 127.0.0.1:0, real curl, HTTPS and HTTP
//! origins on loopback with a test CA generated here.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

struct Env {
    _dir: tempfile::TempDir,
    ca: TestCa,
    https: Origin,
    http: Origin,
    proxy: Proxy,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let http = Origin::start(None);
    let hp = https.addr.port();
    let mut config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "500");
    for (name, ip) in [
        ("api.test", "127.0.0.1"),
        ("big.test", "127.0.0.1"),
        ("slow.test", "127.0.0.1"),
        ("plain.test", "127.0.0.1"),
        ("port.test", "127.0.0.1"),
        ("denied.test", "127.0.0.1"),
        ("other.test", "127.0.0.1"),
        ("private.test", "127.0.0.2"),
        ("meta.test", "169.254.169.254"),
        ("mixed.test", "127.0.0.2, 127.0.0.1"),
    ] {
        config = config.host(name, ip);
    }
    let mut tok = SandboxSpec::new("tok")
        .token("tok-secret")
        .deny("denied.test");
    for entry in [
        "api.test:*",
        "big.test:*",
        "slow.test:*",
        "plain.test:*",
        "private.test:*",
        "meta.test:*",
        "mixed.test:*",
        "port.test:1",
        "nowhere.test:*",
    ] {
        tok = tok.allow(entry);
    }
    let proxy = config
        .guard_allow("127.0.0.1/32")
        .defaults(
            "timeouts",
            "{ connect_ms: 2000, idle_ms: 30000, header_ms: 1000, shutdown_grace_ms: 1500 }",
        )
        .sandbox(tok)
        .sandbox(
            SandboxSpec::new("rep")
                .token("rep-secret")
                .report()
                .allow("api.test:1"),
        )
        .sandbox(
            SandboxSpec::new("ips")
                .token("ips-secret")
                .allow(&format!("127.0.0.1:{hp}")),
        )
        .sandbox(
            SandboxSpec::new("loop")
                .token("loop-secret")
                .allow("127.0.0.0/8:*"),
        )
        .start(dir.path());
    Env {
        _dir: dir,
        ca,
        https,
        http,
        proxy,
    }
}

impl Env {
    fn px(&self, user: &str, pass: &str) -> String {
        format!("http://{user}:{pass}@{}", self.proxy.proxy)
    }

    fn https_url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.https.addr.port())
    }

    fn http_url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.http.addr.port())
    }

    /// curl through the proxy as `tok`, printing the CONNECT status after the body.
    fn get(&self, user: &str, pass: &str, url: &str) -> CurlOut {
        let ca = self.ca.ca_pem.display().to_string();
        curl(&[
            "-x",
            &self.px(user, pass),
            "--cacert",
            &ca,
            "-w",
            "\n%{http_connect} %{http_code}",
            url,
        ])
    }

    /// A raw CONNECT: the proxy's full response (status line, headers, body).
    fn raw_connect(&self, authority: &str, auth: Option<&str>) -> String {
        let auth = auth
            .map(|a| format!("Proxy-Authorization: {a}\r\n"))
            .unwrap_or_default();
        raw_exchange(
            self.proxy.proxy,
            format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n").as_bytes(),
            Duration::from_secs(5),
        )
    }
}

fn last_line(out: &CurlOut) -> String {
    out.text().lines().last().unwrap_or("").to_string()
}

#[test]
fn https_allowed_and_denied_by_name_port_rule_and_guard() {
    let e = env();
    let ok = e.get("tok", "tok-secret", &e.https_url("api.test", "/hello"));
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(
        ok.text().starts_with("hello from origin /hello"),
        "{}",
        ok.text()
    );
    assert_eq!(last_line(&ok), "200 200");

    for (host, reason) in [
        ("other.test", "no_rule_matched"),
        ("denied.test", "denied_by_rule"),
        ("port.test", "port_not_allowed"),
        ("private.test", "destination_ip_prohibited"),
        ("meta.test", "destination_ip_prohibited"),
    ] {
        let out = e.get("tok", "tok-secret", &e.https_url(host, "/"));
        assert_ne!(out.code, 0, "{host} should be refused");
        assert!(last_line(&out).starts_with("403"), "{host}: {}", out.text());
        let rec = e.proxy.wait_record(|r| r["target_host"] == host);
        assert_eq!(rec["reason"], reason, "{host}");
        assert_eq!(rec["decision"], "deny");
        assert_eq!(rec["sandbox"], "tok");
        assert_eq!(rec["identity"], "token");
        assert!(
            rec["dialed"].is_null(),
            "{host} must never be dialled: {rec}"
        );
    }
    // A mixed answer dials only the permitted address.
    let out = e.get("tok", "tok-secret", &e.https_url("mixed.test", "/m"));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rec = e.proxy.wait_record(|r| r["target_host"] == "mixed.test");
    assert_eq!(rec["dialed"], format!("127.0.0.1:{}", e.https.addr.port()));
    assert_eq!(
        rec["resolved"],
        serde_json::json!(["127.0.0.2", "127.0.0.1"])
    );

    // The deny response says what, for whom, why, where to change it, and not to go around.
    let text = e.raw_connect("other.test:443", Some(&basic("tok", "tok-secret")));
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains(
            "proxy-status: egress-proxy; error=http_request_denied; details=\"no_rule_matched"
        ),
        "{text}"
    );
    assert!(text.contains("for sandbox tok"), "{text}");
    assert!(
        text.contains("not in network.egress of sandbox tok") && text.contains("proxy.yaml"),
        "{text}"
    );
    assert!(
        text.contains("Retrying without the proxy will not work"),
        "{text}"
    );
    let text = e.raw_connect("private.test:443", Some(&basic("tok", "tok-secret")));
    assert!(text.contains("error=destination_ip_prohibited"), "{text}");
}

#[test]
fn ip_literals_need_address_rules() {
    let e = env();
    let ok = e.get(
        "ips",
        "ips-secret",
        &format!("https://127.0.0.1:{}/ip", e.https.addr.port()),
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let refused = e.raw_connect(
        &format!("127.0.0.1:{}", e.http.addr.port()),
        Some(&basic("ips", "ips-secret")),
    );
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("port_not_allowed"), "{refused}");
    let refused = e.raw_connect("127.0.0.2:443", Some(&basic("ips", "ips-secret")));
    assert!(refused.contains("no_rule_matched"), "{refused}");
    // Name rules never allow an IP literal: `tok` allows api.test (127.0.0.1) by name only.
    let refused = e.raw_connect(
        &format!("127.0.0.1:{}", e.https.addr.port()),
        Some(&basic("tok", "tok-secret")),
    );
    assert!(refused.contains("no_rule_matched"), "{refused}");
    // A name with no name rule is allowed when every address it resolves to is covered.
    let ok = e.get(
        "ips",
        "ips-secret",
        &e.https_url("other.test", "/by-address"),
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "other.test" && r["sandbox"] == "ips");
    assert_eq!(rec["rule"], format!("127.0.0.1:{}", e.https.addr.port()));
}

#[test]
fn proxy_never_dials_itself() {
    let e = env();
    for port in [e.proxy.proxy.port(), e.proxy.admin.port()] {
        let text = e.raw_connect(
            &format!("127.0.0.1:{port}"),
            Some(&basic("loop", "loop-secret")),
        );
        assert!(text.starts_with("HTTP/1.1 403"), "{text}");
        assert!(text.contains("error=proxy_loop_detected"), "{text}");
    }
    let rec = e.proxy.wait_record(|r| r["reason"] == "proxy_loop");
    assert_eq!(rec["sandbox"], "loop");
}

#[test]
fn authentication_challenges() {
    let e = env();
    let ca = e.ca.ca_pem.display().to_string();
    let url = e.https_url("api.test", "/");
    let out = curl(&[
        "-x",
        &format!("http://{}", e.proxy.proxy),
        "--cacert",
        &ca,
        "-w",
        "%{http_connect}",
        &url,
    ]);
    assert_ne!(out.code, 0);
    assert_eq!(out.text(), "407");
    let text = e.raw_connect("api.test:443", None);
    assert!(text.starts_with("HTTP/1.1 407"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("proxy-authenticate: basic realm=\"egress-proxy\""),
        "{text}"
    );
    let out = e.get("tok", "wrong", &url);
    assert_ne!(out.code, 0);
    assert!(last_line(&out).starts_with("407"));
    let out = e.get("nosuch", "x", &url);
    assert!(last_line(&out).starts_with("407"));
    e.proxy
        .wait_record(|r| r["reason"] == "auth_required" && r["identity"] == "none");
    e.proxy
        .wait_record(|r| r["reason"] == "auth_failed" && r["identity"] == "token");
    let unknown = e.proxy.wait_record(|r| r["reason"] == "unknown_sandbox");
    assert!(
        unknown["sandbox"].is_null(),
        "an unauthenticated claim is not recorded as a sandbox"
    );
}

#[test]
fn report_mode_proceeds_and_records() {
    let e = env();
    let out = e.get("rep", "rep-secret", &e.https_url("api.test", "/r"));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rec = e.proxy.wait_record(|r| r["sandbox"] == "rep");
    assert_eq!(rec["decision"], "report");
    assert_eq!(rec["reason"], "port_not_allowed");
    // Report mode never relaxes the guard.
    let text = e.raw_connect("127.0.0.2:443", Some(&basic("rep", "rep-secret")));
    assert!(
        text.starts_with("HTTP/1.1 403") && text.contains("destination_ip_prohibited"),
        "{text}"
    );
}

#[test]
fn plain_http_forwarding() {
    let e = env();
    let out = e.get("tok", "tok-secret", &e.http_url("plain.test", "/echo?q=1"));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let body = out.text();
    assert!(
        body.starts_with("GET /echo?q=1 HTTP/1.1"),
        "origin-form upstream: {body}"
    );
    assert!(
        body.to_ascii_lowercase()
            .contains(&format!("host: plain.test:{}", e.http.addr.port())),
        "{body}"
    );
    assert!(
        !body.to_ascii_lowercase().contains("proxy-authorization"),
        "credentials forwarded: {body}"
    );
    assert!(
        !body.to_ascii_lowercase().contains("proxy-connection"),
        "{body}"
    );
    let out = e.get("tok", "tok-secret", &e.http_url("denied.test", "/"));
    assert!(last_line(&out).ends_with("403"), "{}", out.text());
    assert!(
        out.text().contains("denied by rule `denied.test`"),
        "{}",
        out.text()
    );
    let rec = e
        .proxy
        .wait_record(|r| r["mode"] == "http" && r["target_host"] == "plain.test");
    assert_eq!(rec["decision"], "allow");
    assert!(rec["bytes_down"].as_u64().unwrap() > 20, "{rec}");
    // An https:// URI in absolute form is refused with a hint to use CONNECT.
    let text = raw_exchange(
        e.proxy.proxy,
        format!(
            "GET https://api.test/ HTTP/1.1\r\nHost: api.test\r\nProxy-Authorization: {}\r\n\r\n",
            basic("tok", "tok-secret")
        )
        .as_bytes(),
        Duration::from_secs(5),
    );
    assert!(
        text.starts_with("HTTP/1.1 400") && text.contains("use CONNECT"),
        "{text}"
    );
}

#[test]
fn eight_mib_transfer_is_intact() {
    let e = env();
    let out = e.get("tok", "tok-secret", &e.https_url("big.test", "/big"));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let body = &out.stdout[..out.stdout.len() - "\n200 200".len()];
    assert_eq!(body.len(), BIG);
    assert!(
        body.iter().enumerate().all(|(i, b)| *b == big_byte(i)),
        "corrupted transfer"
    );
    let rec = e.proxy.wait_record(|r| r["target_host"] == "big.test");
    assert!(rec["bytes_down"].as_u64().unwrap() >= BIG as u64, "{rec}");
    assert_eq!(rec["close"], "eof");
    let open = e
        .proxy
        .audit_records()
        .into_iter()
        .find(|r| r["event"] == "open" && r["target_host"] == "big.test");
    assert!(open.is_some(), "tunnels get an open record");
}

#[test]
fn bad_input_gets_4xx_or_close_and_the_next_client_is_served() {
    let e = env();
    let auth = basic("tok", "tok-secret");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), "HTTP/1.1 400"),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03binary".to_vec(),
            "",
        ),
        (
            format!("CONNECT api.test HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n")
                .into_bytes(),
            "HTTP/1.1 400",
        ),
        (
            format!("CONNECT 127.1:443 HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n")
                .into_bytes(),
            "HTTP/1.1 400",
        ),
        (
            format!("CONNECT a@b.test:443 HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n")
                .into_bytes(),
            "HTTP/1.1 400",
        ),
        (
            format!(
                "CONNECT api.test:443 HTTP/1.1\r\nX-Long: {}\r\n\r\n",
                "a".repeat(100_000)
            )
            .into_bytes(),
            "HTTP/1.1 431",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
        (
            b"CONNECT api.test:443 HTTP/1.1\r\nX-Bin: \x01\x02\xff\r\n\r\n".to_vec(),
            "",
        ),
    ];
    for (bytes, want) in &cases {
        let text = raw_exchange(e.proxy.proxy, bytes, Duration::from_secs(5));
        assert!(
            text.starts_with(want),
            "for {:?}: {text:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(60)])
        );
    }
    // A client that stalls mid-header is cut off after header_ms (1 s here).
    let start = Instant::now();
    let text = raw_exchange(
        e.proxy.proxy,
        b"CONNECT api.test:443 HTTP/1.1\r\nX-Partial: ",
        Duration::from_secs(10),
    );
    assert!(
        start.elapsed() < Duration::from_secs(9),
        "stalled client was not cut off"
    );
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text:?}"
    );
    // A client that disconnects mid-tunnel.
    {
        let mut s = TcpStream::connect(e.proxy.proxy).unwrap();
        write!(
            s,
            "CONNECT api.test:{} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n",
            e.https.addr.port()
        )
        .unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        s.write_all(b"\x16\x03\x01 not really tls").unwrap();
    }
    // Neither a hello nor a head before the close: not read, so refused (no entry declares
    // opaque TCP), and recorded.
    e.proxy.wait_record(|r| {
        r["target_host"] == "api.test"
            && r["mode"] == "connect"
            && r["reason"] == "unrecognised_protocol"
    });
    // Every refusal was audited, and the proxy still serves.
    let invalid = e
        .proxy
        .audit_records()
        .iter()
        .filter(|r| r["reason"] == "invalid_target")
        .count();
    assert!(invalid >= 6, "refusals audited: {invalid}");
    let ok = e.get("tok", "tok-secret", &e.https_url("api.test", "/after"));
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

#[test]
fn dns_failure_fails_closed() {
    let e = env();
    let out = e.get("tok", "tok-secret", &e.https_url("nowhere.test", "/"));
    assert_ne!(out.code, 0);
    let status = last_line(&out);
    assert!(
        status.starts_with("502") || status.starts_with("504"),
        "{status}"
    );
    let rec = e.proxy.wait_record(|r| r["target_host"] == "nowhere.test");
    assert!(
        ["dns_error", "dns_timeout", "destination_not_found"]
            .contains(&rec["reason"].as_str().unwrap()),
        "{rec}"
    );
    assert_eq!(rec["decision"], "deny");
}

#[test]
fn audit_metrics_health_and_no_secrets() {
    let e = env();
    assert_eq!(e.proxy.admin_get("/healthz").0, 200);
    let (code, body) = e.proxy.admin_get("/readyz");
    assert_eq!(code, 200, "{body}");
    let before = e.proxy.admin_get("/metrics").1;
    assert!(before.contains("egress_policy_info{version="), "{before}");
    e.get("tok", "tok-secret", &e.https_url("api.test", "/a"));
    e.get("tok", "tok-secret", &e.https_url("other.test", "/b"));
    e.get("tok", "wrong-secret", &e.https_url("api.test", "/c"));
    e.proxy.wait_record(|r| r["reason"] == "auth_failed");
    e.proxy
        .wait_record(|r| r["target_host"] == "api.test" && r["decision"] == "allow");
    let metrics = e.proxy.admin_get("/metrics").1;
    for needle in [
        "egress_connections_total{decision=\"allow\",mode=\"connect\",reason=\"rule_matched\",sandbox=\"tok\"} 1",
        "egress_connections_total{decision=\"deny\",mode=\"connect\",reason=\"no_rule_matched\",sandbox=\"tok\"} 1",
        "egress_connections_total{decision=\"deny\",mode=\"connect\",reason=\"auth_failed\",sandbox=\"-\"} 1",
        "egress_bytes_total{direction=\"down\",sandbox=\"tok\"}",
        "egress_decision_seconds_count",
        "egress_dns_seconds_count",
        "egress_dial_seconds_count",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    assert!(
        !metrics.contains("api.test"),
        "destination hosts must not be labels"
    );
    let records = e.proxy.audit_records();
    let allowed = records
        .iter()
        .find(|r| r["event"] == "end" && r["decision"] == "allow")
        .unwrap();
    assert_eq!(allowed["rule"], "api.test:*");
    assert!(allowed["rule_source"]
        .as_str()
        .unwrap()
        .contains("sandbox tok: network.egress[0]"));
    assert_eq!(allowed["policy_version"].as_str().unwrap().len(), 12);
    assert!(allowed["duration_ms"].is_u64() && allowed["ts"].is_string());
    let ids: std::collections::HashSet<u64> = records
        .iter()
        .filter(|r| r["event"] == "end")
        .map(|r| r["conn_id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        records.iter().filter(|r| r["event"] == "end").count(),
        "one final record per connection"
    );
    let audit = std::fs::read_to_string(&e.proxy.audit).unwrap();
    let logs = e.proxy.stderr_text();
    for secret in [
        "tok-secret",
        "wrong-secret",
        &basic("tok", "tok-secret")[6..],
        &basic("tok", "wrong-secret")[6..],
    ] {
        assert!(!audit.contains(secret), "secret in audit");
        assert!(!logs.contains(secret), "secret in logs");
    }
}

#[test]
fn sigterm_drains_then_cuts_tunnels_and_flushes_the_audit() {
    let mut e = env();
    let ca = e.ca.ca_pem.display().to_string();
    let px = e.px("tok", "tok-secret");
    let url = e.https_url("slow.test", "/slow");
    let slow = std::thread::spawn(move || curl(&["-x", &px, "--cacert", &ca, &url]));
    e.proxy
        .wait_audit("open", |r| r["target_host"] == "slow.test");
    let start = Instant::now();
    let status = e.proxy.terminate();
    assert!(status.success(), "{status:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    let out = slow.join().unwrap();
    assert_ne!(out.code, 0, "the slow download was cut");
    let rec = e.proxy.wait_record(|r| r["target_host"] == "slow.test");
    assert_eq!(rec["close"], "shutdown");
    assert!(rec["bytes_down"].as_u64().unwrap() > 0);
}

/// A tunnel must never be sent another tunnel's bytes. The young relay reuses a worker's spare
/// chunk buffers (`relay::chunk`): tunnels that each move 12 KiB of one secret alternate with
/// tunnels that send one byte, on the same proxy, and every one-byte tunnel must get back its
/// own byte and nothing else. A buffer handed out with its last chunk still in it sends the
/// secret instead.
#[test]
fn a_tunnel_gets_back_its_own_bytes_never_an_earlier_tunnels() {
    let e = env();
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut r, mut w) = (s.try_clone().unwrap(), s);
                let _ = std::io::copy(&mut r, &mut w);
                let _ = w.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    let auth = basic("loop", "loop-secret");
    let open = || {
        let mut s = TcpStream::connect(e.proxy.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: {auth}\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).to_string();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    };
    let secret = vec![b'S'; 12 * 1024];
    for round in 0..16 {
        let mut big = open();
        big.write_all(&secret).unwrap();
        let mut back = vec![0u8; secret.len()];
        big.read_exact(&mut back).unwrap();
        assert_eq!(back, secret, "round {round}: the echo of the secret");
        drop(big);
        let mut small = open();
        small.write_all(b"x").unwrap();
        small.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        small.read_to_end(&mut got).unwrap();
        assert_eq!(
            got,
            b"x",
            "round {round}: a one-byte tunnel got {} bytes",
            got.len()
        );
    }
}
