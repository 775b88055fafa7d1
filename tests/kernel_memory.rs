//! What stalled tunnels pin in kernel memory: 50 CONNECT tunnels of one sandbox download
//! `/big` while their clients read nothing. The kernel's own accounting (`ss -tm`, the
//! `skmem` of the proxy's sockets) says how much the proxy holds: queued to send to the
//! clients, and received from the origin but not yet relayed. With
//! `limits.socket_buffer_bytes` (the default, 256 KiB; 128 KiB here) that is bounded per
//! tunnel; with `0` (the kernel's autotuning) the same tunnels hold several times more — the
//! measurement can tell the two apart.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;

const TUNNELS: usize = 50;
const CAP: u64 = 128 * 1024;

fn start(dir: &std::path::Path, buffer: u64) -> Proxy {
    ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("big.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("require_tls_ports", "[]")
        .defaults("limits", &format!("{{ socket_buffer_bytes: {buffer} }}"))
        .sandbox(
            SandboxSpec::new("sb")
                .source("127.0.0.0/8")
                .allow("big.test:*"),
        )
        .start(dir)
}

/// Sum of one `skmem` field over the sockets `ss` selects with `filter`.
fn skmem_sum(filter: &str, field: &str) -> u64 {
    let out = std::process::Command::new("ss")
        .args(["-tmnH", "state", "established"])
        .arg(filter)
        .output()
        .expect("ss (iproute2) must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut sum = 0;
    for part in text.split("skmem:(").skip(1) {
        let inner = part.split(')').next().unwrap_or("");
        for kv in inner.split(',') {
            let (name, value): (String, String) = kv.chars().partition(|c| c.is_ascii_alphabetic());
            if name == field {
                sum += value.parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

/// What the proxy holds for its stalled tunnels, once it stops growing: bytes queued to send
/// to the clients (`w` of its sockets on the proxy port) plus bytes received from the origin
/// and not yet read (`r` of its sockets towards the origin).
fn pinned(proxy: SocketAddr, origin: SocketAddr) -> u64 {
    let measure = || {
        skmem_sum(&format!("( sport = :{} )", proxy.port()), "w")
            + skmem_sum(&format!("( dport = :{} )", origin.port()), "r")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = measure();
    loop {
        std::thread::sleep(Duration::from_millis(700));
        let now = measure();
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn stalled_total(buffer: u64) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), buffer);
    let held: Vec<_> = (0..TUNNELS)
        .map(|_| stalled_download(p.proxy, &origin, None))
        .collect();
    let total = pinned(p.proxy, origin.addr);
    drop(held);
    total
}

#[test]
fn stalled_tunnels_pin_at_most_their_socket_buffers() {
    let capped = stalled_total(CAP);
    // Per tunnel: the client socket's send buffer and the origin socket's receive buffer, each
    // at most twice the cap (the kernel doubles SO_SNDBUF/SO_RCVBUF for its bookkeeping).
    let budget = TUNNELS as u64 * 2 * (2 * CAP);
    assert!(
        capped <= budget,
        "{TUNNELS} stalled tunnels pin {capped} bytes, over the budget of {budget}"
    );
    let autotuned = stalled_total(0);
    eprintln!("pinned by {TUNNELS} stalled tunnels: capped {capped} B, autotuned {autotuned} B");
    assert!(
        autotuned > budget,
        "without the cap the same tunnels pin only {autotuned} bytes: the measurement cannot tell"
    );
}
