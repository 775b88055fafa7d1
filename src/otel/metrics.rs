//! The usage ledger's counters as OTel metrics: `egress.connections`, `egress.requests` and
//! `egress.bytes` (with `direction`), cumulative since the process started, each point with
//! `sandbox.id` and `egress.decision`; inference calls' `egress.tokens` (with
//! `egress.token.kind`) and `egress.cost`, with `sandbox.id` and `gen_ai.request.model`; the
//! resource carries `service.name`. A periodic reader
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
    tokens(&meter, ledger.clone());
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

/// `egress.tokens` (by `sandbox.id`, `gen_ai.request.model` and `egress.token.kind`) and
/// `egress.cost` (nano-dollars, by sandbox and model): inference calls' usage since the start.
fn tokens(meter: &opentelemetry::metrics::Meter, ledger: Arc<Ledger>) {
    let l = ledger.clone();
    meter
        .u64_observable_counter("egress.tokens")
        .with_description("LLM tokens inference calls used, by kind (reasoning is part of output)")
        .with_callback(move |o| {
            for (sandbox, model, t) in l.tokens_since_start() {
                for (kind, n) in [
                    ("input", t.tokens_input),
                    ("cached_input", t.tokens_cached_input),
                    ("cache_write", t.tokens_cache_write),
                    ("output", t.tokens_output),
                    ("reasoning", t.tokens_reasoning),
                ] {
                    let mut a = model_attributes(&sandbox, &model);
                    a.push(KeyValue::new("egress.token.kind", kind));
                    o.observe(n, &a);
                }
            }
        })
        .build();
    meter
        .u64_observable_counter("egress.cost")
        .with_unit("nUSD")
        .with_description("What inference calls cost by defaults.prices, in nano-dollars")
        .with_callback(move |o| {
            for (sandbox, model, t) in ledger.tokens_since_start() {
                o.observe(t.cost_nano_usd, &model_attributes(&sandbox, &model));
            }
        })
        .build();
}

fn model_attributes(sandbox: &str, model: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("sandbox.id", sandbox.to_string()),
        KeyValue::new("gen_ai.request.model", model.to_string()),
    ]
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
