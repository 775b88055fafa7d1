//! The runtime context: state every data-plane task sees, built by the server and read by
//! the listeners, the DNS listener and the controller — and nothing else: no response
//! building, no record assembly, no registry of connections (each exchange watches the policy
//! itself, see [`crate::relay::watch`]). It sits above the stages it holds (egress, relay,
//! intercept, audit) and below the ones that read it, so no stage it holds imports it.

pub(crate) mod descriptors;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::audit::accept::Accepted;
use crate::audit::metrics::Metrics;
use crate::audit::{AuditGuard, Mode, Sink};
use crate::config::Timeouts;
use crate::egress::admit::Cx;
use crate::egress::limits::Limiters;
use crate::egress::resolve::Resolver;
use crate::egress::source_caps::Admissions;
use crate::egress::verdict::{FirstBytesStage, Verdicts};
use crate::egress::Lookup;
use crate::relay::watch::{Clearance, Phase, Watch};
use crate::sandboxes::set::{LivePolicy, PolicySet};

/// Settings fixed for the life of the process.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The timeouts in force.
    pub timeouts: Timeouts,
    /// `listen.default_sandbox` (sidecar mode).
    pub default_sandbox: Option<String>,
    /// `audit.dns`.
    pub audit_dns: crate::config::AuditDns,
    /// `tls_intercept`: terminates the tunnels credentials and HTTP rules are bound to.
    pub interceptor: Option<Arc<crate::intercept::Interceptor>>,
    /// What serving a tunnel's requests one by one needs (the interceptor's, or the one for
    /// plain HTTP without `tls_intercept`).
    pub serving: crate::intercept::Serving,
    /// `forward_keepalive`.
    pub forward_keepalive: crate::config::ForwardKeepalive,
    /// `upstream_proxy`: the parent allowed exchanges go through.
    pub upstream_proxy: Option<Arc<crate::config::upstream::UpstreamProxy>>,
    /// `listen.attribution.observe`: the process behind each connection, from the kernel.
    pub observer: Option<Arc<crate::egress::attribution::Observer>>,
    /// Every sandbox's flow labels (`network.flows`), kept in `state_dir`.
    pub flows: Arc<crate::pipeline::flow::Ledger>,
}

/// Everything a connection task needs.
pub struct Shared {
    /// The policy in force (snapshot per connection) and its publications (watched by every
    /// live exchange).
    pub policy: LivePolicy,
    /// The proxy's own resolver (targets are resolved here, never by the client); replaced
    /// when a reload changes `dns:`.
    resolver: ArcSwap<Resolver>,
    /// Where each connection's audit guard writes and counts.
    pub sink: Sink,
    /// Timeouts and the default sandbox.
    pub settings: Settings,
    /// Per-sandbox limiter state, kept across reloads.
    pub limiters: Limiters,
    /// Per-address limits before identification.
    pub admissions: Arc<Admissions>,
    /// The global cap (`max_connections`) on identified connections; shutdown waits for
    /// every permit to come back.
    pub cap: Arc<Semaphore>,
    /// Serving → draining → stopping: HTTP connections and relays watch it.
    pub phase: watch::Sender<Phase>,
    /// Listeners bound and policy loaded (`/readyz`).
    pub ready: AtomicBool,
    /// Answers the DNS listener gave, by sandbox and address (names for nameless
    /// transparent connections).
    pub dns_memory: crate::egress::answers::DnsMemory,
    /// Open descriptors against the reserve kept for the data plane.
    pub descriptors: Arc<crate::runtime::descriptors::Descriptors>,
    /// DNS clients no sandbox has: their refusals summed per source, their rate bounded.
    pub dns_strangers: Arc<crate::egress::strangers::Strangers>,
    /// Idle upstream connections of forwarded requests, per sandbox and origin.
    pub upstreams: Arc<crate::egress::upstream_pool::UpstreamPool>,
    /// The verdict point's stages, in order.
    pub verdicts: Verdicts,
    /// The external deciders' connections (the verdict stage and terminated exchanges).
    pub deciders: Arc<crate::decider::Deciders>,
    /// Access requests and their grants (set once, at start).
    pub desk: std::sync::OnceLock<Arc<crate::approvals::Desk>>,
    /// Source of `conn_id`s.
    next_id: AtomicU64,
}

impl Shared {
    /// The shared state of a server over `config`.
    pub fn new(
        policy: PolicySet,
        resolver: Resolver,
        sink: Sink,
        admissions: Arc<Admissions>,
        cap: usize,
        settings: Settings,
    ) -> Self {
        let deciders = Arc::new(crate::decider::Deciders::default());
        Shared {
            deciders: deciders.clone(),
            upstreams: Arc::new(crate::egress::upstream_pool::UpstreamPool::new(
                settings.forward_keepalive,
            )),
            verdicts: Verdicts::new(vec![
                Arc::new(FirstBytesStage),
                Arc::new(crate::intercept::InClear),
                Arc::new(crate::egress::quota::DestinationQuotaStage),
                Arc::new(crate::decider::stage::DeciderStage { deciders }),
                // Last: a `once` grant is spent only by an exchange every other stage passed.
                Arc::new(crate::egress::grant_stage::GrantStage),
            ]),
            policy: LivePolicy::new(policy),
            resolver: ArcSwap::from_pointee(resolver),
            sink,
            settings,
            limiters: Limiters::default(),
            admissions: admissions.clone(),
            cap: Arc::new(Semaphore::new(cap)),
            phase: watch::channel(Phase::Serving).0,
            ready: AtomicBool::new(false),
            dns_memory: Default::default(),
            descriptors: crate::runtime::descriptors::Descriptors::new(
                admissions.config().descriptor_reserve,
            ),
            dns_strangers: crate::egress::strangers::Strangers::new(
                admissions.config().dns_queries_per_second_per_source,
            ),
            desk: std::sync::OnceLock::new(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Where this proxy's sandboxes ask for access: `https://egress-proxy.local/…` when it
    /// holds the interception CA (reached through `HTTPS_PROXY` alone), else `http://`.
    pub fn ask(&self) -> crate::relay::deny::AskUrl {
        crate::relay::deny::AskUrl::with_tls(self.settings.interceptor.is_some())
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.sink.metrics
    }

    /// A place under the global cap, if one is free.
    pub fn take_cap(&self) -> Option<OwnedSemaphorePermit> {
        self.cap.clone().try_acquire_owned().ok()
    }

    /// A fresh `conn_id`.
    pub fn next_conn_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The audit guard of a connection (or request) decided under `set`.
    pub fn audit(&self, accepted: &Accepted, mode: Mode, set: &PolicySet) -> AuditGuard {
        AuditGuard::new(self.sink.clone(), accepted, mode, set.version_arc())
    }

    /// The resolver in force (hold it for one decision).
    pub fn resolver(&self) -> Arc<Resolver> {
        self.resolver.load_full()
    }

    /// Put a resolver built from a reloaded `dns:` in force.
    pub fn set_resolver(&self, resolver: Resolver) {
        self.resolver.store(Arc::new(resolver));
    }

    /// How the data plane looks addresses up, with `resolver`.
    pub fn lookup<'a>(&'a self, resolver: &'a Resolver) -> Lookup<'a> {
        Lookup {
            resolver: Some(resolver),
            metrics: Some(self.metrics()),
            process: None,
        }
    }

    /// The handles the admission sequence reads, for one exchange decided under `set` with
    /// `resolver`.
    pub fn cx<'a>(&'a self, set: &'a PolicySet, resolver: &'a Resolver) -> Cx<'a> {
        Cx {
            set,
            resolver,
            metrics: self.metrics(),
            limiters: &self.limiters,
            admissions: &self.admissions,
            answers: &self.dns_memory,
            upstreams: &self.upstreams,
            verdicts: &self.verdicts,
            default_sandbox: self.settings.default_sandbox.as_deref(),
            parent: self.settings.upstream_proxy.as_ref(),
            connect_timeout: self.settings.timeouts.connect,
            observer: self.settings.observer.as_deref(),
        }
    }

    /// The binding of sandbox `id` as it is at each call, with the version of the set it is
    /// in: what a terminated tunnel reads per request.
    pub fn current_binding(
        self: &Arc<Self>,
        id: &crate::policy::sandbox_id::SandboxId,
    ) -> crate::intercept::CurrentBinding {
        let shared = Arc::clone(self);
        let id = id.clone();
        Arc::new(move || {
            let set = shared.policy.load();
            set.get(id.as_str())
                .map(|s| (s.binding.clone(), set.version_arc()))
        })
    }

    /// What a forwarded exchange of `clearance` reads ([`crate::relay::forward`]).
    pub fn forwarding(&self, clearance: &Clearance) -> crate::relay::forward::Forwarding {
        crate::relay::forward::Forwarding {
            watch: self.watch(clearance.clone()),
            upstreams: self.upstreams.clone(),
            metrics: self.sink.metrics.clone(),
            idle: self.settings.timeouts.idle,
            connect: self.settings.timeouts.connect,
            judge_body_bytes: self.settings.serving.judge_body_bytes(),
            asker: self.deciders.clone(),
            flows: self.settings.flows.clone(),
        }
    }

    /// Watch `clearance` against every later policy and the process phase.
    pub fn watch(&self, clearance: Clearance) -> Watch {
        let mine = self.policy.subscribe_sandbox(&clearance.sandbox);
        Watch::new(
            clearance,
            self.policy.subscribe(),
            mine,
            self.phase.subscribe(),
        )
    }
}
