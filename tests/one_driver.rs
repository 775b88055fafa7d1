//! One driver for every HTTP request (issue 89, first part), through the real binary, real
//! curl and local origins: the DLP phase reads plain HTTP inside CONNECT and SOCKS5 tunnels to
//! hosts without `network.http` rules (security review 7a B6: the key reached the origin in
//! the URL, a header and the body), and such a tunnel's pipelined requests each get a record
//! naming their method and path (W5); a request the rules refuse spends no quota on the
//! forwarded path or the terminated one; a forwarded MCP call is refused with its reason (its
//! answer is filtered only inside a tunnel); forwarded records name method, path and status,
//! so `simulate` replays them (7b S02).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;

/// An AWS access key id the DLP rule below looks for.
const KEY: &str = "AKIAQWERTYUIOPASDFGH";

/// Sandbox `dev` (token `dev-secret`) with a DLP rule for AWS keys, reaching `other.test` on
/// the origin's port, which no `network.http` rule names; no `tls_intercept`: plain HTTP is
/// read without an interception CA. The explicit, admin and SOCKS5 listeners.
fn dlp_proxy(dir: &Path, port: u16) -> Proxy {
    sandbox_proxy(dir, port, |dev| dev.entry("dlp", DLP))
}

/// The DLP block of `dlp_proxy` and `table_proxy`: AWS access key ids.
const DLP: &str = r#"{ rules: [{ name: aws_key, pattern: "AKIA[0-9A-Z]{16}" }] }"#;

/// A proxy with one sandbox `dev` (token `dev-secret`) reaching `other.test:port`, as `dev`
/// makes it; the explicit, admin and SOCKS5 listeners.
fn sandbox_proxy(dir: &Path, port: u16, dev: fn(SandboxSpec) -> SandboxSpec) -> Proxy {
    ProxyConfig::new()
        .socks5()
        .dns_server("127.0.0.1:9")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(dev(SandboxSpec::new("dev")
            .token("dev-secret")
            .allow(&format!("other.test:{port}"))))
        .start(dir)
}

fn text(o: &CurlOut) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), o.stderr)
}

/// Security review 7a B6: a key in the URL, a header or the body of plain HTTP inside a CONNECT
/// tunnel (`curl -p`) or a SOCKS5 connection to a host without rules reached the origin,
/// while the same request forwarded was refused. Each is refused now on all three paths, the
/// origin gets none of the bodies, and the same request without the key passes.
#[test]
fn dlp_reads_plain_http_in_connect_and_socks5_tunnels_to_hosts_without_rules() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let p = dlp_proxy(dir.path(), port);
    let http_proxy = format!("http://dev:dev-secret@{}", p.proxy);
    let socks = format!(
        "socks5h://dev:dev-secret@{}",
        p.socks5.expect("listen.socks5 is bound")
    );
    let upload = format!("http://other.test:{port}/upload");
    let query = format!("{upload}?k={KEY}");
    let header = format!("X-Key: {KEY}");
    let body = format!("k={KEY}");
    let paths: [(&str, Vec<&str>); 3] = [
        ("forwarded", vec!["-x", &http_proxy]),
        ("connect", vec!["-p", "-x", &http_proxy]),
        ("socks5", vec!["-x", &socks]),
    ];
    for (path, via) in &paths {
        let cases: [(&str, &str, Vec<&str>); 3] = [
            ("url", &query, vec!["--data-binary", "x"]),
            ("header", &upload, vec!["-H", &header, "--data-binary", "x"]),
            ("body", &upload, vec!["--data-binary", &body]),
        ];
        for (what, url, extra) in cases {
            let mut args = via.clone();
            args.extend(["-s", "-i"]);
            args.extend(extra);
            args.push(url);
            let out = curl(&args);
            assert!(
                text(&out).contains("dlp_blocked"),
                "{path} {what}: {}",
                text(&out)
            );
        }
        assert_eq!(
            origin.received.load(Ordering::SeqCst),
            0,
            "{path}: a refused body reached the origin"
        );
        let mut args = via.clone();
        args.extend(["-s", "--data-binary", "nothing", &upload]);
        let out = curl(&args);
        assert!(text(&out).contains("received 7"), "{path}: {}", text(&out));
        origin.received.store(0, Ordering::SeqCst);
    }
    // Every refusal is a request's record naming the rule: the three forwarded and the six
    // tunnelled ones.
    eventually(Duration::from_secs(10), "nine refusals recorded", || {
        let n = p
            .audit_records()
            .iter()
            .filter(|r| r["reason"] == "dlp_blocked")
            .count();
        (n >= 9).then_some(())
    });
    for rec in p.audit_records() {
        if rec["reason"] == "dlp_blocked" {
            assert_eq!(rec["mode"], "http", "{rec}");
            assert_eq!(rec["dlp"], "aws_key", "{rec}");
            assert_eq!(rec["method"], "POST", "{rec}");
            assert_eq!(rec["path"], "/upload", "{rec}");
        }
    }
}

/// Security review 7a W5 and issue 89: on a host without rules, plain HTTP in a tunnel was one
/// record per connection, naming no method or path. Two requests pipelined in one CONNECT
/// tunnel give two request records, each with its method, path (no query), status and bytes;
/// the connection keeps its own record — for a sandbox whose requests are read (`dlp`: served
/// by the exchange) and for one without (relayed by the checked relay).
#[test]
fn two_pipelined_requests_in_a_tunnel_give_two_request_records() {
    for dlp in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let port = keepalive_origin("127.0.0.1");
        let p = match dlp {
            true => dlp_proxy(dir.path(), port),
            false => sandbox_proxy(dir.path(), port, |dev| dev),
        };
        let mut s = TcpStream::connect(p.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let target = format!("other.test:{port}");
        connect_on(&mut s, &target, Some(&basic("dev", "dev-secret")));
        // Both requests in one write: the second is on its way before the first is answered.
        let one = format!("GET /one HTTP/1.1\r\nHost: {target}\r\n\r\n");
        let two = format!("DELETE /two?x=1 HTTP/1.1\r\nHost: {target}\r\n\r\n");
        s.write_all(format!("{one}{two}").as_bytes()).unwrap();
        let mut got = String::new();
        let mut buf = [0u8; 4096];
        while !got.contains("hello from origin /two?x=1\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        assert!(got.contains("hello from origin /one"), "dlp={dlp}: {got}");
        assert!(
            got.contains("hello from origin /two?x=1"),
            "dlp={dlp}: {got}"
        );
        drop(s);
        let requests = || {
            p.audit_records()
                .into_iter()
                .filter(|r| r["sandbox"] == "dev" && r["mode"] == "http" && r["event"] == "end")
                .collect::<Vec<_>>()
        };
        eventually(Duration::from_secs(10), "two request records", || {
            (requests().len() >= 2).then_some(())
        });
        let recs = requests();
        let named: Vec<(String, String, u64)> = recs
            .iter()
            .map(|r| {
                (
                    r["method"].as_str().unwrap_or("-").to_string(),
                    r["path"].as_str().unwrap_or("-").to_string(),
                    r["status"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                ("GET".to_string(), "/one".to_string(), 200),
                ("DELETE".to_string(), "/two".to_string(), 200)
            ],
            "dlp={dlp}: {recs:?}"
        );
        if !dlp {
            // Each request's own bytes: its head up, its answer down.
            let answer = |path: &str| {
                let body = format!("hello from origin {path}\n");
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .len()
            };
            let bytes: Vec<(u64, u64)> = recs
                .iter()
                .map(|r| {
                    (
                        r["bytes_up"].as_u64().unwrap(),
                        r["bytes_down"].as_u64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                bytes,
                [
                    (one.len() as u64, answer("/one") as u64),
                    (two.len() as u64, answer("/two?x=1") as u64)
                ],
                "{recs:?}"
            );
        }
        p.wait_record(|r| r["sandbox"] == "dev" && r["mode"] == "connect" && r["event"] == "end");
    }
}

/// A proxy terminating `api.test` (and judging `mcp.test`) for sandbox `dev` with
/// `requests_per_day: 2` and these `http` rules.
fn judged_proxy(dir: &Path, ca: &TestCa, ports: (u16, u16), http: &str) -> Proxy {
    ca_init(&dir.join("ica"));
    std::fs::create_dir_all(dir.join("state")).unwrap();
    judged_config(dir, ca, ports, http).start(dir)
}

/// The configuration of [`judged_proxy`].
fn judged_config(dir: &Path, ca: &TestCa, ports: (u16, u16), http: &str) -> ProxyConfig {
    ProxyConfig::new()
        .raw(&format!("state_dir: {}", dir.join("state").display()))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("mcp.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .sandbox(
            SandboxSpec::new("dev")
                .token("dev-secret")
                .limits("{ requests_per_day: 2 }")
                .allow(&format!("api.test:{}", ports.0))
                .allow(&format!("mcp.test:{}", ports.1))
                .network("http", http),
        )
}

fn quota_spent(p: &Proxy) -> serde_json::Value {
    let (status, body) = p.admin_get("/v1/usage?sandbox=dev");
    assert_eq!(status, 200, "{body}");
    let u: serde_json::Value = serde_json::from_str(&body).unwrap();
    u["quotas"][0]["requests"].clone()
}

/// Forwarded, the quota unit was reserved before the rules: three requests `network.http`
/// refused spent `requests_per_day: 2`, and the allowed request after them got 429. The
/// rules come first now: the refused ones spend nothing and both allowed ones are served.
#[test]
fn a_forwarded_request_the_rules_refuse_spends_no_quota() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let rule = r#"[{ host: api.test, methods: [GET], paths: ["/ok/**"] }]"#;
    let p = judged_proxy(dir.path(), &ca, (port, 9), rule);
    let via = format!("http://dev:dev-secret@{}", p.proxy);
    let code = |path: &str| {
        let url = format!("http://api.test:{port}{path}");
        http_code(&["-x", &via, &url])
    };
    for _ in 0..3 {
        assert_eq!(code("/denied"), "403");
    }
    assert_eq!(quota_spent(&p), 0);
    assert_eq!(code("/ok/a"), "200");
    assert_eq!(code("/ok/b"), "200");
    assert_eq!(code("/ok/c"), "429", "the quota still holds");
    assert_eq!(quota_spent(&p), 2);
}

/// On a terminated host the unit was reserved after the head rules but before the body was
/// judged: JSON-RPC calls the rule refuses spent the quota. They spend nothing now.
#[test]
fn a_terminated_request_its_body_rule_refuses_spends_no_quota() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let rule = r#"[{ host: api.test, paths: [/upload], protocol: jsonrpc, methods: [eth_call] }]"#;
    let p = judged_proxy(dir.path(), &ca, (port, 9), rule);
    let via = format!("http://dev:dev-secret@{}", p.proxy);
    let ica = dir.path().join("ica/ca.crt").display().to_string();
    let url = format!("https://api.test:{port}/upload");
    let call = |method: &str| {
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":[]}}"#);
        let out = curl(&[
            "-s",
            "-x",
            &via,
            "--cacert",
            &ica,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &body,
            &url,
        ]);
        text(&out)
    };
    for _ in 0..3 {
        let out = call("eth_sendTransaction");
        assert!(out.contains("jsonrpc_not_allowed"), "{out}");
    }
    assert_eq!(quota_spent(&p), 0);
    assert!(call("eth_call").contains("received"));
    assert!(call("eth_call").contains("received"));
    let third = call("eth_call");
    // Refused at the CONNECT already: the quota is spent.
    assert!(third.contains("429"), "the quota still holds: {third}");
    assert_eq!(quota_spent(&p), 2);
}

/// `docs/protocols.md` says an MCP host's answers are filtered both ways, but a forwarded
/// `tools/list` went out and its answer came back unfiltered. A forwarded MCP call is now
/// refused with its reason, before anything reaches the origin (inside a tunnel it is served
/// and filtered).
#[test]
fn a_forwarded_mcp_call_is_refused_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let rule = r#"[{ host: mcp.test, paths: [/upload], protocol: mcp, tools: [search] }]"#;
    let p = judged_proxy(dir.path(), &ca, (9, port), rule);
    let via = format!("http://dev:dev-secret@{}", p.proxy);
    let url = format!("http://mcp.test:{port}/upload");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let out = curl(&[
        "-s",
        "-i",
        "-x",
        &via,
        "-H",
        "Content-Type: application/json",
        "-H",
        "Accept: application/json, text/event-stream",
        "--data-binary",
        body,
        &url,
    ]);
    let out = text(&out);
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("mcp_not_allowed"), "{out}");
    assert!(out.contains("only inside a tunnel"), "{out}");
    assert_eq!(origin.received.load(Ordering::SeqCst), 0);
    let rec = p.wait_record(|r| r["reason"] == "mcp_not_allowed");
    assert_eq!(rec["call"], "mcp tools/list", "{rec}");
    assert_eq!(rec["status"], 403, "{rec}");
}

/// Security review 7b S02: forwarded records on hosts without `network.http` rules named no
/// method or path, so `simulate` answered "cannot tell" for a candidate that adds rules to
/// the host. They name method, path and status now, and the replay judges them.
#[test]
fn forwarded_records_name_method_path_and_status_and_simulate_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(None);
    let port = origin.addr.port();
    // No rule names api.test yet.
    let rule = r#"[{ host: mcp.test, methods: [GET], paths: ["/**"] }]"#;
    let p = judged_proxy(dir.path(), &ca, (port, 9), rule);
    let via = format!("http://dev:dev-secret@{}", p.proxy);
    for path in ["/v1/read", "/v2/write"] {
        let url = format!("http://api.test:{port}{path}");
        let out = curl(&["-s", "-x", &via, &url]);
        assert!(out.text().contains("hello from origin"), "{}", text(&out));
    }
    let rec = p.wait_record(|r| r["mode"] == "http" && r["path"] == "/v2/write");
    assert_eq!(rec["method"], "GET", "{rec}");
    assert_eq!(rec["status"], 200, "{rec}");
    // The candidate allows only /v1/** on api.test.
    let candidate = judged_config(
        dir.path(),
        &ca,
        (port, 9),
        r#"[{ host: api.test, methods: [GET], paths: ["/v1/**"] }]"#,
    );
    let file = dir.path().join("candidate.yaml");
    std::fs::write(&file, candidate.yaml(&p.audit)).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["simulate", "--json", "--sandbox", "dev", "--config"])
        .arg(&file)
        .arg(&p.audit)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&cli.stdout),
            String::from_utf8_lossy(&cli.stderr)
        )
    });
    assert!(
        report["cannot_tell"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "{report:#}"
    );
    let refused = report["newly_refused"].as_object().unwrap();
    assert_eq!(refused.len(), 1, "{report:#}");
    let (_, entry) = refused.iter().next().unwrap();
    assert_eq!(entry["count"], 1, "{report:#}");
    assert!(
        entry["examples"][0]
            .as_str()
            .unwrap()
            .contains("GET /v2/write"),
        "{report:#}"
    );
}

/// An origin that answers every request head with `answer` and keeps every byte it was sent
/// (over all connections) in the returned buffer.
fn switching_origin(answer: &'static str) -> (u16, Kept) {
    origin_answering_after(1, answer)
}

/// What an origin got, and how many of its connections ended (a positive marker: nothing
/// more can arrive on a connection once it has).
type Kept = std::sync::Arc<(std::sync::Mutex<Vec<u8>>, std::sync::atomic::AtomicUsize)>;

/// An origin that keeps every byte it gets and writes `answer` once it has seen `ends` blank
/// lines (`\r\n\r\n`): 1 answers after the head, 2 after a chunked body's trailer.
fn origin_answering_after(ends: usize, answer: &'static str) -> (u16, Kept) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got: Kept = Default::default();
    let kept = got.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let _ended = Ended(&kept.1);
                let mut buf = [0u8; 4096];
                let mut answered = false;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut all = kept.0.lock().unwrap();
                    all.extend_from_slice(&buf[..n]);
                    if !answered && all.windows(4).filter(|w| w == b"\r\n\r\n").count() >= ends {
                        answered = true;
                        drop(all);
                        let _ = s.write_all(answer.as_bytes());
                    }
                }
            });
        }
    });
    (port, got)
}

/// Counts a connection as ended when its thread is done with it, however it left.
struct Ended<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What a sandbox with `dlp:` sends after asking to switch protocols is not relayed unread:
/// an `Upgrade: websocket` (no `protocol: websocket` rule allows one) loses its `Upgrade`, and
/// neither it nor a `CONNECT` inside the tunnel lets bytes past the DLP phase — the key the
/// client sends after the origin's `101` or `200` never reaches the origin. On the old relay
/// (`http_checked`) both switched and everything after was relayed as it came.
#[test]
fn a_switch_inside_a_read_tunnel_carries_nothing_unread() {
    let cases = [
        (
            "upgrade",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: {t}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        ),
        (
            "connect",
            "HTTP/1.1 200 Connection established\r\n\r\n",
            "CONNECT inner.test:80 HTTP/1.1\r\nHost: {t}\r\n\r\n",
        ),
    ];
    for (what, answer, request) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (port, got) = switching_origin(answer);
        let p = dlp_proxy(dir.path(), port);
        let mut s = TcpStream::connect(p.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let target = format!("other.test:{port}");
        connect_on(&mut s, &target, Some(&basic("dev", "dev-secret")));
        s.write_all(request.replace("{t}", &target).as_bytes())
            .unwrap();
        // Whatever came back, the sandbox now sends the key as if the switch had happened.
        let mut answered = [0u8; 512];
        let _ = s.read(&mut answered);
        let _ = s.write_all(format!("k={KEY}\r\n\r\n").as_bytes());
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        // The proxy's connection to the origin ends after whatever it relayed.
        eventually(
            Duration::from_secs(10),
            "the origin's connection ended",
            || (got.1.load(Ordering::SeqCst) > 0).then_some(()),
        );
        let seen = String::from_utf8_lossy(&got.0.lock().unwrap()).to_string();
        assert!(!seen.contains(KEY), "{what}: the origin got {seen:?}");
        if what == "upgrade" {
            assert!(seen.contains("GET /ws"), "{what}: {seen:?}");
            assert!(
                !seen.to_ascii_lowercase().contains("upgrade: websocket"),
                "{what}: {seen:?}"
            );
        }
    }
}

/// A proxy for the path × phase table: sandbox `dev` with a `dlp` rule, `requests_per_day:
/// 100`, and one `network.http` rule on `api.test` (GET and POST on `/ok/**` and `/upload`),
/// reached over TLS on `ports.0` and in clear on `ports.1`; explicit, admin and SOCKS5
/// listeners; `tls_intercept` with the test CA upstream.
fn table_proxy(dir: &Path, ca: &TestCa, ports: (u16, u16)) -> Proxy {
    table_proxy_with(dir, ca, ports, ("dlp", DLP))
}

/// [`table_proxy`] with this key of the sandbox's entry instead of its `dlp` rule (and
/// `/admin/**` allowed by the rule too).
fn table_proxy_with(dir: &Path, ca: &TestCa, ports: (u16, u16), entry: (&str, &str)) -> Proxy {
    ca_init(&dir.join("ica"));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (tls, plain) = ports;
    let mut config = ProxyConfig::new()
        .socks5()
        .raw(&format!("state_dir: {}", state.display()))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .sandbox(
            SandboxSpec::new("dev")
                .token("dev-secret")
                .limits("{ requests_per_day: 100 }")
                .entry(entry.0, entry.1)
                .allow(&format!("api.test:{tls}"))
                .allow(&format!("api.test:{plain}"))
                .allow(&format!("other.test:{plain}"))
                .network(
                    "http",
                    r#"[{ host: api.test, methods: [GET, POST], paths: ["/ok/**", "/admin/**", /upload] }]"#,
                ),
        );
    // The TLS listener (HTTP/2 to the proxy) where the test wrote its certificate.
    if dir.join("server.pem").exists() {
        config = config.listen_at(
            "proxy_tls",
            "{ addr: 127.0.0.1:0, cert_file: server.pem, key_file: server.key }",
        );
    }
    config.start(dir)
}

/// One row of the path × phase table: how curl reaches `api.test` on that path.
struct Row {
    name: &'static str,
    via: Vec<String>,
    base: String,
}

impl Row {
    /// curl `-s -i` on this path to `path`, with `extra` arguments: what it printed.
    fn run(&self, path: &str, extra: &[&str]) -> String {
        let url = format!("{}{path}", self.base);
        let mut args = vec!["-s", "-i"];
        args.extend(self.via.iter().map(String::as_str));
        args.extend_from_slice(extra);
        args.push(&url);
        text(&curl(&args))
    }
}

/// The rows for a [`table_proxy`] `p` (its CA under `dir`), with the origin over TLS on
/// `ports.0` and in clear on `ports.1`: forwarded HTTP/1.1, plain in CONNECT and SOCKS5,
/// terminated HTTP/1.1 and HTTP/2.
fn table_rows(p: &Proxy, dir: &Path, (tls, plain): (u16, u16)) -> Vec<Row> {
    let http_proxy = format!("http://dev:dev-secret@{}", p.proxy);
    let socks = format!("socks5h://dev:dev-secret@{}", p.socks5.unwrap());
    let ica = dir.join("ica/ca.crt").display().to_string();
    let in_clear = format!("http://api.test:{plain}");
    let over_tls = format!("https://api.test:{tls}");
    let row = |name, via: &[&str], base: &str| Row {
        name,
        via: via.iter().map(|s| s.to_string()).collect(),
        base: base.to_string(),
    };
    vec![
        row("forwarded_h1", &["-x", &http_proxy], &in_clear),
        row("connect_plain", &["-p", "-x", &http_proxy], &in_clear),
        row("socks5_plain", &["-x", &socks], &in_clear),
        row(
            "terminated_h1",
            &["-x", &http_proxy, "--cacert", &ica, "--http1.1"],
            &over_tls,
        ),
        row(
            "terminated_h2",
            &["-x", &http_proxy, "--cacert", &ica, "--http2"],
            &over_tls,
        ),
    ]
}

/// The path × phase table (hyper's `t!` style: one row a path): forwarded HTTP/1.1, plain HTTP
/// inside CONNECT and SOCKS5, terminated HTTP/1.1 and HTTP/2. On each, the head rules refuse
/// a path no rule allows, the DLP phase refuses a key in a header (neither refusal spends the
/// quota) and cuts an upload carrying one in its body (its head went out: one unit), an
/// allowed request spends one unit and its record names method, path and status.
/// Forwarded HTTP/2 is its own test (`forwarded_h2_runs_the_head_dlp_quota_and_record_phases`:
/// curl 7.88 cannot send it); the transparent listener's row is
/// `transparent_netns::gateway_plain_requests_run_the_head_dlp_quota_and_record_phases` (it
/// needs a network namespace and root).
#[test]
fn every_path_runs_the_head_dlp_quota_and_record_phases() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let tls = AlpnOrigin::start(&ca);
    let plain = Origin::start(None);
    let (tls_port, plain_port) = (tls.addr.port(), plain.addr.port());
    let p = table_proxy(dir.path(), &ca, (tls_port, plain_port));
    let rows = table_rows(&p, dir.path(), (tls_port, plain_port));
    let body = format!("k={KEY}");
    let header = format!("X-Key: {KEY}");
    for r in &rows {
        let row = r.name;
        let run = |path: &str, extra: &[&str]| r.run(path, extra);
        let before = quota_spent(&p).as_u64().unwrap_or(0);
        // The head phase.
        let out = run("/denied", &[]);
        assert!(out.contains("http_not_allowed"), "{row} head: {out}");
        // The DLP phase on the target and headers: refused before anything is sent.
        let out = run("/upload", &["-H", &header, "--data-binary", "x"]);
        assert!(out.contains("dlp_blocked"), "{row} dlp header: {out}");
        // The quota: requests refused before anything of them was sent spend nothing.
        assert_eq!(quota_spent(&p).as_u64().unwrap_or(0), before, "{row} quota");
        // The DLP phase on the body, as it streams: the upload is cut. Its head went out, so
        // it is counted.
        let out = run("/upload", &["--data-binary", &body]);
        assert!(out.contains("dlp_blocked"), "{row} dlp body: {out}");
        assert_eq!(quota_spent(&p).as_u64().unwrap(), before + 1, "{row} quota");
        let path = format!("/ok/{row}");
        let out = run(&path, &[]);
        assert!(
            out.contains(&format!("hello from origin {path}")),
            "{row}: {out}"
        );
        assert_eq!(quota_spent(&p).as_u64().unwrap(), before + 2, "{row} quota");
        // The request's own record.
        let rec = p.wait_record(|r| r["path"] == path.as_str());
        assert_eq!(rec["method"], "GET", "{row}: {rec}");
        assert_eq!(rec["status"], 200, "{row}: {rec}");
        assert_eq!(rec["decision"], "allow", "{row}: {rec}");
    }
    // Each DLP refusal is a request's record naming its rule: two a row.
    let refusals = || {
        p.audit_records()
            .into_iter()
            .filter(|r| r["reason"] == "dlp_blocked")
            .collect::<Vec<_>>()
    };
    eventually(Duration::from_secs(10), "ten DLP records", || {
        (refusals().len() >= 2 * rows.len()).then_some(())
    });
    for r in refusals() {
        assert_eq!(r["dlp"], "aws_key", "{r}");
        assert_eq!(
            (&r["method"], &r["path"]),
            (&"POST".into(), &"/upload".into()),
            "{r}"
        );
    }
    // No byte of a body the DLP phase cut reached either origin (a cut upload's head may
    // have: never its body); HTTP/2 was spoken upstream.
    assert_eq!(plain.received.load(Ordering::SeqCst), 0);
    let seen = tls.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|(_, _, path, n)| path != "/upload" || *n == 0),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(v, _, path, _)| v == "HTTP/2.0" && path == "/ok/terminated_h2"),
        "{seen:?}"
    );
}

/// One request on a stream of the HTTP/2 connection `h2` to the TLS listener, as sandbox `dev`:
/// its status and body.
async fn h2_send(
    h2: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    (method, url): (&str, &str),
    header: Option<(&str, &str)>,
    body: &str,
) -> (u16, String) {
    use http_body_util::BodyExt;
    let mut req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("proxy-authorization", basic("dev", "dev-secret"));
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    h2.ready().await.unwrap();
    let resp = h2.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = match resp.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(e) => format!("(the body failed: {e})"),
    };
    (status, body)
}

/// Forwarded HTTP/2 as a row of the path × phase table: absolute-form requests on the streams
/// of one HTTP/2 connection to the TLS listener (`listen.proxy_tls`; curl 7.88 has no
/// `--proxy-http2`, so hyper's client) go through the same driver as forwarded HTTP/1.1 — the
/// head rules refuse a path no rule allows, the DLP phase refuses a key in a header (neither
/// spends the quota) and cuts an upload carrying one in its body (one unit), an allowed request
/// spends one unit and its record names method, path and status.
#[test]
fn forwarded_h2_runs_the_head_dlp_quota_and_record_phases() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let tls = AlpnOrigin::start(&ca);
    let plain = Origin::start(None);
    let roots = proxy_certificate(dir.path());
    let p = table_proxy(dir.path(), &ca, (tls.addr.port(), plain.addr.port()));
    let base = format!("http://api.test:{}", plain.addr.port());
    let url = |path: &str| format!("{base}{path}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut h2 = connect_h2(p.proxy_tls.expect("proxy_tls"), roots).await;
        let before = quota_spent(&p).as_u64().unwrap_or(0);
        let (status, out) = h2_send(&mut h2, ("GET", &url("/denied")), None, "").await;
        assert_eq!(status, 403, "{out}");
        assert!(out.contains("http_not_allowed"), "head: {out}");
        let header = Some(("x-key", KEY));
        let (_, out) = h2_send(&mut h2, ("POST", &url("/upload")), header, "x").await;
        assert!(out.contains("dlp_blocked"), "dlp header: {out}");
        assert_eq!(quota_spent(&p).as_u64().unwrap_or(0), before, "quota");
        let body = format!("k={KEY}");
        let (_, out) = h2_send(&mut h2, ("POST", &url("/upload")), None, &body).await;
        assert!(out.contains("dlp_blocked"), "dlp body: {out}");
        assert_eq!(quota_spent(&p).as_u64().unwrap(), before + 1, "quota");
        let (status, out) = h2_send(&mut h2, ("GET", &url("/ok/forwarded_h2")), None, "").await;
        assert_eq!(status, 200, "{out}");
        assert!(out.contains("hello from origin /ok/forwarded_h2"), "{out}");
        assert_eq!(quota_spent(&p).as_u64().unwrap(), before + 2, "quota");
    });
    let rec = p.wait_record(|r| r["path"] == "/ok/forwarded_h2");
    assert_eq!(
        (&rec["method"], &rec["status"], &rec["decision"]),
        (&"GET".into(), &200.into(), &"allow".into()),
        "{rec}"
    );
    let cut = p.wait_record(|r| r["reason"] == "dlp_blocked" && r["dlp"] == "aws_key");
    assert_eq!(
        (&cut["method"], &cut["path"]),
        (&"POST".into(), &"/upload".into()),
        "{cut}"
    );
    assert_eq!(
        plain.received.load(Ordering::SeqCst),
        0,
        "a refused body reached the origin"
    );
}

/// The decider phase as a row of the path × phase table: on forwarded HTTP/1.1, plain HTTP in
/// CONNECT and SOCKS5 (to a host whose requests are judged, and to one that has no rules) and
/// terminated HTTP/1.1 and HTTP/2, the sandbox's decider is asked about each request after its
/// rules, with the same question: a request the rules refuse reaches no decider, `/admin/…`
/// is refused by it, a POST's body is shown to it (PROJECT-X refused, other bodies sent), and
/// an allowed request's record carries what it said. Before, forwarded requests were asked at
/// admission before the rules and without the body, and plain HTTP in a tunnel to a host
/// without rules only once, for the connection.
#[test]
fn every_path_asks_the_decider_after_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let tls = AlpnOrigin::start(&ca);
    let plain = Origin::start(None);
    let (tls_port, plain_port) = (tls.addr.port(), plain.addr.port());
    // The example decider (tests/data/../../examples/decider.py), on a port of its own.
    let d = ScriptOrigin::start("../../examples/decider.py", &[]);
    let decider = format!(
        "{{ url: \"http://127.0.0.1:{}/decide\", timeout_ms: 3000 }}",
        d.port
    );
    let p = table_proxy_with(
        dir.path(),
        &ca,
        (tls_port, plain_port),
        ("decider", &decider),
    );
    let rows = table_rows(&p, dir.path(), (tls_port, plain_port));
    for r in &rows {
        let row = r.name;
        let run = |path: &str, extra: &[&str]| r.run(path, extra);
        // Refused by the rules: no decider is asked.
        let denied = format!("/denied/{row}");
        let out = run(&denied, &[]);
        assert!(out.contains("http_not_allowed"), "{row} head: {out}");
        let rec = p.wait_record(|r| r["path"] == denied.as_str());
        assert!(
            rec["decider"].is_null(),
            "{row}: asked before the rules: {rec}"
        );
        // Refused by the decider.
        let out = run(&format!("/admin/{row}"), &[]);
        assert!(out.contains("denied_by_decider"), "{row} admin: {out}");
        // The body shown.
        let out = run("/upload", &["--data-binary", "about PROJECT-X"]);
        assert!(out.contains("denied_by_decider"), "{row} body: {out}");
        // Allowed, with what the decider said on the record.
        let path = format!("/ok/{row}");
        let out = run(&path, &[]);
        assert!(
            out.contains(&format!("hello from origin {path}")),
            "{row}: {out}"
        );
        let rec = p.wait_record(|r| r["path"] == path.as_str());
        assert!(
            rec["decider"].as_str().unwrap_or("").starts_with("allow"),
            "{row}: {rec}"
        );
    }
    // And to a host without rules, plain in a tunnel: asked about each request too.
    for r in rows.iter().filter(|r| r.name.ends_with("_plain")) {
        let other = Row {
            name: r.name,
            via: r.via.clone(),
            base: format!("http://other.test:{plain_port}"),
        };
        let out = other.run("/admin/x", &[]);
        assert!(
            out.contains("denied_by_decider"),
            "{} to other.test: {out}",
            r.name
        );
    }
    assert_eq!(
        plain.received.load(Ordering::SeqCst),
        0,
        "a refused body was sent"
    );
}

/// Review 7a B8: a key in a chunked request's *trailer* reached the origin (the DLP phase read
/// the body's data frames only). Trailers are scanned like headers now: the request is cut,
/// recorded `dlp_blocked`, and the origin never sees the key. The origin answers only after
/// the whole request, trailer included, so the trailer is always read (an origin that answers
/// after the head can end the exchange before the proxy reads the trailer — then the trailer
/// is neither read nor sent).
#[test]
fn a_key_in_a_chunked_trailer_is_refused() {
    for answer_early in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (port, got) = origin_answering_after(
            if answer_early { 1 } else { 2 },
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        );
        trailer_key(dir.path(), port, &got, !answer_early);
    }
}

/// A chunked POST with the key in its trailer inside a CONNECT tunnel to the origin on `port`
/// (which keeps what it got in `got`); `refused`: the record must say `dlp_blocked`.
fn trailer_key(dir: &Path, port: u16, got: &Kept, refused: bool) {
    let p = dlp_proxy(dir, port);
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let target = format!("other.test:{port}");
    connect_on(&mut s, &target, Some(&basic("dev", "dev-secret")));
    write!(
        s,
        "POST /up HTTP/1.1\r\nHost: {target}\r\nTransfer-Encoding: chunked\r\nTrailer: X-Note\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\nX-Note: {KEY}\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    match refused {
        true => p.wait_record(|r| r["reason"] == "dlp_blocked" && r["dlp"] == "aws_key"),
        // Answered before the trailer: the exchange may end before the trailer is read.
        false => p.wait_record(|r| r["event"] == "end" && r["path"] == "/up"),
    };
    drop(s);
    drop(p);
    // The origin's connection ends after whatever the proxy relayed on it.
    eventually(
        Duration::from_secs(10),
        "the origin's connection ended",
        || (got.1.load(Ordering::SeqCst) > 0).then_some(()),
    );
    let seen = String::from_utf8_lossy(&got.0.lock().unwrap()).to_string();
    assert!(!seen.contains(KEY), "the origin got {seen:?}");
}

/// Review 7a B7, W2, W3: the key base64-encoded at an offset of a longer run (in a header and
/// in a multipart part, wrapped as MIME does), padded at the end of a payload, in UTF-16 JSON
/// and percent-encoded twice — each passed the DLP phase. Each is refused now, forwarded and
/// inside a CONNECT tunnel, and none reaches the origin.
#[test]
fn encoded_keys_are_decoded_on_every_path() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let p = dlp_proxy(dir.path(), port);
    let http_proxy = format!("http://dev:dev-secret@{}", p.proxy);
    let upload = format!("http://other.test:{port}/upload");
    let header = format!("X-Data: abc{}", b64.encode(format!("id={KEY}")));
    let padded = b64.encode(format!("the key is {KEY}"));
    let wide = dir.path().join("utf16.json");
    let json: Vec<u8> = format!("{{\"k\": \"{KEY}\"}}")
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    std::fs::write(&wide, json).unwrap();
    let wide_arg = format!("@{}", wide.display());
    let twice: String = KEY.bytes().map(|b| format!("%25{b:02X}")).collect();
    let twice = format!("k={twice}");
    let mime = dir.path().join("part.txt");
    // curl encodes the part as base64, wrapped at 76 columns (`encoder=base64`).
    std::fs::write(&mime, format!("{}{KEY}", ".".repeat(70))).unwrap();
    let part = format!("f=@{};encoder=base64", mime.display());
    for via in [vec!["-x", &http_proxy], vec!["-p", "-x", &http_proxy]] {
        let cases: [(&str, Vec<&str>); 5] = [
            ("base64 header", vec!["-H", &header, "--data-binary", "x"]),
            ("padded base64 body", vec!["--data-binary", &padded]),
            (
                "utf-16 json",
                vec![
                    "-H",
                    "Content-Type: application/json; charset=utf-16",
                    "--data-binary",
                    &wide_arg,
                ],
            ),
            ("twice percent-encoded", vec!["--data-binary", &twice]),
            ("mime base64 part", vec!["-F", &part]),
        ];
        for (what, extra) in cases {
            let mut args = via.clone();
            args.extend(["-s", "-i"]);
            args.extend(extra);
            args.push(&upload);
            let out = curl(&args);
            assert!(
                text(&out).contains("dlp_blocked"),
                "{via:?} {what}: {}",
                text(&out)
            );
        }
    }
    assert_eq!(
        origin.received.load(Ordering::SeqCst),
        0,
        "a body reached the origin"
    );
}
