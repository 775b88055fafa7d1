//! Process runtime: logging, the tokio runtime, binding the listeners, the accept loops (with
//! the global connection cap), and graceful shutdown on SIGTERM/SIGINT: stop accepting, let
//! HTTP connections finish their request, give tunnels `shutdown_grace_ms`, cut the rest
//! (audited `close: shutdown`), flush the audit log.

pub(crate) mod shared;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use sha2::{Digest, Sha256};

use crate::audit::metrics::Metrics;
use crate::audit::{AuditLog, Close, Mode, Sink};
use crate::config::Config;
use crate::control::admin::Admin;
use crate::control::Controller;
use crate::egress::admission::{self, Admissions};
use crate::egress::resolve::Resolver;
use crate::listen::accept::Accepted;
use crate::listen::deny::{self, Refusal};
use crate::policy::reason::Reason;
use crate::policy::set::PolicySet;
use crate::policy::Decision;
use crate::relay::watch::Phase;
use crate::server::shared::{Settings, Shared};

/// The log filter when `EGRESS_LOG` is not set.
const DEFAULT_LOG: &str = "info,hickory_server=warn,hickory_proto=warn,hickory_resolver=warn";

/// How long shutdown waits for the audit writer after the connections are done.
const AUDIT_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Run the proxy with a loaded configuration until SIGTERM/SIGINT.
pub fn run(config: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    // A closed or full stderr must never take a task down: tracing-subscriber reports its own
    // write errors with `eprintln!`, which panics when stderr itself is the problem.
    let _ = tracing_subscriber::fmt()
        .json()
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EGRESS_LOG")
                // hickory-server logs every query at info: the audit log already has them.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
        )
        .try_init();
    for w in &config.warnings {
        tracing::warn!(warning = %w, "config");
    }
    // Every tunnel holds two descriptors: take the hard limit, as proxies usually do.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(nofile = n, "descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the descriptor limit"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(config, path))
}

/// A listener for TPROXY'd connections: `IP_TRANSPARENT` set before `bind`, so connections
/// addressed to any destination are accepted and keep their original destination as the
/// local address.
fn bind_tproxy(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    crate::listen::orig_dst::set_transparent(&socket, addr.is_ipv6())?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The DNS listener's sockets: UDP and TCP on the same address. With port 0, the TCP port is
/// the one the kernel chose for UDP (retried a few times if another process holds it).
async fn bind_dns(addr: SocketAddr) -> std::io::Result<(tokio::net::UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..8 {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        let bound = udp.local_addr()?;
        match TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port free for both UDP and TCP")))
}

/// SHA-256 of the admin bearer token, read once at start.
fn admin_token(config: &Config) -> anyhow::Result<Option<[u8; 32]>> {
    let Some(p) = &config.admin_token_file else {
        return Ok(None);
    };
    let t = std::fs::read_to_string(p)
        .with_context(|| format!("reading admin_token_file {}", p.display()))?;
    let t = t.trim();
    if t.is_empty() {
        anyhow::bail!("admin_token_file {} is empty", p.display());
    }
    Ok(Some(Sha256::digest(t.as_bytes()).into()))
}

async fn serve(config: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    crate::audit::record::set_run_id();
    let token_sha256 = admin_token(&config)?;
    let transparent = match config.listen.transparent {
        Some(a) if config.listen.transparent_tproxy => Some(bind_tproxy(a).with_context(|| {
            format!("binding listen.transparent {a} for TPROXY (needs CAP_NET_ADMIN)")
        })?),
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("binding listen.transparent {a}"))?,
        ),
        None => None,
    };
    let proxy = match config.listen.proxy {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("binding listen.proxy {a}"))?,
        ),
        None => None,
    };
    let proxy_tls = match &config.listen.proxy_tls {
        Some(t) => {
            let server = crate::listen::explicit_tls::TlsServer::load(t)?;
            let listener = TcpListener::bind(t.addr)
                .await
                .with_context(|| format!("binding listen.proxy_tls {}", t.addr))?;
            Some((listener, Arc::new(server)))
        }
        None => None,
    };
    let admin = match config.listen.admin {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("binding listen.admin {a}"))?,
        ),
        None => None,
    };
    let dns = match config.listen.dns {
        Some(a) => Some(
            bind_dns(a)
                .await
                .with_context(|| format!("binding listen.dns {a} (UDP and TCP)"))?,
        ),
        None => None,
    };
    let dns_addr = dns.as_ref().and_then(|(u, _)| u.local_addr().ok());
    let proxy_addr = proxy.as_ref().and_then(|l| l.local_addr().ok());
    let proxy_tls_addr = proxy_tls.as_ref().and_then(|(l, _)| l.local_addr().ok());
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let transparent_addr = transparent.as_ref().and_then(|l| l.local_addr().ok());
    let listeners: Vec<SocketAddr> = [
        proxy_addr,
        admin_addr,
        transparent_addr,
        dns_addr,
        proxy_tls_addr,
    ]
    .into_iter()
    .flatten()
    .collect();
    let set =
        PolicySet::compile(&config, &[], listeners.clone()).context("compiling the policy")?;
    let (resolver, dns_warning) = Resolver::new(&config.dns);
    if let Some(w) = dns_warning {
        tracing::warn!(warning = %w, "dns");
    }
    let interceptor = match &config.intercept {
        Some(c) => Some(Arc::new(crate::intercept::Interceptor::load(c)?)),
        None => None,
    };
    let signing_key = match &config.audit_trail.signing_key_file {
        Some(f) => Some(crate::audit::verify::read_signing_key(f).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let audit = AuditLog::open_with(
        config.audit_path.clone(),
        config.audit_queue_max,
        &config.audit_trail,
        signing_key,
    )
    .context("opening the audit log")?;
    let metrics = Metrics::new().context("registering metrics")?;
    metrics.set_policy_version(set.version());
    let sink = Sink {
        log: Arc::new(audit),
        metrics: Arc::new(metrics),
    };
    let shared = Arc::new(Shared::new(
        set,
        resolver,
        sink,
        Admissions::new(config.admission),
        config.max_connections.get(),
        Settings {
            timeouts: config.defaults.timeouts,
            default_sandbox: config.listen.default_sandbox.clone(),
            audit_dns: config.audit_dns,
            interceptor,
        },
    ));
    let control = Arc::new(Controller::new(
        shared.clone(),
        path,
        config.clone(),
        listeners,
    ));
    for problem in control.restore() {
        tracing::warn!(problem = %problem, "state_dir");
    }
    // With etcd, registrations come from there: ready once the first list is applied.
    let plane = config
        .etcd
        .clone()
        .map(|cfg| crate::control::etcd::ControlPlane::new(cfg, control.clone(), shared.clone()));
    let version = shared.policy.load().version().to_string();
    let cap = shared.cap.clone();
    let mut tasks = Vec::new();
    if let Some(l) = proxy {
        tasks.push(tokio::spawn(accept_loop(
            l,
            shared.clone(),
            Kind::Proxy,
            None,
        )));
    }
    if let Some((l, tls)) = proxy_tls {
        tasks.push(tokio::spawn(watch_tls_files(tls.clone())));
        tasks.push(tokio::spawn(accept_loop(
            l,
            shared.clone(),
            Kind::ProxyTls,
            Some(tls),
        )));
    }
    if let Some(l) = transparent {
        tasks.push(tokio::spawn(accept_loop(
            l,
            shared.clone(),
            Kind::Transparent,
            None,
        )));
    }
    let admin_tls = match &config.listen.admin_tls {
        Some(t) => Some(Arc::new(crate::listen::explicit_tls::TlsServer::load(t)?)),
        None => None,
    };
    if let Some(l) = admin {
        if let Some(tls) = &admin_tls {
            tasks.push(tokio::spawn(watch_tls_files(tls.clone())));
        }
        let admin = Arc::new(Admin {
            shared: shared.clone(),
            control: control.clone(),
            plane: plane.clone(),
            token_sha256,
            max_body: config.runtime.max_binding_bytes,
        });
        let gate = Gate::new("admin", &shared, config.admission);
        tasks.push(tokio::spawn(accept_admin(l, gate, admin, admin_tls)));
    }
    if let Some((udp, tcp)) = dns {
        let mut server = hickory_server::ServerFuture::new(crate::dns::listener::DnsListener {
            shared: shared.clone(),
        });
        server.register_socket(udp);
        let handler = Arc::new(crate::dns::listener::DnsListener {
            shared: shared.clone(),
        });
        let idle = config.defaults.timeouts.header;
        let dns_shared = shared.clone();
        tasks.push(tokio::spawn(accept_gated(
            tcp,
            Gate::new("dns", &shared, config.admission),
            move |stream, client| {
                let phase = dns_shared.phase.subscribe();
                crate::dns::tcp::serve(handler.clone(), stream, client, idle, phase)
            },
        )));
        tasks.push(tokio::spawn(async move {
            if let Err(e) = server.block_until_done().await {
                tracing::error!(error = %e, "the DNS listener stopped");
            }
        }));
    }
    tasks.push(tokio::spawn(watch_files(control.clone())));
    tasks.push(tokio::spawn(reload_on_sighup(
        control.clone(),
        shared.sink.log.clone(),
    )));
    match &plane {
        Some(p) => tasks.push(p.spawn()),
        None => shared.ready.store(true, Ordering::Release),
    }
    tracing::info!(
        proxy_addr = %proxy_addr.map(|a| a.to_string()).unwrap_or_default(),
        proxy_tls_addr = %proxy_tls_addr.map(|a| a.to_string()).unwrap_or_default(),
        admin_addr = %admin_addr.map(|a| a.to_string()).unwrap_or_default(),
        transparent_addr = %transparent_addr.map(|a| a.to_string()).unwrap_or_default(),
        dns_addr = %dns_addr.map(|a| a.to_string()).unwrap_or_default(),
        policy_version = %version,
        "listening"
    );

    wait_for_signal().await;
    tracing::info!("shutting down: no new connections; draining");
    shared.ready.store(false, Ordering::Release);
    for t in &tasks {
        t.abort();
    }
    shared.phase.send_replace(Phase::Draining);
    let grace = config.defaults.timeouts.shutdown_grace;
    let all = config.max_connections.get_u32();
    let drained = tokio::time::timeout(grace, cap.acquire_many(all)).await;
    if drained.is_err() {
        tracing::info!("grace period over: closing the remaining tunnels");
        shared.phase.send_replace(Phase::Stopping);
        let _ = tokio::time::timeout(Duration::from_secs(2), cap.acquire_many(all)).await;
    }
    control.flush_state();
    // The audit sink may be stuck (a pipe nobody reads): never wait for it forever.
    let lost = shared.sink.log.close(AUDIT_CLOSE_WAIT);
    if lost > 0 {
        tracing::error!(
            lost,
            "the audit log did not accept the last records within {AUDIT_CLOSE_WAIT:?}"
        );
        let _ = writeln!(
            std::io::stderr(),
            "egress-proxy: {lost} audit records could not be written before exit"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Which data-plane listener an accept loop serves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Proxy,
    /// The explicit proxy over TLS.
    ProxyTls,
    Transparent,
}

/// Accept loop of a data-plane listener: one task per connection. Explicit-proxy connections
/// are admitted per source address until their first request identifies them (then they take
/// a place under the global cap); transparent connections are identified by their source at
/// once and take their place under the cap here.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    kind: Kind,
    tls: Option<Arc<crate::listen::explicit_tls::TlsServer>>,
) {
    let mut backoff = Duration::from_millis(5);
    loop {
        let (stream, client) = match listener.accept().await {
            Ok(x) => {
                backoff = Duration::from_millis(5);
                x
            }
            Err(e) => {
                // EMFILE and friends: wait and retry rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let accepted = Accepted {
            conn_id: shared.next_conn_id(),
            client,
            started: Instant::now(),
        };
        let shared = shared.clone();
        if shared.sink.log.saturated() {
            // The audit writer is behind: refuse rather than accept what cannot be recorded.
            shared.metrics().audit_backpressure();
            tokio::spawn(refuse_unrecorded(stream, kind));
            continue;
        }
        match kind {
            Kind::Proxy | Kind::ProxyTls => match shared.admissions.accept(client.ip()) {
                Ok(slot) => match &tls {
                    Some(tls) => {
                        tokio::spawn(serve_tls(shared, accepted, stream, slot, tls.clone()));
                    }
                    None => {
                        let io = crate::listen::client_io::ClientIo::Tcp(stream);
                        let cert = crate::listen::explicit_tls::ClientCert::Absent;
                        tokio::spawn(crate::listen::explicit::serve(
                            shared, accepted, io, slot, cert,
                        ));
                    }
                },
                Err(refusal) => {
                    let listener = if kind == Kind::Proxy {
                        "proxy"
                    } else {
                        "proxy_tls"
                    };
                    shared
                        .metrics()
                        .admission_refused(listener, refusal.label());
                    let (reason, detail) = match refusal {
                        admission::Refusal::Rate(_) => (
                            Reason::RateLimited,
                            "this address opens connections faster than admission.accepts_per_second_per_source",
                        ),
                        admission::Refusal::Unidentified => (
                            Reason::ConnectionLimit,
                            "this address holds too many connections that have not identified a sandbox (admission.unidentified_per_source)",
                        ),
                    };
                    tokio::spawn(refuse_early(shared, accepted, stream, kind, reason, detail));
                }
            },
            Kind::Transparent => match shared.take_cap() {
                Some(permit) => {
                    tokio::spawn(crate::listen::transparent::serve(
                        shared, accepted, stream, permit,
                    ));
                }
                None => {
                    let detail = "the proxy is at its connection limit (max_connections)";
                    tokio::spawn(refuse_early(
                        shared,
                        accepted,
                        stream,
                        kind,
                        Reason::ConnectionLimit,
                        detail,
                    ));
                }
            },
        }
    }
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
    };
    let mut audit = shared.audit(&accepted, mode, &shared.policy.load());
    audit.decision(&Decision::deny(reason, None));
    audit.close(Close::Limit);
    audit.detail(detail);
    match kind {
        Kind::Proxy => {
            let resp = deny::wire(&Refusal {
                reason,
                what: "this connection",
                sandbox: None,
                explanation: detail,
                retry_after: Some(1),
            });
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&resp)).await;
        }
        // No HTTP before the handshake: reset.
        Kind::ProxyTls | Kind::Transparent => {
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
    slot: crate::egress::admission::UnidentifiedSlot,
    tls: Arc<crate::listen::explicit_tls::TlsServer>,
) {
    let _ = stream.set_nodelay(true);
    let wait = shared.admissions.first_byte();
    let (reason, close, detail) =
        match tokio::time::timeout(wait, tls.acceptor().accept(stream)).await {
            Ok(Ok(s)) => {
                let cert = tls.client_sandbox(s.get_ref().1.peer_certificates());
                let io = crate::listen::client_io::ClientIo::Tls(Box::new(s));
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

/// Poll the TLS listener's certificate, key and client CA once a second; reload on change.
async fn watch_tls_files(tls: Arc<crate::listen::explicit_tls::TlsServer>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let t = tls.clone();
        let r = tokio::task::spawn_blocking(move || t.reload_if_changed()).await;
        match r {
            Ok(Some(Ok(()))) => tracing::info!("listen.proxy_tls: certificate reloaded"),
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "listen.proxy_tls: new files not loaded; the previous certificate stays in force")
            }
            _ => {}
        }
    }
}

/// The audit queue is full: answer 503 (reset on the transparent listener) without a record —
/// `egress_audit_backpressure_total` counts these.
async fn refuse_unrecorded(mut stream: TcpStream, kind: Kind) {
    match kind {
        Kind::Proxy => {
            let resp = deny::unavailable_wire(
                "cannot record connections right now (its audit log is behind)",
                "audit log backpressure",
            );
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&resp)).await;
        }
        Kind::ProxyTls | Kind::Transparent => {
            let _ = stream.set_zero_linger();
        }
    }
}

/// Poll the configuration's files once a second; reload when one changed. (Polling follows
/// symlinks, so a Kubernetes ConfigMap's atomic `..data` swap is seen too.)
async fn watch_files(control: Arc<Controller>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let c = control.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if c.files_changed() {
                let _ = c.reload("file change");
            }
        })
        .await;
    }
}

/// SIGHUP reloads the configuration and reopens the audit file; SIGUSR1 only reopens it
/// (logrotate: move the file, then signal).
async fn reload_on_sighup(control: Arc<Controller>, audit: Arc<AuditLog>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut hup), Ok(mut usr1)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::user_defined1()),
    ) else {
        return;
    };
    loop {
        tokio::select! {
            Some(()) = hup.recv() => {
                audit.reopen();
                let c = control.clone();
                let _ = tokio::task::spawn_blocking(move || c.reload("SIGHUP")).await;
            }
            Some(()) = usr1.recv() => audit.reopen(),
            else => return,
        }
    }
}

/// Admission for a listener whose connections never identify a sandbox (admin, DNS over
/// TCP): the same per-source cap, total cap and accept rate as an unidentified proxy
/// connection (`admission:`), in a table of this listener's own — a flood of one listener
/// never takes another's places — and the same first-byte timeout. A connection holds its
/// place until it closes.
struct Gate {
    name: &'static str,
    admissions: Arc<Admissions>,
    shared: Arc<Shared>,
}

impl Gate {
    fn new(name: &'static str, shared: &Arc<Shared>, cfg: crate::config::Admission) -> Self {
        Gate {
            name,
            admissions: Admissions::new(cfg),
            shared: shared.clone(),
        }
    }

    /// Admit `stream` from `client` and wait for its first byte: `None` (closed, counted)
    /// when refused or silent.
    async fn admit(
        admissions: Arc<Admissions>,
        shared: Arc<Shared>,
        name: &'static str,
        stream: &TcpStream,
        client: SocketAddr,
    ) -> Option<admission::UnidentifiedSlot> {
        let slot = match admissions.accept(client.ip()) {
            Ok(slot) => slot,
            Err(r) => {
                shared.metrics().admission_refused(name, r.label());
                return None;
            }
        };
        let mut one = [0u8; 1];
        match tokio::time::timeout(admissions.first_byte(), stream.peek(&mut one)).await {
            Ok(Ok(n)) if n > 0 => Some(slot),
            Ok(_) => None,
            Err(_) => {
                shared.metrics().admission_refused(name, "silent");
                None
            }
        }
    }
}

/// Accept loop of a gated listener: every connection through [`Gate`], then `serve`.
async fn accept_gated<F, Fut>(listener: TcpListener, gate: Gate, serve: F)
where
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let mut backoff = Duration::from_millis(5);
    loop {
        let (stream, client) = match listener.accept().await {
            Ok(x) => {
                backoff = Duration::from_millis(5);
                x
            }
            Err(e) => {
                // EMFILE and friends: wait and retry rather than spin.
                tracing::warn!(error = %e, listener = gate.name, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let (admissions, shared, name) = (gate.admissions.clone(), gate.shared.clone(), gate.name);
        let serve = serve.clone();
        tokio::spawn(async move {
            if let Some(_slot) = Gate::admit(admissions, shared, name, &stream, client).await {
                serve(stream, client).await;
            }
        });
    }
}

/// The admin listener (plain HTTP or TLS with a client certificate), gated.
async fn accept_admin(
    listener: TcpListener,
    gate: Gate,
    admin: Arc<Admin>,
    tls: Option<Arc<crate::listen::explicit_tls::TlsServer>>,
) {
    let handshake = gate.shared.settings.timeouts.header;
    accept_gated(listener, gate, move |stream, _client| {
        let admin = admin.clone();
        let tls = tls.clone();
        async move {
            match tls {
                None => crate::control::admin::serve(admin, stream).await,
                Some(tls) => {
                    let hs = tokio::time::timeout(handshake, tls.acceptor().accept(stream));
                    match hs.await {
                        Ok(Ok(s)) => crate::control::admin::serve(admin, s).await,
                        Ok(Err(e)) => tracing::debug!(error = %e, "admin TLS handshake failed"),
                        Err(_) => {}
                    }
                }
            }
        }
    })
    .await
}
