//! A CONNECT tunnel on the explicit proxy, once it is allowed: answer 200, recover the
//! client's socket from hyper, read and check its first bytes before anything reaches the
//! destination, then pick the relay — terminate it for a host credentials are bound to
//! ([`crate::intercept`]), check every request of plain HTTP ([`crate::relay::http_checked`]),
//! or move bytes ([`crate::relay::tunnel`]) — each held by the grant's watch.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{AuditGuard, Close};
use crate::egress::allowed::Allowed;
use crate::policy::set::Sandbox;
use crate::policy::target::Target;
use crate::policy::Enforcement;
use crate::relay::abortable::{Abortable, OverTcp};
use crate::relay::body::{self, Body};
use crate::relay::client_io::ClientIo;
use crate::relay::server_io::ServerIo;
use crate::relay::tunnel::Relayed;
use crate::server::shared::Shared;
use crate::wire::first_bytes::{self, FirstBytes};
use crate::wire::peek::Peeked;

/// Answer 200 and, in its own task, check the tunnel's first bytes ([`crate::wire::first_bytes`]) and
/// relay it until it ends, is revoked, idles out or is shut down.
pub(super) fn tunnel(
    shared: Arc<Shared>,
    permit: Option<OwnedSemaphorePermit>,
    req: Request<Incoming>,
    allowed: Allowed,
    opaque: bool,
) -> Response<Body> {
    let Allowed {
        mut audit,
        sandbox,
        grant,
        dialed,
        slot,
    } = allowed;
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
                let shaper = limiter.shapes().then_some(&**limiter);
                let start = TunnelStart {
                    shared: &shared,
                    sandbox: &sandbox,
                    target: &target,
                    server: dialed.stream,
                    opaque,
                };
                relay_upgraded(upgraded, start, &mut audit, stop, shaper).await
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

/// What a tunnel starts from, besides the client.
struct TunnelStart<'a> {
    shared: &'a Arc<Shared>,
    sandbox: &'a Sandbox,
    target: &'a Target,
    /// The dialled destination.
    server: ServerIo,
    /// The rule lets opaque TCP flow ([`first_bytes::Rules::opaque`]).
    opaque: bool,
}

/// Relay a CONNECT tunnel: the client socket is recovered from hyper (with any bytes it had
/// already buffered), its first bytes are read and verified before anything reaches the
/// destination (a refusal resets both sockets), replayed, and the two plain TCP sockets are
/// relayed — zero-copy when unshaped, and abortable on revocation.
async fn relay_upgraded<F>(
    upgraded: hyper::upgrade::Upgraded,
    start: TunnelStart<'_>,
    audit: &mut AuditGuard,
    stop: F,
    shaper: Option<&crate::egress::limits::SandboxLimiter>,
) -> Relayed
where
    F: std::future::Future<Output = Close>,
{
    let TunnelStart {
        shared,
        sandbox,
        target,
        mut server,
        opaque,
    } = start;
    // An HTTP/1.1 connection (plain or TLS) is taken back whole; on HTTP/2 the tunnel is
    // one stream of the connection, relayed as it is.
    let (mut client, early) = match upgraded.downcast::<TokioIo<Abortable<ClientIo>>>() {
        Ok(parts) => {
            // Taken apart at once: `read_buf` shares hyper's read buffer, which a `parts`
            // kept alive would hold for the tunnel's whole life.
            let hyper::upgrade::Parts { io, read_buf, .. } = parts;
            let early = read_buf.to_vec();
            drop(read_buf);
            let Some(client) = io.into_inner().into_inner() else {
                return Relayed::nothing(Close::Error);
            };
            (client, early)
        }
        Err(stream) => (ClientIo::H2(Box::new(TokioIo::new(stream))), Vec::new()),
    };
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
    if let Some(tcp) = client.tcp() {
        crate::relay::buffers::cap(tcp, server.tcp(), b.limits.socket_buffer_bytes);
    }
    let rules = first_bytes::Rules {
        require_tls: b.require_tls_ports.contains(&target.port),
        refuse_ech: b.refuse_ech,
        opaque,
    };
    let report = b.enforcement == Enforcement::Report;
    if let Err(m) = first_bytes::verify(target, &inspected.first, rules) {
        if m.record(audit, report) {
            // Nothing of the tunnel reaches the destination; both sides are reset.
            client.reset();
            server.reset();
            return Relayed::nothing(Close::Eof);
        }
    }
    // A host that a credential or an HTTP rule of this sandbox is bound to is terminated
    // (and only such a host); over plain HTTP it is refused: the secret would travel in clear.
    let terminate = shared
        .settings
        .interceptor
        .as_ref()
        .filter(|ix| ix.terminates(b, &target.host.to_string()));
    if let Some(ix) = terminate {
        match &inspected.first {
            FirstBytes::Client(Peeked::Tls(hello)) => {
                let tunnel = crate::intercept::Tunnel {
                    current: shared.current_binding(&sandbox.binding.id),
                    host: &target.host.to_string(),
                    port: target.port,
                    client,
                    early: inspected.client,
                    server,
                    client_alpn: hello.alpn.clone(),
                };
                let live = std::sync::Arc::new(crate::relay::liveness::Liveness::new(
                    shared.settings.timeouts.idle,
                ));
                // Boxed, like every branch a plain tunnel does not take: an idle tunnel's task
                // holds only the state of the branch it is in (see docs/performance.md).
                return Box::pin(crate::intercept::serve(ix, tunnel, audit, stop, live, wait))
                    .await;
            }
            _ => {
                audit.refused_in_tunnel(
                    crate::policy::reason::Reason::CredentialMisuse,
                    "the host's credentials or HTTP rules need TLS; this tunnel is not TLS",
                );
                client.reset();
                server.reset();
                return Relayed::nothing(Close::Eof);
            }
        }
    }
    audit.open();
    let idle = shared.settings.timeouts.idle;
    if let FirstBytes::Client(Peeked::Http { .. }) = &inspected.first {
        // Plain HTTP: every later request in the tunnel must name the CONNECT host too.
        let checked = Box::pin(crate::relay::http_checked::relay_checked(
            client,
            server,
            inspected.client,
            target,
            report,
            idle,
            stop,
            shaper,
        ))
        .await;
        if let Some(m) = checked.mismatch {
            m.record(audit, report);
        }
        return checked.relayed;
    }
    // Replay what was read, each in its direction, then relay (without the buffers).
    use tokio::io::AsyncWriteExt;
    if server.write_all(&inspected.client).await.is_err()
        || client.write_all(&inspected.server).await.is_err()
    {
        return Relayed::nothing(Close::Error);
    }
    let replayed = (inspected.client.len() as u64, inspected.server.len() as u64);
    drop(inspected);
    let mut r = match (client, server.into_tcp()) {
        (ClientIo::Tcp(client), Ok(server)) => {
            crate::relay::tunnel::relay_tcp(client, server, idle, stop, shaper).await
        }
        // Either side in TLS (or an HTTP/2 stream): relayed in user space.
        (client, server) => {
            let server = server.map_or_else(|tls| tls, ServerIo::Tcp);
            Box::pin(crate::relay::tunnel::relay_streams(
                client, server, idle, stop, shaper,
            ))
            .await
        }
    };
    r.up += replayed.0;
    r.down += replayed.1;
    r
}
