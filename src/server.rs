//! Process runtime: logging, the tokio runtime, binding the listeners, the accept loops (with
//! the global connection cap), and graceful shutdown on SIGTERM/SIGINT: stop accepting, let
//! HTTP connections finish their request, give tunnels `shutdown_grace_ms`, cut the rest
//! (audited `close: shutdown`), flush the audit log.

mod accept;
mod bind;
mod desk;
mod signals;
mod threads;
pub mod usage;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use crate::audit::metrics::Metrics;
use crate::audit::{AuditLog, Sink};
use crate::config::Config;
use crate::control::admin::Admin;
use crate::control::Controller;
use crate::egress::resolve::Resolver;
use crate::egress::source_caps::Admissions;
use crate::relay::watch::Phase;
use crate::runtime::{Settings, Shared};
use crate::sandboxes::set::PolicySet;
use accept::{Gate, Kind};
use bind::Listeners;

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
    // Before any worker thread has an arena: freed memory is given back predictably.
    crate::dns::give_back::fix_thresholds();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(config, path))
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
    let mut stop = signals::Signals::install(); // before anything listens
    crate::audit::record::set_run_id();
    let token_sha256 = admin_token(&config)?;
    let listeners = Listeners::bind(&config).await?;
    let addrs = listeners.addrs();
    let shared = start_shared(&config, addrs.all())?;
    let control = Arc::new(Controller::new(
        shared.clone(),
        path,
        config.clone(),
        addrs.all(),
    ));
    for problem in control.restore() {
        tracing::warn!(problem = %problem, "state_dir");
    }
    let desk = desk::start(&config, &shared, &control);
    let keeper = usage::Keeper::start(
        config.state_dir.as_deref(),
        config.etcd.is_some(),
        shared.clone(),
    );
    let plane = control_plane(&config, &control, &shared, &desk);
    let admin = Arc::new(Admin {
        shared: shared.clone(),
        control: control.clone(),
        plane: plane.clone(),
        token_sha256,
        max_body: config.runtime.max_binding_bytes,
        console: crate::control::console::Console::start(&config.console, &shared),
    });
    // Before the listeners: no record is written that the exporter does not see.
    let otel = match &config.otel {
        Some(c) => Some(crate::otel::Otel::start(c, &shared)?),
        None => None,
    };
    let runtimes = threads::start(config.listen.threads).context("starting listen.threads")?;
    let mut tasks = spawn_listeners(listeners, &runtimes, &shared, admin, &config);
    tasks.push(tokio::spawn(keeper.clone().run()));
    tasks.push(tokio::spawn(signals::watch_files(control.clone())));
    tasks.push(tokio::spawn(
        stop.reloads(control.clone(), shared.sink.log.clone()),
    ));
    match &plane {
        Some(p) => tasks.extend(etcd_tasks(p, &desk, &shared)),
        None => shared.ready.store(true, Ordering::Release),
    }
    listening(&addrs, &shared);
    stop.stopped().await;
    let lost = shutdown(&shared, &control, &config, tasks).await;
    if let Some(p) = &plane {
        crate::control::etcd::quota_lease::give_back_all(p).await;
    }
    keeper.save();
    drop(otel);
    match lost {
        0 => Ok(()),
        n => anyhow::bail!("{n} audit records were lost at exit: the trail could not take them and they could not be kept in audit.spill_file"),
    }
}

/// With etcd, registrations (and grants, and flow labels) come from there: ready once the
/// first list is applied.
fn control_plane(
    config: &Config,
    control: &Arc<Controller>,
    shared: &Arc<Shared>,
    desk: &crate::approvals::Desk,
) -> Option<Arc<crate::control::etcd::ControlPlane>> {
    let cfg = config.etcd.clone()?;
    let p = crate::control::etcd::ControlPlane::new(cfg, control.clone(), shared.clone());
    desk.set_remote(crate::control::etcd::grants::EtcdGrants::new(p.clone()));
    let share = crate::control::etcd::flows::EtcdFlows::new(p.clone());
    shared.settings.flows.set_share(share);
    Some(p)
}

/// The one line that says where the proxy listens (tests and operators wait for it).
fn listening(addrs: &bind::Addrs, shared: &Shared) {
    let show = |a: Option<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(
        proxy_addr = %show(addrs.proxy),
        proxy_tls_addr = %show(addrs.proxy_tls),
        admin_addr = %show(addrs.admin),
        transparent_addr = %show(addrs.transparent),
        dns_addr = %show(addrs.dns),
        socks5_addr = %show(addrs.socks5),
        policy_version = %shared.policy.load().version(),
        "listening"
    );
}

/// Everything a connection handler reads: the compiled policy, the resolver, the
/// interception CA, the audit log and metrics, admission and the connection cap.
pub(crate) fn start_shared(
    config: &Config,
    listeners: Vec<SocketAddr>,
) -> anyhow::Result<Arc<Shared>> {
    let set = PolicySet::compile(config, &[], listeners).context("compiling the policy")?;
    let (resolver, dns_warning) = Resolver::new(&config.dns);
    if let Some(w) = dns_warning {
        tracing::warn!(warning = %w, "dns");
    }
    let interceptor = match &config.intercept {
        Some(c) => Some(Arc::new(crate::intercept::Interceptor::load(c)?)),
        None => None,
    };
    let serving = match &interceptor {
        Some(ix) => ix.serving(),
        None => crate::intercept::Serving::in_clear()?,
    };
    let signing_key = match &config.audit_trail.signing_key_file {
        Some(f) => Some(crate::audit::verify::read_signing_key(f)?),
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
    let usage: Arc<crate::audit::usage::Ledger> = Default::default();
    let gauges = crate::audit::usage::Gauges::new(usage.clone()).context("usage metrics")?;
    metrics
        .register(Box::new(gauges))
        .context("registering usage metrics")?;
    let sink = Sink {
        log: Arc::new(audit),
        metrics: Arc::new(metrics),
        denials: Default::default(),
        usage,
    };
    Ok(Arc::new(Shared::new(
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
            serving,
            forward_keepalive: config.forward_keepalive,
            upstream_proxy: config.upstream_proxy.clone().map(Arc::new),
            observer: config
                .listen
                .observe_processes
                .map(|n| Arc::new(crate::egress::attribution::Observer::new(n))),
            flows: Arc::new(
                crate::pipeline::flow::Ledger::open(config.state_dir.as_deref())
                    .context("reading the flow labels kept in state_dir")?,
            ),
        },
    )))
}

/// What a replica of a fleet runs beside its listeners: the registrations' session and the
/// loops that keep grants, usage, layers and flow labels in step through etcd.
fn etcd_tasks(
    p: &Arc<crate::control::etcd::ControlPlane>,
    desk: &Arc<crate::approvals::Desk>,
    shared: &Arc<Shared>,
) -> Vec<JoinHandle<()>> {
    use crate::control::etcd::{flows, grants, layers, quota_lease, requests, usage};
    crate::egress::quota::share::join_fleet();
    vec![
        tokio::spawn(quota_lease::run(p.clone())),
        tokio::spawn(grants::run(p.clone(), desk.clone())),
        tokio::spawn(requests::run(p.clone(), desk.clone())),
        tokio::spawn(usage::run(p.clone())),
        tokio::spawn(layers::run(p.clone())),
        tokio::spawn(flows::run(p.clone(), shared.settings.flows.clone())),
        p.spawn(),
    ]
}

/// One accept loop per bound listener (and the TLS listeners' certificate watchers).
fn spawn_listeners(
    l: Listeners,
    runtimes: &[tokio::runtime::Handle],
    shared: &Arc<Shared>,
    admin: Arc<Admin>,
    config: &Config,
) -> Vec<JoinHandle<()>> {
    // The address `egress-proxy.local` is answered with: configured, else a listener's own.
    let own = {
        let bound = l.addrs();
        let specific =
            |a: Option<std::net::SocketAddr>| a.map(|a| a.ip()).filter(|ip| !ip.is_unspecified());
        config
            .dns
            .self_address
            .or_else(|| specific(bound.dns))
            .or_else(|| specific(bound.proxy))
    };
    let mut tasks = vec![
        tokio::spawn(shared.descriptors.clone().sample()),
        tokio::spawn(sweep_upstreams(shared.clone())),
        tokio::spawn(sweep_dns_memory(shared.clone())),
        tokio::spawn(drop_minted_tokens(shared.clone())),
    ];
    let data_plane = [
        (l.proxy, None, Kind::Proxy),
        (l.transparent, None, Kind::Transparent),
        (l.socks5, None, Kind::Socks5),
    ]
    .into_iter()
    .chain(l.proxy_tls.map(|(g, t)| (g, Some(t), Kind::ProxyTls)));
    // With `listen.threads`, each thread accepts on its own socket of every group.
    for (group, tls, kind) in data_plane {
        if let Some(t) = &tls {
            tasks.push(tokio::spawn(signals::watch_tls_files(t.clone())));
        }
        let served = accept::Served::new(shared, kind, tls);
        for (i, listener) in group.into_iter().enumerate() {
            let accepting = accept::accept_loop(listener, shared.clone(), served.clone());
            tasks.push(match runtimes.get(i) {
                Some(rt) => rt.spawn(accepting),
                None => tokio::spawn(accepting),
            });
        }
    }
    if let Some(listener) = l.admin {
        if let Some(tls) = &l.admin_tls {
            tasks.push(tokio::spawn(signals::watch_tls_files(tls.clone())));
        }
        let gate = Gate::new("admin", shared, config.admission);
        tasks.push(tokio::spawn(accept::accept_admin(
            listener,
            gate,
            admin,
            l.admin_tls,
        )));
    }
    if let Some(dns) = l.dns {
        tasks.extend(spawn_dns(dns, shared, config, own));
    }
    tasks
}

/// The DNS listener's UDP sockets and TCP accept loop, and the summary of strangers' queries;
/// `own`: the address `egress-proxy.local` is answered with.
fn spawn_dns(
    (udp, tcp): (Vec<tokio::net::UdpSocket>, tokio::net::TcpListener),
    shared: &Arc<Shared>,
    config: &Config,
    own: Option<std::net::IpAddr>,
) -> [JoinHandle<()>; 3] {
    let strangers = shared.dns_strangers.clone();
    let summary = tokio::spawn(crate::dns::strangers::summarise(
        strangers.clone(),
        shared.clone(),
        config.admission.dns_summary,
    ));
    let handler = Arc::new(crate::dns::listener::DnsListener {
        shared: shared.clone(),
        strangers,
        own,
    });
    let on_udp = tokio::spawn(crate::dns::udp::serve(
        handler.clone(),
        udp,
        shared.phase.subscribe(),
    ));
    let idle = config.defaults.timeouts.header;
    let dns_shared = shared.clone();
    let on_tcp = tokio::spawn(accept::accept_gated(
        tcp,
        Gate::new("dns", shared, config.admission),
        move |stream, client| {
            let phase = dns_shared.phase.subscribe();
            crate::dns::tcp::serve(handler.clone(), stream, client, idle, phase)
        },
    ));
    [summary, on_udp, on_tcp]
}

/// Stop accepting, let HTTP connections finish their request, give tunnels
/// `shutdown_grace_ms`, cut the rest, keep the `state_dir` log, flush the audit log.
async fn shutdown(
    shared: &Arc<Shared>,
    control: &Controller,
    config: &Config,
    tasks: Vec<JoinHandle<()>>,
) -> usize {
    tracing::info!("shutting down: no new connections; draining");
    shared.ready.store(false, Ordering::Release);
    for t in &tasks {
        t.abort();
    }
    shared.phase.send_replace(Phase::Draining);
    let cap = shared.cap.clone();
    let grace = config.defaults.timeouts.shutdown_grace;
    let all = config.max_connections.get_u32();
    let drained = tokio::time::timeout(grace, cap.acquire_many(all)).await;
    if drained.is_err() {
        tracing::info!("grace period over: closing the remaining tunnels");
        shared.phase.send_replace(Phase::Stopping);
        let _ = tokio::time::timeout(Duration::from_secs(2), cap.acquire_many(all)).await;
    }
    control.flush_state();
    // The last period's sums of unidentified DNS clients.
    crate::dns::strangers::write(&shared.dns_strangers, shared);
    // The audit sink may be stuck (a pipe nobody reads): never wait for it forever.
    let lost = shared.sink.log.close(AUDIT_CLOSE_WAIT);
    if lost > 0 {
        tracing::error!(
            lost,
            "the audit log did not accept the last records within {AUDIT_CLOSE_WAIT:?}"
        );
        let _ = writeln!(
            std::io::stderr(),
            "egress-proxy: {lost} audit records could not be written or kept before exit"
        );
    }
    tracing::info!("stopped");
    lost
}

/// Close the kept upstream connections of forwarded requests that must go: at once when a
/// policy is published (a revoked destination gets nothing more), and on a timer (idle too
/// long, closed by the origin).
/// Drop the DNS answers that expired and, after many, give their memory back to the system.
async fn sweep_dns_memory(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
    loop {
        tick.tick().await;
        crate::dns::give_back::freed(shared.dns_memory.sweep());
        crate::dns::give_back::release_if_many();
    }
}

/// On every publication, drop the minted tokens of credentials the policy no longer has.
async fn drop_minted_tokens(shared: Arc<Shared>) {
    let Some(ix) = shared.settings.interceptor.clone() else {
        return;
    };
    let mut published = shared.policy.subscribe_every();
    while published.changed().await.is_ok() {
        ix.minter.retain(&shared.policy.load());
    }
}

/// Close the kept upstream connections that must not be kept (idle too long, closed by the
/// origin, no longer allowed), on every publication and every few seconds: forwarded
/// requests' and terminated tunnels'.
async fn sweep_upstreams(shared: Arc<Shared>) {
    let ix = shared.settings.interceptor.clone();
    let every = [
        Some(shared.upstreams.sweep_every()),
        ix.as_ref().map(|ix| ix.kept.sweep_every()),
    ];
    let mut tick = tokio::time::interval(
        every
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::from_secs(5)),
    );
    let mut published = shared.policy.subscribe();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = published.changed() => if changed.is_err() { return },
        }
        let set = shared.policy.load();
        shared.upstreams.sweep(&set);
        if let Some(ix) = &ix {
            ix.kept.sweep(&set);
            ix.scrubbers.prune();
            ix.upstream.prune();
        }
    }
}
