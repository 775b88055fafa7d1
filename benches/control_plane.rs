//! Control-plane benchmark (the fleet-scale issue's budgets): how fast the proxy restarts with
//! N registered sandboxes, how much memory each costs, how many `PUT /v1/sandboxes/{id}` per
//! second one keep-alive client gets with N already registered, what a PUT storm does to
//! CONNECT latency, and how fast a `DELETE` cuts thousands of open tunnels.
//!
//! ```text
//! cargo build --release && cargo bench --bench control_plane -- --registered 10000 --puts 200 --reloads 5
//! # state_dir writes flushed together every 50 ms instead of fsynced one by one:
//! cargo bench --bench control_plane -- --registered 50000 --puts 5000 --state-sync-ms 50
//! # CONNECT p50/p99 quiet vs during 1,000 PUT/s (two rounds of 10 s each):
//! cargo bench --bench control_plane -- --registered 50000 --puts 0 --storm 1000 --storm-seconds 10
//! # open 10,000 tunnels of one registered sandbox, DELETE it, time the resets (needs
//! # `ulimit -n` above 40,000 — as root: ulimit -Hn 100000; ulimit -n 100000):
//! cargo bench --bench control_plane -- --registered 0 --puts 0 --cut 10000
//! ```
//! It starts `target/release/egress-proxy` itself (a temporary config with an admin token and
//! a `state_dir` whose log holds N registrations with 4-entry policies), waits until it listens, reads
//! the proxy's RSS, then sends PUTs of new 4-entry sandboxes on one keep-alive connection, then
//! `--reloads` times edits one file-defined sandbox and `POST /v1/reload`s (median time).
//! The state directory is under `TMPDIR` (set `TMPDIR=/dev/shm` to take the disk out).
//! One JSON line of results on stdout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

mod common;
use common::*;

fn binding(i: usize) -> String {
    let digest = hex::encode(Sha256::digest(format!("token-{i}").as_bytes()));
    format!(
        r#"{{"auth": {{"token_sha256": "{digest}"}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["api.example.com", "*.github.com", "10.0.0.0/8:5432", "h{i}.example.org"]}}}}}}"#
    )
}

/// One request on a keep-alive connection; returns the status.
fn request(s: &mut BufReader<TcpStream>, method: &str, path: &str, body: &str, token: &str) -> u16 {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.get_mut().write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let mut status_line = String::new();
    if s.read_line(&mut status_line).is_err() {
        return 0;
    }
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).is_err() || line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut rest = vec![0u8; length];
    let _ = s.read_exact(&mut rest);
    status
}

fn main() {
    let registered = arg("--registered", 10_000);
    let puts = arg("--puts", 200);
    let reloads = arg("--reloads", 0);
    let sync_ms = arg("--state-sync-ms", 0);
    let storm = arg("--storm", 0);
    let storm_seconds = arg("--storm-seconds", 10) as u64;
    let cut = arg("--cut", 0);
    // The bench's own descriptors (tunnels: client and origin ends) and the proxy's.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let dir = tempfile::tempdir().expect("temporary directory");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    // The state a proxy leaves: its registration log, one put line per sandbox.
    let mut log = String::new();
    for i in 0..registered {
        log.push_str(&format!(
            "{{\"op\":\"put\",\"id\":\"sb-{i}\",\"binding\":{}}}\n",
            binding(i)
        ));
    }
    std::fs::write(state.join("registrations.jsonl"), log).expect("state log");
    let token = "control-plane-bench-token";
    std::fs::write(dir.path().join("admin.token"), token).expect("token");
    let config = dir.path().join("proxy.yaml");
    let write_config = |host: &str| {
        std::fs::write(
            &config,
            format!(
                "listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0, default_sandbox: probe }}\n\
                 audit: {{ path: /dev/null }}\nadmin_token_file: {}\nstate_dir: {}\n\
                 runtime: {{ state_sync_ms: {sync_ms}, max_sandboxes: 1000000 }}\n\
                 max_connections: 100000\n\
                 admission: {{ unidentified_per_source: 100000, unidentified_total: 100000, accepts_per_second_per_source: 1000000, accept_burst_per_source: 1000000 }}\n\
                 defaults: {{ guard_allow_ranges: [127.0.0.1/32] }}\n\
                 sandboxes:\n\
                 \x20 - {{ id: edited, policy: {{ provider: local, config: {{}}, network: {{ egress: [{host}] }} }} }}\n\
                 \x20 - {{ id: probe, limits: {LOOSE}, policy: {{ provider: local, config: {{}}, network: {{ egress: [\"127.0.0.1:*\"] }} }} }}\n",
                dir.path().join("admin.token").display(),
                state.display()
            ),
        )
        .expect("config");
    };
    write_config("a.example.com");
    let started = Instant::now();
    let Started {
        mut child,
        proxy,
        admin,
    } = start_proxy(Path::new("target/release/egress-proxy"), &config, &[]);
    let ready = started.elapsed();
    let (Some(admin), Some(proxy)) = (admin, proxy) else {
        eprintln!("the proxy did not start");
        let _ = child.kill();
        std::process::exit(1);
    };
    std::thread::sleep(Duration::from_millis(300));
    let rss = rss_kib(child.id());
    let stream = TcpStream::connect(admin).expect("admin");
    let _ = stream.set_nodelay(true);
    let mut s = BufReader::new(stream);
    let t = Instant::now();
    let mut ok = 0;
    for i in 0..puts {
        let id = registered + i;
        let status = request(
            &mut s,
            "PUT",
            &format!("/v1/sandboxes/sb-{id}"),
            &binding(id),
            token,
        );
        if i == 0 && status != 201 {
            eprintln!("first PUT answered {status}");
        }
        if status == 201 {
            ok += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let mut reload_ms = Vec::new();
    for i in 0..reloads {
        write_config(&format!("r{i}.example.com"));
        let t = Instant::now();
        let status = request(&mut s, "POST", "/v1/reload", "", token);
        if status != 200 {
            eprintln!("reload answered {status}");
        }
        reload_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    reload_ms.sort_by(f64::total_cmp);
    let origin = Origin::start();
    let next_id = std::sync::atomic::AtomicUsize::new(registered + puts);
    let storm_rounds: Vec<serde_json::Value> = if storm > 0 {
        (0..2)
            .map(|_| storm_round(proxy, admin, &origin, token, storm, storm_seconds, &next_id))
            .collect()
    } else {
        Vec::new()
    };
    let cut_result = (cut > 0).then(|| cut_tunnels(proxy, admin, &origin, token, cut));
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "{}",
        serde_json::json!({
            "registered": registered,
            "ready_s": (ready.as_secs_f64() * 1000.0).round() / 1000.0,
            "rss_kib": rss,
            "kib_per_sandbox": if registered > 0 { ((rss as f64 / registered as f64) * 100.0).round() / 100.0 } else { 0.0 },
            "puts": puts,
            "puts_ok": ok,
            "puts_per_sec": (puts as f64 / secs).round(),
            "reloads": reloads,
            "reload_median_ms": reload_ms.get(reload_ms.len() / 2).map(|m| m.round()),
            "state_sync_ms": sync_ms,
            "storm": storm_rounds,
            "cut": cut_result,
        })
    );
}

/// Limits loose enough that the bench measures the control plane, not the rate limiter.
const LOOSE: &str = "{ max_connections: 100000, connections_per_second: 1000000, burst: 1000000 }";

/// A loopback origin: every connection echoes one byte; then it is dropped, or held (for the
/// cut measurement) while `hold` is set.
struct Origin {
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Origin {
    fn start() -> Origin {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("origin");
        let addr = listener.local_addr().expect("origin address");
        let hold = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (h, v) = (hold.clone(), held.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("origin runtime");
            rt.block_on(async move {
                let _ = listener.set_nonblocking(true);
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                while let Ok((mut s, _)) = listener.accept().await {
                    let (h, v) = (h.clone(), v.clone());
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut b = [0u8; 1];
                        if s.read_exact(&mut b).await.is_err() || s.write_all(&b).await.is_err() {
                            return;
                        }
                        if h.load(Ordering::Relaxed) {
                            if let Ok(std) = s.into_std() {
                                if let Ok(mut v) = v.lock() {
                                    v.push(std);
                                }
                            }
                        } else {
                            let mut rest = [0u8; 64];
                            while matches!(s.read(&mut rest).await, Ok(n) if n > 0) {}
                        }
                    });
                }
            });
        });
        Origin { addr, hold, held }
    }
}

/// CONNECT to `origin` through `proxy` and prove the tunnel with a one-byte echo.
fn open_tunnel(
    proxy: SocketAddr,
    origin: SocketAddr,
    auth: Option<&str>,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(proxy)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = auth
        .map(|a| format!("Proxy-Authorization: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n{auth}\r\n").as_bytes())?;
    let mut head = Vec::with_capacity(128);
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 || head.len() > 8192 {
            return Err(std::io::Error::other("proxy closed during CONNECT"));
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&head).into_owned(),
        ));
    }
    s.write_all(b"x")?;
    s.read_exact(&mut b)?;
    Ok(s)
}

/// p50/p99 (µs) of connect → CONNECT → echoed byte, `threads` clients for `seconds`.
fn connect_latency(proxy: SocketAddr, origin: SocketAddr, seconds: u64) -> (f64, f64, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if open_tunnel(proxy, origin, None).is_ok() {
                        v.push(t.elapsed());
                    }
                }
                v
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Duration> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap_or_default())
        .collect();
    all.sort_unstable();
    let q = |f: f64| {
        all.get(((all.len() as f64 * f) as usize).min(all.len().saturating_sub(1)))
            .map(|d| (d.as_secs_f64() * 1e6).round())
            .unwrap_or(0.0)
    };
    (q(0.5), q(0.99), all.len())
}

/// One round: CONNECT latency quiet, then during `rate` PUT/s of new sandboxes.
fn storm_round(
    proxy: SocketAddr,
    admin: SocketAddr,
    origin: &Origin,
    token: &str,
    rate: usize,
    seconds: u64,
    next_id: &std::sync::atomic::AtomicUsize,
) -> serde_json::Value {
    let (quiet_p50, quiet_p99, quiet_n) = connect_latency(proxy, origin.addr, seconds);
    let stop = Arc::new(AtomicBool::new(false));
    let first = next_id.fetch_add(rate * (seconds as usize + 2), Ordering::Relaxed);
    let storm = {
        let (stop, token) = (stop.clone(), token.to_string());
        std::thread::spawn(move || {
            let Ok(stream) = TcpStream::connect(admin) else {
                return (0usize, 0.0);
            };
            let _ = stream.set_nodelay(true);
            let mut s = BufReader::new(stream);
            let t0 = Instant::now();
            let mut sent = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // Paced: the n-th PUT leaves at n / rate seconds.
                let due = t0 + Duration::from_secs_f64(sent as f64 / rate as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let id = first + sent;
                request(
                    &mut s,
                    "PUT",
                    &format!("/v1/sandboxes/sb-{id}"),
                    &binding(id),
                    &token,
                );
                sent += 1;
            }
            (sent, sent as f64 / t0.elapsed().as_secs_f64())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let (storm_p50, storm_p99, storm_n) = connect_latency(proxy, origin.addr, seconds);
    stop.store(true, Ordering::Relaxed);
    let (puts, put_rate) = storm.join().unwrap_or((0, 0.0));
    serde_json::json!({
        "quiet_p50_us": quiet_p50, "quiet_p99_us": quiet_p99, "quiet_samples": quiet_n,
        "storm_p50_us": storm_p50, "storm_p99_us": storm_p99, "storm_samples": storm_n,
        "storm_puts": puts, "storm_puts_per_sec": put_rate.round(),
        "p99_ratio": if quiet_p99 > 0.0 { (storm_p99 / quiet_p99 * 100.0).round() / 100.0 } else { 0.0 },
    })
}

/// Register sandbox `victim`, open `n` of its tunnels, `DELETE` it and time until every
/// client and every origin socket has seen the reset (the last byte either peer can get).
fn cut_tunnels(
    proxy: SocketAddr,
    admin: SocketAddr,
    origin: &Origin,
    token: &str,
    n: usize,
) -> serde_json::Value {
    let digest = hex::encode(Sha256::digest(b"victim-secret"));
    let body = format!(
        r#"{{"auth": {{"token_sha256": "{digest}"}}, "limits": {LOOSE_JSON}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["127.0.0.1:*"]}}}}}}"#
    );
    let Ok(stream) = TcpStream::connect(admin) else {
        return serde_json::json!({ "error": "admin" });
    };
    let mut s = BufReader::new(stream);
    let status = request(&mut s, "PUT", "/v1/sandboxes/victim", &body, token);
    if status != 201 && status != 200 {
        return serde_json::json!({ "error": format!("PUT victim answered {status}") });
    }
    let auth = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "victim:victim-secret"
        )
    );
    origin.hold.store(true, Ordering::Relaxed);
    let mut clients = Vec::with_capacity(n);
    let mut errors = 0;
    let mut last_error = String::new();
    for _ in 0..n {
        match open_tunnel(proxy, origin.addr, Some(&auth)) {
            Ok(c) => clients.push(c),
            Err(e) => {
                errors += 1;
                last_error = e.to_string();
            }
        }
    }
    // Every origin end accepted and echoed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while origin.held.lock().map(|v| v.len()).unwrap_or(0) < clients.len()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let origins: Vec<TcpStream> = origin
        .held
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default();
    origin.hold.store(false, Ordering::Relaxed);
    let mut ends: Vec<(TcpStream, Option<Duration>)> = clients
        .into_iter()
        .chain(origins)
        .map(|e| {
            let _ = e.set_nonblocking(true);
            (e, None)
        })
        .collect();
    // The DELETE runs on its own thread: the sweep below watches the ends from the moment it
    // is sent, not from its answer.
    let t0 = Instant::now();
    let delete = {
        let token = token.to_string();
        std::thread::spawn(move || {
            let status = request(&mut s, "DELETE", "/v1/sandboxes/victim", "", &token);
            (status, t0.elapsed())
        })
    };
    let mut buf = [0u8; 4096];
    let mut open = ends.len();
    while open > 0 && t0.elapsed() < Duration::from_secs(30) {
        for (e, cut_at) in ends.iter_mut().filter(|(_, c)| c.is_none()) {
            loop {
                match e.read(&mut buf) {
                    Ok(0) => {}
                    Ok(_) => continue,
                    Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {}
                }
                // End of stream or reset: this end is cut.
                *cut_at = Some(t0.elapsed());
                open -= 1;
                break;
            }
        }
    }
    let (status, answered) = delete.join().unwrap_or((0, Duration::ZERO));
    let mut times: Vec<f64> = ends
        .iter()
        .filter_map(|(_, c)| c.map(|d| d.as_secs_f64() * 1000.0))
        .collect();
    times.sort_by(f64::total_cmp);
    let q = |f: f64| {
        times
            .get(((times.len() as f64 * f) as usize).min(times.len().saturating_sub(1)))
            .map(|m| (m * 10.0).round() / 10.0)
    };
    serde_json::json!({
        "tunnels": ends.len() / 2, "open_errors": errors, "last_open_error": last_error,
        "delete_status": status, "delete_answered_ms": (answered.as_secs_f64() * 1e4).round() / 10.0,
        "ends_cut": times.len(), "ends_still_open": open,
        "cut_p50_ms": q(0.5), "cut_max_ms": times.last().map(|m| (m * 10.0).round() / 10.0),
    })
}

const LOOSE_JSON: &str =
    r#"{"max_connections": 100000, "connections_per_second": 1000000, "burst": 1000000}"#;
