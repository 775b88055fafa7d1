//! The one relay chooser: once an exchange is admitted and its first bytes judged, how its
//! bytes move — the same for a CONNECT tunnel and a transparent connection:
//! - a host judged per request ([`crate::pipeline::judged_per_request`]) is terminated
//!   ([`crate::intercept`]) over TLS; plain HTTP to it has each request judged by the same
//!   exchange ([`crate::intercept::serve`], plain) unless a secret is bound to the host (a
//!   secret never travels in clear); anything else to it is refused and nothing reaches it;
//! - plain HTTP of a sandbox whose every request is read
//!   ([`crate::pipeline::reads_every_request`]: `dlp`, a decider) is served by the same exchange, to
//!   any host: each request gets the phases a forwarded one gets, and its own record;
//! - other plain HTTP has every later request checked against the decided host
//!   ([`crate::relay::http_checked`]);
//! - anything else has what was read replayed in its directions and is relayed — zero-copy
//!   between two plain TCP sockets, in user space otherwise ([`crate::relay::tunnel`]).
//!
//! Every branch a plain tunnel does not take is boxed: an idle tunnel's task holds only the
//! state of the branch it is in (see docs/performance-history.md).

use std::future::Future;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::io::AsyncWriteExt;

use crate::audit::{AuditGuard, Close};
use crate::egress::abortable::OverTcp;
use crate::egress::limits::SandboxLimiter;
use crate::egress::server_io::ServerIo;
use crate::policy::reason::Reason;
use crate::policy::Decision;
use crate::policy::Enforcement;
use crate::relay::client_io::ClientIo;
use crate::relay::liveness::Liveness;
use crate::relay::tunnel::Relayed;
use crate::runtime::Shared;
use crate::sandboxes::set::Sandbox;

use super::running::Running;
use crate::wire::first_bytes::{FirstBytes, Inspected};
use crate::wire::peek::Peeked;

/// The id of the `once` grant that allowed `decision`, if one did: the exchange it allows is
/// one request, wherever the proxy frames requests.
fn once_grant(shared: &Shared, sandbox: &Sandbox, decision: &Decision) -> Option<Arc<str>> {
    let set = shared.policy.load();
    set.grant_of(sandbox, decision)
        .filter(|g| g.kind == crate::policy::granted::GrantKind::Once)
        .map(|g| g.id.clone())
}

/// Relay an admitted exchange until it ends, idles out, is revoked or shut down (its
/// stop): `client` is the client's stream, `inspected` what was read of both sides before
/// deciding (replayed, or terminated). A tunnel its grant's end cut says so (clients review
/// F4).
///
/// A function returning an async block rather than an `async fn`: an `async fn` keeps each
/// argument twice in its state (as the argument and as the local it is moved into,
/// rust-lang/rust#62958), and every idle tunnel's task holds this state (docs/performance-history.md,
/// issue 67 seventh part).
pub(super) fn relay(
    running: Box<Running>,
    client: ClientIo,
    inspected: Inspected,
    audit: &mut AuditGuard,
) -> impl Future<Output = Relayed> + '_ {
    let granted_by = running.granted_by.clone();
    // A map, not an async block awaiting it: awaiting moves the future into a second slot.
    relay_until_stopped(running, client, inspected, audit).map(move |mut relayed| {
        if relayed.close == Close::Revoked && relayed.cut.is_none() && granted_by.is_some() {
            relayed.cut =
                crate::relay::watch::Watch::cut_detail(Close::Revoked, granted_by.as_deref());
        }
        relayed
    })
}

/// Whether plain HTTP in this tunnel is served one request at a time: when a phase reads every
/// request, or when the sandbox's requests quota is a fleet share — each request then waits
/// for its share, instead of being refused while the replica leases the next chunk.
fn plain_read_per_request(running: &Running, inspected: &Inspected) -> bool {
    if !matches!(&inspected.first, FirstBytes::Client(Peeked::Http { .. })) {
        return false;
    }
    if crate::pipeline::reads_every_request(&running.sandbox.binding) {
        return true;
    }
    if !crate::egress::quota::share::in_fleet() {
        return false;
    }
    let host = running.target.host.to_string();
    let meters = running.slot.limiter().meters_for(&host, None);
    let requests = crate::egress::quota::share::Kind::Requests;
    meters.iter().any(|m| m.shared_as(requests))
}

/// [`relay`], until the relay stops.
///
/// An async block, not an `async fn`, so its arguments are held once (see [`relay`]'s
/// comment on `async fn` arguments).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds each argument twice in its state (rust-lang/rust#62958)"
)]
fn relay_until_stopped(
    running: Box<Running>,
    client: ClientIo,
    inspected: Inspected,
    audit: &mut AuditGuard,
) -> impl Future<Output = Relayed> + '_ {
    async move {
        let shared = running.shared.clone();
        let b = &running.sandbox.binding;
        // The kernel buffers a relayed TCP client's tunnel may pin (crate::relay::buffers): the
        // client's now, the destination's by each path below (the zero-copy one, lazily).
        let buffer = client.tcp().and(b.limits.socket_buffer_bytes);
        if let Some(tcp) = client.tcp() {
            crate::relay::buffers::cap_client(tcp, buffer);
        }
        let ix = shared.settings.interceptor.as_deref();
        let terminate = ix.is_some_and(|ix| ix.terminates(b, &running.target.host.to_string()));
        let once = once_grant(&shared, &running.sandbox, &running.decision);
        if terminate || plain_read_per_request(&running, &inspected) {
            cap_upstream(&running.server, buffer);
            return per_request(ix, running, (client, inspected), audit, once).await;
        }
        let report = b.enforcement == Enforcement::Report;
        let Running {
            target,
            server,
            stop,
            slot,
            _active,
            ..
        } = *running;
        // A connection the proxy does not read is a write to its destination (flow rules).
        let process = b.network.flows.as_ref().and_then(|_| audit.attributed());
        let flow =
            crate::pipeline::flow::Phase::of(b, Some(&shared.settings.flows), process.as_deref());
        let stop = match flow {
            Some(flow) => match super::opaque_flow::admit(&flow, b, &target, audit).await {
                // Boxed: it would size every tunnel's task, flow rules or not.
                Ok(watch) => futures_util::future::Either::Left(Box::pin(watch.or(stop))),
                Err(()) => {
                    client.reset();
                    server.reset();
                    return Relayed::nothing(Close::Eof);
                }
            },
            None => futures_util::future::Either::Right(stop),
        };
        let limiter: &SandboxLimiter = slot.limiter();
        let shaper = limiter.shapes().then_some(limiter);
        // A tunnel the proxy does not see into is one request, reserved against the quotas.
        let process = audit.attributed();
        let live = Liveness::new(shared.settings.timeouts.idle)
            .metered(limiter, &target.host, process.as_deref())
            .once(once);
        if let Err(r) = live.reserve_waiting().await {
            audit.refused_in_tunnel(r.reason, r.detail);
            client.reset();
            server.reset();
            return Relayed::nothing(Close::Limit);
        }
        audit.open();
        if let FirstBytes::Client(Peeked::Http { .. }) = &inspected.first {
            cap_upstream(&server, buffer);
            // Plain HTTP: every later request on the connection must name the decided host too.
            let checked = Box::pin(crate::relay::http_checked::relay_checked(
                client,
                server,
                inspected.client,
                &target,
                report,
                (live, audit.recorder().in_clear()),
                stop,
                shaper,
            ))
            .await;
            if let Some(m) = checked.mismatch {
                audit.mismatch(m, report);
            }
            return checked.relayed;
        }
        replay_and_relay(client, server, inspected, (live, buffer), stop, shaper).await
    }
}

/// Cap the receive buffer of the destination's TCP socket (under TLS, of the socket it runs
/// over), for the paths that do not cap it lazily.
fn cap_upstream(server: &ServerIo, bytes: Option<u32>) {
    if let Some(tcp) = server.tcp() {
        crate::relay::buffers::cap_upstream(tcp, bytes);
    }
}

/// A host judged per request (or plain HTTP of a sandbox whose every request is read): TLS
/// is terminated ([`crate::intercept::serve`]), plain HTTP has each request judged in clear
/// ([`crate::intercept::serve`], plain) unless a secret is bound to the host; anything else
/// is refused and nothing reaches it.
async fn per_request(
    ix: Option<&crate::intercept::Interceptor>,
    running: Box<Running>,
    (client, inspected): (ClientIo, Inspected),
    audit: &mut AuditGuard,
    once: Option<Arc<str>>,
) -> Relayed {
    // Read in place, `server` and `stop` moved out: what is left is held until the end.
    let (shared, target) = (&running.shared, &running.target);
    let b = &running.sandbox.binding;
    let host = target.host.to_string();
    let (hello, in_clear) = match &inspected.first {
        FirstBytes::Client(Peeked::Tls(hello)) => (Some(hello), None),
        FirstBytes::Client(Peeked::Http { .. }) => (None, crate::intercept::secret_in_clear(b, &host)),
        _ => (None, Some("the host is judged per request: only TLS or plain HTTP is read, and this connection is neither".into())),
    };
    if let Some(why) = in_clear {
        audit.refused_in_tunnel(Reason::CredentialMisuse, why);
        client.reset();
        running.server.reset();
        return Relayed::nothing(Close::Eof);
    }
    let tunnel = crate::intercept::Tunnel {
        ends: crate::intercept::Ends {
            current: shared.current_binding(&b.id),
            host: &host,
            port: target.port,
            resolver: shared.resolver(),
            deciders: shared.deciders.clone(),
            flows: shared.settings.flows.clone(),
        },
        client,
        early: inspected.client,
        server: running.server,
        client_alpn: hello.map(|h| h.alpn.clone()).unwrap_or_default(),
        tls: hello.is_some(),
        clearance: running.clearance,
    };
    let timeouts = &shared.settings.timeouts;
    let process = audit.attributed();
    let live = Arc::new(
        Liveness::new(timeouts.idle)
            .metered(running.slot.limiter(), &target.host, process.as_deref())
            .once(once),
    );
    Box::pin(crate::intercept::serve(
        (&shared.settings.serving, ix),
        tunnel,
        audit,
        running.stop,
        live,
        timeouts.header,
    ))
    .await
}

/// Replay what was read, each in its direction, then relay without the buffers.
///
/// An async block, not an `async fn`, so its arguments are held once (see [`relay`]'s
/// comment on `async fn` arguments).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds each argument twice in its state (rust-lang/rust#62958)"
)]
fn replay_and_relay<'a, F>(
    mut client: ClientIo,
    mut server: ServerIo,
    inspected: Inspected,
    (live, buffer): (Liveness, Option<u32>),
    stop: F,
    shaper: Option<&'a SandboxLimiter>,
) -> impl Future<Output = Relayed> + 'a
where
    F: Future<Output = Close> + 'a,
{
    async move {
        // Decided before the replay: what the replay sets off may already be arriving.
        let zero_copy =
            shaper.is_none() && matches!((&client, &server), (ClientIo::Tcp(_), ServerIo::Tcp(_)));
        let late = match server.tcp() {
            Some(tcp) if zero_copy => crate::relay::buffers::defer_upstream(tcp, buffer),
            _ => {
                cap_upstream(&server, buffer);
                None
            }
        };
        if server.write_all(&inspected.client).await.is_err()
            || client.write_all(&inspected.server).await.is_err()
        {
            return Relayed::nothing(Close::Error);
        }
        // What was replayed counts like what the relay moves (and toward the sandbox's quota).
        live.moved(true, inspected.client.len());
        live.moved(false, inspected.server.len());
        drop(inspected);
        match (client, server.into_tcp()) {
            (ClientIo::Tcp(client), Ok(server)) => {
                crate::relay::tunnel::relay_tcp(client, server, (live, late), stop, shaper).await
            }
            // Either side in TLS (or an HTTP/2 stream): relayed in user space.
            (client, server) => {
                let server = server.map_or_else(|tls| tls, ServerIo::Tcp);
                Box::pin(crate::relay::tunnel::relay_streams(
                    client, server, live, stop, shaper,
                ))
                .await
            }
        }
    }
}
