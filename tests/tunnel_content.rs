//! What flows through a tunnel, with the real binary and real clients: a CONNECT tunnel's
//! first bytes must match what was allowed — TLS on `require_tls_ports`, an SNI naming the
//! CONNECT host (no domain fronting), a `Host` naming it for plain HTTP — and absolute-form
//! forwarding sends the decided authority as `Host`, deciding every request on its own.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// A TCP origin that counts every byte it receives (over all connections) and, when given a
/// greeting, speaks first.
struct RawOrigin {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

impl RawOrigin {
    fn start(greeting: Option<&'static [u8]>) -> RawOrigin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let counter = received.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().map_while(Result::ok) {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    if let Some(g) = greeting {
                        let _ = s.write_all(g);
                    }
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        counter.fetch_add(n as u64, Ordering::SeqCst);
                    }
                });
            }
        });
        RawOrigin { addr, received }
    }
}

struct Env {
    dir: tempfile::TempDir,
    ca: TestCa,
    tls: Origin,
    http: Origin,
    raw: RawOrigin,
    proxy: Proxy,
}

/// Sandboxes `tok` (enforced) and `rep` (report mode), both allowed every port of `api.test`
/// and `api.example.com`; the TLS origin's and the raw origin's ports require TLS.
fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let tls = Origin::start(Some(&ca));
    let http = Origin::start(None);
    let raw = RawOrigin::start(None);
    let sandbox = |id: &str, secret: &str| {
        SandboxSpec::new(id)
            .token(secret)
            .allow("tcp://api.test:*")
            .allow("api.example.com:*")
    };
    let tls_ports = format!("[{}, {}]", tls.addr.port(), raw.addr.port());
    let proxy = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("api.example.com", "127.0.0.1")
        .host("denied.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("require_tls_ports", &tls_ports)
        .defaults("timeouts", "{ header_ms: 30000 }")
        .sandbox(sandbox("tok", "tok-secret"))
        .sandbox(sandbox("rep", "rep-secret").report())
        .start(dir.path());
    Env {
        dir,
        ca,
        tls,
        http,
        raw,
        proxy,
    }
}

impl Env {
    /// A tunnel that passes: curl's ClientHello (SNI `api.example.com`) to the raw origin, as
    /// `tok`. Its length, once the origin has received at least that much: a positive marker
    /// after which bytes refused earlier would have arrived, had they gone out.
    fn passing_hello(&self) -> u64 {
        let hello =
            std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hello-curl.bin"))
                .unwrap();
        let target = format!("api.example.com:{}", self.raw.addr.port());
        let mut s = connect(&self.proxy, &target);
        s.write_all(&hello).unwrap();
        let want = hello.len() as u64;
        eventually(
            Duration::from_secs(10),
            "the passing hello at the origin",
            || (self.raw.received.load(Ordering::SeqCst) >= want).then_some(()),
        );
        want
    }

    /// `openssl s_client` through the proxy to `api.test` on the TLS origin, sending `sni`.
    fn s_client(&self, user: &str, secret: &str, sni: &str) -> std::process::Output {
        std::process::Command::new("openssl")
            .args(["s_client", "-brief", "-proxy"])
            .arg(self.proxy.proxy.to_string())
            .args(["-proxy_user", user, "-proxy_pass"])
            .arg(format!("pass:{secret}"))
            .arg("-connect")
            .arg(format!("api.test:{}", self.tls.addr.port()))
            .args(["-servername", sni])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("openssl")
    }

    fn record_for(&self, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.proxy.wait_record(pred)
    }
}

/// Open a CONNECT tunnel to `target` as `tok`; returns the socket after the 200.
fn connect(p: &Proxy, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_on(&mut s, target, Some(&basic("tok", "tok-secret")));
    s
}

/// Whether the proxy ended the connection (EOF or reset) without sending anything.
fn ended_silently(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn openssl_with_another_servername_is_refused_and_the_matching_name_passes() {
    let e = env();
    let fronted = e.s_client("tok", "tok-secret", "evil.test");
    assert!(!fronted.status.success(), "a fronted handshake completed");
    let rec = e.record_for(|r| r["sni"] == "evil.test" && r["sandbox"] == "tok");
    assert_eq!(rec["decision"], "deny", "{rec}");
    assert_eq!(rec["reason"], "sni_mismatch", "{rec}");
    let detail = rec["detail"].as_str().unwrap();
    assert!(
        detail.contains("evil.test") && detail.contains("api.test"),
        "{detail}"
    );
    assert_eq!(rec["bytes_up"], 0, "{rec}");

    let matching = e.s_client("tok", "tok-secret", "api.test");
    assert!(
        matching.status.success(),
        "{}",
        String::from_utf8_lossy(&matching.stderr)
    );
    let rec = e.record_for(|r| r["sni"] == "api.test" && r["event"] == "end");
    assert_eq!(rec["decision"], "allow", "{rec}");
    assert_eq!(rec["mode"], "connect", "{rec}");
    assert_eq!(rec["ech"], false, "{rec}");
}

#[test]
fn curl_connect_to_another_host_is_refused_as_fronting() {
    let e = env();
    let port = e.tls.addr.port();
    let ca = e.ca.ca_pem.display().to_string();
    // curl sends CONNECT api.test (allowed) and an SNI of denied.test.
    let out = curl(&[
        "-x",
        &format!("http://tok:tok-secret@{}", e.proxy.proxy),
        "--cacert",
        &ca,
        "--connect-to",
        &format!("denied.test:{port}:api.test:{port}"),
        &format!("https://denied.test:{port}/"),
    ]);
    assert_ne!(out.code, 0, "{}", out.text());
    let rec = e.record_for(|r| r["sni"] == "denied.test");
    assert_eq!(rec["target_host"], "api.test", "{rec}");
    assert_eq!(rec["reason"], "sni_mismatch", "{rec}");
    // The same request without the trick goes through.
    let ok = curl(&[
        "-x",
        &format!("http://tok:tok-secret@{}", e.proxy.proxy),
        "--cacert",
        &ca,
        &format!("https://api.test:{port}/"),
    ]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

#[test]
fn raw_bytes_on_a_tls_port_are_refused_and_nothing_reaches_the_origin() {
    let e = env();
    let mut s = connect(&e.proxy, &format!("api.test:{}", e.raw.addr.port()));
    s.write_all(b"SSH-2.0-OpenSSH_9.6\r\nexfiltrated secrets follow\r\n")
        .unwrap();
    assert!(ended_silently(&mut s));
    let rec = e.record_for(|r| r["event"] == "end" && r["sandbox"] == "tok");
    assert_eq!(rec["reason"], "protocol_not_allowed", "{rec}");
    assert_eq!(rec["decision"], "deny", "{rec}");
    let passed = e.passing_hello();
    assert_eq!(e.raw.received.load(Ordering::SeqCst), passed);
    // Metrics count the new reason.
    let (_, metrics) = e.proxy.admin_get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("reason=\"protocol_not_allowed\"")
                && l.contains("sandbox=\"tok\"")
                && !l.ends_with(" 0")),
        "{metrics}"
    );
}

#[test]
fn a_client_hello_sent_byte_by_byte_still_passes() {
    let e = env();
    // A ClientHello captured from curl, with SNI api.example.com.
    let hello =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hello-curl.bin"))
            .unwrap();
    let mut s = connect(&e.proxy, &format!("api.example.com:{}", e.raw.addr.port()));
    s.set_nodelay(true).unwrap();
    for b in &hello {
        s.write_all(&[*b]).unwrap();
        let_time_pass(
            Duration::from_millis(1),
            "a client's pace: one byte per read",
        );
    }
    eventually(
        Duration::from_secs(10),
        "the hello to reach the origin",
        || (e.raw.received.load(Ordering::SeqCst) >= hello.len() as u64).then_some(()),
    );
    assert_eq!(e.raw.received.load(Ordering::SeqCst), hello.len() as u64);
    let open = e
        .proxy
        .wait_audit("open", |r| r["sni"] == "api.example.com");
    assert_eq!(
        open["alpn"],
        serde_json::json!(["h2", "http/1.1"]),
        "{open}"
    );
}

/// The CONNECT head and the ClientHello in one write (the explicit listener reads the head
/// with what follows it in one call and hands both to the HTTP parser): the hello is judged
/// as if it had come after the 200 — a fronted SNI is refused with nothing reaching the origin,
/// a matching one reaches it byte for byte — also behind a head larger than the first read.
#[test]
fn a_hello_sent_with_the_connect_head_is_judged_as_if_it_came_after() {
    let e = env();
    let hello =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hello-curl.bin"))
            .unwrap();
    let port = e.raw.addr.port();
    let send = |host: &str, pad: usize| {
        let mut s = TcpStream::connect(e.proxy.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut all = format!(
            "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: {}\r\nX-Pad: {}\r\n\r\n",
            basic("tok", "tok-secret"),
            "p".repeat(pad)
        )
        .into_bytes();
        all.extend_from_slice(&hello);
        s.write_all(&all).unwrap();
        let head = read_head(&mut s);
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        s
    };
    // Fronted: CONNECT api.test, SNI api.example.com.
    for pad in [1, 9000] {
        let mut s = send("api.test", pad);
        assert!(ended_silently(&mut s));
        let rec = e.record_for(|r| {
            r["event"] == "end" && r["sni"] == "api.example.com" && r["target_host"] == "api.test"
        });
        assert_eq!(rec["reason"], "sni_mismatch", "{rec}");
    }
    // Matching, behind a short head and behind one over the first read's 4 KiB: the origin
    // receives exactly their bytes (the marker that nothing fronted arrived before them).
    for (n, pad) in [(1u64, 1), (2, 9000)] {
        let _s = send("api.example.com", pad);
        let want = n * hello.len() as u64;
        eventually(Duration::from_secs(10), "the hello to arrive", || {
            (e.raw.received.load(Ordering::SeqCst) >= want).then_some(())
        });
        assert_eq!(e.raw.received.load(Ordering::SeqCst), want);
    }
}

#[test]
fn report_mode_lets_a_mismatch_through_and_records_it() {
    let e = env();
    let out = e.s_client("rep", "rep-secret", "evil.test");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = e.record_for(|r| r["sandbox"] == "rep" && r["event"] == "end");
    assert_eq!(rec["decision"], "report", "{rec}");
    assert_eq!(rec["reason"], "sni_mismatch", "{rec}");
    assert!(rec["bytes_up"].as_u64().unwrap() > 0, "{rec}");
}

#[test]
fn plain_http_in_a_tunnel_must_name_the_connect_host() {
    let e = env();
    let port = e.http.addr.port();
    let px = format!("http://tok:tok-secret@{}", e.proxy.proxy);
    let url = format!("http://api.test:{port}/echo");
    let ok = curl(&["-p", "-x", &px, &url]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let bad = curl(&["-p", "-x", &px, "-H", "Host: denied.test", &url]);
    assert_ne!(bad.code, 0, "{}", bad.text());
    let rec = e.record_for(|r| r["reason"] == "host_mismatch");
    assert!(
        rec["detail"].as_str().unwrap().contains("denied.test"),
        "{rec}"
    );
}

#[test]
fn a_server_speaks_first_protocol_is_not_held_for_header_ms() {
    let e = env();
    let ssh = RawOrigin::start(Some(b"SSH-2.0-test\r\n"));
    // header_ms is 30 s: waiting for the client would time this read out.
    let mut s = connect(&e.proxy, &format!("api.test:{}", ssh.addr.port()));
    let mut banner = [0u8; 14];
    s.read_exact(&mut banner).unwrap();
    assert_eq!(&banner, b"SSH-2.0-test\r\n");
    s.write_all(b"SSH-2.0-client\r\n").unwrap();
    eventually(
        Duration::from_secs(10),
        "the client's banner at the server",
        || (ssh.received.load(Ordering::SeqCst) >= 16).then_some(()),
    );
}

#[test]
fn absolute_form_sends_the_decided_host_upstream() {
    let e = env();
    let port = e.http.addr.port();
    let out = curl(&[
        "-x",
        &format!("http://tok:tok-secret@{}", e.proxy.proxy),
        "-H",
        "Host: denied.test",
        &format!("http://api.test:{port}/echo"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let echoed = out.text().to_ascii_lowercase();
    assert!(
        echoed.contains(&format!("host: api.test:{port}")),
        "{echoed}"
    );
    assert!(!echoed.contains("denied.test"), "{echoed}");
}

#[test]
fn pipelined_requests_are_decided_one_by_one() {
    let e = env();
    let port = e.http.addr.port();
    let auth = basic("tok", "tok-secret");
    let mut s = TcpStream::connect(e.proxy.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Both in one write: an allowed one, then one to a host no rule allows.
    write!(
        s,
        "GET http://api.test:{port}/one HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: {auth}\r\n\r\n\
         GET http://denied.test:{port}/two HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.contains("hello from origin /one"), "{out}");
    assert!(!out.contains("hello from origin /two"), "{out}");
    assert_eq!(out.matches("HTTP/1.1 403").count(), 1, "{out}");
    let denied = e.record_for(|r| r["target_host"] == "denied.test");
    assert_eq!(denied["reason"], "no_rule_matched", "{denied}");
    let allowed = e.record_for(|r| r["target_host"] == "api.test" && r["event"] == "end");
    assert_eq!(allowed["decision"], "allow", "{allowed}");
    let _ = &e.dir;
}

#[test]
fn a_later_request_in_a_plain_tunnel_must_name_the_connect_host_too() {
    let e = env();
    let port = e.http.addr.port();
    let mut s = connect(&e.proxy, &format!("api.test:{port}"));
    write!(
        s,
        "GET /one HTTP/1.1\r\nHost: api.test:{port}\r\n\r\nGET /two HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let rec = e.record_for(|r| r["event"] == "end" && r["target_host"] == "api.test");
    assert_eq!(rec["reason"], "host_mismatch", "{rec}");
    assert_eq!(rec["decision"], "deny", "{rec}");
    assert!(
        rec["detail"].as_str().unwrap().contains("denied.test"),
        "{rec}"
    );
}
