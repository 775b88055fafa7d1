//! The admin listener (`listen.admin`): health, readiness, metrics, and the runtime API
//! (DESIGN §10, §14). Mutating calls (`PUT`/`DELETE /v1/sandboxes/{id}`, `POST /v1/reload`)
//! need `Authorization: Bearer <token>` and are refused (403) when no `admin_token_file` is
//! configured; with a token configured every `/v1/*` call needs it. Tokens are compared as
//! SHA-256 digests in constant time. Bodies are capped at `runtime.max_binding_bytes`.
//! `GET /v1/observe` streams decisions ([`crate::control::observe`]); like a mutating call it
//! needs the token, and is refused when none is configured.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::admin_layers::Candidate;
use super::admin_paths::Path;
use crate::control::etcd::ControlPlane;
use crate::control::{ChangeError, Controller};
use crate::runtime::Shared;

/// What the admin API needs.
pub struct Admin {
    pub shared: Arc<Shared>,
    pub control: Arc<Controller>,
    /// The shared control plane, when `control_plane.etcd` is configured: registrations go
    /// through it instead of `control`.
    pub plane: Option<Arc<ControlPlane>>,
    /// SHA-256 of the bearer token (`None`: no token configured: mutating calls refused).
    pub token_sha256: Option<[u8; 32]>,
    /// Largest request body (`runtime.max_binding_bytes`).
    pub max_body: usize,
    /// The console under `/ui/` (`admin.console: true`).
    pub console: Option<Arc<crate::control::console::Console>>,
}

/// Who is calling the admin API on one connection: its address, and the subject of its
/// client certificate on the TLS admin listener.
#[derive(Debug, Clone)]
pub struct Caller {
    pub addr: std::net::SocketAddr,
    pub certificate: Option<Box<str>>,
    /// The connection is TLS (the console's cookies are then `Secure`).
    pub tls: bool,
}

/// Serve one admin connection from `caller`.
pub async fn serve<S>(admin: Arc<Admin>, stream: S, caller: Caller)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let admin = admin.clone();
        req.extensions_mut().insert(caller.clone());
        async move { Ok::<_, Infallible>(respond(&admin, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(10))
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

/// A response of any admin call: a whole body, or the observe stream.
pub(super) type AdminBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn respond(admin: &Admin, req: Request<Incoming>) -> Response<AdminBody> {
    if req.method() == Method::GET && req.uri().path() == "/v1/observe" {
        return observe(admin, &req);
    }
    if crate::control::console::owns(req.uri().path()) {
        return crate::control::console::respond(admin, req).await;
    }
    route(admin, req).await.map(BodyExt::boxed)
}

/// `GET /v1/observe`: the token is required (as for a change), then the stream.
fn observe(admin: &Admin, req: &Request<Incoming>) -> Response<AdminBody> {
    if let Some(refused) = admin.gate(req, true) {
        return refused.map(BodyExt::boxed);
    }
    let filter = match crate::control::observe::Filter::parse(req.uri().query()) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()).map(BodyExt::boxed),
    };
    let lines = crate::control::observe::stream(admin.shared.sink.log.observe(), filter);
    let mut r = Response::new(lines.boxed());
    if let Ok(v) = "application/x-ndjson".parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    if let Ok(v) = "no-cache".parse() {
        r.headers_mut().insert(header::CACHE_CONTROL, v);
    }
    r
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

pub(super) fn json_resp(status: StatusCode, v: Value) -> Response<Full<Bytes>> {
    text(status, "application/json", format!("{v}\n"))
}

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    json_resp(status, json!({ "error": message.into() }))
}

impl Admin {
    /// Who answers through this request, for the approval records: the caller's address and
    /// the credential it used — its certificate's subject, or the admin token's digest (its
    /// first six bytes), never the token.
    pub(super) fn who(&self, req: &Request<Incoming>) -> crate::approvals::Who {
        let caller = req.extensions().get::<Caller>();
        let credential = caller.and_then(|c| c.certificate.clone()).or_else(|| {
            let digest = self.token_sha256.filter(|_| self.authorized(req))?;
            Some(format!("token sha256:{}", hex::encode(&digest[..6])).into())
        });
        crate::approvals::Who {
            by: "admin",
            client: caller.map(|c| c.addr),
            credential,
            identity: None,
            principal: None,
        }
    }

    /// Whether the request carries the configured bearer token (`false` when none is
    /// configured). The scheme is case-insensitive (RFC 9110 §11.1).
    fn authorized(&self, req: &Request<Incoming>) -> bool {
        let Some(expected) = &self.token_sha256 else {
            return false;
        };
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| -> [u8; 32] { Sha256::digest(t.trim().as_bytes()).into() });
        match presented {
            Some(p) => bool::from(p.ct_eq(expected)),
            None => false,
        }
    }

    /// Refuse the call unless it may go ahead: mutating calls always need the token (and are
    /// refused outright when none is configured); with a token configured, every `/v1/*` call
    /// needs it.
    fn gate(&self, req: &Request<Incoming>, mutating: bool) -> Option<Response<Full<Bytes>>> {
        let api = req.uri().path().starts_with("/v1/");
        if mutating && self.token_sha256.is_none() {
            return Some(error(
                StatusCode::FORBIDDEN,
                "this call needs the admin token, and none is configured. Set \
                 `admin_token_file` in proxy.yaml to a file holding a long random token, and \
                 send it as `Authorization: Bearer <token>`",
            ));
        }
        if (mutating || (api && self.token_sha256.is_some())) && !self.authorized(req) {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "this call needs Authorization: Bearer <admin token>",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"egress-proxy-admin\""),
            );
            return Some(r);
        }
        None
    }
}

/// The body, at most `max` bytes: a larger announced length is refused before any of it is
/// read, a larger body as soon as it passes `max`.
pub(super) async fn read_body(
    req: Request<Incoming>,
    max: usize,
) -> Result<String, Response<Full<Bytes>>> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body larger than {max} bytes (runtime.max_binding_bytes) or unreadable"),
        )
    };
    if req.body().size_hint().lower() > max as u64 {
        return Err(too_large());
    }
    let collected = Limited::new(req.into_body(), max)
        .collect()
        .await
        .map_err(|_| too_large())?;
    String::from_utf8(collected.to_bytes().to_vec())
        .map_err(|_| error(StatusCode::BAD_REQUEST, "body is not UTF-8"))
}

fn change_error(e: ChangeError) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = match e {
        ChangeError::Invalid(errs) => json_resp(
            status,
            json!({ "error": "invalid binding", "errors": errs.0.iter().map(|e| e.to_string()).collect::<Vec<_>>() }),
        ),
        ChangeError::Outcome {
            detail,
            committed,
            revision,
        } => json_resp(
            status,
            json!({
                "error": detail,
                "outcome": if committed { "committed" } else { "unknown" },
                "revision": revision,
            }),
        ),
        other => error(status, other.to_string()),
    };
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    r
}

async fn route(admin: &Admin, req: Request<Incoming>) -> Response<Full<Bytes>> {
    // Public, like any issuer's keys: no token.
    if let Some(r) = super::admin_keys::well_known(&admin.shared, &req) {
        return r;
    }
    let Some(path) = Path::of(req.uri().path()) else {
        return text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into());
    };
    let method = req.method().clone();
    if let Some(refused) = admin.gate(&req, path.mutating(&method)) {
        return refused;
    }
    let shared = &admin.shared;
    match (method, path) {
        (Method::GET, Path::Healthz) => text(StatusCode::OK, PLAIN, "ok\n".into()),
        (Method::GET, Path::Readyz) => readyz(admin),
        (Method::GET, Path::Metrics) => metrics(shared),
        (Method::GET, Path::Sandboxes) => sandboxes(admin),
        (Method::POST, Path::Reload) => reload(admin).await,
        (Method::POST, Path::Check) => match read_body(req, admin.max_body).await {
            Ok(body) => check(shared, &body).await,
            Err(r) => r,
        },
        (Method::POST, Path::Keepalive(id)) => keepalive(admin, id).await,
        (Method::GET, Path::Placeholders(id)) => placeholders(admin, &req, &id),
        (Method::GET, Path::Usage) => super::admin_usage::answer(shared, req.uri().query()),
        (Method::GET, Path::Sandbox(id)) => sandbox(admin, &id),
        (Method::PUT, Path::Sandbox(id)) => put_simulated(admin, id, req).await,
        (m, Path::Layers(at)) if at.takes(&m) => super::admin_layers::route(admin, at, req).await,
        (Method::DELETE, Path::Sandbox(id)) => delete(admin, id).await,
        (Method::GET, Path::Flows(id, false)) => {
            super::admin_flows::route(admin, &id, false, req).await
        }
        (Method::POST, Path::Flows(id, true)) => {
            super::admin_flows::route(admin, &id, true, req).await
        }
        (m, Path::Requests(at)) if at.takes(&m) => {
            let who = admin.who(&req);
            super::admin_requests::route(shared, at, req, (admin.max_body, who)).await
        }
        (_, path) => method_not_allowed(&path),
    }
}

/// `GET /metrics`: the audit sink's, the DNS memory's and the desk's gauges brought up to date,
/// then all.
fn metrics(shared: &Shared) -> Response<Full<Bytes>> {
    let m = shared.metrics();
    m.audit_sink(&shared.sink.log.health().status());
    m.dns_remembered(&shared.dns_memory.shares());
    m.approval_long_polls(shared.desk.get().map_or(0, |d| d.long_polls()));
    text(StatusCode::OK, "text/plain; version=0.0.4", m.render())
}

/// `GET /v1/sandboxes`: every sandbox, and the control plane's state when there is one.
fn sandboxes(admin: &Admin) -> Response<Full<Bytes>> {
    let mut list = admin.control.list();
    if let Some(plane) = &admin.plane {
        list["control_plane"] = plane.status();
    }
    json_resp(StatusCode::OK, list)
}

/// `PUT /v1/sandboxes/{id}`: refused when `?require=` asks for a simulation the candidate
/// fails, else registered (`?ttl_s=` a lifetime).
async fn put_simulated(admin: &Admin, id: String, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (ttl_s, require) = match super::admin_layers::put_query(req.uri().query()) {
        Ok(q) => q,
        Err(m) => return error(StatusCode::BAD_REQUEST, m.to_string()),
    };
    let body = match read_body(req, admin.max_body).await {
        Ok(body) => body,
        Err(r) => return r,
    };
    let candidate = Candidate::Sandbox(id.clone(), body.clone());
    match super::admin_layers::refused_by_simulation(admin, require, candidate).await {
        Some(refused) => refused,
        None => put(admin, id, body, ttl_s).await,
    }
}

/// A known path with a method it does not take: 405 with `Allow`.
fn method_not_allowed(path: &Path) -> Response<Full<Bytes>> {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("use {}", path.allow()),
    );
    r.headers_mut()
        .insert(header::ALLOW, http::HeaderValue::from_static(path.allow()));
    r
}

const PLAIN: &str = "text/plain; charset=utf-8";

/// `GET /readyz`: 200 once the policy is loaded (and etcd listed), 503 otherwise — and 503
/// while the audit sink fails under `audit.on_failure: refuse` (this replica serves nothing
/// then, so a Service should send its traffic elsewhere).
fn readyz(admin: &Admin) -> Response<Full<Bytes>> {
    let shared = &admin.shared;
    if !shared.ready.load(Ordering::Acquire) {
        return text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "not ready\n".into());
    }
    let audit = shared.sink.log.health().status();
    let failing = audit.failing_for.map(|d| {
        format!(
            "the audit sink has been failing for {:.1} s ({})",
            d.as_secs_f64(),
            audit.error
        )
    });
    if let Some(f) = &failing {
        if audit.on_failure == crate::config::audit::OnFailure::Refuse {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: audit_unavailable: {f}; connections are refused until it writes again\n"),
            );
        }
    }
    let dropping = failing
        .map(|f| format!("; {f}: records are dropped (audit.on_failure: continue)"))
        .unwrap_or_default();
    let revision = admin
        .plane
        .as_ref()
        .map(|p| format!(", control plane revision {}", p.revision()))
        .unwrap_or_default();
    text(
        StatusCode::OK,
        PLAIN,
        format!(
            "ready: policy {}{revision}{dropping}\n",
            shared.policy.load().version()
        ),
    )
}

/// `POST /v1/reload`.
async fn reload(admin: &Admin) -> Response<Full<Bytes>> {
    match off_reactor(admin, |c| c.reload("api"))
        .await
        .map(|r| r.map_err(|e| e.messages()))
        .unwrap_or_else(|| Err(vec!["control-plane task failed".into()]))
    {
        Ok(r) => json_resp(
            StatusCode::OK,
            json!({ "policy_version": r.version, "needs_restart": r.needs_restart }),
        ),
        Err(errors) => json_resp(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({ "error": "reload refused; the running policy stays", "errors": errors }),
        ),
    }
}

/// `POST /v1/sandboxes/{id}/keepalive` (etcd leases).
async fn keepalive(admin: &Admin, id: String) -> Response<Full<Bytes>> {
    let Some(plane) = &admin.plane else {
        return error(
            StatusCode::BAD_REQUEST,
            "leases need control_plane.etcd; registrations without it never expire",
        );
    };
    match plane.keepalive(&id).await {
        Ok(ttl) => json_resp(StatusCode::OK, json!({ "id": id, "ttl_s": ttl })),
        Err(e) => change_error(e),
    }
}

/// `GET /v1/sandboxes/{id}/placeholders`: they stand in for secrets, so only the admin token
/// holder gets them.
fn placeholders(admin: &Admin, req: &Request<Incoming>, id: &str) -> Response<Full<Bytes>> {
    if admin.token_sha256.is_none() || !admin.authorized(req) {
        return error(
            StatusCode::UNAUTHORIZED,
            "placeholders need Authorization: Bearer <admin token>",
        );
    }
    let set = admin.shared.policy.load();
    match set.get(id) {
        Some(sb) => json_resp(
            StatusCode::OK,
            json!({
                "id": id,
                "placeholders": sb.binding.credentials.iter().map(super::admin_keys::placeholder_of).collect::<Vec<_>>(),
            }),
        ),
        None => error(StatusCode::NOT_FOUND, format!("no sandbox `{id}`")),
    }
}

/// `GET /v1/sandboxes/{id}`: the sandbox in force, or why its etcd value is not.
fn sandbox(admin: &Admin, id: &str) -> Response<Full<Bytes>> {
    match (admin.control.get(id), admin.control.skipped(id)) {
        (Some(v), _) => json_resp(StatusCode::OK, v),
        (None, Some((revision, why))) => json_resp(
            StatusCode::NOT_FOUND,
            json!({
                "error": format!("the value of sandbox `{id}` in etcd (revision {revision}) is not in force"),
                "why": why,
            }),
        ),
        (None, None) => error(StatusCode::NOT_FOUND, format!("no sandbox `{id}`")),
    }
}

/// `DELETE /v1/sandboxes/{id}`: its open exchanges are cut.
async fn delete(admin: &Admin, id: String) -> Response<Full<Bytes>> {
    let result = match &admin.plane {
        Some(plane) => plane.delete(&id).await.map(|(n, r)| (n, Some(r))),
        None => off_reactor(admin, {
            let id = id.clone();
            move |c| c.delete(&id)
        })
        .await
        .unwrap_or_else(|| Err(ChangeError::Failed("control-plane task failed".into())))
        .map(|n| (n, None)),
    };
    match result {
        Ok((revoked, revision)) => {
            // Its flow labels go with it (a new sandbox of the same id starts clean).
            if let Err(e) = admin.shared.settings.flows.forget(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "cannot keep the flow state");
            }
            let mut body = json!({ "id": id, "deleted": true, "tunnels_closed": revoked });
            if let Some(r) = revision {
                body["revision"] = json!(r);
            }
            json_resp(StatusCode::OK, body)
        }
        Err(e) => change_error(e),
    }
}

/// `PUT /v1/sandboxes/{id}`: through etcd when configured, else in this process.
async fn put(admin: &Admin, id: String, body: String, ttl_s: Option<i64>) -> Response<Full<Bytes>> {
    let result = match (&admin.plane, ttl_s) {
        (Some(plane), ttl) => plane.put(&id, &body, ttl).await.map(|(c, r)| (c, Some(r))),
        (None, Some(_)) => Err(ChangeError::BadRequest(
            "ttl_s needs control_plane.etcd (leases are etcd's); without it a registration stays until deleted".into(),
        )),
        (None, None) => {
            let put_id = id.clone();
            off_reactor(admin, move |c| c.put(&put_id, &body))
                .await
                .unwrap_or_else(|| Err(ChangeError::Failed("control-plane task failed".into())))
                .map(|c| (c, None))
        }
    };
    match result {
        Ok((created, revision)) => {
            let mut body = json!({ "id": id, "created": created, "policy_version": admin.shared.policy.load().version() });
            if let Some(r) = revision {
                body["revision"] = json!(r);
            }
            json_resp(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                body,
            )
        }
        Err(e) => change_error(e),
    }
}

/// Run a control-plane change (compile, fsync, under the controller's lock) on the blocking
/// pool, never on a data-plane worker thread.
async fn off_reactor<T: Send + 'static>(
    admin: &Admin,
    change: impl FnOnce(&Controller) -> T + Send + 'static,
) -> Option<T> {
    let control = admin.control.clone();
    match tokio::task::spawn_blocking(move || change(&control)).await {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!(error = %e, "control-plane task failed");
            None
        }
    }
}

/// `POST /v1/check {"sandbox","target"}`: the decision the proxy would make now, resolving
/// names exactly as it would.
async fn check(shared: &Shared, body: &str) -> Response<Full<Bytes>> {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected JSON {\"sandbox\": ..., \"target\": ...}",
        );
    };
    let (Some(sandbox), Some(_)) = (v["sandbox"].as_str(), v["target"].as_str()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected JSON {\"sandbox\": ..., \"target\": ...}",
        );
    };
    let set = shared.policy.load();
    let Some(sb) = set.get(sandbox) else {
        return error(StatusCode::NOT_FOUND, format!("no sandbox `{sandbox}`"));
    };
    json_resp(
        StatusCode::OK,
        crate::control::check::check_json(&set, sb, &v, Some(&shared.resolver())).await,
    )
}
