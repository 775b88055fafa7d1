//! Kept upstream connections of terminated tunnels. A terminated tunnel whose client closed
//! cleanly leaves its upstream connection — TLS verified for the host, HTTP/1.1 or HTTP/2 on
//! it — idle for the next tunnel of the **same sandbox** to the **same host and port** at the
//! **same checked address**, identified the **same way** (the same token, certificate or
//! source address), from the **same process**, offering the **same protocols**, while
//! the host gets the **same credentials** (and identity token) it got when the connection was
//! opened. That next tunnel is identified, limited, decided, resolved and dialled as if it
//! were the first: the pool replaces only the upstream's TLS and HTTP handshakes, so it never
//! widens anything.
//!
//! An HTTP/2 connection is shared rather than handed over: it stays in the pool while tunnels
//! of the same key send their requests on it side by side, each as its own streams, and is idle
//! (timed, closed when idle too long) only once none of them holds it.
//!
//! The pool is [`crate::egress::upstream_pool`]'s (bounded per key and in all, idle-timed by
//! `tls_intercept.upstream_keepalive`); its sweep closes — with a reset — every kept
//! connection that the policy in force no longer allows (the clearance of the tunnel that used
//! it last) or whose host's credentials changed.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::exchange::Upstream;
use crate::config::credentials::Credential;
use crate::config::Binding;
use crate::egress::abortable::Cut;
use crate::egress::clearance::Clearance;
use crate::egress::upstream_pool::{Kept, UpstreamPool};
use crate::sandboxes::set::PolicySet;

/// The idle upstream connections of terminated tunnels.
pub type KeptPool = UpstreamPool<KeptTls>;

/// What a connection's requests get put on them at its host: the credentials bound to it and
/// whether the identity token is. A connection is kept, and taken again, only while the
/// binding still says the same (a rotated secret retires it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carries {
    credentials: Vec<Credential>,
    identity: bool,
}

impl Carries {
    /// What `binding` puts on requests to `host`.
    pub fn of(binding: &Binding, host: &str) -> Self {
        Carries {
            credentials: (binding.credentials.iter())
                .filter(|c| c.bound_to(host) || c.token_host(host))
                .cloned()
                .collect(),
            identity: (binding.identity_token.as_ref()).is_some_and(|t| t.bound_to(host)),
        }
    }
}

/// One terminated tunnel's upstream connection, idle or about to be.
pub struct KeptTls {
    pub(super) up: Upstream,
    pub(super) conn: Conn,
}

/// What the pool knows of a connection besides its sender.
#[derive(Clone)]
pub struct Conn {
    /// Ends the connection (the sweep resets one the policy no longer allows).
    pub(super) cut: Arc<Cut>,
    /// The checked address it is connected to.
    addr: SocketAddr,
    /// The protocol the origin chose (ALPN): what the next client is offered.
    pub(super) alpn: Option<Vec<u8>>,
    /// The host it was verified for.
    host: String,
    carries: Carries,
    /// Tunnels it has served before this one (0: new).
    pub(super) reused: u32,
    /// One per handle on the connection: the pool's and each tunnel's sharing it.
    users: Arc<()>,
}

impl Conn {
    /// A new connection to `host` at `addr`, whose requests get `carries`.
    pub(super) fn new(
        cut: Arc<Cut>,
        addr: SocketAddr,
        alpn: Option<Vec<u8>>,
        host: &str,
        carries: Carries,
    ) -> Self {
        Conn {
            cut,
            addr,
            alpn,
            host: host.to_string(),
            carries,
            reused: 0,
            users: Arc::new(()),
        }
    }

    /// Whether it may serve a tunnel whose requests get `carries`.
    pub(super) fn carries(&self, carries: &Carries) -> bool {
        self.carries == *carries
    }
}

/// What a tunnel needs to keep its upstream connection: the clearance it was admitted with,
/// the key, and what its host's requests get now.
pub struct Keeping {
    pub(super) clearance: Clearance,
    pub(super) authority: String,
    pub(super) carries: Carries,
}

impl Keeping {
    /// Where `conn`, this tunnel's connection, goes when the tunnel ends cleanly: `pool`.
    pub(super) fn into_keep(self, pool: &KeptPool, conn: Conn) -> Keep<'_> {
        Keep {
            pool,
            clearance: self.clearance,
            authority: self.authority,
            conn,
        }
    }
}

/// Where a tunnel's upstream connection goes when the tunnel ends cleanly: back to `pool`,
/// under the clearance the tunnel was admitted with.
pub struct Keep<'a> {
    pub(super) pool: &'a KeptPool,
    pub(super) clearance: Clearance,
    pub(super) authority: String,
    pub(super) conn: Conn,
}

impl Keep<'_> {
    /// Keep `up` idle (or close it, when it cannot be reused or there is no room).
    pub(super) fn give_back(self, up: Upstream) {
        let kept = KeptTls {
            up,
            conn: self.conn,
        };
        self.pool.keep(&self.clearance, self.authority, kept);
    }
}

impl Kept for KeptTls {
    fn ready(&mut self) -> bool {
        self.up.ready()
    }

    fn closed(&self) -> bool {
        self.up.closed()
    }

    fn cut(&self) -> &Arc<Cut> {
        &self.conn.cut
    }

    fn addr(&self) -> SocketAddr {
        self.conn.addr
    }

    fn taken(&mut self) {
        self.conn.reused += 1;
    }

    fn fits(&self, set: &PolicySet, clearance: &Clearance) -> bool {
        set.get(clearance.sandbox.as_str())
            .is_some_and(|sb| Carries::of(&sb.binding, &self.conn.host) == self.conn.carries)
    }

    fn share(&mut self) -> Option<Self> {
        Some(KeptTls {
            up: self.up.share()?,
            conn: self.conn.clone(),
        })
    }

    fn in_use(&self) -> bool {
        Arc::strong_count(&self.conn.users) > 1
    }
}

/// The key a terminated tunnel's connection is kept under: its host and port, and the
/// protocols the client offered (`offer`, which decides what the origin may choose).
pub fn authority(host: &str, port: u16, offer: usize) -> String {
    format!("{host}:{port} tls {offer}")
}

/// The address a tunnel cleared for `dialed` on `port` keeps its connection at.
pub fn at(dialed: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(dialed, port)
}
