//! `listen.threads`: data-plane threads, each with its own single-threaded runtime and its own
//! socket of every TCP data-plane listener (one `SO_REUSEPORT` group). With the real binary
//! and raw sockets:
//! - every socket of the group accepts: connections the kernel spreads over them are all
//!   served (an accept loop missing on one socket leaves the connections hashed to it
//!   waiting);
//! - a reload that stops allowing a host cuts the tunnels on every thread, each recorded
//!   `revoked` (the policy is watched across runtimes);
//! - the transparent listener's per-source admission is one table for the whole group: a
//!   source gets its accept rate once, not once a thread;
//! - a shutdown drains and stops a process that has data-plane threads.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const ADMIN_TOKEN: &str = "threads-admin-token";
const THREADS: usize = 3;

/// `proxy.yaml` in `dir`: `THREADS` data-plane threads; sandbox `tok` may reach `egress`.
fn write_config(dir: &Path, egress: &str) {
    let yaml = ProxyConfig::new()
        .listen_at("threads", &THREADS.to_string())
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("timeouts", "{ shutdown_grace_ms: 5000 }")
        .sandbox(SandboxSpec::new("tok").token("tok-secret").allow(egress))
        .yaml(&dir.join("audit.jsonl"));
    std::fs::write(dir.join("proxy.yaml"), yaml).unwrap();
}

fn start(dir: &Path, egress: &str) -> Proxy {
    std::fs::write(dir.join("admin.token"), ADMIN_TOKEN).unwrap();
    write_config(dir, egress);
    Proxy::start_with(dir.join("proxy.yaml"), dir.join("audit.jsonl"), &[])
}

/// A tunnel through `p` to the origin as `api.test`, with one request answered through it
/// (the tunnel then stays open: the origin keeps the connection alive).
fn tunnel(p: &Proxy, origin: &Origin) -> TcpStream {
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let target = format!("api.test:{}", origin.addr.port());
    connect_on(&mut s, &target, Some(&basic("tok", "tok-secret")));
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    let head = String::from_utf8_lossy(&read_head(&mut s)).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// An origin that answers each connection's first request with the head of a body it never
/// sends, and holds the connection open; its port.
fn holding_origin() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut s in l.incoming().flatten() {
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n");
            held.push(s);
        }
    });
    port
}

/// A tunnel through `p` to the holding origin on `port`, as `api.test`, its request answered
/// by a head: open until cut.
fn held_tunnel(p: &Proxy, port: u16) -> TcpStream {
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_on(
        &mut s,
        &format!("api.test:{port}"),
        Some(&basic("tok", "tok-secret")),
    );
    s.write_all(b"GET /held HTTP/1.1\r\nHost: api.test\r\n\r\n")
        .unwrap();
    let head = String::from_utf8_lossy(&read_head(&mut s)).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// The listening sockets on `port` (`ss`), and the names of the process's threads.
fn sockets_and_threads(p: &Proxy) -> (usize, Vec<String>) {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{}", p.proxy.port())])
        .output()
        .expect("ss (iproute2) runs");
    let sockets = String::from_utf8_lossy(&out.stdout).lines().count();
    let tasks = format!("/proc/{}/task", p.child.id());
    let mut names: Vec<String> = std::fs::read_dir(tasks)
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with("egress-data-"))
        .collect();
    names.sort();
    (sockets, names)
}

#[test]
fn every_socket_of_the_group_accepts_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), "api.test:*");
    let (sockets, names) = sockets_and_threads(&p);
    assert_eq!(sockets, THREADS, "one listening socket a thread");
    assert_eq!(names, ["egress-data-0", "egress-data-1", "egress-data-2"]);
    // The kernel spreads connections over the group by source port: 48 of them reach every
    // socket but with odds of about one in 10^8, and each must be answered.
    let tunnels: Vec<TcpStream> = (0..48).map(|_| tunnel(&p, &origin)).collect();
    drop(tunnels);
    let ends = eventually(Duration::from_secs(15), "48 end records", || {
        let n = p
            .audit_records()
            .iter()
            .filter(|r| r["event"] == "end" && r["target_host"] == "api.test")
            .filter(|r| r["mode"] != "http")
            .count();
        (n == 48).then_some(n)
    });
    assert_eq!(ends, 48);
}

#[test]
fn a_revoking_reload_cuts_the_tunnels_of_every_thread() {
    let dir = tempfile::tempdir().unwrap();
    let port = holding_origin();
    let p = start(dir.path(), "api.test:*");
    let mut tunnels: Vec<TcpStream> = (0..24).map(|_| held_tunnel(&p, port)).collect();
    // Every tunnel is open (and recorded) before the reload.
    eventually(Duration::from_secs(15), "24 open records", || {
        let records = p.audit_records();
        let open = records
            .iter()
            .filter(|r| r["event"] == "open")
            .filter(|r| r["mode"] != "http")
            .count();
        (open == 24).then_some(())
    });
    write_config(dir.path(), "other.test:*");
    let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    for s in &mut tunnels {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        let ended = match s.read(&mut b) {
            Ok(0) => true,
            Ok(n) => panic!("{n} bytes came after the cut"),
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        assert!(ended, "a tunnel outlived the reload that revoked it");
    }
    let revoked = eventually(Duration::from_secs(15), "24 revoked records", || {
        let records = p.audit_records();
        let ended: Vec<_> = records
            .iter()
            .filter(|r| r["event"] == "end" && r["target_host"] == "api.test")
            .filter(|r| r["mode"] != "http")
            .collect();
        (ended.len() == 24).then_some(ended.iter().filter(|r| r["close"] == "revoked").count())
    });
    assert_eq!(revoked, 24, "every tunnel recorded as revoked");
    // The new policy is enforced on every thread too: a new tunnel to the old host is refused.
    for _ in 0..12 {
        let mut s = TcpStream::connect(p.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let target = format!("api.test:{port}");
        write!(
            s,
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {}\r\n\r\n",
            basic("tok", "tok-secret")
        )
        .unwrap();
        let head = String::from_utf8_lossy(&read_head(&mut s)).to_string();
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    }
}

#[test]
fn the_transparent_listener_admits_a_source_once_for_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let p = ProxyConfig::new()
        .listen("transparent")
        .listen_at("threads", "4")
        .raw("admission: { accepts_per_second_per_source: 1, accept_burst_per_source: 2, unidentified_per_source: 1000 }")
        .sandbox(SandboxSpec::new("elsewhere").source("10.9.9.9/32").allow("ok.test"))
        .start(dir.path());
    let at = p.transparent.unwrap();
    let began = Instant::now();
    let conns: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(at).unwrap()).collect();
    let series = r#"egress_admission_refused_total{listener="transparent",why="rate"}"#;
    // Every connection is answered: refused at admission, or admitted and then refused (no
    // sandbox has this source); each is closed by the proxy.
    for mut s in conns {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 16];
        assert!(
            !matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a connection was left open"
        );
    }
    let elapsed = began.elapsed().as_secs_f64();
    let refused = p.metric(series).unwrap_or(0.0) as usize;
    let admitted = 40 - refused;
    // One table: the burst of 2 and one more a second. A table a thread would admit up to
    // four bursts.
    let most = 2 + elapsed.ceil() as usize;
    assert!(
        admitted <= most,
        "{admitted} of 40 admitted in {elapsed:.2} s: the burst of 2 was granted per thread"
    );
}

#[test]
fn a_shutdown_stops_a_process_with_data_threads() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let mut p = start(dir.path(), "api.test:*");
    drop(tunnel(&p, &origin));
    assert!(p.terminate().success(), "{}", p.stderr_text());
}
