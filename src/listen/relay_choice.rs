//! The one relay chooser: once an exchange is admitted and its first bytes judged, how its
//! bytes move — the same for a CONNECT tunnel and a transparent connection:
//! - a host that a credential or an HTTP rule of the sandbox is bound to is terminated
//!   ([`crate::intercept`]), and only over TLS: anything else to it is refused (a secret never
//!   travels in clear) and nothing reaches it;
//! - plain HTTP has every later request checked against the decided host
//!   ([`crate::relay::http_checked`]);
//! - anything else has what was read replayed in its directions and is relayed — zero-copy
//!   between two plain TCP sockets, in user space otherwise ([`crate::relay::tunnel`]).
//!
//! Every branch a plain tunnel does not take is boxed: an idle tunnel's task holds only the
//! state of the branch it is in (see docs/performance.md).

use std::future::Future;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;

use crate::audit::{AuditGuard, Close};
use crate::egress::limits::SandboxLimiter;
use crate::policy::reason::Reason;
use crate::policy::set::Sandbox;
use crate::policy::target::Target;
use crate::policy::Enforcement;
use crate::relay::abortable::OverTcp;
use crate::relay::client_io::ClientIo;
use crate::relay::liveness::Liveness;
use crate::relay::server_io::ServerIo;
use crate::relay::tunnel::Relayed;
use crate::runtime::Shared;
use crate::wire::first_bytes::{FirstBytes, Inspected};
use crate::wire::peek::Peeked;

/// What a relay starts from.
pub struct Start<'a> {
    pub shared: &'a Arc<Shared>,
    pub sandbox: &'a Sandbox,
    /// The decided target (what the grant allows).
    pub target: &'a Target,
    pub client: ClientIo,
    /// The dialled destination.
    pub server: ServerIo,
    /// What was read before deciding, to be replayed, and what it was.
    pub inspected: Inspected,
}

/// Relay an admitted exchange until it ends, idles out, is revoked or shut down (`stop`).
pub async fn relay<F>(
    start: Start<'_>,
    audit: &mut AuditGuard,
    stop: F,
    limiter: &SandboxLimiter,
) -> Relayed
where
    F: Future<Output = Close>,
{
    let shaper = limiter.shapes().then_some(limiter);
    let Start {
        shared,
        sandbox,
        target,
        client,
        server,
        inspected,
    } = start;
    let b = &sandbox.binding;
    if let Some(tcp) = client.tcp() {
        crate::relay::buffers::cap(tcp, server.tcp(), b.limits.socket_buffer_bytes);
    }
    let terminate = shared
        .settings
        .interceptor
        .as_ref()
        .filter(|ix| ix.terminates(b, &target.host.to_string()));
    if let Some(ix) = terminate {
        let FirstBytes::Client(Peeked::Tls(hello)) = &inspected.first else {
            audit.refused_in_tunnel(
                Reason::CredentialMisuse,
                "the host's credentials or HTTP rules need TLS; this connection is not TLS",
            );
            client.reset();
            server.reset();
            return Relayed::nothing(Close::Eof);
        };
        let tunnel = crate::intercept::Tunnel {
            current: shared.current_binding(&b.id),
            host: &target.host.to_string(),
            port: target.port,
            client,
            early: inspected.client,
            server,
            client_alpn: hello.alpn.clone(),
            resolver: shared.resolver(),
            deciders: shared.deciders.clone(),
        };
        let timeouts = &shared.settings.timeouts;
        let live = Arc::new(Liveness::new(timeouts.idle).metered(limiter, &target.host));
        return Box::pin(crate::intercept::serve(
            ix,
            tunnel,
            audit,
            stop,
            live,
            timeouts.header,
        ))
        .await;
    }
    audit.open();
    // A tunnel the proxy does not see into is one request.
    let live = Liveness::new(shared.settings.timeouts.idle).metered(limiter, &target.host);
    live.request();
    if let FirstBytes::Client(Peeked::Http { .. }) = &inspected.first {
        // Plain HTTP: every later request on the connection must name the decided host too.
        let report = b.enforcement == Enforcement::Report;
        let checked = Box::pin(crate::relay::http_checked::relay_checked(
            client,
            server,
            inspected.client,
            target,
            report,
            live,
            stop,
            shaper,
        ))
        .await;
        if let Some(m) = checked.mismatch {
            m.record(audit, report);
        }
        return checked.relayed;
    }
    replay_and_relay(client, server, inspected, live, stop, shaper).await
}

/// Replay what was read, each in its direction, then relay without the buffers.
async fn replay_and_relay<F>(
    mut client: ClientIo,
    mut server: ServerIo,
    inspected: Inspected,
    live: Liveness,
    stop: F,
    shaper: Option<&SandboxLimiter>,
) -> Relayed
where
    F: Future<Output = Close>,
{
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
            crate::relay::tunnel::relay_tcp(client, server, live, stop, shaper).await
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
