//! The bypass classes the field published (`shared/reviews/field-wave4.md`, section 3), each
//! tried against the real binary as a sandboxed client would: Encrypted Client Hello behind an
//! allowed outer SNI, `Upgrade: h2c` smuggling on forwarded HTTP, an HTTP/2 preface on the
//! plain listener, a CONNECT inside a CONNECT, and the framing forms request smuggling lives
//! on (`Transfer-Encoding: chunked, identity`, two `Transfer-Encoding`s, `Content-Length: +10`).
//! Each must be refused, and nothing of it may reach the origin. (The transparent listener's
//! ECH case is in `transparent_netns.rs`; brokered redirects in `credentials.rs`; DNS in
//! `dns_channel.rs`.)

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::tls_hello::{client_hello, ech_hello};
use common::*;

/// An origin on loopback that keeps every byte it receives and answers each request head
/// with a small 200 (so a kept connection could carry a second request).
struct Recorder {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<u8>>>,
}

impl Recorder {
    fn start() -> Recorder {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let keep = got.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().map_while(Result::ok) {
                let keep = keep.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        keep.lock().unwrap().extend_from_slice(&buf[..n]);
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            // A CONNECT it refuses (a 2xx would open a tunnel).
                            let answer: &[u8] = if buf.starts_with(b"CONNECT") {
                                b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"
                            } else {
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                            };
                            let _ = s.write_all(answer);
                        }
                    }
                });
            }
        });
        Recorder { addr, got }
    }

    fn seen(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }
}

fn start(dir: &std::path::Path, origin: &Recorder) -> Proxy {
    let port = origin.addr.port();
    proxy(
        dir,
        &["ok.test", "denied.test", "db.test"],
        &[
            ("require_tls_ports", "[443]"),
            ("refuse_ech", "true"),
            ("timeouts", "{ header_ms: 1500 }"),
        ],
        &[&format!("ok.test:{port}"), &format!("tcp://db.test:{port}")],
    )
}

/// A proxy where sandbox `s` (every loopback client) reaches `egress`; `hosts` on loopback,
/// loopback let through the guard, these more `defaults` keys.
fn proxy(
    dir: &std::path::Path,
    hosts: &[&str],
    defaults: &[(&str, &str)],
    egress: &[&str],
) -> Proxy {
    let s = egress
        .iter()
        .fold(SandboxSpec::new("s").source("127.0.0.0/8"), |s, e| {
            s.allow(e)
        });
    let config = hosts
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"));
    defaults
        .iter()
        .fold(config, |c, (k, v)| c.defaults(k, v))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .sandbox(s)
        .start(dir)
}

/// Open a tunnel to `target` and send `bytes` in it; what came back (until close or 3 s).
fn through_tunnel(proxy: SocketAddr, target: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    connect_on(&mut s, target, None);
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw request to the proxy itself; the answer (until close or 3 s).
fn raw(proxy: SocketAddr, bytes: &[u8]) -> String {
    raw_exchange(proxy, bytes, Duration::from_secs(3))
}

#[test]
fn an_ech_hello_behind_an_allowed_outer_sni_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let p = start(dir.path(), &origin);
    let target = format!("ok.test:{}", origin.addr.port());
    // Without ECH the same hello passes (reaches the origin).
    through_tunnel(p.proxy, &target, &client_hello("ok.test", &[]));
    assert!(!origin.seen().is_empty(), "a plain hello should pass");
    origin.got.lock().unwrap().clear();
    through_tunnel(p.proxy, &target, &ech_hello("ok.test"));
    assert!(origin.seen().is_empty(), "the ECH hello reached the origin");
    let rec = p.wait_record(|r| r["ech"] == true);
    assert_eq!(rec["reason"], "protocol_not_allowed", "{rec}");
    assert_eq!(rec["decision"], "deny", "{rec}");
}

#[test]
fn h2c_upgrade_and_an_h2_preface_are_not_smuggled_through() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let p = start(dir.path(), &origin);
    let port = origin.addr.port();
    // A forwarded request asking the origin to switch to h2c: the origin never sees the
    // upgrade (a hop-by-hop header), so nothing after it escapes the per-request checks.
    let answer = raw(
        p.proxy,
        format!(
            "GET http://ok.test:{port}/up HTTP/1.1\r\nHost: ok.test:{port}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = origin.seen().to_ascii_lowercase();
    assert!(seen.contains("get /up"), "{seen}");
    assert!(
        !seen.contains("upgrade") && !seen.contains("http2-settings"),
        "{seen}"
    );
    // HTTP/2 prior knowledge on the plain listener: not HTTP/1.1, refused, nothing forwarded.
    origin.got.lock().unwrap().clear();
    let answer = raw(
        p.proxy,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    );
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(origin.seen().is_empty(), "{}", origin.seen());
}

#[test]
fn a_connect_inside_a_connect_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let p = start(dir.path(), &origin);
    let target = format!("ok.test:{}", origin.addr.port());
    let inner = b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n";
    through_tunnel(p.proxy, &target, inner);
    assert!(
        !origin.seen().contains("denied.test"),
        "the inner CONNECT reached the origin: {}",
        origin.seen()
    );
    let rec = p.wait_record(|r| r["reason"] == "host_mismatch");
    assert_eq!(rec["decision"], "deny", "{rec}");
}

#[test]
fn ambiguous_framing_is_refused_before_anything_is_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let p = start(dir.path(), &origin);
    let port = origin.addr.port();
    let head = format!("POST http://ok.test:{port}/smuggle HTTP/1.1\r\nHost: ok.test:{port}\r\n");
    for framing in [
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "Content-Length: +10\r\n",
        "Content-Length: 10, 11\r\n",
    ] {
        let req =
            format!("{head}{framing}\r\n0\r\n\r\nGET /inner HTTP/1.1\r\nHost: denied.test\r\n\r\n");
        let answer = raw(p.proxy, req.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 400"), "{framing:?}: {answer}");
    }
    let seen = origin.seen();
    assert!(
        !seen.contains("/smuggle") && !seen.contains("/inner"),
        "{seen}"
    );
}

/// Inside a CONNECT tunnel to a name whose entry names no port (allowed on `defaults.ports`),
/// what flows must be a ClientHello or an HTTP head the proxy reads: a head led by CRLF, a
/// lowercase method, a head over the first-bytes cap or HTTP/2 prior knowledge is refused as
/// `unrecognised_protocol` (before, each was relayed unchecked, Host and all); a plain
/// request naming the host passes. An entry that declares opaque TCP (`tcp://`) carries another
/// protocol, never bytes that only start like HTTP.
#[test]
fn a_tunnel_carries_only_what_the_proxy_reads_unless_the_entry_declares_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let port = origin.addr.port();
    let p = proxy(
        dir.path(),
        &["web.test", "raw.test"],
        &[
            ("ports", &format!("[443, {port}]")),
            ("timeouts", "{ header_ms: 1500 }"),
        ],
        &["web.test", &format!("tcp://raw.test:{port}")],
    );
    let target = format!("web.test:{port}");
    let big = format!(
        "GET /big HTTP/1.1\r\nHost: web.test\r\nX: {}\r\n",
        "b".repeat(70 * 1024)
    );
    let cases: [&[u8]; 4] = [
        b"\r\nGET /crlf HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        b"get /lower HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        big.as_bytes(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ];
    for case in cases {
        through_tunnel(p.proxy, &target, case);
    }
    assert!(origin.seen().is_empty(), "{:.200}", origin.seen());
    let refused = || {
        p.audit_records()
            .iter()
            .filter(|r| r["reason"] == "unrecognised_protocol")
            .count()
    };
    eventually(Duration::from_secs(10), "a refusal per case", || {
        (refused() == cases.len()).then_some(())
    });
    through_tunnel(
        p.proxy,
        &target,
        b"GET /fine HTTP/1.1\r\nHost: web.test\r\n\r\n",
    );
    assert!(origin.seen().contains("GET /fine"), "{}", origin.seen());
    // Another protocol flows to a name whose entry declares opaque TCP; bytes that only start
    // like HTTP do not, there either (review B4: nginx reads a leading CRLF as a request).
    through_tunnel(
        p.proxy,
        &format!("raw.test:{port}"),
        b"*1\r\n$4\r\nPING\r\n",
    );
    assert!(origin.seen().contains("PING"), "{}", origin.seen());
    through_tunnel(p.proxy, &format!("raw.test:{port}"), b"\r\nset a b\r\n");
    assert!(!origin.seen().contains("set a b"), "{}", origin.seen());
}

/// One first-bytes cap on both paths (64 KiB; the CONNECT path had 16): a 40 KiB head in a
/// tunnel is read whole and its `Host` checked — a denied name is refused, nothing reaches
/// the origin, and the same head naming the tunnel's host passes. The transparent side is in
/// `transparent_netns.rs` (`gateway_checks_every_request_and_requires_tls_on_tls_ports`).
#[test]
fn a_head_under_the_one_cap_is_read_whole_and_checked_in_a_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let port = origin.addr.port();
    let p = proxy(
        dir.path(),
        &["web.test"],
        &[
            ("ports", &format!("[{port}]")),
            ("timeouts", "{ header_ms: 3000 }"),
        ],
        &["web.test"],
    );
    let target = format!("web.test:{port}");
    let head = |host: &str, path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Pad: {}\r\n\r\n",
            "p".repeat(40 * 1024)
        )
    };
    through_tunnel(p.proxy, &target, head("denied.test", "/denied").as_bytes());
    let rec = eventually(Duration::from_secs(10), "the refusal", || {
        p.audit_records()
            .into_iter()
            .find(|r| r["event"] == "end" && r["reason"] == "host_mismatch")
    });
    assert_eq!(rec["decision"], "deny", "{rec}");
    assert!(origin.seen().is_empty(), "{:.200}", origin.seen());
    through_tunnel(p.proxy, &target, head("web.test", "/fine").as_bytes());
    eventually(Duration::from_secs(10), "the allowed head", || {
        origin.seen().contains("GET /fine").then_some(())
    });
}

/// An origin that answers the first request head with `101 Switching Protocols` and keeps
/// every byte it receives.
fn switching_origin() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let keep = keep.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut answered = false;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    keep.lock().unwrap().extend_from_slice(&buf[..n]);
                    if !answered {
                        answered = true;
                        let _ = s.write_all(
                            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                        );
                    }
                }
            });
        }
    });
    (addr, got)
}

/// A request with `Upgrade:` ends the per-request checks only when the origin really
/// switches: pipelined behind an upgrade the origin answered `200`, a request for a denied
/// Host is refused and never reaches the origin (before, it was relayed: the stream was taken
/// for opaque at the Upgrade header); after a real `101` the rest is the new protocol's.
#[test]
fn an_upgrade_the_origin_did_not_accept_does_not_end_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let (switching, switched_got) = switching_origin();
    let p = proxy(
        dir.path(),
        &["ok.test", "ws.test"],
        &[("timeouts", "{ header_ms: 1500 }")],
        &[
            &format!("ok.test:{}", origin.addr.port()),
            &format!("ws.test:{}", switching.port()),
        ],
    );
    let port = origin.addr.port();
    let smuggle = format!(
        "GET /ws HTTP/1.1\r\nHost: ok.test:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\
GET /two HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    );
    through_tunnel(p.proxy, &format!("ok.test:{port}"), smuggle.as_bytes());
    let seen = origin.seen();
    assert!(seen.contains("GET /ws"), "{seen}");
    assert!(
        !seen.contains("/two") && !seen.contains("denied.test"),
        "{seen}"
    );
    let rec = p.wait_record(|r| r["reason"] == "host_mismatch");
    assert_eq!(rec["decision"], "deny", "{rec}");
    // The same after a CONNECT the origin refused (405): it ends nothing.
    origin.got.lock().unwrap().clear();
    let connect = format!(
        "CONNECT ok.test:{port} HTTP/1.1\r\nHost: ok.test:{port}\r\n\r\nGET /three HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    );
    through_tunnel(p.proxy, &format!("ok.test:{port}"), connect.as_bytes());
    assert!(!origin.seen().contains("/three"), "{}", origin.seen());
    // A real switch: what follows is the new protocol's, relayed as it is.
    let ws = format!(
        "GET /ws HTTP/1.1\r\nHost: ws.test:{}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x01\x05hello GET /x HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        switching.port()
    );
    through_tunnel(
        p.proxy,
        &format!("ws.test:{}", switching.port()),
        ws.as_bytes(),
    );
    let got = String::from_utf8_lossy(&switched_got.lock().unwrap()).into_owned();
    assert!(got.contains("\u{1}\u{5}hello GET /x"), "{got:?}");
}

/// A forwarded request whose chunked body is malformed is the client's fault: 400
/// `malformed_request` in the answer and the record (it was a 502 `connection_refused`,
/// blaming the origin).
#[test]
fn a_malformed_request_body_is_the_clients_fault() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let p = start(dir.path(), &origin);
    let port = origin.addr.port();
    let req = format!(
        "POST http://ok.test:{port}/body HTTP/1.1\r\nHost: ok.test:{port}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    );
    let answer = raw(p.proxy, req.as_bytes());
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("malformed_request"),
        "{answer}"
    );
    let rec = p.wait_record(|r| r["reason"] == "malformed_request");
    assert_eq!(rec["decision"], "deny", "{rec}");
}

/// Security review round B, B4, and round 7a B1–B4: an entry that names its port
/// (`ok.test:PORT`, as the docs advise for plain HTTP) relayed bytes the reader did not call HTTP
/// or TLS as opaque TCP — a leading CRLF, a lowercase method, a tab after the method, a PROXY
/// header — which nginx, Go and Python read as a request for the `Host` they name. Only an
/// entry written `tcp://` is opaque now, and even there what starts like a request the proxy
/// does not read is refused.
#[test]
fn a_port_scoped_entry_relays_no_head_the_proxy_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Recorder::start();
    let p = start(dir.path(), &origin);
    let port = origin.addr.port();
    for target in [format!("ok.test:{port}"), format!("db.test:{port}")] {
        for bytes in [
            &b"\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"[..],
            b"\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n",
            b"get / HTTP/1.1\r\nHost: denied.test\r\n\r\n",
            b"GET\t/ HTTP/1.1\r\nHost: denied.test\r\n\r\n",
            b"PROXY TCP4 6.6.6.6 127.0.0.1 1 2\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        ] {
            let answer = through_tunnel(p.proxy, &target, bytes);
            assert!(!answer.contains("200 OK\r\nContent-Length: 2"), "{answer}");
            assert!(
                origin.seen().is_empty(),
                "{:?} reached the origin through {target}: {}",
                String::from_utf8_lossy(bytes),
                origin.seen()
            );
        }
    }
    let rec = p.wait_record(|r| r["reason"] == "unrecognised_protocol");
    assert_eq!(rec["decision"], "deny", "{rec}");
    // Another protocol is refused under a name that merely names its port…
    let postgres = b"\x00\x00\x00\x08\x04\xd2\x16\x2f";
    through_tunnel(p.proxy, &format!("ok.test:{port}"), postgres);
    assert!(origin.seen().is_empty(), "{}", origin.seen());
    // …and passes where the entry declares opaque TCP.
    through_tunnel(p.proxy, &format!("db.test:{port}"), postgres);
    assert!(
        !origin.seen().is_empty(),
        "an opaque protocol should pass on tcp://"
    );
}
