//! Prometheus metrics (DESIGN §8), in one registry owned by the process. Labels come from
//! bounded sets only — sandbox ids from configuration, reason codes, modes — never a
//! destination host or an unauthenticated client's claimed sandbox id (those become `-`).

use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::audit::outcome::Mode;
use crate::policy::reason::Reason;
use crate::policy::Verdict;

/// Every metric the proxy exports. Callers use the typed methods below, so label order and
/// spelling live in this file only.
pub struct Metrics {
    registry: Registry,
    connections: IntCounterVec,
    bytes: IntCounterVec,
    active: IntGaugeVec,
    decision_seconds: Histogram,
    dns_seconds: Histogram,
    dial_seconds: Histogram,
    rate_limited: IntCounterVec,
    dns_queries: IntCounterVec,
    reloads: IntCounterVec,
    policy_info: IntGaugeVec,
    audit_backpressure: IntCounter,
    /// The audit sink's state, set from [`crate::audit::health::Health`] at each scrape.
    audit_sink: AuditSinkMetrics,
    control_plane_revision: IntGauge,
    control_plane_connected: IntGauge,
    control_plane_errors: IntCounterVec,
    admission_refused: IntCounterVec,
    secret_reflected: IntCounterVec,
    dns_remembered: IntGaugeVec,
    approval_long_polls: IntGauge,
}

/// `egress_audit_sink_failing_seconds`, `egress_audit_dropped_total`,
/// `egress_audit_queue_pending`.
struct AuditSinkMetrics {
    failing_seconds: prometheus::Gauge,
    dropped: IntCounter,
    pending: IntGauge,
}

impl AuditSinkMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = AuditSinkMetrics {
            failing_seconds: prometheus::Gauge::new(
                "egress_audit_sink_failing_seconds",
                "How long the audit sink has been failing to write (0 while it writes)",
            )?,
            dropped: IntCounter::new(
                "egress_audit_dropped_total",
                "Audit records given up on (audit.on_failure: continue while the sink failed)",
            )?,
            pending: IntGauge::new(
                "egress_audit_queue_pending",
                "Audit records waiting to be written (queued, or kept from a failed write)",
            )?,
        };
        registry.register(Box::new(m.failing_seconds.clone()))?;
        registry.register(Box::new(m.dropped.clone()))?;
        registry.register(Box::new(m.pending.clone()))?;
        Ok(m)
    }
}

/// One sandbox's per-connection metric handles, looked up once per sandbox and policy version
/// (cached in its compiled [`crate::sandboxes::set::Sandbox`]) instead of hashing labels per
/// connection.
#[derive(Debug)]
pub struct SandboxStats {
    active: IntGauge,
    bytes_up: IntCounter,
    bytes_down: IntCounter,
}

impl SandboxStats {
    /// Count `up`/`down` relayed bytes.
    pub fn relayed(&self, up: u64, down: u64) {
        if up > 0 {
            self.bytes_up.inc_by(up);
        }
        if down > 0 {
            self.bytes_down.inc_by(down);
        }
    }

    /// One more open exchange until the returned value is dropped.
    pub fn active(&self) -> ActiveGuard {
        self.active.inc();
        ActiveGuard(self.active.clone())
    }
}

/// Decrements `egress_active_connections` when dropped.
pub struct ActiveGuard(IntGauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Which histogram a timing goes to.
#[derive(Debug, Clone, Copy)]
pub enum Timing {
    Decision,
    Dns,
    Dial,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        let buckets = vec![
            0.000_001, 0.000_005, 0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05,
            0.1, 0.5, 1.0, 5.0,
        ];
        Ok(Metrics {
            connections: counters(r, "egress_connections_total", "Connections (and forwarded requests) by outcome", &["sandbox", "mode", "decision", "reason"])?,
            bytes: counters(r, "egress_bytes_total", "Bytes relayed, up = client to destination", &["sandbox", "direction"])?,
            active: gauges(r, "egress_active_connections", "Open client connections by sandbox", &["sandbox"])?,
            decision_seconds: histogram(r, "egress_decision_seconds", "Time to decide (policy and guard), excluding DNS", &buckets)?,
            dns_seconds: histogram(r, "egress_dns_seconds", "Time to resolve a target name", &buckets)?,
            dial_seconds: histogram(r, "egress_dial_seconds", "Time to connect to the destination", &buckets)?,
            rate_limited: counters(r, "egress_rate_limited_total", "Connections refused by a limit", &["sandbox", "limit"])?,
            dns_queries: counters(r, "egress_dns_queries_total", "Queries answered by the DNS listener, by decision", &["sandbox", "decision"])?,
            reloads: counters(r, "egress_config_reloads_total", "Policy reloads by result", &["result"])?,
            policy_info: gauges(r, "egress_policy_info", "The policy version in force (value 1)", &["version"])?,
            audit_backpressure: registered(r, IntCounter::new(
                "egress_audit_backpressure_total",
                "Connections, requests and DNS queries refused (audit_unavailable: 503 / reset / REFUSED, unrecorded) because the audit queue was full or its sink failed",
            )?)?,
            audit_sink: AuditSinkMetrics::register(r)?,
            control_plane_revision: registered(r, IntGauge::new(
                "egress_control_plane_revision",
                "The etcd revision this replica has applied (0 without a control plane)",
            )?)?,
            control_plane_connected: registered(r, IntGauge::new(
                "egress_control_plane_connected",
                "1 while this replica watches etcd, 0 otherwise (it keeps enforcing what it applied)",
            )?)?,
            control_plane_errors: counters(r, "egress_control_plane_errors_total", "Control-plane failures: connect, list, watch, write, invalid_value, compacted", &["kind"])?,
            admission_refused: counters(r, "egress_admission_refused_total", "Connections refused before identification, by listener and why (per_source, rate, silent)", &["listener", "why"])?,
            secret_reflected: counters(r, "egress_secret_reflected_total", "Responses of terminated hosts in which a brokered secret was found and replaced by its placeholder", &["sandbox", "credential"])?,
            dns_remembered: gauges(r, "egress_dns_remembered_addresses", "Addresses the DNS listener's answers gave each sandbox that are still remembered (TTL plus grace)", &["sandbox"])?,
            approval_long_polls: registered(r, IntGauge::new(
                "egress_approval_long_polls",
                "Long polls (GET /v1/requests/{id}?wait=) waiting for a person's answer on this replica",
            )?)?,
            registry,
        })
    }

    /// Handles for one sandbox's per-connection metrics.
    pub fn sandbox(&self, id: &str) -> SandboxStats {
        SandboxStats {
            active: self.active.with_label_values(&[id]),
            bytes_up: self.bytes.with_label_values(&[id, "up"]),
            bytes_down: self.bytes.with_label_values(&[id, "down"]),
        }
    }

    /// Count a finished connection (or forwarded request) by outcome; `-` when no sandbox was
    /// identified.
    pub fn connection_finished(
        &self,
        sandbox: Option<&str>,
        mode: Mode,
        verdict: Verdict,
        reason: Reason,
    ) {
        self.connections
            .with_label_values(&[
                sandbox.unwrap_or("-"),
                mode.as_str(),
                verdict.as_str(),
                reason.code(),
            ])
            .inc();
    }

    /// Count a refusal by a limit (`connections` or `rate`).
    pub fn rate_limited(&self, sandbox: &str, limit: &str) {
        self.rate_limited.with_label_values(&[sandbox, limit]).inc();
    }

    /// Count a DNS listener query (`sandbox` `None` when the client was not identified).
    pub fn dns_query(&self, sandbox: Option<&str>, verdict: Verdict) {
        self.dns_queries
            .with_label_values(&[sandbox.unwrap_or("-"), verdict.as_str()])
            .inc();
    }

    /// Count a connection refused by admission on `listener` (`proxy`, `admin`, `dns`).
    pub fn admission_refused(&self, listener: &str, why: &str) {
        self.admission_refused
            .with_label_values(&[listener, why])
            .inc();
    }

    /// Count a response of a terminated host that carried `credential`'s secret.
    pub fn secret_reflected(&self, sandbox: &str, credential: &str) {
        self.secret_reflected
            .with_label_values(&[sandbox, credential])
            .inc();
    }

    /// Count a connection refused because the audit queue was full.
    pub fn audit_backpressure(&self) {
        self.audit_backpressure.inc();
    }

    /// Export the audit sink's state (called before each scrape renders).
    pub fn audit_sink(&self, st: &crate::audit::health::Status) {
        let m = &self.audit_sink;
        m.failing_seconds
            .set(st.failing_for.map_or(0.0, |d| d.as_secs_f64()));
        let seen = m.dropped.get();
        if st.dropped > seen {
            m.dropped.inc_by(st.dropped - seen);
        }
        m.pending.set(i64::try_from(st.pending).unwrap_or(i64::MAX));
    }

    /// Export how many addresses each sandbox's DNS answers hold (called before each scrape
    /// renders; a sandbox holding none has no series).
    pub fn dns_remembered(&self, shares: &[(crate::policy::sandbox_id::SandboxId, usize)]) {
        self.dns_remembered.reset();
        for (sandbox, n) in shares {
            self.dns_remembered
                .with_label_values(&[sandbox.as_str()])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Export how many long polls wait on the approvals desk (called before each scrape).
    pub fn approval_long_polls(&self, waiting: usize) {
        self.approval_long_polls
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// Count a reload or registration attempt.
    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.with_label_values(&[result]).inc();
    }

    /// Observe the time since `since` in one of the histograms.
    pub fn observe(&self, which: Timing, since: Instant) {
        let h = match which {
            Timing::Decision => &self.decision_seconds,
            Timing::Dns => &self.dns_seconds,
            Timing::Dial => &self.dial_seconds,
        };
        h.observe(since.elapsed().as_secs_f64());
    }

    /// The etcd revision applied.
    pub fn control_plane_revision(&self, revision: i64) {
        self.control_plane_revision.set(revision);
    }

    /// Whether the watch on etcd is up.
    pub fn control_plane_connected(&self, up: bool) {
        self.control_plane_connected.set(i64::from(up));
    }

    /// Count `n` control-plane failures of one kind.
    pub fn control_plane_error(&self, kind: &str, n: u64) {
        self.control_plane_errors
            .with_label_values(&[kind])
            .inc_by(n);
    }

    /// Mark `version` as the policy in force (and no other).
    pub fn set_policy_version(&self, version: &str) {
        self.policy_info.reset();
        self.policy_info.with_label_values(&[version]).set(1);
    }

    /// The Prometheus text exposition.
    /// Also gather `collector` (the usage ledger's gauges).
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> prometheus::Result<()> {
        self.registry.register(collector)
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            return format!("# encoding error: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// Register `m` in `registry` and hand it back.
fn registered<M>(registry: &Registry, m: M) -> Result<M, prometheus::Error>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(m.clone()))?;
    Ok(m)
}

/// A registered counter family.
fn counters(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// A registered gauge family.
fn gauges(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

/// A registered histogram of seconds.
fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Result<Histogram, prometheus::Error> {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    registered(registry, Histogram::with_opts(opts)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::new().unwrap();
        m.connection_finished(
            Some("demo"),
            Mode::Connect,
            Verdict::Allow,
            Reason::RuleMatched,
        );
        let stats = m.sandbox("demo");
        stats.relayed(5, 0);
        let active = stats.active();
        let now = Instant::now();
        m.observe(Timing::Decision, now);
        m.observe(Timing::Dns, now);
        m.observe(Timing::Dial, now);
        m.rate_limited("demo", "rate");
        m.reload(true);
        m.set_policy_version("abc");
        m.set_policy_version("def");
        let text = m.render();
        for name in [
            "egress_connections_total{decision=\"allow\",mode=\"connect\",reason=\"rule_matched\",sandbox=\"demo\"} 1",
            "egress_bytes_total{direction=\"up\",sandbox=\"demo\"} 5",
            "egress_active_connections{sandbox=\"demo\"} 1",
            "egress_decision_seconds_count 1",
            "egress_dns_seconds_count 1",
            "egress_dial_seconds_count 1",
            "egress_rate_limited_total",
            "egress_config_reloads_total{result=\"ok\"} 1",
            "egress_policy_info{version=\"def\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
        assert!(!text.contains("version=\"abc\""));
        drop(active);
        assert!(m
            .render()
            .contains("egress_active_connections{sandbox=\"demo\"} 0"));
    }
}
