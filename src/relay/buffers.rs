//! What one relayed connection may pin in kernel memory: the client socket's send buffer and
//! the destination socket's receive buffer are capped at `limits.socket_buffer_bytes`
//! (`SO_SNDBUF` / `SO_RCVBUF`; the kernel doubles the value for its bookkeeping). With the
//! kernel's autotuning alone a client that stops reading leaves ~4 MiB queued towards it and
//! as much received from the destination per tunnel; a sandbox's 512 tunnels would pin 4 GiB.
//! Capped, a stalled tunnel holds at most about twice the cap on each side, plus its pipe.
//!
//! The default cap is set once on the data-plane listeners, and accepted sockets inherit it
//! ([`inherited`]): only a sandbox with another value pays a `setsockopt` on its client side.
//!
//! The destination's side of a tunnel relayed zero-copy ([`crate::relay::splice`]) is capped
//! only when its download switches to splice, after 64 KiB ([`defer_upstream`]): a short
//! tunnel (an API call) then never pays the `setsockopt`. Until the switch the proxy has read
//! less than 80 KiB from the destination, and it reads on while the client takes it, so the
//! socket holds at most what the kernel gives a new socket (`tcp_rmem`'s default, 128 KiB):
//! the cap is deferred only when it allows that much anyway, and set before relaying when
//! it is smaller. Every other path caps it before relaying.
//!
//! The price, measured (docs/performance-history.md): single-tunnel bulk on loopback ~7–10 % lower
//! with 256 KiB than with autotuning. `TCP_NOTSENT_LOWAT` on the client side was measured
//! too and cost more (~20 %). `0` turns the cap off.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::socket::{setsockopt, sockopt};

/// The `SO_SNDBUF` the data-plane listeners set, which accepted sockets inherit (0: none).
static INHERITED: AtomicU32 = AtomicU32::new(0);

/// The data-plane listeners set `SO_SNDBUF` to `bytes` ([`crate::server`]'s bind).
pub fn inherited(bytes: Option<u32>) {
    INHERITED.store(bytes.unwrap_or(0), Ordering::Relaxed);
}

/// Cap the send buffer of `client` (no-op for `None`), only when it differs from what its
/// listener gave it. Failures are ignored: the kernel keeps its own limits.
pub fn cap_client(client: &impl AsFd, bytes: Option<u32>) {
    let Some(n) = bytes else {
        return;
    };
    if INHERITED.load(Ordering::Relaxed) != n {
        let _ = setsockopt(client, sockopt::SndBuf, &(n as usize));
    }
}

/// Cap the receive buffer of the destination socket `upstream` (no-op for `None`). Failures
/// are ignored: the kernel keeps its own limits.
pub fn cap_upstream(upstream: &impl AsFd, bytes: Option<u32>) {
    if let Some(n) = bytes {
        let _ = setsockopt(upstream, sockopt::RcvBuf, &(n as usize));
    }
}

/// A cap on the receive buffer of `upstream` that may wait until its download switches to
/// splice: `bytes` when the kernel's default receive buffer (what the socket holds until
/// then) is no larger, else `None` once the cap is set now.
pub fn defer_upstream(upstream: &impl AsFd, bytes: Option<u32>) -> Option<u32> {
    let n = bytes?;
    if initial_rcvbuf().is_some_and(|initial| initial <= u64::from(n)) {
        return Some(n);
    }
    cap_upstream(upstream, Some(n));
    None
}

/// The receive buffer the kernel gives a new TCP socket in this network namespace (the
/// middle of `net.ipv4.tcp_rmem`), read once; `None` when it cannot be read.
fn initial_rcvbuf() -> Option<u64> {
    static INITIAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *INITIAL.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem").ok()?;
        text.split_whitespace().nth(1)?.parse().ok()
    })
}
