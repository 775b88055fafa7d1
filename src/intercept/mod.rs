//! Credential brokering: the tunnels of a sandbox to hosts that one of its credentials (or a
//! `network.http` rule) is bound to are terminated — and only those. The proxy presents a
//! certificate for the decided name issued by the operator's CA ([`ca`]), opens TLS to the
//! upstream itself and verifies it for that same name (public roots plus
//! `tls_intercept.upstream_ca_file`), keeps the ALPN the upstream chose (HTTP/1.1 or HTTP/2,
//! so gRPC works), and then handles each request ([`exchange`]) under the sandbox's binding as
//! it is at that request: one authority ([`authority`]), canonical paths and methods, a
//! placeholder only where its credential says ([`placeholder`]), the credentials bound to this
//! host put on the request, and the response scrubbed of their secrets ([`scrub`]). Every
//! other tunnel is relayed untouched, as before.

mod authority;
pub mod ca;
pub mod credential;
pub mod credential_error;
mod error;
mod exchange;
pub mod identity_token;
mod in_clear;
pub mod kept;
mod mcp_filter;
pub mod minter;
mod per_binding;
mod placeholder;
pub(crate) mod prefixed;
pub mod resumption;
mod scrub;
pub mod sealed;
mod sigv4;
mod suites;
pub mod websocket;

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};

use crate::audit::outcome::Close;
use crate::audit::AuditGuard;
use crate::config::credentials::{BoundHost, InterceptConfig};
use crate::config::Binding;
use crate::relay::boxed_spawn::BoxedSpawn;
use crate::relay::client_io::ClientIo;
use crate::relay::liveness::Liveness;
use crate::relay::tunnel::Relayed;
use ca::InterceptCa;
pub use credential_error::CredentialError;
pub use error::InterceptError;
pub use exchange::CurrentBinding;
use exchange::{Destination, Exchange, Upstream};
pub use in_clear::{plain_http_misuse, secret_in_clear, InClear};
use prefixed::Prefixed;

/// What terminating needs, loaded at start.
pub struct Interceptor {
    ca: InterceptCa,
    /// Upstream TLS, one per ALPN offer a client can make (none, `http/1.1`, `h2`, both),
    /// built once, with a session store per sandbox binding and host.
    pub upstream: resumption::Resuming,
    never: Vec<BoundHost>,
    scrub_body_bytes: u64,
    judge_body_bytes: u64,
    refusals_inside: bool,
    /// Tokens minted for `oauth2` and `github_app` credentials, shared by every tunnel.
    pub minter: Arc<minter::Minter>,
    /// The signer of sandbox identity tokens (its keys are served by the admin listener).
    pub issuer: Arc<identity_token::Issuer>,
    /// Idle upstream connections of terminated tunnels, per sandbox, host and address.
    pub kept: kept::KeptPool,
    /// Scrubbers compiled once per binding and host ([`scrub::Compiled`]).
    pub scrubbers: Arc<scrub::Compiled>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor")
            .field("never", &self.never)
            .finish_non_exhaustive()
    }
}

impl Interceptor {
    /// Load the CA and settings `cfg` names.
    pub fn load(cfg: &InterceptConfig) -> Result<Self, InterceptError> {
        const UPSTREAM_CA: &str = "tls_intercept.upstream_ca_file";
        let ca = InterceptCa::load(&cfg.ca_cert_file, &cfg.ca_key_file)?;
        let pem = match &cfg.upstream_ca_file {
            Some(f) => Some(std::fs::read(f).map_err(|e| InterceptError::file(UPSTREAM_CA, f, e))?),
            None => None,
        };
        let roots = crate::egress::roots::public_and(pem.as_deref())
            .map_err(|e| InterceptError::content(UPSTREAM_CA, crate::policy::cause::of(e)))?;
        let provider = suites::provider();
        let upstream = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let offering = |protocols: &[&[u8]]| {
            let mut c = upstream.clone();
            c.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
            c
        };
        // The proxy's own token requests resume their sessions in a store of their own.
        let mut minting = upstream.clone();
        minting.alpn_protocols = vec![b"http/1.1".to_vec()];
        minting.resumption = rustls::client::Resumption::default();
        let issuer = identity_token::Issuer::new(cfg.identity.clone()).map_err(|e| {
            InterceptError::content("tls_intercept.identity", crate::policy::cause::of(e))
        })?;
        Ok(Interceptor {
            issuer: Arc::new(issuer),
            minter: Arc::new(minter::Minter::new(Arc::new(minting))),
            ca,
            upstream: resumption::Resuming::new([
                offering(&[]),
                offering(&[b"http/1.1"]),
                offering(&[b"h2"]),
                offering(&[b"h2", b"http/1.1"]),
            ]),
            never: cfg.never.clone(),
            scrub_body_bytes: cfg.scrub_body_bytes,
            judge_body_bytes: cfg.judge_body_bytes,
            refusals_inside: cfg.refusals_inside,
            kept: kept::KeptPool::new(cfg.upstream_keepalive),
            scrubbers: Default::default(),
        })
    }

    /// The proxy's own endpoint over TLS (`host` is `egress-proxy.local`): a leaf for it from
    /// the interception CA, which is what sandboxes already trust, offering HTTP/1.1.
    pub fn own_server_config(
        &self,
        host: &str,
    ) -> Result<Arc<rustls::ServerConfig>, InterceptError> {
        Ok(self.ca.leaf(host)?.server_config(Some(b"http/1.1"))?)
    }

    /// What serving requests one by one takes from the interceptor: its minter and issuer,
    /// its body limits.
    pub fn serving(&self) -> Serving {
        Serving {
            minter: self.minter.clone(),
            issuer: Some(self.issuer.clone()),
            scrub_body_bytes: self.scrub_body_bytes,
            judge_body_bytes: self.judge_body_bytes,
            // The sandbox trusts the interception CA: `https://egress-proxy.local` reaches it.
            ask: crate::relay::deny::AskUrl::Https,
            scrubbers: self.scrubbers.clone(),
        }
    }

    /// `tls_intercept.refusals_inside`: refused CONNECTs are answered inside the tunnel.
    pub fn refusals_inside(&self) -> bool {
        self.refusals_inside
    }

    /// Whether the tunnels of `binding` to `host` are terminated.
    pub fn terminates(&self, binding: &Binding, host: &str) -> bool {
        !self.never.iter().any(|n| n.matches(host))
            && crate::pipeline::judged_per_request(binding, host)
    }
}

/// What serving a tunnel's requests one by one needs besides its two sides: the shared parts
/// of the minting context and how much of a body is read. From the interceptor
/// ([`Interceptor::serving`]); without `tls_intercept` ([`Serving::in_clear`]) only plain
/// HTTP is served one by one (for a phase that applies to every host, `dlp`), and no
/// credential, identity token or `network.http` rule can be configured, so its minter is never
/// asked.
#[derive(Clone)]
pub struct Serving {
    minter: Arc<minter::Minter>,
    issuer: Option<Arc<identity_token::Issuer>>,
    scrub_body_bytes: u64,
    judge_body_bytes: u64,
    /// Where a refusal inside the tunnel tells the sandbox to ask for access.
    ask: crate::relay::deny::AskUrl,
    scrubbers: Arc<scrub::Compiled>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("scrub_body_bytes", &self.scrub_body_bytes)
            .field("judge_body_bytes", &self.judge_body_bytes)
            .finish_non_exhaustive()
    }
}

impl Serving {
    /// Serving without `tls_intercept`: the default body limits, and a minter that trusts no
    /// root (no credential can be bound without `tls_intercept`, so it is never asked).
    pub fn in_clear() -> Result<Self, InterceptError> {
        let provider = suites::provider();
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Ok(Serving {
            minter: Arc::new(minter::Minter::new(Arc::new(tls))),
            issuer: None,
            scrub_body_bytes: crate::config::credentials::DEFAULT_SCRUB_BODY_BYTES,
            judge_body_bytes: crate::config::credentials::DEFAULT_JUDGE_BODY_BYTES,
            // No interception CA: asking goes through the proxy as plain HTTP.
            ask: crate::relay::deny::AskUrl::Http,
            scrubbers: Default::default(),
        })
    }

    /// `judge_body_bytes`: the most of a body a protocol rule (or the decider) reads.
    pub fn judge_body_bytes(&self) -> u64 {
        self.judge_body_bytes
    }

    /// What a tunnel's exchange needs to mint, and to ask deciders.
    fn mint_cx(
        &self,
        resolver: &Arc<crate::egress::resolve::Resolver>,
        (deciders, flows): (
            &Arc<crate::decider::Deciders>,
            &Arc<crate::pipeline::flow::Ledger>,
        ),
    ) -> credential::MintCx {
        credential::MintCx {
            minter: self.minter.clone(),
            resolver: resolver.clone(),
            deciders: deciders.clone(),
            flows: flows.clone(),
            issuer: self.issuer.clone(),
            scrubbers: self.scrubbers.clone(),
        }
    }
}

/// One terminated tunnel: what its exchanges read, and its two sides.
pub struct Tunnel<'a> {
    /// What the exchanges read besides the two sides.
    pub ends: Ends<'a>,
    /// The client's stream.
    pub client: ClientIo,
    /// Bytes already read from the client (its ClientHello).
    pub early: Vec<u8>,
    /// The dialled destination.
    pub server: crate::egress::server_io::ServerIo,
    /// The protocols the client's ClientHello offered.
    pub client_alpn: Vec<String>,
    /// Whether the client speaks TLS (terminated); else plain HTTP, judged in clear.
    pub tls: bool,
    /// The clearance the tunnel was admitted with: its upstream connection may be kept for
    /// the next tunnel ([`kept`]) under it. `None`: nothing is kept.
    pub clearance: Option<Box<crate::egress::clearance::Clearance>>,
}

/// One step of a tunnel's setup: bounded by `handshake`, cut by `stop`; its failure ends the
/// tunnel with `$failed(error)` as the record's detail.
macro_rules! step {
    (($audit:expr, $live:expr, $stop:expr, $handshake:expr), $what:expr, $fut:expr, $failed:expr) => {
        match tokio::time::timeout($handshake, $live.run($fut, &mut $stop)).await {
            Ok(Ok(Ok(r))) => r,
            Ok(Ok(Err(e))) => {
                $audit.detail(($failed)(e));
                return Relayed::nothing(Close::Error);
            }
            Ok(Err(close)) => return $live.relayed(close),
            Err(_) => {
                $audit.detail(format!(
                    "terminating: {} took longer than timeouts.header_ms",
                    $what
                ));
                return $live.relayed(Close::Idle);
            }
        }
    };
}

// After `step!`, which it uses.
mod terminate;

/// Serve `t`'s requests until either side closes, nothing moves for the idle timeout, or
/// `stop` fires (revocation, shutdown). TLS is terminated; plain HTTP (`t.tls` false) has
/// every request read and judged by the same exchange ([`crate::pipeline`]), recorded `mode:
/// "http"` and sent on HTTP/1.1 over the dialled connection — only for a host with no secret
/// bound (the caller refuses the others: a credential or identity token never travels in
/// clear), so nothing is put on its requests. Each handshake — TLS to the upstream, TLS with
/// the client, HTTP with the upstream — must finish within `handshake` and is cut by `stop`
/// like the relay itself; request heads must arrive within `handshake` too.
pub async fn serve<F>(
    (serving, ix): (&Serving, Option<&Interceptor>),
    t: Tunnel<'_>,
    audit: &mut AuditGuard,
    stop: F,
    live: Arc<Liveness>,
    handshake: Duration,
) -> Relayed
where
    F: std::future::Future<Output = Close>,
{
    tokio::pin!(stop);
    if !t.tls {
        let up = step!(
            (audit, live, stop, handshake),
            "the upstream's HTTP handshake",
            Upstream::connect(t.server, false, &crate::egress::abortable::Cut::new()),
            |e| format!("plain HTTP judged per request: upstream {e}")
        );
        audit.open();
        let client = Prefixed::new(t.early, t.client);
        let sides = Sides {
            up,
            client,
            h2: false,
            scheme: "http",
            keep: None,
        };
        return exchanges(serving, t.ends, sides, (audit, live, handshake), stop).await;
    }
    let Some(ix) = ix else {
        audit.detail("terminating: TLS is terminated only with tls_intercept");
        return Relayed::nothing(Close::Error);
    };
    terminate::terminate((serving, ix), t, audit, stop, live, handshake).await
}

/// What the exchanges of a tunnel read besides its two sides.
pub struct Ends<'a> {
    /// The sandbox's binding as it is at each request.
    pub current: CurrentBinding,
    /// The decided host.
    pub host: &'a str,
    /// The decided port (the authority every request must name).
    pub port: u16,
    /// The proxy's resolver (token endpoints are resolved by it).
    pub resolver: Arc<crate::egress::resolve::Resolver>,
    /// The external deciders (asked per request).
    pub deciders: Arc<crate::decider::Deciders>,
    /// Where the sandbox's flow labels are kept.
    pub flows: Arc<crate::pipeline::flow::Ledger>,
}

/// The two sides of a tunnel whose requests are served one by one.
struct Sides<'k, C> {
    up: Upstream,
    client: C,
    h2: bool,
    scheme: &'static str,
    /// Where the upstream connection goes when the tunnel ends cleanly (`None`: closed).
    keep: Option<kept::Keep<'k>>,
}

/// Serve the requests of a tunnel whose two sides are set up, each through the exchange,
/// until either side closes, nothing moves for the idle timeout, or `stop` fires.
async fn exchanges<C, F>(
    serving: &Serving,
    t: Ends<'_>,
    sides: Sides<'_, C>,
    (audit, live, handshake): (&mut AuditGuard, Arc<Liveness>, Duration),
    stop: F,
) -> Relayed
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: std::future::Future<Output = Close>,
{
    let recorder = match sides.scheme {
        "http" => audit.recorder().in_clear(),
        _ => audit.recorder(),
    };
    let Some(ex) = Exchange::new(
        t.current,
        Destination {
            host: t.host.to_string(),
            port: t.port,
            scheme: sides.scheme,
            process: audit.attributed(),
            ask: serving.ask,
        },
        sides.up,
        recorder,
        live.clone(),
        serving.mint_cx(&t.resolver, (&t.deciders, &t.flows)),
        exchange::BodyLimits {
            scrub: serving.scrub_body_bytes,
            judge: serving.judge_body_bytes,
        },
    ) else {
        audit.detail("terminating: the host and port are not an authority");
        return Relayed::nothing(Close::Error);
    };
    let ending = ex.sockets().ending();
    let ex = Arc::new(ex);
    let served = serve_requests(ex.clone(), sides.client, sides.h2, handshake);
    // An open socket is told first, and given a moment to send its close frames.
    let stop = async move {
        let close = stop.await;
        ending.send_replace(Some(close));
        let _ = tokio::time::timeout(websocket::CLOSE_GRACE, ending.closed()).await;
        close
    };
    match live.run(served, stop).await {
        Ok((true, None)) => {
            // A clean end: the upstream connection may serve the next tunnel.
            // Not one that replaced a kept connection: the kept one's cut would not cover it.
            if let (Some(keep), Ok(ex)) = (sides.keep, Arc::try_unwrap(ex)) {
                let up = ex.into_upstream();
                if !up.replaced() {
                    keep.give_back(up);
                }
            }
            live.relayed(Close::Eof)
        }
        Ok((_, Some(close))) => live.relayed(close),
        Ok((false, None)) => live.relayed(Close::Error),
        Err(close) => live.relayed(close),
    }
}

/// Serve the client's requests on its TLS stream with `ex` (HTTP/2 when the upstream chose
/// it; HTTP/1.1 heads within `handshake`); whether the connection ended cleanly, and how the
/// WebSocket it switched to ended, if it did (HTTP/1.1 only: the connection is the socket).
async fn serve_requests<S>(
    ex: Arc<Exchange>,
    client: S,
    h2: bool,
    handshake: Duration,
) -> (bool, Option<Close>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let serving = ex.clone();
    let svc = hyper::service::service_fn(move |req| {
        let ex = serving.clone();
        async move { Ok::<_, std::convert::Infallible>(ex.handle(req).await) }
    });
    let io = TokioIo::new(client);
    if h2 {
        let mut b = hyper::server::conn::http2::Builder::new(BoxedSpawn);
        b.timer(TokioTimer::new());
        // Extended CONNECT (RFC 8441) is offered only where a rule allows a WebSocket.
        if ex.offers_websocket() {
            b.enable_connect_protocol();
        }
        let ok = b.serve_connection(io, svc).await.is_ok();
        return (ok, None);
    }
    let ok = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(handshake)
        .serve_connection(io, svc)
        .with_upgrades()
        .await
        .is_ok();
    match ex.sockets().take_parked() {
        Some(socket) if ok => (true, Some(socket.await)),
        _ => (ok, None),
    }
}
