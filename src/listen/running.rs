//! The one tail of every tunnel listener (a CONNECT, a SOCKS5 CONNECT, a transparent
//! connection): an admitted exchange becomes [`Running`] — the sandbox's active count taken,
//! the clearance's watch armed, the connection slot (and so the limiter) held — and the relay
//! chooser ([`super::relay_choice::relay`]) consumes it. A listener keeps only what is its own:
//! how it tells the client the tunnel is open, and where the client's bytes come from.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::audit::metrics::ActiveGuard;
use crate::audit::{AuditGuard, Close};
use crate::egress::admit::{Admitted, Route};
use crate::egress::handles::Handles;
use crate::egress::limits::ConnectionSlot;
use crate::egress::server_io::ServerIo;
use crate::policy::target::Target;
use crate::policy::Decision;
use crate::runtime::Shared;
use crate::sandboxes::set::Sandbox;

/// What ends a running tunnel: revocation, shutdown (the clearance's watch).
pub(super) type Stop = Pin<Box<dyn Future<Output = Close> + Send>>;

/// An admitted tunnel, running: everything the relay reads, and what it holds while it runs.
pub(super) struct Running {
    pub shared: Arc<Shared>,
    pub sandbox: Arc<Sandbox>,
    /// The decided target (what the clearance allows).
    pub target: Target,
    /// The dialled destination.
    pub server: ServerIo,
    /// The decision that admitted it (a `once` grant allows one request).
    pub decision: Decision,
    /// Whether the policy allowed it without looking at its bytes (`*:port` opaque rules).
    pub opaque: bool,
    /// Boxed: held once for the tunnel's life, not once per async layer it passes through.
    pub stop: Stop,
    /// The grant that allowed it, if one did (what a cut by its end names).
    pub granted_by: Option<Arc<str>>,
    /// The clearance, kept only for a host whose tunnels are terminated: their upstream
    /// connection may be kept for the next tunnel under it ([`crate::intercept::kept`]).
    pub clearance: Option<Box<crate::egress::clearance::Clearance>>,
    pub(super) slot: ConnectionSlot,
    /// The sandbox's active-connection count, taken while it runs.
    pub(super) _active: ActiveGuard,
}

impl Running {
    /// Start the exchange `admitted` as a tunnel; `None` (its record closed as an error) when
    /// it was routed to a kept connection, which only a forwarded request asks for.
    ///
    /// Boxed: each async layer a tunnel passes through (the listener's task, the first-bytes
    /// check, the relay chooser) would otherwise keep the whole `Running` in its state, some
    /// twice (argument and local) — about a kilobyte of every idle tunnel's task for one
    /// allocation of 168 bytes (docs/performance-history.md, issue 67 seventh part).
    pub fn start(
        shared: &Arc<Shared>,
        admitted: Admitted,
        audit: &mut AuditGuard,
    ) -> Option<Box<Running>> {
        let Route::Dialed(dialed) = admitted.route else {
            audit.close(Close::Error);
            return None;
        };
        let target = admitted.clearance.target.clone();
        let granted_by = admitted.clearance.granted_by.clone();
        let clearance = (shared.settings.interceptor.as_ref())
            .filter(|ix| ix.terminates(&admitted.sandbox.binding, &target.host.to_string()))
            .map(|_| Box::new(admitted.clearance.clone()));
        let stop: Stop = Box::pin(shared.watch(admitted.clearance).stopped());
        Some(Box::new(Running {
            shared: shared.clone(),
            _active: admitted.sandbox.stats(shared.metrics()).active(),
            sandbox: admitted.sandbox,
            target,
            server: dialed.stream,
            decision: admitted.decision,
            opaque: admitted.opaque,
            stop,
            granted_by,
            clearance,
            slot: admitted.slot,
        }))
    }
}
