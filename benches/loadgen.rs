//! Load generator for egress-proxy and the proxies it is compared with. It runs its own
//! loopback origin (echo, or an endless source for bulk) and drives it directly or through an
//! HTTP CONNECT proxy (or, with `--socks5`, a SOCKS5 one: no authentication, an IPv4 CONNECT).
//! One JSON line of results per run, on stdout.
//!
//! ```text
//! cargo bench --bench loadgen -- rate    --proxy 127.0.0.1:3128 --concurrency 32 --seconds 5
//! cargo bench --bench loadgen -- bulk    --proxy direct        --tunnels 4     --seconds 5
//! cargo bench --bench loadgen -- latency --proxy 127.0.0.1:3128 --concurrency 8 --seconds 5
//! cargo bench --bench loadgen -- idle    --proxy 127.0.0.1:3128 --tunnels 10000 --pid 1234
//! ```
//! rate: CONNECT, one 1-byte echo round trip, close — connections per second (`--hello`: the
//! tunnel starts with a real TLS ClientHello instead, which a verifying proxy parses).
//! bulk: N tunnels each reading an endless stream — Gbit/s delivered to the client.
//! latency: p50/p99 of connect → CONNECT → first echoed byte; closed loop, or paced at
//! `--rate N` connections per second in all (the same load for every proxy compared).
//! idle: open N tunnels (each proven with an echo) and report the proxy's RSS growth per tunnel.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Args {
    mode: String,
    proxy: Option<SocketAddr>,
    concurrency: usize,
    tunnels: usize,
    seconds: u64,
    pid: Option<u32>,
    auth: Option<String>,
    /// Use an origin run by another `loadgen origin` process (descriptor limits).
    origin: Option<SocketAddr>,
    /// Open each tunnel with a real TLS ClientHello (captured from curl) instead of one byte:
    /// the TLS-shaped workload, which a verifying proxy must parse.
    hello: bool,
    /// `latency`: connections per second in all, spread over the concurrent tasks (0: as
    /// fast as each answers).
    rate: u64,
    /// Speak SOCKS5 to the proxy instead of HTTP CONNECT.
    socks5: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        mode: String::new(),
        proxy: None,
        concurrency: 32,
        tunnels: 4,
        seconds: 5,
        pid: None,
        auth: None,
        origin: None,
        hello: false,
        rate: 0,
        socks5: false,
    };
    let mut it = std::env::args().skip(1).filter(|s| s != "--bench");
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--proxy" => {
                let v = it.next().unwrap_or_default();
                a.proxy = if v == "direct" { None } else { v.parse().ok() };
            }
            "--concurrency" => a.concurrency = it.next().and_then(|v| v.parse().ok()).unwrap_or(32),
            "--tunnels" => a.tunnels = it.next().and_then(|v| v.parse().ok()).unwrap_or(4),
            "--seconds" => a.seconds = it.next().and_then(|v| v.parse().ok()).unwrap_or(5),
            "--pid" => a.pid = it.next().and_then(|v| v.parse().ok()),
            "--auth" => a.auth = it.next(),
            "--origin" => a.origin = it.next().and_then(|v| v.parse().ok()),
            "--hello" => a.hello = true,
            "--socks5" => a.socks5 = true,
            "--rate" => a.rate = it.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            m if !m.starts_with('-') && a.mode.is_empty() => a.mode = m.to_string(),
            _ => {}
        }
    }
    a
}

/// The origin: first byte `e` → echo everything; `s` → send an endless stream.
async fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let addr = l.local_addr().expect("origin addr");
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if s.read_exact(&mut first).await.is_err() {
                    return;
                }
                if first[0] == b's' {
                    let chunk = vec![0u8; 256 * 1024];
                    while s.write_all(&chunk).await.is_ok() {}
                } else {
                    if s.write_all(&first).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// `--socks5`: the proxy speaks SOCKS5 (set once, before any connection).
static SOCKS5: AtomicBool = AtomicBool::new(false);

/// Through a SOCKS5 proxy: no authentication (the sandbox is known by the source address),
/// CONNECT to the origin's IPv4 address, success expected.
async fn open_socks5(s: &mut TcpStream, origin: SocketAddr) -> std::io::Result<()> {
    let std::net::IpAddr::V4(ip) = origin.ip() else {
        return Err(std::io::Error::other("--socks5 needs an IPv4 origin"));
    };
    let mut req = vec![5, 1, 0, 5, 1, 0, 1];
    req.extend_from_slice(&ip.octets());
    req.extend_from_slice(&origin.port().to_be_bytes());
    // Greeting and request in one write; the server answers both in order.
    s.write_all(&req).await?;
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer).await?;
    if answer[..2] != [5, 0] || answer[2..4] != [5, 0] {
        return Err(std::io::Error::other(format!("SOCKS5 refused: {answer:?}")));
    }
    Ok(())
}

/// Connect to `origin`, through `proxy` with CONNECT when given.
async fn open(
    proxy: Option<SocketAddr>,
    origin: SocketAddr,
    auth: Option<&str>,
) -> std::io::Result<TcpStream> {
    let Some(p) = proxy else {
        let s = TcpStream::connect(origin).await?;
        s.set_nodelay(true)?;
        return Ok(s);
    };
    let mut s = TcpStream::connect(p).await?;
    s.set_nodelay(true)?;
    if SOCKS5.load(Ordering::Relaxed) {
        open_socks5(&mut s, origin).await?;
        return Ok(s);
    }
    let auth = auth
        .map(|a| format!("Proxy-Authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await?;
    let head = connect_head(&mut s).await?;
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&head[..head.len().min(40)]).into_owned(),
        ));
    }
    Ok(s)
}

/// Read the proxy's answer to CONNECT, and nothing of the tunnel: peek until the head's end
/// is there, then read exactly the head. (Byte by byte, as this once did, cost the load
/// generator one `recvfrom` per byte of the answer: more CPU for a proxy with a longer
/// answer, on the machine it shares with the proxy.)
async fn connect_head(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 8192];
    loop {
        // Waits for bytes when none are there (a peek that finds none clears readiness).
        let n = s.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("proxy closed during CONNECT"));
        }
        let seen = head.len();
        head.extend_from_slice(&buf[..n]);
        let from = seen.saturating_sub(3);
        let end = head[from..].windows(4).position(|w| w == b"\r\n\r\n");
        let take = match end {
            Some(at) => from + at + 4 - seen,
            None => n,
        };
        s.read_exact(&mut buf[..take]).await?;
        if end.is_some() {
            head.truncate(seen + take);
            return Ok(head);
        }
        if head.len() > 8192 {
            return Err(std::io::Error::other("CONNECT answer head over 8 KiB"));
        }
    }
}

/// A TLS 1.3 ClientHello from curl (SNI api.example.com).
const HELLO: &[u8] = include_bytes!("../tests/data/hello-curl.bin");

/// Send the first bytes of a tunnel (one byte `e`, or a ClientHello with `--hello`) and read
/// the echo of the first one.
async fn echo_once(s: &mut TcpStream, hello: bool) -> std::io::Result<()> {
    s.write_all(if hello { HELLO } else { b"e" }).await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    Ok(())
}

async fn rate(a: &Args, origin: SocketAddr) -> serde_json::Value {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let hello = a.hello;
        let (done, errors, stop, proxy, auth) = (
            done.clone(),
            errors.clone(),
            stop.clone(),
            a.proxy,
            a.auth.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = async {
                    let mut s = open(proxy, origin, auth.as_deref()).await?;
                    echo_once(&mut s, hello).await
                }
                .await;
                match r {
                    Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    // Warm up one second, then measure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (d0, t0) = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let (d1, t1) = (done.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let per_sec = (d1 - d0) as f64 / (t1 - t0).as_secs_f64();
    // `connections`: every one completed, the warm-up's too (what a profiler of the proxy saw).
    serde_json::json!({ "mode": "rate", "conn_per_sec": per_sec.round(), "connections": done.load(Ordering::Relaxed), "errors": errors.load(Ordering::Relaxed), "concurrency": a.concurrency })
}

async fn bulk(a: &Args, origin: SocketAddr) -> serde_json::Value {
    let bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..a.tunnels {
        let (bytes, stop, proxy, auth) = (bytes.clone(), stop.clone(), a.proxy, a.auth.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut s) = open(proxy, origin, auth.as_deref()).await else {
                return;
            };
            if s.write_all(b"s").await.is_err() {
                return;
            }
            let mut buf = vec![0u8; 256 * 1024];
            while !stop.load(Ordering::Relaxed) {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => bytes.fetch_add(n as u64, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (b0, t0) = (bytes.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let (b1, t1) = (bytes.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    let gbit = (b1 - b0) as f64 * 8.0 / (t1 - t0).as_secs_f64() / 1e9;
    serde_json::json!({ "mode": "bulk", "gbit_per_sec": (gbit * 100.0).round() / 100.0, "tunnels": a.tunnels })
}

async fn latency(a: &Args, origin: SocketAddr) -> serde_json::Value {
    let samples = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let hello = a.hello;
        let (samples, stop, proxy, auth) = (samples.clone(), stop.clone(), a.proxy, a.auth.clone());
        // Paced: each task starts a connection every `every`, on a schedule (a late one is
        // started at once, never skipped).
        let every =
            (a.rate > 0).then(|| Duration::from_secs_f64(a.concurrency as f64 / a.rate as f64));
        tasks.push(tokio::spawn(async move {
            let mut next = tokio::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(every) = every {
                    tokio::time::sleep_until(next).await;
                    next += every;
                }
                let t = Instant::now();
                let ok = async {
                    let mut s = open(proxy, origin, auth.as_deref()).await?;
                    echo_once(&mut s, hello).await
                }
                .await
                .is_ok();
                if ok {
                    if let Ok(mut v) = samples.lock() {
                        v.push(t.elapsed());
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut v = samples.lock().map(|v| v.clone()).unwrap_or_default();
    v.sort_unstable();
    let q = |f: f64| {
        v.get(((v.len() as f64 * f) as usize).min(v.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1e6)
            .unwrap_or(0.0)
    };
    serde_json::json!({ "mode": "latency", "p50_us": q(0.5).round(), "p99_us": q(0.99).round(), "samples": v.len(), "concurrency": a.concurrency })
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn idle(a: &Args, origin: SocketAddr) -> serde_json::Value {
    let before = a.pid.and_then(rss_kib);
    let mut held = Vec::with_capacity(a.tunnels);
    let mut errors = 0;
    for _ in 0..a.tunnels {
        match open(a.proxy, origin, a.auth.as_deref()).await {
            Ok(mut s) => {
                if echo_once(&mut s, a.hello).await.is_ok() {
                    held.push(s);
                } else {
                    errors += 1;
                }
            }
            Err(_) => errors += 1,
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = a.pid.and_then(rss_kib);
    let per = match (before, after) {
        (Some(b), Some(x)) if !held.is_empty() => {
            Some(((x as f64 - b as f64) / held.len() as f64 * 100.0).round() / 100.0)
        }
        _ => None,
    };
    serde_json::json!({ "mode": "idle", "tunnels": held.len(), "errors": errors, "rss_before_kib": before, "rss_after_kib": after, "kib_per_tunnel": per })
}

fn main() {
    let a = parse_args();
    if a.mode.is_empty() {
        eprintln!("usage: loadgen rate|bulk|latency|idle [--proxy ADDR|direct] [--socks5] [--concurrency N] [--tunnels N] [--seconds S] [--pid PID] [--auth VALUE]");
        return;
    }
    SOCKS5.store(a.socks5, Ordering::Relaxed);
    // Ten thousand tunnels need twenty thousand descriptors here (client and origin ends).
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return;
        }
    };
    let out = rt.block_on(async {
        let o = match a.origin {
            Some(o) => o,
            None => origin().await,
        };
        match a.mode.as_str() {
            "origin" => {
                // Serve until killed; print the address first.
                println!("{}", serde_json::json!({ "origin": o.to_string() }));
                std::future::pending::<()>().await;
                serde_json::Value::Null
            }
            "rate" => rate(&a, o).await,
            "bulk" => bulk(&a, o).await,
            "latency" => latency(&a, o).await,
            "idle" => idle(&a, o).await,
            m => serde_json::json!({ "error": format!("unknown mode {m}") }),
        }
    });
    println!("{out}");
    rt.shutdown_timeout(Duration::from_millis(100));
}
