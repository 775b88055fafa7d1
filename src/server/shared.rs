//! State every data-plane task sees, and nothing else: no response building, no record
//! assembly, no registry of connections (each exchange watches the policy itself, see
//! [`crate::relay::watch`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::audit::accept::Accepted;
use crate::audit::metrics::Metrics;
use crate::audit::{AuditGuard, Mode, Sink};
use crate::config::Timeouts;
use crate::egress::admission::Admissions;
use crate::egress::limits::{ConnectionSlot, Limiters, Refusal as LimitRefusal};
use crate::egress::resolve::Resolver;
use crate::egress::Lookup;
use crate::policy::reason::Reason;
use crate::policy::set::{LivePolicy, PolicySet, Sandbox};
use crate::relay::watch::{Grant, Phase, Watch};

/// Settings fixed for the life of the process.
#[derive(Debug, Clone)]
pub struct Settings {
    pub timeouts: Timeouts,
    /// `listen.default_sandbox` (sidecar mode).
    pub default_sandbox: Option<String>,
    /// `audit.dns`.
    pub audit_dns: crate::config::AuditDns,
    /// `tls_intercept`: terminates the tunnels credentials and HTTP rules are bound to.
    pub interceptor: Option<Arc<crate::intercept::Interceptor>>,
    /// `forward_keepalive`.
    pub forward_keepalive: crate::config::ForwardKeepalive,
    /// `upstream_proxy`: the parent allowed exchanges go through.
    pub upstream_proxy: Option<Arc<crate::config::upstream::UpstreamProxy>>,
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
    pub dns_memory: crate::dns::memory::DnsMemory,
    /// Open descriptors against the reserve kept for the data plane.
    pub descriptors: Arc<crate::server::descriptors::Descriptors>,
    /// DNS clients no sandbox has: their refusals summed per source, their rate bounded.
    pub dns_strangers: Arc<crate::dns::strangers::Strangers>,
    /// Idle upstream connections of forwarded requests, per sandbox and origin.
    pub upstreams: crate::relay::upstream_pool::UpstreamPool,
    /// Source of `conn_id`s.
    next_id: AtomicU64,
}

impl Shared {
    pub fn new(
        policy: PolicySet,
        resolver: Resolver,
        sink: Sink,
        admissions: Arc<Admissions>,
        cap: usize,
        settings: Settings,
    ) -> Self {
        Shared {
            upstreams: crate::relay::upstream_pool::UpstreamPool::new(settings.forward_keepalive),
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
            descriptors: crate::server::descriptors::Descriptors::new(
                admissions.config().descriptor_reserve,
            ),
            dns_strangers: crate::dns::strangers::Strangers::new(
                admissions.config().dns_queries_per_second_per_source,
            ),
            next_id: AtomicU64::new(1),
        }
    }

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
        }
    }

    /// The parent proxy `sandbox`'s exchange with `target` goes through: its own, or the
    /// top-level one; none when it is `direct`, the target is bypassed, or none is configured.
    pub fn parent_for<'a>(
        &'a self,
        sandbox: &'a crate::policy::set::Sandbox,
        target: &crate::policy::target::Target,
    ) -> Option<&'a crate::config::upstream::UpstreamProxy> {
        let top = self.settings.upstream_proxy.as_deref();
        let parent = sandbox.binding.upstream_proxy.pick(top)?;
        (!parent.bypassed(target)).then_some(parent)
    }

    /// Open what `decided` allowed for `sandbox` — directly, or through its parent proxy —
    /// and say in `audit` which way (or why not): the connection and the address its grant
    /// is watched with. `prefer`: the client's own destination (transparent mode).
    pub async fn open_allowed(
        &self,
        sandbox: &crate::policy::set::Sandbox,
        set: &crate::policy::set::PolicySet,
        decided: &crate::egress::Decided,
        target: &crate::policy::target::Target,
        prefer: Option<std::net::IpAddr>,
        audit: &mut crate::audit::AuditGuard,
    ) -> Result<(crate::egress::Dialed, std::net::IpAddr), crate::egress::parent::ParentFailed>
    {
        let resolver = self.resolver();
        let opened = crate::egress::parent::open(
            self.parent_for(sandbox, target),
            decided,
            target,
            prefer,
            &set.guard,
            &resolver,
            self.settings.timeouts.connect,
            self.metrics(),
        )
        .await;
        match opened {
            Ok(o) => {
                if let Some(via) = o.via {
                    audit.detail(via);
                }
                Ok((o.dialed, o.checked))
            }
            Err(failed) => {
                if !failed.detail.is_empty() {
                    audit.detail(failed.detail.clone());
                }
                Err(failed)
            }
        }
    }

    /// Watch `grant` against every later policy and the process phase.
    /// The binding of sandbox `id` as it is at each call, with the version of the set it is
    /// in: what a terminated tunnel reads per request.
    pub fn current_binding(
        self: &Arc<Self>,
        id: &crate::policy::sandbox_id::SandboxId,
    ) -> crate::intercept::CurrentBinding {
        let shared = Arc::clone(self);
        let id = id.clone();
        Box::new(move || {
            let set = shared.policy.load();
            set.get(id.as_str())
                .map(|s| (s.binding.clone(), set.version_arc()))
        })
    }

    pub fn watch(&self, grant: Grant) -> Watch {
        let mine = self.policy.subscribe_sandbox(&grant.sandbox);
        Watch::new(grant, self.policy.subscribe(), mine, self.phase.subscribe())
    }

    /// Admit a connection of `sandbox` under its limits, or count the refusal and say why
    /// (reason, seconds for Retry-After).
    pub fn admit(&self, sandbox: &Sandbox) -> Result<ConnectionSlot, (Reason, u64)> {
        let limiter = sandbox.limiter(&self.limiters);
        limiter.admit(self.limiters.now()).map_err(|r| {
            self.metrics().rate_limited(&sandbox.binding.id, r.label());
            match r {
                LimitRefusal::Connections => (Reason::ConnectionLimit, 1),
                LimitRefusal::Rate(d) => {
                    (Reason::RateLimited, d.as_secs_f64().ceil().max(1.0) as u64)
                }
            }
        })
    }
}
