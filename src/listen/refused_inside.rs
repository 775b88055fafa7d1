//! A refused CONNECT answered inside the tunnel (`tls_intercept.refusals_inside`), as Squid
//! shows its error pages in a bumped tunnel: curl prints only `CONNECT tunnel failed,
//! response 403` and Node's undici only `Request was cancelled` for a refused CONNECT, so an
//! agent using them never sees the reason or where to ask. With this on, the CONNECT of an
//! identified sandbox refused by policy (a `403`) is answered `200`; the proxy then reads the
//! client's first bytes (within `timeouts.header_ms`) and answers its first request with the
//! same refusal — over TLS with a leaf for the refused name from the interception CA when the
//! client starts TLS, in the clear when it sends HTTP — and closes. Nothing is dialled, and
//! the record is the CONNECT's refusal, as without it.
//!
//! Off by default: a sandbox that does not trust the interception CA gets a certificate error
//! instead of the `403` status line.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;

use crate::audit::AuditGuard;
use crate::policy::Decision;
use crate::relay::body::{self, Body};
use crate::runtime::Shared;
use crate::sandboxes::set::Sandbox;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// When `refusal` of `req` is to be answered inside the tunnel: the tunnel's upgrade, taken
/// now (before the request is answered); the record says so.
pub fn wanted(
    shared: &Shared,
    req: &mut Request<Incoming>,
    sandbox: Option<&Sandbox>,
    refusal: &Decision,
    audit: &mut AuditGuard,
) -> Option<OnUpgrade> {
    let on = shared
        .settings
        .interceptor
        .as_ref()
        .is_some_and(|ix| ix.refusals_inside());
    if !on || req.method() != http::Method::CONNECT || sandbox.is_none() {
        return None;
    }
    if refusal.reason.status() != 403 {
        return None;
    }
    if !audit.has_detail() {
        audit.detail("refused inside the tunnel (tls_intercept.refusals_inside)");
    }
    Some(hyper::upgrade::on(req))
}

/// Answer the CONNECT `200`, and `refusal` to the first request inside the tunnel to
/// `host` (the refused name or address), holding the connection's place (`permit`) until the
/// end — all within `timeouts.header_ms`.
pub fn answer(
    shared: &Arc<Shared>,
    upgrade: OnUpgrade,
    refusal: Response<Body>,
    host: String,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response<Body> {
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrade.await {
            let header = shared.settings.timeouts.header;
            let _ = tokio::time::timeout(header, serve(&shared, upgraded, refusal, &host)).await;
        }
        drop(permit);
    });
    Response::new(body::empty())
}

/// Read the first bytes; TLS (with a leaf for `host`) or plain HTTP; one response; close.
async fn serve(
    shared: &Shared,
    upgraded: hyper::upgrade::Upgraded,
    refusal: Response<Body>,
    host: &str,
) -> Option<()> {
    let mut io = TokioIo::new(upgraded);
    let mut first = vec![0u8; 1];
    if io.read(&mut first).await.ok()? == 0 {
        return None;
    }
    let io = crate::intercept::prefixed::Prefixed::new(first.clone(), io);
    let once = Arc::new(Mutex::new(Some(refusal)));
    if first[0] != TLS_HANDSHAKE {
        return one_response(io, once).await;
    }
    let ix = shared.settings.interceptor.as_ref()?;
    let config = ix.own_server_config(host.trim_matches(['[', ']'])).ok()?;
    let tls = tokio_rustls::TlsAcceptor::from(config)
        .accept(io)
        .await
        .ok()?;
    one_response(tls, once).await
}

/// Serve HTTP/1.1 on `io` until the refusal was answered (it says `Connection: close`).
async fn one_response<IO>(io: IO, once: Arc<Mutex<Option<Response<Body>>>>) -> Option<()>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
        let taken = once.lock().ok().and_then(|mut r| r.take());
        async move {
            Ok::<_, std::convert::Infallible>(taken.unwrap_or_else(|| Response::new(body::empty())))
        }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await
        .ok()
}

/// The admission's refusal of `req`: answered as a §6 response, or — a refused CONNECT, with
/// `tls_intercept.refusals_inside` — inside the tunnel ([`super::refused_inside`]).
pub(super) fn refused_admission(
    conn: &super::explicit::ClientConn,
    mut req: Request<Incoming>,
    mut audit: AuditGuard,
    r: crate::egress::admit::Refused,
) -> Response<Body> {
    let shared = &conn.shared;
    let sandbox = r.sandbox.as_deref();
    let inside = wanted(shared, &mut req, sandbox, &r.shown, &mut audit);
    let resp = super::explicit_refuse::refuse_as(
        shared,
        audit,
        &req,
        sandbox,
        &r.shown,
        r.explanation,
        r.retry_after,
    );
    let Some(upgrade) = inside else {
        return resp;
    };
    // The refused name, parsed again: only on this path.
    let host = super::explicit::read_target(&req).map(|t| t.host.to_string());
    // The connection's place goes with the tunnel, as an allowed one's does.
    let permit = conn.take_place();
    answer(shared, upgrade, resp, host.unwrap_or_default(), permit)
}
