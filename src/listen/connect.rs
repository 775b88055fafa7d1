//! A CONNECT tunnel on the explicit proxy, once it is admitted: answer 200, recover the
//! client's socket from hyper, read and judge its first bytes (the same checker as the
//! transparent listener's) before anything reaches the destination, then hand it to the one
//! relay chooser ([`super::relay_choice`]), held by the grant's watch.

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{AuditGuard, Close};
use crate::egress::abortable::Abortable;
use crate::egress::admit::Admitted;
use crate::egress::verdict;
use crate::intercept::prefixed::Prefixed;
use crate::relay::body::{self, Body};
use crate::relay::client_io::ClientIo;
use crate::relay::tunnel::Relayed;
use crate::runtime::Shared;
use crate::wire::first_bytes::{self, FirstBytes};
use crate::wire::peek::Peeked;

use super::relay_choice;
use super::running::Running;

/// Answer 200 and, in its own task, check the tunnel's first bytes and relay it until it
/// ends, is revoked, idles out or is shut down.
pub(super) fn tunnel(
    shared: Arc<Shared>,
    permit: Option<OwnedSemaphorePermit>,
    req: Request<Incoming>,
    mut audit: AuditGuard,
    admitted: Admitted,
) -> Response<Body> {
    let Some(running) = Running::start(&shared, admitted, &mut audit) else {
        // A CONNECT never asks for a kept connection: nothing to relay.
        return Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(body::empty())
            .unwrap_or_else(|_| Response::new(body::empty()));
    };
    // Taken out of what the task holds for the tunnel's whole life: a task's state keeps
    // room for every value it captured even after it moved on (the request: ~260 bytes).
    let upgrade = hyper::upgrade::on(req);
    tokio::spawn(tunnel_task(upgrade, running, audit, permit));
    Response::builder()
        .status(StatusCode::OK)
        .body(body::empty())
        .unwrap_or_else(|_| Response::new(body::empty()))
}

/// The task that holds a CONNECT tunnel for its life: wait for hyper to hand the client's
/// socket over, relay it, record how it ended. Its size is what every idle tunnel costs
/// ([`super::task_size`] bounds it).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds each argument twice in its state (rust-lang/rust#62958)"
)]
pub(super) fn tunnel_task(
    upgrade: hyper::upgrade::OnUpgrade,
    running: Box<Running>,
    mut audit: AuditGuard,
    permit: Option<OwnedSemaphorePermit>,
) -> impl Future<Output = ()> + Send {
    async move {
        let relayed = match upgrade.await.ok().and_then(take_client) {
            Some((client, early)) => relay_opened(running, client, early, &mut audit).await,
            None => Relayed::nothing(Close::Error),
        };
        audit.relayed(relayed);
        drop(audit);
        drop(permit);
    }
}

/// Relay a tunnel the client was told is open (a CONNECT's 200, a SOCKS5 success): its first
/// bytes (`early`: what was read with the request) are read and judged by the one checker
/// ([`verdict::first_bytes_of`]) before anything reaches the destination (a refusal resets
/// both sockets), then [`relay_choice::relay`] moves them.
///
/// An async block, not an `async fn`, so its arguments are held once (see
/// [`relay_choice::relay`]'s comment on `async fn` arguments).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds each argument twice in its state (rust-lang/rust#62958)"
)]
pub(super) fn relay_opened(
    mut running: Box<Running>,
    mut client: ClientIo,
    early: Vec<u8>,
    audit: &mut AuditGuard,
) -> impl Future<Output = Relayed> + '_ {
    async move {
        let wait = running.shared.settings.timeouts.header;
        let read = first_bytes::read_first_bytes(&mut client, &mut running.server, early, wait);
        let inspected = tokio::select! {
            r = read => match r {
                Ok(i) => i,
                Err(_) => return Relayed::nothing(Close::Error),
            },
            close = &mut running.stop => return Relayed::nothing(close),
        };
        if let FirstBytes::Client(Peeked::Tls(hello)) = &inspected.first {
            audit.client_hello(hello.sni.as_deref(), &hello.alpn, hello.ech);
        }
        let (sandbox, target) = (&running.sandbox, &running.target);
        let first = &inspected.first;
        if let Err(m) = verdict::first_bytes_of(&sandbox.binding, target, first, running.opaque) {
            // Refused — or, in report mode, reported — by what it carries.
            if verdict::refused(sandbox, &running.decision, m, audit).is_err() {
                // Nothing of the tunnel reaches the destination; both sides are reset.
                client.reset();
                running.server.reset();
                return Relayed::nothing(Close::Eof);
            }
        }
        relay_choice::relay(running, client, inspected, audit).await
    }
}

/// The client's side of an upgraded CONNECT: an HTTP/1.1 connection (plain or TLS) is taken
/// back whole with the bytes hyper had buffered; on HTTP/2 the tunnel is one stream of the
/// connection, relayed as it is.
fn take_client(upgraded: hyper::upgrade::Upgraded) -> Option<(ClientIo, Vec<u8>)> {
    match upgraded.downcast::<TokioIo<Abortable<Prefixed<ClientIo>>>>() {
        Ok(parts) => {
            // Taken apart at once: `read_buf` shares hyper's read buffer, which a `parts`
            // kept alive would hold for the tunnel's whole life.
            let hyper::upgrade::Parts { io, read_buf, .. } = parts;
            // What hyper had read past the head, then what it never read of the first look
            // (none: hyper reads the first look whole before the connection's own bytes).
            let (unread, client) = io.into_inner().into_inner()?.into_parts();
            let mut early = read_buf.to_vec();
            drop(read_buf);
            early.extend_from_slice(&unread);
            Some((client, early))
        }
        Err(stream) => Some((ClientIo::H2(Box::new(TokioIo::new(stream))), Vec::new())),
    }
}
