//! Keep-alive for forwarded plain HTTP (`GET http://…` on the explicit proxy,
//! [`crate::relay::forward`]). An upstream connection whose exchange ended cleanly is kept
//! idle for the next request of the **same sandbox** to the **same decided authority** at the
//! **same checked address**, and only replaces the connect: that next request is identified,
//! limited, decided and resolved as if it were the first, and a kept connection is taken only
//! when its address is one the fresh decision allows. So the pool never widens anything:
//! it is never shared across sandboxes, and a connection whose policy was revoked is not only
//! never taken again — [`UpstreamPool::sweep`] closes it (with a reset), along with those
//! idle longer than `forward_keepalive.idle_ms` and those the origin closed. Bounded per
//! origin and in total; `idle_ms: 0` keeps none.
//!
//! Each upstream connection has its own [`Cut`] and a task that drives it until the origin
//! closes it or the cut fires: the client connection that used it last does not own it.
//!
//! The pool is generic over what it keeps ([`Kept`]): terminated tunnels keep their upstream
//! TLS connections in one too ([`crate::intercept::kept`]), under the same rules and a key
//! that says more.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper_util::rt::TokioIo;

use crate::config::upstream::UpstreamProxy;
use crate::config::ForwardKeepalive;
use crate::egress::abortable::{Abortable, Cut};
use crate::egress::clearance::Clearance;
use crate::egress::server_io::ServerIo;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::Target;
use crate::sandboxes::set::PolicySet;

/// The body of a forwarded request, as sent upstream.
pub type ReqBody = BoxBody<Bytes, crate::pipeline::forwarded::SendError>;

/// One HTTP/1.1 connection to an origin.
pub struct Upstream {
    pub sender: hyper::client::conn::http1::SendRequest<ReqBody>,
    /// Ends it: `close` (FIN) or `abort` (reset).
    pub cut: Arc<Cut>,
    /// The checked address it is connected to.
    pub addr: SocketAddr,
    /// Requests it has carried before this one (0: new).
    pub reused: u32,
    /// The parent proxy it is connected to, when requests go to one in absolute form.
    pub via: Option<Arc<UpstreamProxy>>,
}

/// How kept connections to `target` are found: its authority, and the parent they go to if
/// any (a connection to a parent is kept for requests to the same authority through it).
pub fn authority(target: &Target, via: Option<&UpstreamProxy>) -> String {
    match via {
        None => target.to_string(),
        Some(parent) => format!("{target} via {}", parent.shown()),
    }
}

impl Upstream {
    /// Speak HTTP/1.1 on a dialled socket (to an origin, or to the parent `via`); the
    /// connection is driven by its own task until the origin closes it or its cut fires.
    pub async fn handshake(
        stream: ServerIo,
        addr: SocketAddr,
        via: Option<Arc<UpstreamProxy>>,
    ) -> Result<Upstream, hyper::Error> {
        let mut up = Self::handshake_with(stream, addr, Cut::new()).await?;
        up.via = via;
        Ok(up)
    }

    /// [`Upstream::handshake`] under an existing `cut` (a connection that replaces one whose
    /// exchange is already watched with that cut).
    pub async fn handshake_with(
        stream: ServerIo,
        addr: SocketAddr,
        cut: Arc<Cut>,
    ) -> Result<Upstream, hyper::Error> {
        let io = TokioIo::new(Abortable::new(stream, cut.clone()));
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        let mut fired = cut.subscribe();
        tokio::spawn(async move {
            // Dropping the connection closes the socket (reset after an abort).
            tokio::select! {
                _ = conn => {}
                _ = fired.changed() => {}
            }
        });
        Ok(Upstream {
            sender,
            cut,
            addr,
            reused: 0,
            via: None,
        })
    }
}

/// A kept connection as the pool sees it: a forwarded request's HTTP/1.1 connection
/// ([`Upstream`]), or a terminated tunnel's ([`crate::intercept::kept::KeptTls`]).
pub trait Kept: Send + 'static {
    /// Free for a request now, and not closed by the origin.
    fn ready(&mut self) -> bool;
    /// Closed by the origin.
    fn closed(&self) -> bool;
    /// Its switch.
    fn cut(&self) -> &Arc<Cut>;
    /// The checked address it is connected to.
    fn addr(&self) -> SocketAddr;
    /// Counted when taken again.
    fn taken(&mut self);
    /// Whether the policy `set` still lets it be kept, beyond the clearance of the exchange
    /// that used it last (a terminated one: the credentials bound to its host unchanged).
    fn fits(&self, _set: &PolicySet, _clearance: &Clearance) -> bool {
        true
    }
    /// A second handle on it for another exchange, leaving this one kept (an HTTP/2
    /// connection carries several at once); `None`: it is handed over whole.
    fn share(&mut self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
    /// Whether an exchange still holds a handle on it (a shared connection): it is not
    /// closed for being idle, nor for being busy.
    fn in_use(&self) -> bool {
        false
    }
}

impl Kept for Upstream {
    fn ready(&mut self) -> bool {
        self.sender.is_ready() && !self.sender.is_closed()
    }

    fn closed(&self) -> bool {
        self.sender.is_closed()
    }

    fn cut(&self) -> &Arc<Cut> {
        &self.cut
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn taken(&mut self) {
        self.reused += 1;
    }
}

/// Whose idle connections these are: one sandbox, one decided authority, one address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    sandbox: SandboxId,
    /// `host:port` as decided (the name, not what it resolved to).
    authority: String,
    addr: SocketAddr,
}

/// An idle connection, and the clearance of the exchange that used it last.
struct Idle<C> {
    up: C,
    since: Instant,
    clearance: Clearance,
}

impl UpstreamPool<Upstream> {
    /// Keep `up` after a clean exchange under `clearance`, or close it when it cannot be reused
    /// or there is no room.
    pub fn put(&self, clearance: &Clearance, up: Upstream) {
        let key = authority(&clearance.target, up.via.as_deref());
        self.keep(clearance, key, up);
    }
}

/// The idle upstream connections of forwarded requests (or, `C`, of terminated tunnels).
pub struct UpstreamPool<C = Upstream> {
    settings: ForwardKeepalive,
    idle: Mutex<HashMap<Key, Vec<Idle<C>>>>,
}

impl<C: Kept> UpstreamPool<C> {
    pub fn new(settings: ForwardKeepalive) -> Self {
        UpstreamPool {
            settings,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// An idle connection of `sandbox` to `authority` at one of `allowed` (the addresses this
    /// request's own decision allows, in its order) on `port`, ready for a request.
    pub fn take(
        &self,
        sandbox: &SandboxId,
        authority: &str,
        allowed: &[IpAddr],
        port: u16,
    ) -> Option<C> {
        self.take_fitting(sandbox, authority, allowed, port, |_, _| true)
    }

    /// [`UpstreamPool::take`], of the connections `fits` accepts (what the key does not say:
    /// a terminated tunnel's process, credentials and protocol); the others stay.
    pub fn take_fitting(
        &self,
        sandbox: &SandboxId,
        authority: &str,
        allowed: &[IpAddr],
        port: u16,
        fits: impl Fn(&C, &Clearance) -> bool,
    ) -> Option<C> {
        if self.settings.idle.is_zero() {
            return None;
        }
        let mut idle = self.idle.lock().ok()?;
        if idle.is_empty() {
            return None;
        }
        // One key, its address changed per candidate: no allocation per address.
        let mut key = Key {
            sandbox: sandbox.clone(),
            authority: authority.to_string(),
            addr: SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port),
        };
        for ip in allowed {
            key.addr = SocketAddr::new(*ip, port);
            let Some(list) = idle.get_mut(&key) else {
                continue;
            };
            // Newest first: the least likely to be closing.
            let mut at = list.len();
            while at > 0 {
                at -= 1;
                let entry = &mut list[at];
                if !fits(&entry.up, &entry.clearance) {
                    continue;
                }
                let fresh = entry.since.elapsed() < self.settings.idle || entry.up.in_use();
                if fresh && entry.up.ready() {
                    entry.up.taken();
                    // Shared: the entry stays for the next exchange too.
                    if let Some(copy) = entry.up.share() {
                        entry.since = Instant::now();
                        return Some(copy);
                    }
                    let entry = list.remove(at);
                    if list.is_empty() {
                        idle.remove(&key);
                    }
                    return Some(entry.up);
                }
                // Busy with the exchanges sharing it: theirs until they are done.
                if entry.up.in_use() && !entry.up.closed() {
                    continue;
                }
                retire(&list.remove(at).up);
            }
            if list.is_empty() {
                idle.remove(&key);
            }
        }
        None
    }

    /// Keep `up`, idle under `authority` (what [`UpstreamPool::take`] is asked for) after a
    /// clean exchange under `clearance`, or close it when it cannot be reused or there is no
    /// room.
    pub fn keep(&self, clearance: &Clearance, authority: String, up: C) {
        let keep = !self.settings.idle.is_zero() && !up.closed();
        let Ok(mut idle) = self.idle.lock() else {
            up.cut().close();
            return;
        };
        let total: usize = idle.values().map(Vec::len).sum();
        let key = Key {
            sandbox: clearance.sandbox.clone(),
            authority,
            addr: up.addr(),
        };
        let list = idle.entry(key).or_default();
        // A handle on a shared connection: the connection is kept already.
        if let Some(e) = list.iter_mut().find(|e| Arc::ptr_eq(e.up.cut(), up.cut())) {
            if keep {
                e.since = Instant::now();
            }
            return;
        }
        if !keep
            || list.len() >= self.settings.max_idle_per_origin
            || total >= self.settings.max_idle
        {
            up.cut().close();
            return;
        }
        list.push(Idle {
            up,
            since: Instant::now(),
            clearance: clearance.clone(),
        });
    }

    /// Close what must not be kept: idle longer than the setting or closed by the origin
    /// (FIN), or no longer allowed by `set` (reset: a revoked destination gets nothing more,
    /// not even an orderly close). Returns how many were closed.
    pub fn sweep(&self, set: &PolicySet) -> usize {
        let Ok(mut idle) = self.idle.lock() else {
            return 0;
        };
        let mut closed = 0;
        idle.retain(|_, list| {
            list.retain(|e| {
                if !e.clearance.allowed_by(set) || !e.up.fits(set, &e.clearance) {
                    e.up.cut().abort();
                } else if e.up.closed()
                    || (e.since.elapsed() >= self.settings.idle && !e.up.in_use())
                {
                    retire(&e.up);
                } else {
                    return true;
                }
                closed += 1;
                false
            });
            !list.is_empty()
        });
        closed
    }

    /// Idle connections kept now.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// How often [`UpstreamPool::sweep`] should run.
    pub fn sweep_every(&self) -> Duration {
        (self.settings.idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
    }
}

/// Close a kept connection the pool lets go of: with a FIN, unless exchanges still share it
/// (an HTTP/2 connection the origin is closing with a GOAWAY may still finish their streams):
/// then it ends with the last of them.
fn retire<C: Kept>(up: &C) {
    if !up.in_use() {
        up.cut().close();
    }
}

/// Whether `req` may be sent again after a connection failed under it before an answer came
/// back: an idempotent method and no body (RFC 9110 §9.2.2). Forwarded and terminated
/// requests on kept connections both ask it.
pub fn may_send_again<B: hyper::body::Body>(req: &http::Request<B>) -> bool {
    use http::Method;
    let idempotent = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];
    idempotent.contains(req.method()) && req.body().is_end_stream()
}

#[cfg(test)]
mod tests;
