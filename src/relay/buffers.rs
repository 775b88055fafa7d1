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
//! The price, measured (docs/performance.md): single-tunnel bulk on loopback ~7–10 % lower
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

/// Cap the send buffer of `client` and the receive buffer of `upstream` (no-op for `None`).
/// The client's is set only when it differs from what its listener gave it. Failures are
/// ignored: the kernel keeps its own limits.
pub fn cap(client: &impl AsFd, upstream: Option<&impl AsFd>, bytes: Option<u32>) {
    let Some(n) = bytes else {
        return;
    };
    let inherited = INHERITED.load(Ordering::Relaxed) == n;
    let n = n as usize;
    if !inherited {
        let _ = setsockopt(client, sockopt::SndBuf, &n);
    }
    if let Some(up) = upstream {
        let _ = setsockopt(up, sockopt::RcvBuf, &n);
    }
}
