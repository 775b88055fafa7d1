//! State shared by every listener and connection task: the policy in force (swapped
//! atomically on reload), the resolver, the audit log, metrics, settings, and the shutdown
//! signals. Also the one place that turns an outcome into an audit record and metrics, so
//! every connection ends the same way.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::Response;
use http_body_util::combinators::BoxBody;
use tokio::sync::watch;

use crate::audit::{AuditLog, Close, Record};
use crate::config::Timeouts;
use crate::deny::Refusal;
use crate::limits::{Limiters, Refusal as LimitRefusal};
use crate::metrics::Metrics;
use crate::policy::{Decision, Reason};
use crate::policy_set::{PolicySet, Sandbox};
use crate::resolve::Resolver;
use crate::target::Target;
use crate::tunnel::Stop;

/// An open tunnel, as the revocation check needs it.
struct TunnelEntry {
    sandbox: String,
    target: Target,
    /// The address actually dialled: the new policy is asked about exactly this one.
    dialed: IpAddr,
    stop: watch::Sender<Stop>,
}

/// Removes a tunnel from the registry when the tunnel ends.
pub struct TunnelHandle {
    id: u64,
    tunnels: Arc<Mutex<HashMap<u64, TunnelEntry>>>,
}

impl Drop for TunnelHandle {
    fn drop(&mut self) {
        if let Ok(mut t) = self.tunnels.lock() {
            t.remove(&self.id);
        }
    }
}

/// Settings fixed for the life of the process.
#[derive(Debug, Clone)]
pub struct Settings {
    pub timeouts: Timeouts,
    /// `listen.default_sandbox` (sidecar mode).
    pub default_sandbox: Option<String>,
}

/// Everything a connection task needs.
pub struct Shared {
    /// The compiled policy in force; readers take a snapshot per request.
    pub policy: ArcSwap<PolicySet>,
    pub resolver: Resolver,
    pub audit: AuditLog,
    pub metrics: Metrics,
    pub settings: Settings,
    /// Per-sandbox limiter state (kept across reloads).
    pub limiters: Limiters,
    /// Source of `conn_id`s.
    next_id: AtomicU64,
    /// Open tunnels, re-checked after every policy swap and stopped at shutdown.
    tunnels: Arc<Mutex<HashMap<u64, TunnelEntry>>>,
    /// Set once the shutdown grace has expired: new tunnels stop at once.
    stopping: AtomicBool,
    /// Tells HTTP connections to finish their current request and close (shutdown began).
    pub draining: watch::Sender<bool>,
    /// Listeners bound and policy loaded.
    pub ready: AtomicBool,
}

impl Shared {
    pub fn new(
        policy: PolicySet,
        resolver: Resolver,
        audit: AuditLog,
        metrics: Metrics,
        settings: Settings,
    ) -> Self {
        Shared {
            policy: ArcSwap::from_pointee(policy),
            resolver,
            audit,
            metrics,
            settings,
            limiters: Limiters::default(),
            next_id: AtomicU64::new(1),
            tunnels: Arc::new(Mutex::new(HashMap::new())),
            stopping: AtomicBool::new(false),
            draining: watch::channel(false).0,
            ready: AtomicBool::new(false),
        }
    }

    /// Register an open tunnel; the receiver tells it when to stop (revoked or shutdown).
    pub fn register_tunnel(
        &self,
        conn_id: u64,
        sandbox: &str,
        target: &Target,
        dialed: IpAddr,
    ) -> (watch::Receiver<Stop>, TunnelHandle) {
        let initial = if self.stopping.load(Ordering::Acquire) {
            Stop::Shutdown
        } else {
            Stop::Running
        };
        let (tx, rx) = watch::channel(initial);
        if let Ok(mut t) = self.tunnels.lock() {
            t.insert(
                conn_id,
                TunnelEntry {
                    sandbox: sandbox.to_string(),
                    target: target.clone(),
                    dialed,
                    stop: tx,
                },
            );
        }
        (
            rx,
            TunnelHandle {
                id: conn_id,
                tunnels: self.tunnels.clone(),
            },
        )
    }

    /// Tell every open tunnel to stop (shutdown grace expired).
    pub fn stop_all_tunnels(&self) {
        self.stopping.store(true, Ordering::Release);
        if let Ok(t) = self.tunnels.lock() {
            for e in t.values() {
                let _ = e.stop.send(Stop::Shutdown);
            }
        }
    }

    /// Re-check every open tunnel against `set` (same sandbox, target and dialled address);
    /// stop those it no longer allows. Returns how many were revoked.
    pub fn revoke_disallowed(&self, set: &PolicySet) -> usize {
        let Ok(t) = self.tunnels.lock() else { return 0 };
        let mut revoked = 0;
        for e in t.values() {
            let allowed = match set.get(&e.sandbox) {
                None => false,
                Some(sb) => set
                    .decide(sb, &e.target, Some(&[e.dialed]))
                    .decision
                    .verdict
                    .proceeds(),
            };
            if !allowed && e.stop.send(Stop::Revoked).is_ok() {
                revoked += 1;
            }
        }
        revoked
    }

    /// Swap in a new policy set: atomically for new connections, then revoke what it no longer
    /// allows. Returns the number of revoked tunnels.
    pub fn swap_policy(&self, set: PolicySet) -> usize {
        let set = Arc::new(set);
        self.metrics.set_policy_version(set.version());
        self.policy.store(set.clone());
        self.revoke_disallowed(&set)
    }

    /// A fresh record for a connection from `client`, decided under the policy `set`.
    pub fn record(&self, set: &PolicySet, client: SocketAddr, mode: &'static str) -> Record {
        Record {
            event: "end",
            conn_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            identity: "none",
            client: client.to_string(),
            mode,
            decision: "deny",
            reason: "invalid_target",
            policy_version: set.version().to_string(),
            ..Record::default()
        }
    }

    /// Copy a decision into a record.
    pub fn apply_decision(&self, rec: &mut Record, d: &Decision) {
        rec.decision = d.verdict.as_str();
        rec.reason = d.reason.code();
        rec.rule = d.rule.as_ref().map(|r| r.text.clone());
        rec.rule_source = d.rule.as_ref().map(|r| r.source.to_string());
    }

    /// Write the final record and count it.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &self,
        mut rec: Record,
        sandbox: Option<&str>,
        decision: Decision,
        close: Close,
        started: Instant,
        up: u64,
        down: u64,
    ) {
        self.apply_decision(&mut rec, &decision);
        rec.event = "end";
        rec.close = Some(close);
        rec.bytes_up = up;
        rec.bytes_down = down;
        rec.duration_ms = started.elapsed().as_millis() as u64;
        let label = sandbox.unwrap_or("-");
        self.metrics
            .connections
            .with_label_values(&[label, rec.mode, rec.decision, rec.reason])
            .inc();
        if up > 0 {
            self.metrics
                .bytes
                .with_label_values(&[label, "up"])
                .inc_by(up);
        }
        if down > 0 {
            self.metrics
                .bytes
                .with_label_values(&[label, "down"])
                .inc_by(down);
        }
        self.audit.write(rec);
    }

    /// Admit a connection of `sandbox` under its limits, or count the refusal and say why
    /// (reason, seconds for Retry-After).
    pub fn admit(&self, sandbox: &Sandbox) -> Result<crate::limits::ConnectionSlot, (Reason, u64)> {
        let limiter = self
            .limiters
            .get(&sandbox.binding.id, &sandbox.binding.limits);
        limiter.admit(self.limiters.now()).map_err(|r| {
            self.metrics
                .rate_limited
                .with_label_values(&[sandbox.binding.id.as_str(), r.label()])
                .inc();
            match r {
                LimitRefusal::Connections => (Reason::ConnectionLimit, 1),
                LimitRefusal::Rate(d) => {
                    (Reason::RateLimited, d.as_secs_f64().ceil().max(1.0) as u64)
                }
            }
        })
    }

    /// Refuse a connection over a limit: audit (`close: limit`), count, and answer 429.
    pub fn refuse_limited(
        &self,
        rec: Record,
        sandbox: &Sandbox,
        reason: Reason,
        retry_after: u64,
        what: &str,
        started: Instant,
    ) -> Response<BoxBody<Bytes, hyper::Error>> {
        let id = sandbox.binding.id.as_str();
        let decision = Decision::deny(reason, None);
        let explanation = decision.explain(id, sandbox.policy.file(), 0);
        self.finish(rec, Some(id), decision, Close::Limit, started, 0, 0);
        crate::proxy::deny_response(&Refusal {
            reason,
            what,
            sandbox: Some(id),
            explanation: &explanation,
            retry_after: Some(retry_after),
        })
    }

    /// Refuse: audit, count, and build the §6 response.
    pub fn refuse(
        &self,
        rec: Record,
        sandbox: Option<&Arc<Sandbox>>,
        decision: Decision,
        what: &str,
        explanation: &str,
        started: Instant,
    ) -> Response<BoxBody<Bytes, hyper::Error>> {
        let reason = decision.reason;
        let id = sandbox.map(|s| s.binding.id.as_str());
        self.finish(rec, id, decision, Close::Eof, started, 0, 0);
        crate::proxy::deny_response(&Refusal {
            reason,
            what,
            sandbox: id,
            explanation,
            retry_after: None,
        })
    }
}
