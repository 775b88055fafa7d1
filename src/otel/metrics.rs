//! The usage ledger's counters as OTel metrics: `egress.connections`, `egress.requests` and
//! `egress.bytes` (with `direction`), cumulative since the process started, each point with
//! `sandbox.id` and `egress.decision`; the resource carries `service.name`. A periodic reader
//! on the proxy's runtime observes them every `interval_ms` and exports with a timeout; a
//! failed export is dropped (the next one carries the totals again: they are cumulative).

use std::sync::Arc;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::MetricExporter;
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::Resource;

use crate::audit::usage::{Ledger, Tally};
use crate::config::otel::OtelConfig;

/// Build the exporter and the provider, and register the observed counters.
pub(super) fn start(
    cfg: &OtelConfig,
    headers: &[(String, String)],
    ledger: Arc<Ledger>,
) -> anyhow::Result<SdkMeterProvider> {
    let exporter = super::otlp_exporter!(MetricExporter, cfg, headers, "metrics")?;
    let reader = PeriodicReader::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_interval(cfg.interval)
        .build();
    let resource = Resource::builder_empty()
        .with_service_name(cfg.service_name.clone())
        .build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .build();
    let meter = provider.meter("egress-proxy");
    type Pick = fn(&Tally) -> u64;
    let counters: [(&'static str, &'static str, Pick); 2] = [
        (
            "egress.connections",
            "Connections (one per record; a forwarded request is its own)",
            |t| t.connections,
        ),
        (
            "egress.requests",
            "Requests (forwarded, and inside terminated tunnels)",
            |t| t.requests,
        ),
    ];
    for (name, help, pick) in counters {
        let ledger = ledger.clone();
        meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |o| {
                for (sandbox, decision, t) in ledger.since_start() {
                    o.observe(pick(&t), &attributes(sandbox, decision, None));
                }
            })
            .build();
    }
    meter
        .u64_observable_counter("egress.bytes")
        .with_unit("By")
        .with_description("Bytes relayed, by direction (up: client to destination)")
        .with_callback(move |o| {
            for (sandbox, decision, t) in ledger.since_start() {
                let (s, d) = (sandbox.as_str(), decision);
                o.observe(t.bytes_up, &attributes(s.to_string(), d, Some("up")));
                o.observe(t.bytes_down, &attributes(s.to_string(), d, Some("down")));
            }
        })
        .build();
    Ok(provider)
}

fn attributes(
    sandbox: String,
    decision: &'static str,
    direction: Option<&'static str>,
) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("sandbox.id", sandbox),
        KeyValue::new("egress.decision", decision),
    ];
    if let Some(d) = direction {
        a.push(KeyValue::new("direction", d));
    }
    a
}
