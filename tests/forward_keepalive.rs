//! Keep-alive for forwarded plain HTTP with the real binary, curl and a keep-alive origin
//! that counts its connections: a sandbox's second request (from another client connection)
//! reuses the upstream connection; another sandbox, or another authority at the same address,
//! never does; a kept connection is closed when its policy is revoked, and when it has been
//! idle for `forward_keepalive.idle_ms`; `idle_ms: 0` keeps none. A kept connection that the
//! origin closes as the next request arrives: a bodiless GET is sent again on a new
//! connection, a POST with a body is not (502).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// An HTTP/1.1 origin that keeps connections open: it answers every request with its
/// connection's number, counts connections, and notes each one the proxy closes.
struct KeepAliveOrigin {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Connection numbers closed by the peer (EOF or reset), in order.
    closed: Arc<Mutex<Vec<usize>>>,
}

impl KeepAliveOrigin {
    fn start() -> KeepAliveOrigin {
        Self::start_closing_after(usize::MAX)
    }

    /// An origin that answers `answers` requests per connection, then closes the connection
    /// when the next request arrives, without answering it.
    fn start_closing_after(answers: usize) -> KeepAliveOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(Mutex::new(Vec::new()));
        let (a, c) = (accepted.clone(), closed.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let n = a.fetch_add(1, Ordering::SeqCst) + 1;
                let c = c.clone();
                std::thread::spawn(move || {
                    serve(stream, n, answers);
                    c.lock().unwrap().push(n);
                });
            }
        });
        KeepAliveOrigin {
            addr,
            accepted,
            closed,
        }
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn closed(&self) -> Vec<usize> {
        self.closed.lock().unwrap().clone()
    }
}

/// Answer requests on one connection until the peer closes it, or `answers` were answered
/// and another arrives.
fn serve(stream: std::net::TcpStream, n: usize, mut answers: usize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        let mut host = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("host:") {
                host = v.trim().to_string();
            }
        }
        if answers == 0 {
            return;
        }
        let body = format!("connection {n} host {host}\n");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if out.write_all(resp.as_bytes()).is_err() {
            return;
        }
        answers -= 1;
    }
}

const TOKEN_A: &str = "token-of-a";
const TOKEN_B: &str = "token-of-b";

fn start(dir: &std::path::Path, keepalive: &str) -> Proxy {
    std::fs::write(dir.join("admin.token"), "admin-token\n").unwrap();
    config(dir, keepalive, "origin.test:*").start(dir)
}

/// Sandboxes `a` (origin.test and other.test) and `b` (`b_reaches`), `keepalive` (YAML) at
/// the top level.
fn config(dir: &std::path::Path, keepalive: &str, b_reaches: &str) -> ProxyConfig {
    let a = SandboxSpec::new("a")
        .token(TOKEN_A)
        .allow("origin.test:*")
        .allow("other.test:*");
    let b = SandboxSpec::new("b").token(TOKEN_B).allow(b_reaches);
    ProxyConfig::new()
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("origin.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .raw(keepalive)
        .sandbox(a)
        .sandbox(b)
}

/// One GET through the proxy as `sandbox`, a client connection of its own: the body.
fn get(p: &Proxy, sandbox: &str, token: &str, url: &str) -> String {
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://{sandbox}:{token}@{}", p.proxy),
        url,
    ]);
    assert_eq!(out.code, 0, "{}", out.text());
    out.text()
}

#[test]
fn a_sandbox_reuses_its_upstream_connection_and_no_other_sandbox_or_authority_does() {
    let dir = tempfile::tempdir().unwrap();
    let origin = KeepAliveOrigin::start();
    let p = start(dir.path(), "");
    let url = format!("http://origin.test:{}/x", origin.addr.port());

    // Two requests of sandbox a, each from its own client connection: one upstream connection.
    assert!(get(&p, "a", TOKEN_A, &url).contains("connection 1 host origin.test"));
    assert!(get(&p, "a", TOKEN_A, &url).contains("connection 1 host origin.test"));
    assert_eq!(origin.connections(), 1);
    let second = p.wait_record(|r| {
        r["sandbox"] == "a" && r["detail"] == "sent on a kept upstream connection"
    });
    assert_eq!(second["decision"], "allow");

    // Sandbox b to the same origin and address: never a's connection.
    assert!(get(&p, "b", TOKEN_B, &url).contains("connection 2 "));
    assert!(get(&p, "b", TOKEN_B, &url).contains("connection 2 "));
    assert_eq!(origin.connections(), 2);

    // Another authority at the same address: decided and connected for itself.
    let other = format!("http://other.test:{}/x", origin.addr.port());
    assert!(get(&p, "a", TOKEN_A, &other).contains("connection 3 host other.test"));
    assert!(get(&p, "a", TOKEN_A, &url).contains("connection 1 host origin.test"));
    assert_eq!(origin.connections(), 3);
    assert!(origin.closed().is_empty(), "{:?}", origin.closed());
}

#[test]
fn a_kept_connection_is_closed_when_revoked_or_idle_and_none_is_kept_with_idle_zero() {
    let dir = tempfile::tempdir().unwrap();
    let origin = KeepAliveOrigin::start();
    let mut p = start(dir.path(), "forward_keepalive: { idle_ms: 60000 }");
    let url = format!("http://origin.test:{}/x", origin.addr.port());
    get(&p, "b", TOKEN_B, &url);
    get(&p, "a", TOKEN_A, &url);
    assert_eq!(origin.connections(), 2);
    assert!(origin.closed().is_empty());

    // b loses origin.test (a reload): its kept connection is closed at once — long before
    // the idle time — and a's is not.
    let narrowed = config(
        dir.path(),
        "forward_keepalive: { idle_ms: 60000 }",
        "elsewhere.test:*",
    );
    std::fs::write(&p.config, narrowed.yaml(&p.audit)).unwrap();
    let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some("admin-token"));
    assert_eq!(status, 200, "{body}");
    eventually(Duration::from_secs(5), "b's kept connection closed", || {
        (origin.closed() == vec![1]).then_some(())
    });
    assert!(get(&p, "a", TOKEN_A, &url).contains("connection 2 "));
    p.terminate();

    // Idle for idle_ms: closed by the proxy.
    let dir = tempfile::tempdir().unwrap();
    let origin = KeepAliveOrigin::start();
    let mut p = start(dir.path(), "forward_keepalive: { idle_ms: 300 }");
    let url = format!("http://origin.test:{}/x", origin.addr.port());
    get(&p, "a", TOKEN_A, &url);
    eventually(Duration::from_secs(5), "the idle connection closed", || {
        (origin.closed() == vec![1]).then_some(())
    });
    p.terminate();

    // idle_ms: 0 keeps none: every request has its own connection, closed after it.
    let dir = tempfile::tempdir().unwrap();
    let origin = KeepAliveOrigin::start();
    let _p = start(dir.path(), "forward_keepalive: { idle_ms: 0 }");
    let url = format!("http://origin.test:{}/x", origin.addr.port());
    get(&_p, "a", TOKEN_A, &url);
    get(&_p, "a", TOKEN_A, &url);
    assert_eq!(origin.connections(), 2);
    eventually(Duration::from_secs(5), "both closed", || {
        (origin.closed().len() == 2).then_some(())
    });
}

/// The origin closes a kept connection as the next request arrives (its keep-alive ran out
/// just then): a bodiless GET on it is sent again, once, on a new connection to the same
/// checked address, and the record says so; a POST with a body is not (it may have been
/// acted on) and gets the 502.
#[test]
fn a_request_on_a_kept_connection_the_origin_closed_is_sent_again_only_when_it_may_be() {
    let dir = tempfile::tempdir().unwrap();
    let origin = KeepAliveOrigin::start_closing_after(1);
    let p = start(dir.path(), "");
    let url = format!("http://origin.test:{}/x", origin.addr.port());
    assert!(get(&p, "a", TOKEN_A, &url).contains("connection 1"));
    // Taken from the pool: connection 1, which the origin closes unanswered.
    let body = get(&p, "a", TOKEN_A, &url);
    assert!(body.contains("connection 2"), "{body}");
    let rec = p.wait_record(|r| {
        r["detail"]
            .as_str()
            .is_some_and(|d| d.contains("sent again on a new one"))
    });
    assert_eq!(rec["decision"], "allow", "{rec}");

    // Connection 2 is kept; a POST on it is closed unanswered and is not sent again.
    let out = curl(&[
        "-sS",
        "-i",
        "-x",
        &format!("http://a:{TOKEN_A}@{}", p.proxy),
        "-d",
        "payload",
        &url,
    ]);
    assert!(out.text().starts_with("HTTP/1.1 502"), "{}", out.text());
    assert_eq!(origin.connections(), 2, "the POST was sent again");
}
