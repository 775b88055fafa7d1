//! What stalled tunnels pin in kernel memory: 50 CONNECT tunnels of one sandbox download
//! `/big` while their clients read nothing. The kernel's own accounting (`ss -tm`, the
//! `skmem` of the proxy's sockets) says how much the proxy holds: queued to send to the
//! clients, and received from the origin but not yet relayed. With
//! `limits.socket_buffer_bytes` (the default, 256 KiB; 128 KiB here) that is bounded per
//! tunnel; with `0` (the kernel's autotuning) the same tunnels hold several times more — the
//! measurement can tell the two apart.
//!
//! A tunnel relayed zero-copy caps its destination socket lazily (`crate::relay::buffers`):
//! the firehose tests are the clients that try to get past that — one that reads fast (so
//! the kernel grows the buffers) and then stops, and one that stops before the proxy has
//! moved enough to switch to splice, with a cap smaller than the kernel's default buffer.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

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
                .allow("tcp://big.test:*"),
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
/// to the clients (`w` of its sockets on the proxy port) and bytes received from the origin
/// and not yet read (`r` of its sockets towards the origin).
fn pinned(proxy: SocketAddr, origin: SocketAddr) -> (u64, u64) {
    let measure = || {
        (
            skmem_sum(&format!("( sport = :{} )", proxy.port()), "w"),
            skmem_sum(&format!("( dport = :{} )", origin.port()), "r"),
        )
    };
    steady(Duration::from_millis(700), Duration::from_secs(20), measure)
}

fn stalled_total(buffer: u64) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), buffer);
    let held: Vec<_> = (0..TUNNELS)
        .map(|_| stalled_download(p.proxy, &origin, None))
        .collect();
    let (sent, received) = pinned(p.proxy, origin.addr);
    drop(held);
    sent + received
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

/// An origin that, once a connection has sent a line, sends bytes on it until it fails: a
/// download that is not HTTP, so its tunnel is relayed zero-copy.
fn firehose() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut line = [0u8; 64];
                if conn.read(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let chunk = vec![0x5au8; 64 * 1024];
                while conn.write_all(&chunk).is_ok() {}
            });
        }
    });
    addr
}

/// A tunnel to the firehose whose client sets its receive buffer to `rcvbuf` and reads
/// `first` bytes as fast as it can, then nothing more.
fn firehose_tunnel(
    proxy: SocketAddr,
    origin: SocketAddr,
    rcvbuf: Option<usize>,
    first: usize,
) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if let Some(n) = rcvbuf {
        sock.set_recv_buffer_size(n).unwrap();
    }
    sock.connect(&proxy.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_on(&mut s, &format!("big.test:{}", origin.port()), None);
    s.write_all(b"go\n").unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    while got < first {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the firehose stopped after {got} bytes");
        got += n;
    }
    s
}

/// What `tunnels` firehose tunnels pin once their clients stop, with the cap at `buffer`:
/// towards the clients, and received from the origin.
fn firehose_pinned(buffer: u64, tunnels: usize, rcvbuf: Option<usize>, first: usize) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let origin = firehose();
    let p = start(dir.path(), buffer);
    let held: Vec<_> = (0..tunnels)
        .map(|_| firehose_tunnel(p.proxy, origin, rcvbuf, first))
        .collect();
    let parts = pinned(p.proxy, origin);
    drop(held);
    parts
}

const FIREHOSE_TUNNELS: usize = 20;

/// Clients that read 4 MiB as fast as they can (the kernel's autotuning grows the buffers of
/// both of the proxy's sockets) and then stop: their tunnels pin no more than stalled ones.
#[test]
fn tunnels_that_read_fast_then_stop_pin_at_most_their_socket_buffers() {
    let first = 4 << 20;
    let (sent, received) = firehose_pinned(CAP, FIREHOSE_TUNNELS, None, first);
    let capped = sent + received;
    let budget = FIREHOSE_TUNNELS as u64 * 2 * (2 * CAP);
    assert!(
        capped <= budget,
        "{FIREHOSE_TUNNELS} tunnels that read fast then stopped pin {capped} bytes, over the budget of {budget}"
    );
    let (sent, received) = firehose_pinned(0, FIREHOSE_TUNNELS, None, first);
    let autotuned = sent + received;
    eprintln!("pinned after a fast start: capped {capped} B, autotuned {autotuned} B");
    assert!(
        autotuned > budget,
        "without the cap the same tunnels pin only {autotuned} bytes: the measurement cannot tell"
    );
}

/// A cap smaller than the kernel's default receive buffer (16 KiB against 128 KiB), and
/// clients with small receive buffers that read nothing: the proxy's writes towards them block
/// before it has moved the 64 KiB after which a tunnel switches to splice, while the
/// destination keeps sending. Capping only at the switch left ~94 KiB a tunnel received from
/// the destination (the socket's default buffer, filled before the cap): so a cap that small
/// is set before relaying. Counted on the destination's side, where the cap applies, against
/// twice the doubled cap a socket: with a buffer this small, the kernel's count (each segment's
/// whole allocation) runs past the doubled cap (33 KiB a tunnel, capped before the replay).
#[test]
fn tunnels_stalled_before_the_switch_to_splice_pin_at_most_a_small_cap() {
    let small: u64 = 16 * 1024;
    let (_, capped) = firehose_pinned(small, FIREHOSE_TUNNELS, Some(4096), 0);
    let budget = FIREHOSE_TUNNELS as u64 * 2 * (2 * small);
    assert!(
        capped <= budget,
        "{FIREHOSE_TUNNELS} tunnels stalled early hold {capped} bytes from the destination, over the budget of {budget}"
    );
    let (_, autotuned) = firehose_pinned(0, FIREHOSE_TUNNELS, Some(4096), 0);
    eprintln!("received and held when stalled early: capped {capped} B, autotuned {autotuned} B");
    assert!(
        autotuned > budget,
        "without the cap the same tunnels hold only {autotuned} bytes: the measurement cannot tell"
    );
}
