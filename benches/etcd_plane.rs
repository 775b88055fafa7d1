//! Shared control plane benchmark (the etcd issue's budgets), with a real etcd on loopback
//! and real replicas (`target/release/egress-proxy`):
//!
//! - **propagation**: three replicas A, B, C; registrations are PUT through A at `--rate` per
//!   second for `--seconds`, then deleted through A at the same rate. For each write, the
//!   time from sending it to A until B (and C) report a control-plane revision at least the
//!   write's (their `/readyz`, polled every 2 ms) — p50/p99/max. Meanwhile `--tunnels`
//!   sandboxes keep one open CONNECT tunnel each on B and on C; the time from sending their
//!   DELETE to A until each tunnel is reset is reported the same way.
//! - **start**: `--preload N` registrations written to etcd directly (transactions of 100),
//!   then a new replica is started: the time until `/readyz` answers 200, and its RSS.
//!
//! ```text
//! cargo build --release
//! cargo bench --bench etcd_plane -- --rate 1000 --seconds 10 --tunnels 200 --preload 50000
//! ```
//! etcd's data directory is under `TMPDIR` (its fsyncs are etcd's cost, not the proxy's: set
//! `TMPDIR=/dev/shm` to take the disk out and say so when reporting). One JSON line on
//! stdout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

mod common;
use common::*;

const ADMIN_TOKEN: &str = "bench-admin-token";
const PREFIX: &str = "/bench/";

/// A 4-entry policy, token `token-{i}`, that also allows the local sink on `sink_port`.
fn binding(i: usize, sink_port: u16) -> String {
    let digest = hex::encode(Sha256::digest(format!("token-{i}").as_bytes()));
    format!(
        r#"{{"auth": {{"token_sha256": "{digest}"}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["api.example.com", "*.github.com", "127.0.0.1/32:{sink_port}", "h{i}.example.org"]}}}}}}"#
    )
}

struct Etcd {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let peer = free_port();
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "b", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &format!("b={peer}"),
                "--log-level",
                "error",
            ])
            .args(["--quota-backend-bytes", &(4u64 << 30).to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (apt-get install etcd-server)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Etcd {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Replica {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_replica(bin: &Path, etcd_port: u16) -> (Replica, Instant) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).expect("token");
    let config = dir.path().join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0 }}\naudit: {{ path: /dev/null }}\n\
             admin_token_file: admin.token\nmax_connections: 20000\n\
             defaults: {{ guard_allow_ranges: [127.0.0.1/32] }}\nruntime: {{ max_sandboxes: 200000 }}\n\
             control_plane: {{ etcd: {{ endpoints: [\"127.0.0.1:{etcd_port}\"], prefix: {PREFIX} }} }}\n"
        ),
    )
    .expect("config");
    let started = Instant::now();
    let started_proxy = start_proxy(
        bin,
        &config,
        &[("RUST_LOG", "warn,egress_proxy::server=info")],
    );
    let child = started_proxy.child;
    let addr = |a: Option<SocketAddr>| a.expect("address");
    (
        Replica {
            child,
            proxy: addr(started_proxy.proxy),
            admin: addr(started_proxy.admin),
            _dir: dir,
        },
        started,
    )
}

/// One request on a keep-alive connection: (status, body).
fn request(s: &mut BufReader<TcpStream>, method: &str, path: &str, body: &str) -> (u16, String) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.get_mut().write_all(head.as_bytes()).expect("write");
    let mut status_line = String::new();
    s.read_line(&mut status_line).expect("status");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut len = 0;
    loop {
        let mut line = String::new();
        s.read_line(&mut line).expect("header");
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut buf = vec![0; len];
    s.read_exact(&mut buf).expect("body");
    (status, String::from_utf8_lossy(&buf).into_owned())
}

fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    let s = TcpStream::connect(addr).expect("connect");
    let _ = s.set_nodelay(true);
    BufReader::new(s)
}

/// The control-plane revision in a `/readyz` body (0 if not ready).
fn readyz_revision(s: &mut BufReader<TcpStream>) -> i64 {
    let (status, body) = request(s, "GET", "/readyz", "");
    if status != 200 {
        return 0;
    }
    body.rsplit(' ')
        .next()
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    serde_json::json!({
        "n": v.len(),
        "p50_ms": percentile(&v, 0.5),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().copied().unwrap_or(f64::NAN),
    })
}

/// Every (time, revision) a replica reported while `stop` is false.
fn poll_revisions(
    admin: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Instant, i64)>> {
    std::thread::spawn(move || {
        let mut s = connect(admin);
        let mut seen = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let r = readyz_revision(&mut s);
            seen.push((Instant::now(), r));
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    })
}

/// Milliseconds from each write's send time until the replica first reported its revision.
fn delays(writes: &[(Instant, i64)], seen: &[(Instant, i64)]) -> Vec<f64> {
    writes
        .iter()
        .filter_map(|(sent, rev)| {
            seen.iter()
                .find(|(t, r)| r >= rev && t >= sent)
                .map(|(t, _)| t.duration_since(*sent).as_secs_f64() * 1000.0)
        })
        .collect()
}

/// Writes at `rate` per second from several paced threads: (send time, revision) of each.
fn paced_writes(
    admin: SocketAddr,
    ids: std::ops::Range<usize>,
    rate: usize,
    method: &'static str,
    sink_port: u16,
    sent_at: Arc<Mutex<Vec<(usize, Instant)>>>,
) -> Vec<(Instant, i64)> {
    let threads = 8;
    let start = Instant::now() + Duration::from_millis(50);
    let first = ids.start;
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let ids = ids.clone();
            let sent_at = sent_at.clone();
            std::thread::spawn(move || {
                let mut s = connect(admin);
                let mut out = Vec::new();
                for i in ids.filter(|i| i % threads == k) {
                    let due = start + Duration::from_secs_f64((i - first) as f64 / rate as f64);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let body = if method == "PUT" {
                        binding(i, sink_port)
                    } else {
                        String::new()
                    };
                    let sent = Instant::now();
                    sent_at.lock().expect("lock").push((i, sent));
                    let (status, resp) =
                        request(&mut s, method, &format!("/v1/sandboxes/sb{i}"), &body);
                    assert!(
                        status == 200 || status == 201,
                        "{method} sb{i}: {status} {resp}"
                    );
                    let v: serde_json::Value = serde_json::from_str(&resp).expect("json");
                    out.push((sent, v["revision"].as_i64().expect("revision")));
                }
                out
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("writer"))
        .collect()
}

/// Open a CONNECT tunnel as sandbox `i`; a thread waits for it to be cut and returns when.
fn tunnel(proxy: SocketAddr, sink_port: u16, i: usize) -> std::thread::JoinHandle<Instant> {
    let mut s = TcpStream::connect(proxy).expect("proxy");
    let creds = base64_basic(&format!("sb{i}"), &format!("token-{i}"));
    write!(
        s,
        "CONNECT 127.0.0.1:{sink_port} HTTP/1.1\r\nHost: 127.0.0.1:{sink_port}\r\nProxy-Authorization: Basic {creds}\r\n\r\n"
    )
    .expect("connect");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).expect("head");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    })
}

fn base64_basic(user: &str, pass: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
}

/// Write `n` registrations straight into etcd, 100 per transaction.
fn preload(etcd_port: u16, n: usize, sink_port: u16) -> Duration {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([format!("http://127.0.0.1:{etcd_port}")], None)
            .await
            .expect("etcd client");
        let started = Instant::now();
        for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
            let ops: Vec<etcd_client::TxnOp> = chunk
                .iter()
                .map(|i| {
                    etcd_client::TxnOp::put(
                        format!("{PREFIX}sandboxes/pre{i}"),
                        binding(1_000_000 + i, sink_port),
                        None,
                    )
                })
                .collect();
            c.txn(etcd_client::Txn::new().and_then(ops))
                .await
                .expect("txn");
        }
        started.elapsed()
    })
}

fn main() {
    let bin: PathBuf =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/egress-proxy");
    assert!(bin.exists(), "build first: cargo build --release");
    let rate = arg("--rate", 1000);
    let seconds = arg("--seconds", 5);
    let tunnels = arg("--tunnels", 100);
    let preload_n = arg("--preload", 50_000);
    let etcd = Etcd::start();
    let sink = TcpListener::bind("127.0.0.1:0").expect("sink");
    let sink_port = sink.local_addr().expect("sink addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in sink.incoming().map_while(Result::ok) {
            held.push(s);
        }
    });

    let (a, _) = start_replica(&bin, etcd.port);
    let (b, _) = start_replica(&bin, etcd.port);
    let (c, _) = start_replica(&bin, etcd.port);
    for r in [&a, &b, &c] {
        let mut s = connect(r.admin);
        let deadline = Instant::now() + Duration::from_secs(30);
        while readyz_revision(&mut s) == 0 {
            assert!(Instant::now() < deadline, "replica not ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let n = rate * seconds;
    let stop = Arc::new(AtomicBool::new(false));
    let polls_b = poll_revisions(b.admin, stop.clone());
    let polls_c = poll_revisions(c.admin, stop.clone());
    let sent_put = Arc::new(Mutex::new(Vec::new()));
    let puts = paced_writes(a.admin, 0..n, rate, "PUT", sink_port, sent_put);
    // Tunnels on B and C of the first sandboxes, to be cut by the deletes below.
    std::thread::sleep(Duration::from_millis(200));
    let cut: Vec<(usize, std::thread::JoinHandle<Instant>)> = (0..tunnels.min(n))
        .flat_map(|i| {
            [
                (i, tunnel(b.proxy, sink_port, i)),
                (i, tunnel(c.proxy, sink_port, i)),
            ]
        })
        .collect();
    let sent_del = Arc::new(Mutex::new(Vec::new()));
    let deletes = paced_writes(a.admin, 0..n, rate, "DELETE", sink_port, sent_del.clone());
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let seen_b = polls_b.join().expect("poller");
    let seen_c = polls_c.join().expect("poller");
    let sent_del: std::collections::HashMap<usize, Instant> =
        sent_del.lock().expect("lock").iter().copied().collect();
    let cut_ms: Vec<f64> = cut
        .into_iter()
        .map(|(i, h)| {
            let at = h.join().expect("tunnel");
            at.duration_since(sent_del[&i]).as_secs_f64() * 1000.0
        })
        .collect();
    let put_span = puts
        .iter()
        .map(|(t, _)| *t)
        .max()
        .zip(puts.iter().map(|(t, _)| *t).min());
    let achieved = put_span
        .map(|(hi, lo)| n as f64 / hi.duration_since(lo).as_secs_f64().max(1e-9))
        .unwrap_or(0.0);
    let mut prop_put = delays(&puts, &seen_b);
    prop_put.extend(delays(&puts, &seen_c));
    let mut prop_del = delays(&deletes, &seen_b);
    prop_del.extend(delays(&deletes, &seen_c));
    drop((a, b, c));

    // Start with many sandboxes.
    let load = preload(etcd.port, preload_n, sink_port);
    let (late, started) = start_replica(&bin, etcd.port);
    let mut s = connect(late.admin);
    while readyz_revision(&mut s) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = started.elapsed();
    let rss = rss_kib(late.child.id());

    println!(
        "{}",
        serde_json::json!({
            "rate_target": rate,
            "rate_achieved_puts_per_s": (achieved * 10.0).round() / 10.0,
            "writes": n,
            "put_to_enforced_on_b_and_c": summary(prop_put),
            "delete_to_enforced_on_b_and_c": summary(prop_del),
            "delete_to_tunnel_cut_on_b_and_c": summary(cut_ms),
            "preloaded": preload_n,
            "preload_write_s": load.as_secs_f64(),
            "start_to_ready_s": ready.as_secs_f64(),
            "rss_kib_after_ready": rss,
        })
    );
}
