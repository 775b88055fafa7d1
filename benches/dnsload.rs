//! A DNS load generator (UDP): `concurrency` clients, each with one query in flight, for
//! `seconds`; prints queries per second, latency percentiles and response codes as one JSON
//! line. Used by `benches/dns_compare.sh` against the DNS listener and a local resolver.
//!
//! ```text
//! cargo bench --bench dnsload -- --server 127.0.0.1:15053 --name api.example.test \
//!     [--qtype 1] [--random-prefix] [--concurrency 32] [--seconds 5]
//! ```
//! `--random-prefix` asks `<random>.<name>` each time (nothing cacheable: the path of a
//! refused exfiltration attempt).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

struct Args {
    server: SocketAddr,
    name: String,
    qtype: u16,
    random_prefix: bool,
    concurrency: usize,
    seconds: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        server: "127.0.0.1:15053".parse().expect("default address"),
        name: "example.test".into(),
        qtype: 1,
        random_prefix: false,
        concurrency: 32,
        seconds: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_default();
        match k.as_str() {
            "--server" => a.server = v().parse().expect("--server ip:port"),
            "--name" => a.name = v(),
            "--qtype" => a.qtype = v().parse().expect("--qtype number"),
            "--random-prefix" => a.random_prefix = true,
            "--concurrency" => a.concurrency = v().parse().expect("--concurrency number"),
            "--seconds" => a.seconds = v().parse().expect("--seconds number"),
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    a
}

fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    q
}

#[derive(Default)]
struct Counts {
    rcodes: [AtomicU64; 16],
    timeouts: AtomicU64,
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args));
}

async fn run(args: Args) {
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..args.concurrency {
        let counts = counts.clone();
        let name = args.name.clone();
        let (server, qtype, random) = (args.server, args.qtype, args.random_prefix);
        tasks.push(tokio::spawn(async move {
            let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
            sock.connect(server).await.expect("connect");
            let mut lat = Vec::with_capacity(100_000);
            let mut id: u16 = (worker as u16).wrapping_mul(7919);
            let mut seq: u64 = 0;
            let mut buf = [0u8; 1500];
            while Instant::now() < deadline {
                id = id.wrapping_add(1);
                seq += 1;
                let asked = if random {
                    format!("w{worker}x{seq}.{name}")
                } else {
                    name.clone()
                };
                let q = query(id, &asked, qtype);
                let t = Instant::now();
                if sock.send(&q).await.is_err() {
                    continue;
                }
                loop {
                    match tokio::time::timeout(Duration::from_secs(1), sock.recv(&mut buf)).await {
                        Ok(Ok(n)) if n >= 4 && buf[..2] == id.to_be_bytes() => {
                            lat.push(t.elapsed().as_micros() as u32);
                            counts.rcodes[(buf[3] & 0x0f) as usize].fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(Ok(_)) => continue, // a late answer to an earlier query
                        _ => {
                            counts.timeouts.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let rc = |i: usize| counts.rcodes[i].load(Ordering::Relaxed);
    println!(
        "{{\"server\":\"{}\",\"name\":\"{}\",\"random_prefix\":{},\"concurrency\":{},\"qps\":{:.0},\"p50_us\":{},\"p99_us\":{},\"noerror\":{},\"nxdomain\":{},\"refused\":{},\"servfail\":{},\"timeouts\":{}}}",
        args.server,
        args.name,
        args.random_prefix,
        args.concurrency,
        all.len() as f64 / secs,
        percentile(&all, 0.50),
        percentile(&all, 0.99),
        rc(0),
        rc(3),
        rc(5),
        rc(2),
        counts.timeouts.load(Ordering::Relaxed),
    );
}
