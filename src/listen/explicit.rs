//! The explicit proxy listener (`listen.proxy`): HTTP/1.1 `CONNECT host:port` tunnels and
//! absolute-form request forwarding (and the same over TLS and HTTP/2). One connection is
//! served by [`serve`]; each request by [`handle`], an adapter: read the target → one call
//! into the admission sequence ([`crate::egress::admit`]: identify, limits, decide, the
//! verdict point, open, clearance) → tunnel ([`super::connect`]) or forward
//! ([`crate::relay::forward`]). Every refusal is a §6 deny response built by
//! [`crate::relay::deny`]; every request has one audit guard.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::{header, Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::OwnedSemaphorePermit;

use super::explicit_refuse::{describe, refuse, refuse_as};
use crate::audit::accept::Accepted;
use crate::audit::{AuditGuard, Close, Mode};
use crate::egress::abortable::{Abortable, Cut, OverTcp};
use crate::egress::admit::{self, Ask, AtCapacity, Door, Evidence, Seat};
use crate::egress::attribution::Peer;
use crate::egress::source_caps::UnidentifiedSlot;
use crate::intercept::prefixed::Prefixed;
use crate::listen::explicit_tls::ClientCert;
use crate::policy::reason::Reason;
use crate::policy::target::Target;
use crate::policy::Decision;
use crate::relay::body::Body;
use crate::relay::client_io::ClientIo;
use crate::relay::deny::{self, Wording};
use crate::runtime::Shared;

/// Largest request head accepted (hyper answers 431 beyond it).
pub(super) const MAX_HEAD: usize = 64 * 1024;

/// One client connection, as its requests see it.
pub struct ClientConn {
    pub shared: Arc<Shared>,
    pub accepted: Accepted,
    /// Requests seen so far (the first one inherits the accept's id and start time).
    requests: AtomicU64,
    /// Its place among its address's unidentified connections, until a request identifies a
    /// sandbox.
    unidentified: Mutex<Option<UnidentifiedSlot>>,
    /// Its place under the global cap, taken when a request first identifies a sandbox; a
    /// tunnel takes it over, since the HTTP connection ends when the tunnel begins.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Whether a request identified a sandbox (the permit may since have gone to a tunnel).
    identified: std::sync::atomic::AtomicBool,
    /// Fired when a forwarded exchange is revoked (abort) or idles out (close): the client
    /// connection is dropped at once.
    pub cut: Arc<Cut>,
    /// What the client's certificate says (TLS listener with client certificates).
    cert: ClientCert,
    /// HTTP/2 (ALPN `h2` on the TLS listener): a revoked forwarded exchange resets its own
    /// stream, never the connection its siblings share.
    h2: bool,
    /// The client's socket as it sees itself, for attribution by observation.
    peer: Option<Peer>,
}

impl ClientConn {
    /// The connection's place under the cap, for a tunnel it becomes: an HTTP/1.1
    /// connection's goes to its tunnel (the HTTP connection ends there); an HTTP/2 stream's
    /// tunnel holds its own place in its slot (`None`).
    pub(super) fn take_place(&self) -> Option<OwnedSemaphorePermit> {
        match self.h2 {
            true => None,
            false => self.permit.lock().ok().and_then(|mut p| p.take()),
        }
    }

    /// What a forwarded exchange cuts when it is revoked or idles out: the connection on
    /// HTTP/1.1 (its only exchange at a time); on HTTP/2 a cut of its own, so only its stream
    /// ends (its response body fails, and hyper resets the stream).
    fn exchange_cut(&self) -> Arc<Cut> {
        if self.h2 {
            Cut::new()
        } else {
            self.cut.clone()
        }
    }

    /// The accept facts of the next request: the first one inherits the connection's id and
    /// start time, each later one gets its own.
    fn next_accepted(&self) -> Accepted {
        if self.requests.fetch_add(1, Ordering::Relaxed) == 0 {
            return self.accepted;
        }
        Accepted {
            conn_id: self.shared.next_conn_id(),
            client: self.accepted.client,
            started: Instant::now(),
        }
    }

    /// A request identified a sandbox: move from the address's unidentified allowance to the
    /// global cap (once per connection). `false` when the cap is full.
    fn identified(&self) -> bool {
        if self.identified.load(Ordering::Acquire) {
            return true;
        }
        let Some(permit) = self.shared.take_cap() else {
            return false;
        };
        if let Ok(mut p) = self.permit.lock() {
            *p = Some(permit);
        }
        self.identified.store(true, Ordering::Release);
        if let Ok(mut u) = self.unidentified.lock() {
            if let Some(slot) = u.take() {
                self.shared.admissions.identified(slot.source());
            }
        }
        true
    }
}

/// Serve one client connection until it closes. `unidentified` is its place among its
/// address's connections that have not identified a sandbox yet; `cert` what its client
/// certificate (TLS listener) says.
pub async fn serve(
    shared: Arc<Shared>,
    accepted: Accepted,
    io: ClientIo,
    unidentified: UnidentifiedSlot,
    cert: ClientCert,
) {
    // The first look at who holds the client's socket, before any request is read.
    let dialed = || io.tcp()?.local_addr().ok();
    let peer = super::peer_of(&shared, accepted.client, dialed);
    let first = (Vec::new(), unidentified, cert, peer);
    let mut stream = match io {
        ClientIo::Tcp(stream) => stream,
        // The TLS listener has checked the first bytes (the handshake, within first_byte_ms).
        tls => return serve_http(shared, accepted, tls, first).await,
    };
    let (_, unidentified, cert, peer) = first;
    // A client that connects and says nothing holds its allowance only briefly.
    let wait = shared.admissions.first_byte();
    let first_byte = tokio::time::timeout(wait, super::explicit_head::first_look(&mut stream));
    let mut first = Vec::new();
    let silent = tokio::select! {
        r = first_byte => match r {
            Ok(Ok(bytes)) if !bytes.is_empty() => {
                first = bytes;
                None
            }
            Ok(Ok(_)) => Some((Close::Eof, "closed before sending a request")),
            Ok(Err(_)) => Some((Close::Error, "connection error before a request")),
            Err(_) => Some((
                Close::Idle,
                "nothing received within admission.first_byte_ms",
            )),
        },
        () = unidentified.evicted() => Some((
            Close::Limit,
            "closed to make room: it had sent nothing and the unidentified pool was full",
        )),
    };
    unidentified.spoke();
    if let Some((close, detail)) = silent {
        let mut audit = shared.audit(&accepted, Mode::Connect, &shared.policy.load());
        audit.close(close);
        audit.detail(detail);
        return;
    }
    if let Some(bad) = super::explicit_head::malformed_head(&stream, &mut first) {
        return super::explicit_head::refuse_malformed(&shared, accepted, stream, bad).await;
    }
    serve_http(
        shared,
        accepted,
        ClientIo::Tcp(stream),
        (first, unidentified, cert, peer),
    )
    .await
}

/// What a connection brought: the bytes the first look took in, its unidentified place, its
/// client certificate, and its socket as attribution first saw it.
type Arrived = (Vec<u8>, UnidentifiedSlot, ClientCert, Option<Peer>);

/// Serve the HTTP requests of a connection (plain or TLS) until it closes; hyper reads
/// the bytes the first look took in before the connection's own.
async fn serve_http(shared: Arc<Shared>, accepted: Accepted, io: ClientIo, arrived: Arrived) {
    let (first, unidentified, cert, peer) = arrived;
    let h2 = matches!(&io, ClientIo::Tls(t) if t.get_ref().1.alpn_protocol() == Some(b"h2"));
    let eviction = unidentified.eviction();
    let conn = Arc::new(ClientConn {
        peer,
        shared: shared.clone(),
        accepted,
        requests: AtomicU64::new(0),
        unidentified: Mutex::new(Some(unidentified)),
        permit: Mutex::new(None),
        identified: std::sync::atomic::AtomicBool::new(false),
        cut: Cut::new(),
        cert,
        h2,
    });
    let svc = {
        let conn = conn.clone();
        service_fn(move |req| {
            let conn = conn.clone();
            async move { Ok::<_, Infallible>(handle(conn, req).await) }
        })
    };
    let io = TokioIo::new(Abortable::new(Prefixed::new(first, io), conn.cut.clone()));
    let serving = async {
        if conn.h2 {
            // HTTP/2 (negotiated with ALPN on the TLS listener): every stream is a request of its
            // own — a CONNECT tunnel (RFC 9113 §8.5) or a forwarded request — identified, limited,
            // decided, recorded and revoked alone.
            let http =
                hyper::server::conn::http2::Builder::new(crate::relay::boxed_spawn::BoxedSpawn)
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(H2_MAX_STREAMS)
                    .max_pending_accept_reset_streams(Some(H2_MAX_PENDING_RESETS))
                    .max_local_error_reset_streams(Some(H2_MAX_LOCAL_RESETS))
                    .max_header_list_size(MAX_HEAD as u32)
                    .serve_connection(io, svc);
            let idle = Some(shared.settings.timeouts.idle);
            drive(&shared, &conn, http, |h| h.graceful_shutdown(), idle).await
        } else {
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(shared.settings.timeouts.header)
                .max_buf_size(MAX_HEAD)
                .max_header_size(MAX_HEAD)
                .serve_connection(io, svc)
                .with_upgrades();
            drive(&shared, &conn, http, |h| h.graceful_shutdown(), None).await
        }
    };
    // Until it identifies, the connection may be closed to make room in the full pool of
    // unidentified connections (it spoke, but never said who it is).
    let result = tokio::select! {
        r = serving => r,
        () = eviction.wait() => {
            if conn.requests.load(Ordering::Relaxed) == 0 {
                let mut audit = shared.audit(&conn.accepted, Mode::Connect, &shared.policy.load());
                audit.close(Close::Limit);
                audit.detail("closed to make room: it had not identified a sandbox and the unidentified pool was full");
            }
            return;
        }
    };
    let Some(result) = result else { return };
    if conn.requests.load(Ordering::Relaxed) == 0 {
        no_request(&conn, result.err());
    }
}

/// Streams one HTTP/2 connection may have open at once (each is also under its sandbox's
/// `limits.max_connections` and the global `max_connections`).
const H2_MAX_STREAMS: u32 = 100;
/// Streams the client reset before they were served (Rapid Reset, CVE-2023-44487), and
/// streams the server had to reset for the client's protocol errors (MadeYouReset,
/// CVE-2025-8671), beyond which the connection gets GOAWAY ENHANCE_YOUR_CALM. Stated here
/// rather than left to the libraries' defaults (the same numbers today).
const H2_MAX_PENDING_RESETS: usize = 20;
const H2_MAX_LOCAL_RESETS: usize = 1024;

/// Drive a connection until it ends (`Some`), finishing it gracefully at shutdown, or until
/// its cut fires (`None`: dropped at once). With `idle` (HTTP/2), a connection on which no
/// stream has started for that long is finished gracefully too (GOAWAY): its open streams
/// run to their end, and it can no longer hold a place without using it.
async fn drive<C>(
    shared: &Shared,
    conn: &ClientConn,
    http: C,
    finish: impl Fn(std::pin::Pin<&mut C>),
    idle: Option<std::time::Duration>,
) -> Option<Result<(), hyper::Error>>
where
    C: std::future::Future<Output = Result<(), hyper::Error>>,
{
    tokio::pin!(http);
    let mut phase = shared.phase.subscribe();
    let mut cut = conn.cut.subscribe();
    // Only HTTP/2 connections get a ticker: nothing is allocated for an HTTP/1.1 one.
    let mut ticker = idle.map(|d| {
        let every = d / 4;
        tokio::time::interval_at(tokio::time::Instant::now() + every, every)
    });
    let mut seen = conn.requests.load(Ordering::Relaxed);
    let mut quiet_since = Instant::now();
    let mut finishing = false;
    loop {
        tokio::select! {
            // Checked first: once a forwarded exchange is revoked, hyper must not get to
            // answer the client (with a 502 for the upstream connection that was just cut).
            biased;
            // A forwarded exchange was revoked (or idled out): drop the connection, and with
            // it the response; `Abortable` resets it if it was revoked.
            _ = cut.changed() => return None,
            _ = phase.changed() => finish(http.as_mut()),
            _ = tick(&mut ticker), if !finishing => {
                let now = conn.requests.load(Ordering::Relaxed);
                if now != seen {
                    seen = now;
                    quiet_since = Instant::now();
                } else if idle.is_some_and(|d| quiet_since.elapsed() >= d) {
                    finishing = true;
                    finish(http.as_mut());
                }
            }
            r = http.as_mut() => return Some(r),
        }
    }
}

/// The next tick of `ticker`; never without one.
async fn tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The connection ended before any request reached [`handle`]: record why.
fn no_request(conn: &ClientConn, error: Option<hyper::Error>) {
    let shared = &conn.shared;
    let mut audit = shared.audit(&conn.accepted, Mode::Connect, &shared.policy.load());
    let (close, detail) = match &error {
        None => (Close::Eof, "closed before sending a request"),
        Some(e) if e.is_timeout() => (Close::Idle, "request head not received in time"),
        Some(e) if e.is_parse_too_large() => (Close::Error, "request head too large"),
        Some(e) if e.is_parse() => (Close::Error, "malformed request"),
        Some(_) => (Close::Error, "connection error before a request"),
    };
    audit.close(close);
    audit.detail(detail);
}

/// One request, from its target to its tunnel or forwarded exchange: read the target, one
/// call into the admission sequence ([`crate::egress::admit`]), then the tunnel or the
/// forwarder — or the refusal as a §6 response.
/// The forwarding and local paths are boxed: side by side their states made this future 14.6 KB
/// (now 5.6), allocated by hyper for every connection and copied into by every request.
async fn handle(conn: Arc<ClientConn>, req: Request<Incoming>) -> Response<Body> {
    let shared = &conn.shared;
    if let Some(why) = shared.sink.refuse_unrecorded() {
        // Every request (the next one on a kept connection, each HTTP/2 stream) is refused
        // while its record could not be kept — unrecorded, counted.
        return deny::response(&Wording {
            reason: Reason::AuditUnavailable,
            what: &describe(&req),
            sandbox: None,
            explanation: why.explain(),
            retry_after: Some(1),
            ask: shared.ask(),
        });
    }
    let accepted = conn.next_accepted();
    let connect = req.method() == Method::CONNECT;
    let set = shared.policy.load();
    let resolver = shared.resolver();
    let mode = if connect { Mode::Connect } else { Mode::Http };
    let mut audit = shared.audit(&accepted, mode, &set);

    let target = match read_target(&req) {
        Ok(t) => t,
        Err(why) => {
            audit.detail(why);
            let d = Decision::deny(Reason::InvalidTarget, None);
            return refuse(shared, audit, &req, None, d, why.to_string(), None);
        }
    };
    audit.target(&target);
    let door = door(&conn, &req, accepted.client.ip(), target.port);
    if super::ask::is_local(&target) {
        let cx = shared.cx(&set, &resolver);
        return match enter_locally(&conn, &cx, door, &req, audit) {
            Ok((e, audit)) => Box::pin(serve_locally(&conn, e, req, audit)).await,
            Err(refused) => *refused,
        };
    }
    let ask = Ask {
        request: (!connect).then(|| (req.uri(), req.headers())),
        method: (!connect).then(|| req.method()),
        reuse: !connect,
        ..Ask::to(target)
    };
    let admitted = admit::admit(
        &shared.cx(&set, &resolver),
        door,
        &mut Places(&conn),
        ask,
        &mut audit,
    )
    .await;
    drop(set);
    let admitted = match admitted {
        Ok(a) => a,
        Err(r) => return super::refused_inside::refused_admission(&conn, req, audit, r),
    };
    if connect {
        let permit = conn.take_place();
        super::connect::tunnel(conn.shared.clone(), permit, req, audit, admitted)
    } else {
        let fx = conn.shared.forwarding(&admitted.clearance);
        let exchange =
            crate::relay::forward::forward(fx, conn.exchange_cut(), req, audit, admitted);
        Box::pin(exchange).await
    }
}

/// What the request presents to be identified: the connection's client certificate, else its
/// `Proxy-Authorization`.
fn door<'a>(
    conn: &'a ClientConn,
    req: &'a Request<Incoming>,
    source: std::net::IpAddr,
    port: u16,
) -> Door<'a> {
    let credentials = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .map(|v| crate::egress::identity::Credentials::Header(v.as_bytes()));
    Door {
        source,
        evidence: match &conn.cert {
            ClientCert::Names(id) => Evidence::Certificate(Some(id)),
            ClientCert::Unnamed => Evidence::Certificate(None),
            ClientCert::Absent => Evidence::Presented { credentials },
        },
        port,
        peer: conn.peer,
    }
}

/// A request to the proxy's own endpoint (`egress-proxy.local`): identified and limited like
/// any request (then answered by [`super::ask`]); over `CONNECT` only with `tls_intercept`.
fn enter_locally(
    conn: &ClientConn,
    cx: &admit::Cx<'_>,
    door: Door<'_>,
    req: &Request<Incoming>,
    mut audit: AuditGuard,
) -> Result<(admit::Entered, AuditGuard), Box<Response<Body>>> {
    if req.method() == Method::CONNECT && conn.shared.settings.interceptor.is_none() {
        let why = "egress-proxy.local over https needs the proxy's tls_intercept CA: use http://egress-proxy.local/v1/…";
        let d = Decision::deny(Reason::InvalidTarget, None);
        return Err(Box::new(refuse(
            &conn.shared,
            audit,
            req,
            None,
            d,
            why.into(),
            None,
        )));
    }
    match admit::enter(cx, door, &mut Places(conn), &mut audit) {
        Ok(e) => Ok((e, audit)),
        Err(r) => {
            let sandbox = r.sandbox.as_deref();
            Err(Box::new(refuse_as(
                &conn.shared,
                audit,
                req,
                sandbox,
                &r.shown,
                r.explanation,
                r.retry_after,
            )))
        }
    }
}

/// Answer a request to the proxy's own endpoint: a CONNECT becomes a TLS tunnel to it (the
/// connection's place goes with it, as with any tunnel), a plain request is answered.
async fn serve_locally(
    conn: &ClientConn,
    entered: admit::Entered,
    req: Request<Incoming>,
    audit: AuditGuard,
) -> Response<Body> {
    let client = conn.accepted.client;
    if req.method() != Method::CONNECT {
        return super::ask::answer(&conn.shared, entered, req, audit, client).await;
    }
    let permit = match conn.h2 {
        true => None,
        false => conn.permit.lock().ok().and_then(|mut p| p.take()),
    };
    super::ask::tunnel(&conn.shared, entered, req, audit, client, permit)
}

/// The explicit listener's places under the global cap: a request that identifies a sandbox
/// moves its connection from the address's unidentified allowance to the cap (once per
/// connection); each HTTP/2 stream also takes a place of its own, as an HTTP/1.1 connection
/// does.
struct Places<'a>(&'a ClientConn);

impl Seat for Places<'_> {
    fn identified(&mut self) -> Result<Option<OwnedSemaphorePermit>, AtCapacity> {
        if !self.0.identified() {
            return Err(AtCapacity);
        }
        match self.0.h2 {
            false => Ok(None),
            true => self.0.shared.take_cap().map(Some).ok_or(AtCapacity),
        }
    }
}

/// The target of a CONNECT (authority-form, port required) or an absolute-form request
/// (`http://` only; port 80 by default).
pub(super) fn read_target(req: &Request<Incoming>) -> Result<Target, &'static str> {
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
