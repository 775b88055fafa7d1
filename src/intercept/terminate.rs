//! A tunnel that is terminated over TLS: its upstream connection — a kept one
//! ([`super::kept`]), else TLS opened to the dialled address and verified for the decided
//! name, offering what the client offered of HTTP/1.1 and HTTP/2 — then TLS with the client
//! under a leaf from the interception CA, offering the protocol the upstream chose; then the
//! exchanges ([`super::exchanges`]).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

use super::exchange::Spare;
use super::{exchanges, kept, Ends, Interceptor, Serving, Sides, Tunnel, Upstream};
use crate::audit::outcome::Close;
use crate::audit::AuditGuard;
use crate::intercept::prefixed::Prefixed;
use crate::relay::liveness::Liveness;
use crate::relay::tunnel::Relayed;

/// [`serve`] over TLS: the upstream connection (a kept one, or TLS and HTTP opened to the
/// dialled address), then TLS with the client offering what the upstream chose.
pub(super) async fn terminate<F>(
    (serving, ix): (&Serving, &Interceptor),
    mut t: Tunnel<'_>,
    audit: &mut AuditGuard,
    mut stop: std::pin::Pin<&mut F>,
    live: Arc<Liveness>,
    handshake: Duration,
) -> Relayed
where
    F: std::future::Future<Output = Close>,
{
    let offer = offer_of(&t.client_alpn);
    let binding = (t.ends.current)().map(|(b, _)| b);
    let keep = keeping(t.clearance.take(), binding.as_ref(), &t.ends, offer);
    let upstream_tls = || upstream_connector(ix, binding.as_ref(), offer, t.ends.host);
    let kept = keep.as_ref().and_then(|k| take_kept(ix, k, t.ends.port));
    let (up, negotiated, conn) = match kept {
        Some(k) => {
            audit.detail(format!(
                "terminating: on a kept upstream connection (its tunnel {})",
                k.conn.reused + 1
            ));
            with_spare(k, t.server, upstream_tls(), handshake)
        }
        None => {
            let Some((connector, name)) = upstream_tls() else {
                audit.detail("terminating: the host is not a TLS server name");
                return Relayed::nothing(Close::Error);
            };
            let cut = crate::egress::abortable::Cut::new();
            let server = crate::egress::abortable::Abortable::new(t.server, cut.clone());
            let upstream = step!(
                (audit, live, stop, handshake),
                "the upstream's TLS handshake",
                connector.connect(name, server),
                |e| format!(
                    "terminating: the upstream's TLS failed (certificate not valid for {}?): {e}",
                    t.ends.host
                )
            );
            let alpn = upstream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let h2 = alpn.as_deref() == Some(b"h2");
            let up = step!(
                (audit, live, stop, handshake),
                "the upstream's HTTP handshake",
                Upstream::connect(upstream, h2, &cut),
                |e| format!("terminating: upstream {e}")
            );
            let conn = keep.as_ref().map(|k| {
                let addr = kept::at(k.clearance.dialed, t.ends.port);
                kept::Conn::new(cut, addr, alpn.clone(), t.ends.host, k.carries.clone())
            });
            (up, alpn, conn)
        }
    };
    let h2 = negotiated.as_deref() == Some(b"h2");
    let Some(server_cfg) = client_config(ix, t.ends.host, negotiated.as_deref(), audit) else {
        return Relayed::nothing(Close::Error);
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    // A client that does not trust the interception CA ends here.
    let client = step!(
        (audit, live, stop, handshake),
        "the client's TLS handshake",
        acceptor.accept(Prefixed::new(t.early, t.client)),
        |e| {
            format!("terminating: the client refused the proxy's certificate (is the interception CA installed?): {e}")
        }
    );
    audit.open();
    let sides = Sides {
        up,
        client,
        h2,
        scheme: "https",
        keep: keep.zip(conn).map(|(k, conn)| k.into_keep(&ix.kept, conn)),
    };
    exchanges(serving, t.ends, sides, (audit, live, handshake), stop).await
}

/// A kept connection, with the tunnel's own dialled socket (`server`: checked for this tunnel,
/// at the same address) kept as its spare until the first request is answered — to send it
/// again on if the origin closes the kept connection under it. Its sender, its protocol and
/// what the pool knows of it.
fn with_spare(
    k: kept::KeptTls,
    server: crate::egress::server_io::ServerIo,
    connector: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    handshake: Duration,
) -> (Upstream, Option<Vec<u8>>, Option<kept::Conn>) {
    let alpn = k.conn.alpn.clone();
    let up = match connector {
        None => k.up,
        Some((connector, name)) => k.up.with_spare(Spare {
            server,
            connector,
            name,
            alpn: alpn.clone(),
            handshake,
        }),
    };
    (up, alpn, Some(k.conn))
}

/// Which of HTTP/1.1 and HTTP/2 the client offered (`client_alpn`): the index of the upstream
/// TLS configuration that offers the same.
fn offer_of(client_alpn: &[String]) -> usize {
    let h1 = client_alpn.iter().any(|p| p == "http/1.1");
    let h2 = client_alpn.iter().any(|p| p == "h2");
    usize::from(h1) + 2 * usize::from(h2)
}

/// A kept upstream connection this tunnel may take: same sandbox, authority, dialled address
/// and port, cleared by the same proof for the same process, carrying the same credentials.
fn take_kept(ix: &Interceptor, k: &kept::Keeping, port: u16) -> Option<kept::KeptTls> {
    let c = &k.clearance;
    let fits = |up: &kept::KeptTls, last: &crate::egress::clearance::Clearance| {
        last.proof == c.proof && last.process == c.process && up.conn.carries(&k.carries)
    };
    (ix.kept).take_fitting(&c.sandbox, &k.authority, &[c.dialed], port, fits)
}

/// What keeping a tunnel's upstream connection needs, when it may be kept (a clearance was
/// given, the sandbox is still registered: its `binding`): the clearance, the key for the
/// protocols the client offered (`offer`), and what the binding puts on requests to the host
/// now.
fn keeping(
    clearance: Option<Box<crate::egress::clearance::Clearance>>,
    binding: Option<&Arc<crate::config::Binding>>,
    ends: &Ends<'_>,
    offer: usize,
) -> Option<kept::Keeping> {
    Some(kept::Keeping {
        clearance: *clearance?,
        authority: kept::authority(ends.host, ends.port, offer),
        carries: kept::Carries::of(binding?, ends.host),
    })
}

/// How to reach the upstream over TLS: offering it what the client offered (of HTTP/1.1 and
/// HTTP/2), so the protocol it picks is one the client speaks, resuming a session of this
/// sandbox's `binding` with the host ([`super::resumption`]), and the name to verify. `None`
/// when `host` is not a TLS server name.
fn upstream_connector(
    ix: &Interceptor,
    binding: Option<&Arc<crate::config::Binding>>,
    offer: usize,
    host: &str,
) -> Option<(tokio_rustls::TlsConnector, ServerName<'static>)> {
    let config = ix.upstream.config(binding, host, offer);
    let name = ServerName::try_from(host.to_string()).ok()?;
    Some((tokio_rustls::TlsConnector::from(config), name))
}

/// The TLS configuration the client is served with: a leaf for `host` from the interception
/// CA, offering the protocol the upstream chose (`negotiated`). `None` (said in the record)
/// when it cannot be made.
fn client_config(
    ix: &Interceptor,
    host: &str,
    negotiated: Option<&[u8]>,
    audit: &mut AuditGuard,
) -> Option<Arc<rustls::ServerConfig>> {
    let leaf = match ix.ca.leaf(host) {
        Ok(l) => l,
        Err(e) => {
            audit.detail(format!("terminating: cannot issue a certificate: {e}"));
            return None;
        }
    };
    match leaf.server_config(negotiated) {
        Ok(c) => Some(c),
        Err(e) => {
            audit.detail(format!("terminating: {e}"));
            None
        }
    }
}
