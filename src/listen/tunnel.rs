//! A CONNECT tunnel on the explicit proxy, once it is admitted: answer 200, recover the
//! client's socket from hyper, read and judge its first bytes (the same checker as the
//! transparent listener's) before anything reaches the destination, then hand it to the one
//! relay chooser ([`super::relay_choice`]), held by the grant's watch.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{AuditGuard, Close};
use crate::egress::abortable::Abortable;
use crate::egress::admit::{Admitted, Tunnel};
use crate::egress::handles::Handles;
use crate::egress::server_io::ServerIo;
use crate::egress::verdict;
use crate::policy::set::Sandbox;
use crate::policy::target::Target;
use crate::relay::body::{self, Body};
use crate::relay::client_io::ClientIo;
use crate::relay::tunnel::Relayed;
use crate::runtime::Shared;
use crate::wire::first_bytes::{self, FirstBytes};
use crate::wire::peek::Peeked;

use super::relay_choice::{self, Start};

/// Answer 200 and, in its own task, check the tunnel's first bytes and relay it until it
/// ends, is revoked, idles out or is shut down.
pub(super) fn tunnel(
    shared: Arc<Shared>,
    permit: Option<OwnedSemaphorePermit>,
    req: Request<Incoming>,
    mut audit: AuditGuard,
    admitted: Admitted,
) -> Response<Body> {
    let Some(Tunnel {
        sandbox,
        grant,
        dialed,
        slot,
        decision,
        opaque,
    }) = admitted.into_tunnel(&mut audit)
    else {
        // A CONNECT never asks for a kept connection: nothing to relay.
        return Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(body::empty())
            .unwrap_or_else(|_| Response::new(body::empty()));
    };
    let target = grant.target.clone();
    // Both taken out of what the task holds for the tunnel's whole life: a task's state keeps
    // room for every value it captured even after it moved on (the request: ~260 bytes), and
    // the stop future (~500 bytes) would be held twice, by the task and by the relay it is
    // moved into. Boxed, it is one allocation of its own size.
    let upgrade = hyper::upgrade::on(req);
    let stop = Box::pin(shared.watch(grant).stopped());
    tokio::spawn(async move {
        let _active = sandbox.stats(shared.metrics()).active();
        let relayed = match upgrade.await {
            Ok(upgraded) => {
                let limiter = slot.limiter();
                let opened = Opened {
                    shared: &shared,
                    sandbox: &sandbox,
                    target: &target,
                    server: dialed.stream,
                    decision,
                    opaque,
                };
                relay_upgraded(upgraded, opened, &mut audit, stop, limiter).await
            }
            Err(_) => Relayed::nothing(Close::Error),
        };
        audit.relayed(relayed);
        drop(audit);
        drop(slot);
        drop(permit);
    });
    Response::builder()
        .status(StatusCode::OK)
        .body(body::empty())
        .unwrap_or_else(|_| Response::new(body::empty()))
}

/// An admitted tunnel, besides its client.
pub(super) struct Opened<'a> {
    pub shared: &'a Arc<Shared>,
    pub sandbox: &'a Sandbox,
    pub target: &'a Target,
    pub server: ServerIo,
    /// The policy's decision.
    pub decision: crate::policy::Decision,
    pub opaque: bool,
}

/// Relay a CONNECT tunnel: the client socket is recovered from hyper (with any bytes it had
/// already buffered), then [`relay_opened`].
async fn relay_upgraded<F>(
    upgraded: hyper::upgrade::Upgraded,
    opened: Opened<'_>,
    audit: &mut AuditGuard,
    stop: F,
    limiter: &crate::egress::limits::SandboxLimiter,
) -> Relayed
where
    F: std::future::Future<Output = Close>,
{
    let Some((client, early)) = take_client(upgraded) else {
        return Relayed::nothing(Close::Error);
    };
    relay_opened(client, early, opened, audit, stop, limiter).await
}

/// Relay a tunnel the client was told is open (a CONNECT's 200, a SOCKS5 success): its first
/// bytes (`early`: what was read with the request) are read and judged by the one checker
/// ([`verdict::first_bytes_of`]) before anything reaches the destination (a refusal resets
/// both sockets), then [`relay_choice::relay`] moves them.
pub(super) async fn relay_opened<F>(
    mut client: ClientIo,
    early: Vec<u8>,
    opened: Opened<'_>,
    audit: &mut AuditGuard,
    stop: F,
    limiter: &crate::egress::limits::SandboxLimiter,
) -> Relayed
where
    F: std::future::Future<Output = Close>,
{
    let Opened {
        shared,
        sandbox,
        target,
        mut server,
        decision,
        opaque,
    } = opened;
    tokio::pin!(stop);
    let wait = shared.settings.timeouts.header;
    let inspected = tokio::select! {
        r = first_bytes::read_first_bytes(&mut client, &mut server, early, wait) => match r {
            Ok(i) => i,
            Err(_) => return Relayed::nothing(Close::Error),
        },
        close = &mut stop => return Relayed::nothing(close),
    };
    if let FirstBytes::Client(Peeked::Tls(hello)) = &inspected.first {
        audit.client_hello(hello.sni.as_deref(), &hello.alpn, hello.ech);
    }
    let b = &sandbox.binding;
    if let Err(m) = verdict::first_bytes_of(b, target, &inspected.first, opaque) {
        // Refused — or, in report mode, reported — by what it carries.
        if verdict::refused(sandbox, &decision, m, audit).is_err() {
            // Nothing of the tunnel reaches the destination; both sides are reset.
            client.reset();
            server.reset();
            return Relayed::nothing(Close::Eof);
        }
    }
    let start = Start {
        shared,
        sandbox,
        target,
        client,
        server,
        inspected,
        decision: &decision,
    };
    relay_choice::relay(start, audit, stop, limiter).await
}

/// The client's side of an upgraded CONNECT: an HTTP/1.1 connection (plain or TLS) is taken
/// back whole with the bytes hyper had buffered; on HTTP/2 the tunnel is one stream of the
/// connection, relayed as it is.
fn take_client(upgraded: hyper::upgrade::Upgraded) -> Option<(ClientIo, Vec<u8>)> {
    match upgraded.downcast::<TokioIo<Abortable<ClientIo>>>() {
        Ok(parts) => {
            // Taken apart at once: `read_buf` shares hyper's read buffer, which a `parts`
            // kept alive would hold for the tunnel's whole life.
            let hyper::upgrade::Parts { io, read_buf, .. } = parts;
            let early = read_buf.to_vec();
            drop(read_buf);
            let client = io.into_inner().into_inner()?;
            Some((client, early))
        }
        Err(stream) => Some((ClientIo::H2(Box::new(TokioIo::new(stream))), Vec::new())),
    }
}
