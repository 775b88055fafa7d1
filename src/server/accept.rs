//! Every connection enters through here: one accept loop per listener, with a backoff on
//! accept errors (EMFILE and friends), the audit-backpressure refusal, and admission —
//! per-source until a sandbox is identified on the data plane, for the connection's life on
//! the admin listener and DNS over TCP ([`Gate`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::audit::accept::Accepted;
use crate::audit::health::Unavailable;
use crate::audit::{Close, Mode};
use crate::control::admin::Admin;
use crate::egress::source_caps::{self, Admissions};
use crate::policy::reason::Reason;
use crate::policy::Decision;
use crate::relay::deny::{self, Wording};
use crate::runtime::Shared;

/// Which data-plane listener an accept loop serves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Proxy,
    /// The explicit proxy over TLS.
    ProxyTls,
    Transparent,
    Socks5,
}

impl Kind {
    /// The listener's name in metrics and logs.
    fn name(self) -> &'static str {
        match self {
            Kind::Proxy => "proxy",
            Kind::ProxyTls => "proxy_tls",
            Kind::Transparent => "transparent",
            Kind::Socks5 => "socks5",
        }
    }
}

/// Accepting with a backoff on errors: EMFILE and friends wait and retry (5 ms doubling to
/// 1 s) rather than spin.
#[derive(Default)]
struct Backoff(Option<Duration>);

impl Backoff {
    async fn accept(&mut self, listener: &TcpListener, name: &str) -> (TcpStream, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok(x) => {
                    self.0 = None;
                    return x;
                }
                Err(e) => {
                    tracing::warn!(error = %e, listener = name, "accept failed");
                    let wait = self.0.map_or(Duration::from_millis(5), |d| {
                        (d * 2).min(Duration::from_secs(1))
                    });
                    self.0 = Some(wait);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// What an accept loop of a data-plane listener serves, shared by its loops when the
/// listener is a group of sockets (`listen.threads`): its kind, its TLS, and for the
/// transparent listener its own admission table, one for every socket of the group (else
/// each thread would grant a source its rate again).
#[derive(Clone)]
pub(super) struct Served {
    kind: Kind,
    tls: Option<Arc<crate::listen::explicit_tls::TlsServer>>,
    own: Option<Arc<Admissions>>,
}

impl Served {
    pub(super) fn new(
        shared: &Shared,
        kind: Kind,
        tls: Option<Arc<crate::listen::explicit_tls::TlsServer>>,
    ) -> Self {
        // Transparent connections are admitted per source too, in a table of their own (they
        // are identified by source at once, so the place is held only until then: what binds
        // here is the accept rate per source and the cap on connections no sandbox has).
        let own = (kind == Kind::Transparent).then(|| Admissions::new(*shared.admissions.config()));
        Served { kind, tls, own }
    }
}

/// Accept loop of a data-plane listener: one task per connection. Explicit-proxy connections
/// are admitted per source address until their first request identifies them (then they take
/// a place under the global cap); transparent connections are identified by their source at
/// once and take their place under the cap here. The listener is taken from the standard
/// library here, so it is registered with the runtime that runs this loop.
pub(super) async fn accept_loop(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    served: Served,
) {
    let Served { kind, tls, own } = served;
    let name = kind.name();
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, listener = name, "cannot accept on the listener");
            return;
        }
    };
    let mut backoff = Backoff::default();
    loop {
        let (stream, client) = backoff.accept(&listener, name).await;
        let accepted = Accepted {
            conn_id: shared.next_conn_id(),
            client,
            started: Instant::now(),
        };
        let shared = shared.clone();
        if let Some(why) = shared.sink.refuse_unrecorded() {
            // The audit trail is behind or failing: refuse rather than accept what cannot be
            // recorded.
            tokio::spawn(refuse_unrecorded(stream, kind, why));
            continue;
        }
        match kind {
            Kind::Proxy | Kind::ProxyTls => proxy(shared, accepted, stream, kind, tls.as_ref()),
            Kind::Socks5 => socks5(shared, accepted, stream),
            Kind::Transparent => transparent(shared, accepted, stream, own.as_ref()),
        }
    }
}

/// An explicit-proxy connection: admitted per source address until its first request
/// identifies it, then served (over TLS when the listener is `proxy_tls`).
fn proxy(
    shared: Arc<Shared>,
    accepted: Accepted,
    stream: TcpStream,
    kind: Kind,
    tls: Option<&Arc<crate::listen::explicit_tls::TlsServer>>,
) {
    let slot = match shared.admissions.accept(accepted.client.ip()) {
        Ok(slot) => slot,
        Err(refusal) => return refuse_admission(shared, accepted, stream, kind, refusal),
    };
    match tls {
        Some(tls) => {
            // Boxed: the connection's future is several kilobytes, and tokio's cell would copy
            // it whole in and out.
            crate::relay::boxed_spawn::spawn(serve_tls(
                shared,
                accepted,
                stream,
                slot,
                tls.clone(),
            ));
        }
        None => {
            let io = crate::relay::client_io::ClientIo::Tcp(stream);
            let cert = crate::listen::explicit_tls::ClientCert::Absent;
            crate::relay::boxed_spawn::spawn(crate::listen::explicit::serve(
                shared, accepted, io, slot, cert,
            ));
        }
    }
}

/// A SOCKS5 connection: admitted per source address until its login (or its source)
/// identifies it, like an explicit-proxy connection.
fn socks5(shared: Arc<Shared>, accepted: Accepted, stream: TcpStream) {
    match shared.admissions.accept(accepted.client.ip()) {
        Ok(slot) => {
            tokio::spawn(crate::listen::socks5::serve(shared, accepted, stream, slot));
        }
        Err(refusal) => refuse_admission(shared, accepted, stream, Kind::Socks5, refusal),
    }
}

/// A transparent connection: admitted per source in the listener's own table (`own`), and
/// given its place under the global cap here (it is identified by its source at once).
fn transparent(
    shared: Arc<Shared>,
    accepted: Accepted,
    stream: TcpStream,
    own: Option<&Arc<Admissions>>,
) {
    let slot = match own.map(|a| a.accept(accepted.client.ip())) {
        Some(Err(refusal)) => {
            return refuse_admission(shared, accepted, stream, Kind::Transparent, refusal);
        }
        slot => slot.and_then(Result::ok),
    };
    let Some(permit) = shared.take_cap() else {
        let detail = "the proxy is at its connection limit (max_connections)";
        let kind = Kind::Transparent;
        let reason = Reason::ConnectionLimit;
        tokio::spawn(refuse_early(shared, accepted, stream, kind, reason, detail));
        return;
    };
    tokio::spawn(crate::listen::transparent::serve(
        shared, accepted, stream, permit, slot,
    ));
}

/// A connection the per-source admission refused: counted under its listener, refused early
/// with the limit it hit (a rate is `rate_limited`; a per-source or pool cap,
/// `connection_limit`).
fn refuse_admission(
    shared: Arc<Shared>,
    accepted: Accepted,
    stream: TcpStream,
    kind: Kind,
    refusal: source_caps::Capped,
) {
    shared
        .metrics()
        .admission_refused(kind.name(), refusal.label());
    let reason = match refusal {
        source_caps::Capped::Rate(_) => Reason::RateLimited,
        source_caps::Capped::PerSource | source_caps::Capped::Pool => Reason::ConnectionLimit,
    };
    let detail = refusal.explain();
    tokio::spawn(refuse_early(shared, accepted, stream, kind, reason, detail));
}

/// Refuse a connection before reading anything from it: 429 on the explicit proxy (reset on
/// the transparent listener), audited `close: "limit"` with why.
async fn refuse_early(
    shared: Arc<Shared>,
    accepted: Accepted,
    mut stream: TcpStream,
    kind: Kind,
    reason: Reason,
    detail: &'static str,
) {
    let mode = match kind {
        Kind::Proxy | Kind::ProxyTls => Mode::Connect,
        Kind::Transparent => Mode::Tcp,
        Kind::Socks5 => Mode::Socks5,
    };
    let mut audit = shared.audit(&accepted, mode, &shared.policy.load());
    audit.decision(&Decision::deny(reason, None));
    audit.close(Close::Limit);
    audit.detail(detail);
    match kind {
        Kind::Proxy => {
            let resp = deny::wire(&Wording {
                reason,
                what: "this connection",
                sandbox: None,
                explanation: detail,
                retry_after: Some(1),
                ask: shared.ask(),
            });
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&resp)).await;
        }
        // No HTTP before the handshake, and nothing SOCKS5 can say before the greeting: reset.
        Kind::ProxyTls | Kind::Transparent | Kind::Socks5 => {
            let _ = stream.set_zero_linger();
        }
    }
}

/// The TLS proxy listener: the handshake (within `admission.first_byte_ms`), what the client
/// certificate says, then the explicit proxy over the TLS stream. A failed handshake is
/// audited (a client certificate that does not verify: `auth_failed`).
async fn serve_tls(
    shared: Arc<Shared>,
    accepted: Accepted,
    stream: TcpStream,
    slot: crate::egress::source_caps::UnidentifiedSlot,
    tls: Arc<crate::listen::explicit_tls::TlsServer>,
) {
    let wait = shared.admissions.first_byte();
    let handshake = tokio::time::timeout(wait, tls.acceptor().accept(stream));
    let done = tokio::select! {
        r = handshake => r,
        () = slot.evicted() => {
            let mut audit = shared.audit(&accepted, Mode::Connect, &shared.policy.load());
            audit.decision(&Decision::deny(Reason::ConnectionLimit, None));
            audit.close(Close::Limit);
            audit.detail("closed to make room: its TLS handshake had not begun and the unidentified pool was full");
            return;
        }
    };
    slot.spoke();
    let (reason, close, detail) = match done {
        Ok(Ok(s)) => {
            let cert = tls.client_sandbox(s.get_ref().1.peer_certificates());
            let io = crate::relay::client_io::ClientIo::Tls(Box::new(s));
            return crate::listen::explicit::serve(shared, accepted, io, slot, cert).await;
        }
        Ok(Err(e)) => {
            let cert_error = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .is_some_and(|r| {
                    matches!(
                        r,
                        rustls::Error::InvalidCertificate(_)
                            | rustls::Error::NoCertificatesPresented
                    )
                });
            let reason = if cert_error {
                Reason::AuthFailed
            } else {
                Reason::InvalidTarget
            };
            (reason, Close::Error, format!("TLS handshake failed: {e}"))
        }
        Err(_) => (
            Reason::InvalidTarget,
            Close::Idle,
            "no TLS handshake within admission.first_byte_ms".to_string(),
        ),
    };
    let mut audit = shared.audit(&accepted, Mode::Connect, &shared.policy.load());
    audit.decision(&Decision::deny(reason, None));
    audit.close(close);
    audit.detail(detail);
}

/// The audit trail cannot take records (its queue is full or its sink fails): answer 503
/// `audit_unavailable` (reset on the transparent listener and on TLS) without a record —
/// `egress_audit_backpressure_total` counts these.
async fn refuse_unrecorded(mut stream: TcpStream, kind: Kind, why: Unavailable) {
    match kind {
        Kind::Proxy => {
            let resp = deny::wire(&Wording {
                reason: Reason::AuditUnavailable,
                what: "this connection",
                sandbox: None,
                explanation: why.explain(),
                retry_after: Some(1),
                ask: crate::relay::deny::AskUrl::Http,
            });
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                stream.write_all(&resp).await?;
                stream.shutdown().await?;
                // Read what the client sent before closing: closing with unread bytes would
                // reset the connection and could destroy the 503 before the client reads it.
                let mut sink = [0u8; 4096];
                while stream.read(&mut sink).await? > 0 {}
                std::io::Result::Ok(())
            })
            .await;
        }
        Kind::ProxyTls | Kind::Transparent | Kind::Socks5 => {
            let _ = stream.set_zero_linger();
        }
    }
}

/// Admission for a listener whose connections never identify a sandbox (admin, DNS over
/// TCP): the same per-source cap, total cap and accept rate as an unidentified proxy
/// connection (`admission:`), in a table of this listener's own — a flood of one listener
/// never takes another's places — and the same first-byte timeout. A connection holds its
/// place until it closes.
pub(super) struct Gate {
    name: &'static str,
    admissions: Arc<Admissions>,
    shared: Arc<Shared>,
}

impl Gate {
    pub(super) fn new(
        name: &'static str,
        shared: &Arc<Shared>,
        cfg: crate::config::Admission,
    ) -> Self {
        Gate {
            name,
            admissions: Admissions::new(cfg),
            shared: shared.clone(),
        }
    }

    /// Admit a connection from `client`, in accept order (before any task is spawned, so a
    /// later connection can never take the place of an earlier one): `None` (counted) when
    /// refused.
    fn pass(&self, client: SocketAddr) -> Option<source_caps::UnidentifiedSlot> {
        if !self.shared.descriptors.take() {
            // Descriptors are running low: the data plane keeps the reserve.
            self.shared
                .metrics()
                .admission_refused(self.name, "descriptors");
            return None;
        }
        match self.admissions.accept(client.ip()) {
            Ok(slot) => Some(slot),
            Err(r) => {
                self.shared
                    .metrics()
                    .admission_refused(self.name, r.label());
                None
            }
        }
    }

    /// Wait for the first byte of an admitted connection: `false` (closed, counted) when it
    /// stays silent or is closed to make room.
    async fn first_byte(
        shared: &Shared,
        name: &'static str,
        first_byte: Duration,
        stream: &TcpStream,
        slot: &source_caps::UnidentifiedSlot,
    ) -> bool {
        let mut one = [0u8; 1];
        let wait = tokio::time::timeout(first_byte, stream.peek(&mut one));
        let r = tokio::select! {
            r = wait => r,
            () = slot.evicted() => {
                shared.metrics().admission_refused(name, "evicted");
                return false;
            }
        };
        slot.spoke();
        match r {
            Ok(Ok(n)) => n > 0,
            Ok(Err(_)) => false,
            Err(_) => {
                shared.metrics().admission_refused(name, "silent");
                false
            }
        }
    }
}

/// Accept loop of a gated listener: every connection through [`Gate`], then `serve`.
pub(super) async fn accept_gated<F, Fut>(listener: TcpListener, gate: Gate, serve: F)
where
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let mut backoff = Backoff::default();
    loop {
        let (stream, client) = backoff.accept(&listener, gate.name).await;
        let Some(slot) = gate.pass(client) else {
            continue;
        };
        let (shared, name) = (gate.shared.clone(), gate.name);
        let wait = gate.admissions.first_byte();
        let serve = serve.clone();
        tokio::spawn(async move {
            if Gate::first_byte(&shared, name, wait, &stream, &slot).await {
                // Served until it closes — or until it is closed to make room in the full
                // pool for a newcomer (the pool is shared fairly between addresses).
                tokio::select! {
                    () = serve(stream, client) => {}
                    () = slot.evicted() => shared.metrics().admission_refused(name, "evicted"),
                }
            }
            drop(slot);
        });
    }
}

/// The admin listener (plain HTTP or TLS with a client certificate), gated.
pub(super) async fn accept_admin(
    listener: TcpListener,
    gate: Gate,
    admin: Arc<Admin>,
    tls: Option<Arc<crate::listen::explicit_tls::TlsServer>>,
) {
    let handshake = gate.shared.settings.timeouts.header;
    accept_gated(listener, gate, move |stream, client| {
        let admin = admin.clone();
        let tls = tls.clone();
        async move {
            let mut caller = crate::control::admin::Caller {
                addr: client,
                certificate: None,
                tls: tls.is_some(),
            };
            match tls {
                None => crate::control::admin::serve(admin, stream, caller).await,
                Some(tls) => {
                    let hs = tokio::time::timeout(handshake, tls.acceptor().accept(stream));
                    match hs.await {
                        Ok(Ok(s)) => {
                            caller.certificate = certificate_subject(s.get_ref().1);
                            crate::control::admin::serve(admin, s, caller).await
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "admin TLS handshake failed"),
                        Err(_) => {}
                    }
                }
            }
        }
    })
    .await
}

/// `certificate SUBJECT` of the client certificate a TLS admin connection presented.
fn certificate_subject(conn: &rustls::ServerConnection) -> Option<Box<str>> {
    let der = conn.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    Some(format!("certificate {}", cert.subject()).into())
}
