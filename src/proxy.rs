//! The explicit proxy listener (`listen.proxy`): HTTP/1.1 `CONNECT host:port` tunnels and
//! absolute-form request forwarding. Per request: read the target → identify the sandbox →
//! decide on the name → resolve once → decide on the addresses (guard) → dial only a checked
//! address → tunnel or forward → one audit record. Every refusal is a §6 deny response.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{Close, Record};
use crate::deny::{self, Refusal};
use crate::identity::identify;
use crate::limits::ConnectionSlot;
use crate::policy::{Decision, Reason};
use crate::policy_set::Sandbox;
use crate::shaped_body::ShapedBody;
use crate::shared::Shared;
use crate::target::Target;
use crate::tunnel::relay;

type Body = BoxBody<Bytes, hyper::Error>;

/// Largest request head accepted (hyper answers 431 beyond it).
const MAX_HEAD: usize = 64 * 1024;

/// The connection's slot in the global cap; a tunnel takes it over, since the HTTP connection
/// ends when the tunnel begins.
type PermitSlot = Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>;

/// Serve one client connection until it closes. `permit` is its place under the global cap.
pub async fn serve(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let seen = Arc::new(AtomicU64::new(0));
    let slot: PermitSlot = Arc::new(std::sync::Mutex::new(Some(permit)));
    let svc = {
        let shared = shared.clone();
        let seen = seen.clone();
        service_fn(move |req| {
            seen.fetch_add(1, Ordering::Relaxed);
            let shared = shared.clone();
            let slot = slot.clone();
            async move { Ok::<_, Infallible>(handle(shared, peer, req, slot).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.settings.timeouts.header)
        .max_buf_size(MAX_HEAD)
        .max_header_size(MAX_HEAD)
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let mut draining = shared.draining.subscribe();
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            _ = draining.changed() => conn.as_mut().graceful_shutdown(),
        }
    };
    if let Err(e) = result {
        if seen.load(Ordering::Relaxed) == 0 {
            // The request never reached the service: malformed, too large, or too slow.
            let (reason, close, detail) = if e.is_timeout() {
                (
                    Reason::InvalidTarget,
                    Close::Idle,
                    "request head not received in time",
                )
            } else if e.is_parse_too_large() {
                (
                    Reason::InvalidTarget,
                    Close::Error,
                    "request head too large",
                )
            } else if e.is_parse() {
                (Reason::InvalidTarget, Close::Error, "malformed request")
            } else {
                (
                    Reason::InvalidTarget,
                    Close::Error,
                    "connection error before a request",
                )
            };
            let mut rec = shared.record(&shared.policy.load(), peer, "connect");
            rec.detail = Some(detail.into());
            shared.finish(
                rec,
                None,
                Decision::deny(reason, None),
                close,
                Instant::now(),
                0,
                0,
            );
        }
    }
}

/// The text shown for a request in refusals and logs (no credentials, no query).
fn describe(req: &Request<Incoming>) -> String {
    if req.method() == Method::CONNECT {
        format!(
            "CONNECT {}",
            req.uri().authority().map(|a| a.as_str()).unwrap_or("?")
        )
    } else {
        let u = req.uri();
        format!(
            "{} {}://{}{}",
            req.method(),
            u.scheme_str().unwrap_or("?"),
            u.authority().map(|a| a.host()).unwrap_or("?"),
            u.path()
        )
    }
}

async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
    permit_slot: PermitSlot,
) -> Response<Body> {
    let started = Instant::now();
    let connect = req.method() == Method::CONNECT;
    let set = shared.policy.load_full();
    let mut rec = shared.record(&set, peer, if connect { "connect" } else { "http" });
    let what = describe(&req);

    // Target.
    let target = match read_target(&req) {
        Ok(t) => t,
        Err(why) => {
            rec.detail = Some(why.into());
            let d = Decision::deny(Reason::InvalidTarget, None);
            return shared.refuse(rec, None, d, &what, why, started);
        }
    };
    rec.target_host = Some(target.host.to_string());
    rec.target_port = Some(target.port);

    // Identity.
    let auth = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .map(|v| v.as_bytes());
    let who = match identify(
        &set,
        auth,
        peer.ip(),
        shared.settings.default_sandbox.as_deref(),
    ) {
        Ok(w) => w,
        Err(refused) => {
            rec.identity = refused.method.as_str();
            let d = Decision::deny(refused.reason, None);
            let why = d.explain("-", "-", target.port);
            return shared.refuse(rec, None, d, &what, &why, started);
        }
    };
    rec.identity = who.method.as_str();
    let sb = who.sandbox;
    rec.sandbox = Some(sb.binding.id.clone());

    // Limits: a place under max_connections and a rate token, before any work.
    let slot = match shared.admit(&sb) {
        Ok(slot) => slot,
        Err((reason, retry)) => {
            return shared.refuse_limited(rec, &sb, reason, retry, &what, started)
        }
    };

    // Decide on the name, resolve once, decide on the addresses.
    let outcome = match crate::connect::check(&shared, &set, &sb, &target, &mut rec, None).await {
        Ok(o) => o,
        Err((decision, detail)) => {
            let mut why = decision.explain(&sb.binding.id, sb.policy.file(), target.port);
            if let Some(d) = detail {
                why = format!("{why} ({d})");
            }
            return shared.refuse(rec, Some(&sb), decision, &what, &why, started);
        }
    };
    let decision = outcome.decision.clone();

    // Dial only the checked addresses.
    let stream = match crate::connect::dial(&shared, &outcome.dial, target.port, None).await {
        Ok((stream, addr)) => {
            rec.dialed = Some(addr.to_string());
            stream
        }
        Err(reason) => {
            let d = Decision::deny(reason, None);
            let why = d.explain(&sb.binding.id, sb.policy.file(), target.port);
            return shared.refuse(rec, Some(&sb), d, &what, &why, started);
        }
    };

    if connect {
        let permit = permit_slot.lock().ok().and_then(|mut s| s.take());
        open_tunnel(
            shared,
            req,
            stream,
            rec,
            sb,
            decision,
            started,
            (permit, slot),
            target,
        )
    } else {
        forward(
            shared, req, stream, rec, sb, decision, target, started, slot,
        )
        .await
    }
}

/// The target of a CONNECT (authority-form, port required) or an absolute-form request
/// (`http://` only; port 80 by default).
fn read_target(req: &Request<Incoming>) -> Result<Target, &'static str> {
    let uri = req.uri();
    if req.method() == Method::CONNECT {
        let authority = uri.authority().ok_or("CONNECT needs host:port")?;
        return Target::parse(authority.as_str(), None)
            .map_err(|_| "CONNECT target is not a valid host:port");
    }
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err("use CONNECT for https:// destinations"),
        Some(_) => return Err("only http:// URIs are forwarded"),
        None => {
            return Err("not a proxy request: send CONNECT host:port or an absolute http:// URI")
        }
    }
    let authority = uri.authority().ok_or("absolute URI without a host")?;
    Target::parse(authority.as_str(), Some(80))
        .map_err(|_| "URI host is not a valid host name or IP literal")
}

#[allow(clippy::too_many_arguments)]
fn open_tunnel(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    stream: TcpStream,
    mut rec: Record,
    sb: Arc<Sandbox>,
    decision: Decision,
    started: Instant,
    (permit, slot): (Option<OwnedSemaphorePermit>, ConnectionSlot),
    target: Target,
) -> Response<Body> {
    let id = sb.binding.id.clone();
    shared.apply_decision(&mut rec, &decision);
    let mut open = rec.clone();
    open.event = "open";
    open.close = None;
    shared.audit.write(open);
    shared.metrics.active.with_label_values(&[&id]).inc();
    let dialed = rec
        .dialed
        .as_deref()
        .and_then(|d| d.parse::<SocketAddr>().ok())
        .map(|a| a.ip());
    let (stop, handle) = match dialed {
        Some(ip) => {
            let (rx, h) = shared.register_tunnel(rec.conn_id, &id, &target, ip);
            (rx, Some(h))
        }
        None => (
            tokio::sync::watch::channel(crate::tunnel::Stop::Running).1,
            None,
        ),
    };
    let idle = shared.settings.timeouts.idle;
    tokio::spawn(async move {
        let (close, up, down) = match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let limiter = slot.limiter();
                let shaper = limiter.shapes().then_some(&**limiter);
                relay_upgraded(upgraded, stream, idle, stop, shaper).await
            }
            Err(_) => (Close::Error, 0, 0),
        };
        shared.metrics.active.with_label_values(&[&id]).dec();
        shared.finish(rec, Some(&id), decision, close, started, up, down);
        drop(handle);
        drop(slot);
        drop(permit);
    });
    Response::builder()
        .status(StatusCode::OK)
        .body(empty())
        .unwrap_or_else(|_| Response::new(empty()))
}

/// Relay a CONNECT tunnel. Unshaped tunnels over plain TCP take the zero-copy path (the
/// client socket is recovered from hyper, with any bytes it had already buffered sent first).
async fn relay_upgraded(
    upgraded: hyper::upgrade::Upgraded,
    mut stream: TcpStream,
    idle: std::time::Duration,
    stop: tokio::sync::watch::Receiver<crate::tunnel::Stop>,
    shaper: Option<&crate::limits::SandboxLimiter>,
) -> (Close, u64, u64) {
    let upgraded = if shaper.is_none() {
        match upgraded.downcast::<TokioIo<TcpStream>>() {
            Ok(parts) => {
                let client = parts.io.into_inner();
                let early = parts.read_buf;
                if !early.is_empty()
                    && tokio::io::AsyncWriteExt::write_all(&mut stream, &early)
                        .await
                        .is_err()
                {
                    return (Close::Error, 0, 0);
                }
                let r = crate::splice::relay(client, stream, idle, stop).await;
                return (r.close, r.up + early.len() as u64, r.down);
            }
            Err(upgraded) => upgraded,
        }
    } else {
        upgraded
    };
    let r = relay(TokioIo::new(upgraded), stream, idle, stop, shaper).await;
    (r.close, r.up, r.down)
}

fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Hop-by-hop headers, plus the proxy's own credentials: never forwarded.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for h in [
        header::CONNECTION,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(h);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// Writes the request's audit record when the response body is dropped (finished or not).
struct FinishOnDrop {
    shared: Arc<Shared>,
    rec: Option<Record>,
    decision: Decision,
    close: Close,
    sandbox: String,
    started: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    /// The request's place under its sandbox's limits, held until the response body ends.
    _slot: ConnectionSlot,
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(rec) = self.rec.take() {
            self.shared
                .metrics
                .active
                .with_label_values(&[&self.sandbox])
                .dec();
            self.shared.finish(
                rec,
                Some(&self.sandbox),
                self.decision.clone(),
                self.close,
                self.started,
                self.up.load(Ordering::Relaxed),
                self.down.load(Ordering::Relaxed),
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    stream: TcpStream,
    mut rec: Record,
    sb: Arc<Sandbox>,
    decision: Decision,
    target: Target,
    started: Instant,
    slot: ConnectionSlot,
) -> Response<Body> {
    let id = sb.binding.id.clone();
    shared.apply_decision(&mut rec, &decision);
    let (mut parts, body) = req.into_parts();
    // Bandwidth limits apply to forwarded bodies as to tunnels.
    let limiter = slot.limiter().clone();
    let shaped = limiter.shapes();
    let up = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let up_count = up.clone();
    let body = body
        .map_frame(move |f| {
            if let Some(d) = f.data_ref() {
                up_count.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
            f
        })
        .boxed();
    let body = if shaped {
        ShapedBody::new(body, limiter.clone(), true).boxed()
    } else {
        body
    };
    strip_hop_by_hop(&mut parts.headers);
    if !parts.headers.contains_key(header::HOST) {
        if let Ok(v) = target_host_header(&target).parse() {
            parts.headers.insert(header::HOST, v);
        }
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = path
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    parts.version = http::Version::HTTP_11;
    let upstream_req = Request::from_parts(parts, body);

    shared.metrics.active.with_label_values(&[&id]).inc();
    let guard = FinishOnDrop {
        shared: shared.clone(),
        rec: Some(rec),
        decision,
        close: Close::Eof,
        sandbox: id.clone(),
        started,
        up,
        down: down.clone(),
        _slot: slot,
    };
    let result = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.send_request(upstream_req).await
    }
    .await;
    match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let mut guard = Some(guard);
            let body = body
                .map_frame(move |f| {
                    if let Some(d) = f.data_ref() {
                        down.fetch_add(d.len() as u64, Ordering::Relaxed);
                    }
                    // Keep the guard alive exactly as long as the body.
                    let _ = &guard;
                    if f.is_trailers() {
                        guard.take();
                    }
                    f
                })
                .boxed();
            let body = if shaped {
                ShapedBody::new(body, limiter, false).boxed()
            } else {
                body
            };
            Response::from_parts(parts, body)
        }
        Err(e) => {
            let mut guard = guard;
            if let Some(rec) = guard.rec.as_mut() {
                rec.detail = Some(format!("upstream: {e}"));
            }
            // The request was allowed but never answered: record the failure.
            guard.decision = Decision::deny(Reason::ConnectionRefused, None);
            guard.close = Close::Error;
            drop(guard);
            let body = format!(
                "egress-proxy: the destination did not answer the request properly ({e}).\n"
            );
            let mut resp = Response::new(
                http_body_util::Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed(),
            );
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            resp
        }
    }
}

fn target_host_header(t: &Target) -> String {
    if t.port == 80 {
        t.host.to_string()
    } else {
        t.to_string()
    }
}

/// Build the deny response body type.
pub(crate) fn deny_response(r: &Refusal<'_>) -> Response<Body> {
    deny::response(r).map(|b| b.map_err(|never| match never {}).boxed())
}
