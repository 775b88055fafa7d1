//! The proxy's own endpoint inside every sandbox: requests through the proxy to the reserved
//! authority [`LOCAL`] (`egress-proxy.local`, never resolved, never dialled) are answered
//! here, for the sandbox the connection identified (never a field of the body):
//! - `POST /v1/requests` `{"host", "port", "methods"?, "paths"?, "reason"}` → `202` the
//!   request (`pending`, or `approved` at once by auto-approval);
//! - `GET /v1/requests/{id}[?wait=S]` → the request, after waiting up to `S` seconds (at
//!   most 60) for an answer;
//! - `GET /v1/denials` → this sandbox's latest refusals.
//!
//! Over plain HTTP through the proxy ([`answer`]), and over `CONNECT egress-proxy.local:443`
//! with a certificate from the interception CA ([`tunnel`]; needs `tls_intercept`).
//!
//! A new request is checked by auto-approval ([`crate::approvals::auto`]) before it is
//! answered, and sent to the webhook, if any, after.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::approvals::shared;
use crate::approvals::{auto, request, webhook, Answer, Desk};
use crate::audit::{AuditGuard, Close};
use crate::egress::admit::Entered;
use crate::policy::granted::GrantKind;
use crate::policy::reason::Reason;
use crate::policy::target::{Host, Target};
use crate::policy::Decision;
use crate::relay::body::{self, Body};
use crate::runtime::Shared;
use crate::sandboxes::set::Sandbox;

/// The reserved name.
pub const LOCAL: &str = crate::policy::target::PROXY_NAME;
/// Largest request body read.
const MAX_BODY: usize = 8 * 1024;

/// The sandbox's client as a request records it: its address and how it was identified.
#[derive(Debug, Clone, Copy)]
struct Asker {
    addr: SocketAddr,
    identity: crate::egress::identity::Method,
}

fn asker(addr: SocketAddr, entered: &Entered) -> Asker {
    Asker {
        addr,
        identity: entered.method(),
    }
}

/// Whether `target` is the proxy's own endpoint.
pub fn is_local(target: &Target) -> bool {
    matches!(&target.host, Host::Name(n) if &**n == LOCAL)
}

/// Answer one request to the endpoint (plain HTTP through the proxy) for the sandbox
/// `entered` identified.
pub async fn answer(
    shared: &Arc<Shared>,
    entered: Entered,
    req: Request<Incoming>,
    mut audit: AuditGuard,
    client: SocketAddr,
) -> Response<Body> {
    let sb = entered.sandbox().clone();
    let resp = respond(shared, &sb, req, &mut audit, asker(client, &entered)).await;
    drop(entered);
    resp
}

/// `CONNECT egress-proxy.local:443`: answer 200, then terminate TLS with a leaf from the
/// interception CA and answer each request inside as [`answer`] does (each with a record of
/// its own, `mode: "https"`). The tunnel holds the sandbox's place until it ends (the client
/// closes, a request head is late by `timeouts.header_ms`, or the proxy shuts down).
pub fn tunnel(
    shared: &Arc<Shared>,
    entered: Entered,
    req: Request<Incoming>,
    mut audit: AuditGuard,
    client: SocketAddr,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response<Body> {
    audit.decision(&Decision::allow(Reason::ProxyEndpoint, None));
    let config = shared
        .settings
        .interceptor
        .as_ref()
        .map(|ix| ix.own_server_config(LOCAL));
    let Some(Ok(config)) = config else {
        audit.detail("no certificate for egress-proxy.local (tls_intercept)");
        return reply(
            StatusCode::BAD_GATEWAY,
            json!({"error": "egress-proxy.local over https needs tls_intercept: use http://egress-proxy.local"}),
        );
    };
    let upgrade = hyper::upgrade::on(req);
    let shared = shared.clone();
    tokio::spawn(async move {
        let served = match upgrade.await {
            Ok(upgraded) => {
                let io = TokioIo::new(upgraded);
                serve_tls(&shared, &entered, io, config, &audit, client).await
            }
            Err(e) => Err(LocalError::Http(e)),
        };
        if let Err(e) = served {
            audit.detail(format!("egress-proxy.local over TLS: {e}"));
            audit.close(Close::Error);
        }
        drop(audit);
        drop(entered);
        drop(permit);
    });
    Response::builder()
        .status(StatusCode::OK)
        .body(body::empty())
        .unwrap_or_else(|_| Response::new(body::empty()))
}

/// Why `egress-proxy.local` could not be served on a connection (the record's detail).
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("egress-proxy.local over TLS needs tls_intercept")]
    NoInterception,
    #[error("its certificate: {0}")]
    Certificate(#[from] crate::intercept::InterceptError),
    #[error("TLS with the client: {0}")]
    Tls(std::io::Error),
    #[error("TLS with the client took longer than timeouts.header_ms")]
    TlsTimeout,
    #[error("{0}")]
    Http(hyper::Error),
}

/// A transparent connection that named `egress-proxy.local` (its `Host`, or its SNI when
/// `tls_intercept` gives the proxy a certificate for it): answered here, its first bytes
/// (`read`, already taken off the socket) first. `Err` with why it could not be.
pub async fn serve_transparent(
    shared: &Arc<Shared>,
    entered: &Entered,
    stream: tokio::net::TcpStream,
    read: Vec<u8>,
    tls: bool,
    audit: &mut AuditGuard,
    client: SocketAddr,
) -> Result<(), LocalError> {
    audit.decision(&Decision::allow(Reason::ProxyEndpoint, None));
    let io = crate::intercept::prefixed::Prefixed::new(read, stream);
    if !tls {
        let recorder = audit.recorder().in_clear();
        return serve_http(
            shared,
            entered.sandbox(),
            io,
            recorder,
            asker(client, entered),
        )
        .await;
    }
    let config = shared
        .settings
        .interceptor
        .as_ref()
        .ok_or(LocalError::NoInterception)?
        .own_server_config(LOCAL)?;
    serve_tls(shared, entered, io, config, audit, client).await
}

/// TLS with the client (within `timeouts.header_ms`), then [`serve_http`].
async fn serve_tls<IO>(
    shared: &Arc<Shared>,
    entered: &Entered,
    io: IO,
    config: Arc<rustls::ServerConfig>,
    audit: &AuditGuard,
    client: SocketAddr,
) -> Result<(), LocalError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header = shared.settings.timeouts.header;
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(io);
    let tls = match tokio::time::timeout(header, accept).await {
        Ok(r) => r.map_err(LocalError::Tls)?,
        Err(_) => return Err(LocalError::TlsTimeout),
    };
    serve_http(
        shared,
        entered.sandbox(),
        tls,
        audit.recorder(),
        asker(client, entered),
    )
    .await
}

/// Serve HTTP/1.1 requests on `io` until the client closes, a request head is late by
/// `timeouts.header_ms`, or the proxy shuts down; each request is a record of its own
/// (`mode: "https"` over TLS, `"http"` in the clear: `recorder`'s).
async fn serve_http<IO>(
    shared: &Arc<Shared>,
    sb: &Arc<Sandbox>,
    io: IO,
    recorder: crate::audit::Recorder,
    client: Asker,
) -> Result<(), LocalError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header = shared.settings.timeouts.header;
    let mut phase = shared.phase.subscribe();
    let svc = {
        let (shared, sb) = (shared.clone(), sb.clone());
        hyper::service::service_fn(move |req| {
            let (shared, sb, recorder) = (shared.clone(), sb.clone(), recorder.clone());
            async move {
                let mut audit = recorder.guard();
                let resp = respond(&shared, &sb, req, &mut audit, client).await;
                Ok::<_, std::convert::Infallible>(resp)
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header)
        .serve_connection(TokioIo::new(io), svc);
    tokio::select! {
        r = conn => r.map_err(LocalError::Http),
        _ = phase.changed() => Ok(()),
    }
}

/// Route one request to the endpoint; `audit` is its record.
async fn respond(
    shared: &Arc<Shared>,
    sb: &Arc<Sandbox>,
    req: Request<Incoming>,
    audit: &mut AuditGuard,
    client: Asker,
) -> Response<Body> {
    // A kept connection (TLS, transparent) answers only while the sandbox it identified is
    // still registered with the same binding: a removal, a rotated token or a changed policy
    // ends what it may ask, as it ends a tunnel.
    let current = shared.policy.load();
    if !current
        .get(sb.binding.id.as_str())
        .is_some_and(|now| Arc::ptr_eq(&now.binding, &sb.binding))
    {
        let why =
            "the sandbox changed or was removed since this connection identified it; connect again";
        audit.decision(&Decision::deny(Reason::UnknownSandbox, None));
        audit.detail(why);
        return reply(StatusCode::FORBIDDEN, json!({ "error": why }));
    }
    drop(current);
    audit.decision(&Decision::allow(Reason::ProxyEndpoint, None));
    let Some(desk) = shared.desk.get().cloned() else {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": "the proxy is starting"}),
        );
    };
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    audit.detail(format!("answered by the proxy: {method} {path}"));
    match (method, path.as_str()) {
        (Method::POST, "/v1/requests") => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        json!({"error": format!("the body is over {MAX_BODY} bytes or broken")}),
                    )
                }
            };
            create(shared, &desk, sb, &body, client).await
        }
        (Method::GET, "/v1/denials") => reply(
            StatusCode::OK,
            json!({ "sandbox": sb.binding.id.as_str(), "denials": shared.sink.denials.of(sb.binding.id.as_str()) }),
        ),
        (Method::GET, p) if p.starts_with("/v1/requests/") => {
            let id = &p["/v1/requests/".len()..];
            let wait = wait_of(req.uri().query());
            let found = match request::valid_id(id) {
                true => desk.wait(sb.binding.id.as_str(), id, wait).await,
                false => None,
            };
            match found {
                Some(r) => reply(StatusCode::OK, r.view()),
                None => reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": format!("no request {id} of this sandbox")}),
                ),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "egress-proxy.local serves POST /v1/requests, GET /v1/requests/{id}[?wait=S] and GET /v1/denials"}),
        ),
    }
}

/// `?wait=S` (seconds; at most [`crate::approvals::MAX_WAIT`]).
fn wait_of(query: Option<&str>) -> Duration {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("wait="))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s.min(crate::approvals::MAX_WAIT.as_secs_f64())))
        .unwrap_or_default()
}

/// A new request: kept, checked by auto-approval, then sent to the webhook.
async fn create(
    shared: &Arc<Shared>,
    desk: &Arc<Desk>,
    sb: &Arc<Sandbox>,
    body: &Bytes,
    client: Asker,
) -> Response<Body> {
    let cfg = desk.cfg();
    let probe = request::parse(body, cfg.reason_max).ok();
    let terminated = probe.as_ref().is_some_and(|a| terminated(sb, &a.target));
    let r = match desk.ask(sb, terminated, body, (client.addr, client.identity)) {
        Ok(r) => r,
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            return reply(status, json!({ "error": e.message }));
        }
    };
    let mut r = r;
    let set = shared.policy.load();
    if let Some(auto) = auto::compile(&cfg, set.default_ports()) {
        let resolver = shared.resolver();
        let own = sb.policy.decide(&r.asked.target, None, &set.guard);
        let own_denied = own.decision.reason == Reason::DeniedByRule;
        let checks = auto::check(
            &auto,
            &cfg,
            &set,
            own_denied,
            terminated,
            &r.asked.target,
            &resolver,
        )
        .await;
        if checks.passed {
            let approve = Answer::Approve {
                kind: GrantKind::Ttl,
                ttl: Some(cfg.auto_ttl),
                note: Some("auto-approved (approvals.auto)".into()),
            };
            let (d, id) = (desk.clone(), r.id.clone());
            let done = shared::answer(d, id, approve, "auto".into(), checks.lines).await;
            if let Ok(done) = done {
                r = done;
            }
        } else {
            desk.note_checks(&r.id, checks.lines.clone());
            r.checks = checks.lines;
        }
    }
    if cfg.webhook.is_some() && r.state == crate::approvals::State::Pending {
        tokio::spawn(ask_webhook(desk.clone(), r.view()));
    }
    let mut resp = reply(StatusCode::ACCEPTED, r.view());
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/requests/{}", r.id)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// Send a request to the webhook; apply the decision its reply carries, if signed right.
async fn ask_webhook(desk: Arc<Desk>, view: Value) {
    let Some(hook) = desk.cfg().webhook.clone() else {
        return;
    };
    let id = view["id"].as_str().unwrap_or_default().to_string();
    let body = json!({ "type": "access_request", "request": view }).to_string();
    let reply = match webhook::send(&hook, &id, body.into_bytes()).await {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(request = %id, error = %e, "approvals webhook");
            return;
        }
    };
    // The same checks as the admin API's (`Answer::approve`): a reply outside them is
    // logged and the request stays pending.
    let answer = match (reply.decision.as_str(), reply.grant.as_deref()) {
        ("deny", _) => Answer::deny(reply.note),
        ("approve", g) => match g.unwrap_or("ttl") {
            "once" => Answer::approve(GrantKind::Once, reply.ttl_s, reply.note),
            "permanent" => Answer::approve(GrantKind::Permanent, reply.ttl_s, reply.note),
            "ttl" => Answer::approve(GrantKind::Ttl, reply.ttl_s, reply.note),
            other => Err(crate::approvals::DeskError {
                status: 400,
                message: format!("unknown grant `{other}`"),
            }),
        },
        (other, _) => Err(crate::approvals::DeskError {
            status: 400,
            message: format!("unknown decision `{other}`"),
        }),
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(request = %id, error = %e.message, "approvals webhook: reply refused; the request stays pending");
            desk.answer_refused(&id, &"webhook".into(), &e.message);
            return;
        }
    };
    let done = shared::answer(
        desk.clone(),
        id.clone(),
        answer,
        "webhook".into(),
        Vec::new(),
    )
    .await;
    if let Err(e) = done {
        tracing::warn!(request = %id, error = %e.message, "approvals webhook: answer not applied");
        desk.answer_refused(&id, &"webhook".into(), &e.message);
    }
}

/// Whether the sandbox's requests to `target`'s host are terminated (a credential or an
/// HTTP rule is bound to it): its rules stay above every grant.
fn terminated(sb: &Sandbox, target: &Target) -> bool {
    let host = target.host.to_string();
    let b = &sb.binding;
    b.credentials.iter().any(|c| c.bound_to(&host))
        || b.network.http.iter().any(|r| r.host.matches(&host))
}

fn reply(status: StatusCode, v: Value) -> Response<Body> {
    let mut resp = Response::new(body::full(Bytes::from(v.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
