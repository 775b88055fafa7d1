//! The refusal matrix as one table (hyper's `t!` style): every listener that answers in its
//! own protocol × every reason a connection is refused before anything reaches the
//! destination → what the client is told (an HTTP status, a SOCKS5 reply code or login
//! status) and the record (`mode`, `reason`, nothing dialled). One proxy, built with
//! [`ProxyConfig`], serves every row; each (listener, reason) pair is exactly one record.
//! Transparent refusals (an RST and the same record) are in `transparent_netns.rs`, which
//! needs network namespaces.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use base64::Engine;
use common::*;

/// How a client reached the proxy.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Listener {
    /// A forwarded request in absolute form: `mode: "http"`.
    Forward,
    /// `CONNECT`: `mode: "connect"`.
    Connect,
    /// A SOCKS5 CONNECT: `mode: "socks5"`.
    Socks5,
}

impl Listener {
    fn mode(self) -> &'static str {
        match self {
            Listener::Forward => "http",
            Listener::Connect => "connect",
            Listener::Socks5 => "socks5",
        }
    }
}

/// What the client is told.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Told {
    /// An HTTP status (the explicit proxy).
    Status(u16),
    /// A SOCKS5 reply code (RFC 1928 §6).
    Reply(u8),
    /// A failed SOCKS5 login (RFC 1929 status 1): no request is read.
    LoginRefused,
}

/// One row: who asks, for what, and what must come of it.
struct Row {
    reason: &'static str,
    /// `user:password`.
    login: &'static str,
    target: fn(&Env) -> String,
    forward: Told,
    connect: Told,
    socks5: Told,
}

struct Env {
    _dir: tempfile::TempDir,
    proxy: Proxy,
    /// A loopback port nothing listens on (held while the environment lives).
    closed: u16,
    _closed: ClosedPort,
}

const OK: &str = "agent1:tok-agent1";

fn rows() -> Vec<Row> {
    use Told::*;
    vec![
        Row {
            reason: "no_rule_matched",
            login: OK,
            target: |_| "other.test:443".into(),
            forward: Status(403),
            connect: Status(403),
            socks5: Reply(2),
        },
        Row {
            reason: "denied_by_rule",
            login: OK,
            target: |_| "denied.test:443".into(),
            forward: Status(403),
            connect: Status(403),
            socks5: Reply(2),
        },
        Row {
            reason: "port_not_allowed",
            login: OK,
            target: |_| "ok.test:8443".into(),
            forward: Status(403),
            connect: Status(403),
            socks5: Reply(2),
        },
        Row {
            reason: "destination_ip_prohibited",
            login: OK,
            target: |_| "metadata.test:80".into(),
            forward: Status(403),
            connect: Status(403),
            socks5: Reply(2),
        },
        Row {
            reason: "connection_refused",
            login: OK,
            target: |e| format!("closed.test:{}", e.closed),
            forward: Status(502),
            connect: Status(502),
            socks5: Reply(5),
        },
        Row {
            reason: "auth_failed",
            login: "agent1:wrong",
            target: |_| "ok.test:443".into(),
            forward: Status(407),
            connect: Status(407),
            socks5: LoginRefused,
        },
        Row {
            reason: "unknown_sandbox",
            login: "nobody:tok-agent1",
            target: |_| "ok.test:443".into(),
            forward: Status(407),
            connect: Status(407),
            socks5: LoginRefused,
        },
    ]
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let held = ClosedPort::new();
    let closed = held.port();
    let proxy = ProxyConfig::new()
        .socks5()
        .host("ok.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .host("denied.test", "127.0.0.1")
        .host("closed.test", "127.0.0.1")
        .host("metadata.test", "169.254.169.254")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("agent1")
                .token("tok-agent1")
                .allow("ok.test:443")
                .allow("ok.test:80")
                .allow("denied.test:443")
                .allow("metadata.test:80")
                .allow(&format!("closed.test:{closed}"))
                .deny("denied.test"),
        )
        .start(dir.path());
    Env {
        _dir: dir,
        proxy,
        closed,
        _closed: held,
    }
}

fn stream(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The status of the explicit proxy's answer to `head`.
fn status(addr: SocketAddr, head: String) -> u16 {
    let mut s = stream(addr);
    s.write_all(head.as_bytes()).unwrap();
    let got = String::from_utf8_lossy(&read_head(&mut s)).into_owned();
    got.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {got:?}"))
}

fn basic(login: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(login)
}

/// Ask through `listener` for `target` as `login`; what the client was told.
fn ask(e: &Env, listener: Listener, target: &str, login: &str) -> Told {
    match listener {
        Listener::Forward => Told::Status(status(
            e.proxy.proxy,
            format!(
                "GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
                basic(login)
            ),
        )),
        Listener::Connect => Told::Status(status(
            e.proxy.proxy,
            format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic(login)
            ),
        )),
        Listener::Socks5 => socks5(e.proxy.socks5.expect("listen.socks5"), target, login),
    }
}

/// RFC 1928 with an RFC 1929 login, by hand: the reply code, or a refused login.
fn socks5(addr: SocketAddr, target: &str, login: &str) -> Told {
    let mut s = stream(addr);
    s.write_all(&[5, 1, 2]).unwrap();
    let mut chosen = [0u8; 2];
    s.read_exact(&mut chosen).unwrap();
    assert_eq!(chosen, [5, 2], "the login method is chosen when offered");
    let (user, pass) = login.split_once(':').unwrap();
    let mut auth = vec![1, user.len() as u8];
    auth.extend_from_slice(user.as_bytes());
    auth.push(pass.len() as u8);
    auth.extend_from_slice(pass.as_bytes());
    s.write_all(&auth).unwrap();
    let mut status = [0u8; 2];
    s.read_exact(&mut status).unwrap();
    if status[1] != 0 {
        return Told::LoginRefused;
    }
    let (host, port) = target.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).unwrap();
    Told::Reply(reply[1])
}

#[test]
fn every_listener_tells_every_refusal_in_its_own_protocol_and_records_it_once() {
    let e = env();
    let listeners = [Listener::Forward, Listener::Connect, Listener::Socks5];
    let mut asked = 0;
    for row in rows() {
        let target = (row.target)(&e);
        for l in listeners {
            let want = match l {
                Listener::Forward => row.forward,
                Listener::Connect => row.connect,
                Listener::Socks5 => row.socks5,
            };
            let told = ask(&e, l, &target, row.login);
            assert_eq!(told, want, "{} through {l:?} to {target}", row.reason);
            asked += 1;
        }
    }
    // Every (listener, reason) pair is one record, and nothing was dialled for any of them
    // but the refused connection itself.
    let all = eventually(Duration::from_secs(15), "a record of every refusal", || {
        let all = e.proxy.audit_records();
        let ends = all.iter().filter(|r| r["event"] == "end").count();
        (ends >= asked).then_some(all)
    });
    for row in rows() {
        for l in listeners {
            let hits: Vec<&serde_json::Value> = all
                .iter()
                .filter(|r| r["mode"] == l.mode() && r["reason"] == row.reason)
                .collect();
            assert_eq!(hits.len(), 1, "{} through {l:?}: {hits:?}", row.reason);
            let r = hits[0];
            assert_eq!(r["decision"], "deny", "{r}");
            if row.reason != "connection_refused" {
                assert!(r["dialed"].is_null(), "nothing dialled: {r}");
            }
        }
    }
}
