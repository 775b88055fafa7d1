//! Prometheus metrics (DESIGN §8), in one registry owned by the process. Labels come from
//! bounded sets only — sandbox ids from configuration, reason codes, modes — never a
//! destination host or an unauthenticated client's claimed sandbox id (those become `-`).

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric the proxy exports.
pub struct Metrics {
    registry: Registry,
    pub connections: IntCounterVec,
    pub bytes: IntCounterVec,
    pub active: IntGaugeVec,
    pub decision_seconds: Histogram,
    pub dns_seconds: Histogram,
    pub dial_seconds: Histogram,
    pub rate_limited: IntCounterVec,
    pub reloads: IntCounterVec,
    pub policy_info: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let connections = IntCounterVec::new(
            Opts::new(
                "egress_connections_total",
                "Connections (and forwarded requests) by outcome",
            ),
            &["sandbox", "mode", "decision", "reason"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "egress_bytes_total",
                "Bytes relayed, up = client to destination",
            ),
            &["sandbox", "direction"],
        )?;
        let active = IntGaugeVec::new(
            Opts::new(
                "egress_active_connections",
                "Open client connections by sandbox",
            ),
            &["sandbox"],
        )?;
        let buckets = vec![
            0.000_001, 0.000_005, 0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05,
            0.1, 0.5, 1.0, 5.0,
        ];
        let decision_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "egress_decision_seconds",
                "Time to decide (policy and guard), excluding DNS",
            )
            .buckets(buckets.clone()),
        )?;
        let dns_seconds = Histogram::with_opts(
            HistogramOpts::new("egress_dns_seconds", "Time to resolve a target name")
                .buckets(buckets.clone()),
        )?;
        let dial_seconds = Histogram::with_opts(
            HistogramOpts::new("egress_dial_seconds", "Time to connect to the destination")
                .buckets(buckets),
        )?;
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "egress_rate_limited_total",
                "Connections refused by a limit",
            ),
            &["sandbox", "limit"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new("egress_config_reloads_total", "Policy reloads by result"),
            &["result"],
        )?;
        let policy_info = IntGaugeVec::new(
            Opts::new(
                "egress_policy_info",
                "The policy version in force (value 1)",
            ),
            &["version"],
        )?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(active.clone()))?;
        registry.register(Box::new(decision_seconds.clone()))?;
        registry.register(Box::new(dns_seconds.clone()))?;
        registry.register(Box::new(dial_seconds.clone()))?;
        registry.register(Box::new(rate_limited.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(policy_info.clone()))?;
        Ok(Metrics {
            registry,
            connections,
            bytes,
            active,
            decision_seconds,
            dns_seconds,
            dial_seconds,
            rate_limited,
            reloads,
            policy_info,
        })
    }

    /// Mark `version` as the policy in force (and no other).
    pub fn set_policy_version(&self, version: &str) {
        self.policy_info.reset();
        self.policy_info.with_label_values(&[version]).set(1);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            return format!("# encoding error: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::new().unwrap();
        m.connections
            .with_label_values(&["demo", "connect", "allow", "rule_matched"])
            .inc();
        m.bytes.with_label_values(&["demo", "up"]).inc_by(5);
        m.active.with_label_values(&["demo"]).set(1);
        m.decision_seconds.observe(0.000_002);
        m.dns_seconds.observe(0.001);
        m.dial_seconds.observe(0.001);
        m.rate_limited.with_label_values(&["demo", "rate"]).inc();
        m.reloads.with_label_values(&["ok"]).inc();
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
    }
}
