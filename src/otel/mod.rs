//! OpenTelemetry export (`otel:`, [`crate::config::otel`]): the audit records go to an OTLP
//! collector as OTel logs, and the usage ledger's counters as OTel metrics, over gRPC or
//! OTLP/HTTP, through the `opentelemetry-otlp` exporters.
//!
//! Nothing here is on the data plane. The logs are taken from the audit writer's observer
//! channel ([`crate::audit::AuditLog::observe`]: each record's JSON line, after it was
//! written) by one task, batched and exported per sandbox (`sandbox.id` and `service.name`
//! are the batch's resource attributes). The channel is bounded: a collector that is slow,
//! down or silent only makes this task fall behind, and what it lost is counted
//! (`egress_otel_records_dropped_total`); an export that fails or takes longer than
//! `timeout_ms` is dropped and counted too — never retried into a growing backlog. The metrics
//! are observed from the ledger every `interval_ms` on the same runtime
//! ([`metrics`]).

mod health;
mod logs;
mod metrics;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use prometheus::{IntCounter, IntCounterVec, Opts};

use crate::config::otel::{parse_headers, OtelConfig, OtelProtocol};
use crate::runtime::Shared;

/// What the export counts (registered with the proxy's own Prometheus metrics).
#[derive(Clone)]
pub struct Counts {
    /// Records exported, by outcome (`exported`, `failed`).
    pub records: IntCounterVec,
    /// Records the exporter fell too far behind to take.
    pub dropped: IntCounter,
}

impl Counts {
    fn new(shared: &Shared) -> anyhow::Result<Counts> {
        let records = IntCounterVec::new(
            Opts::new(
                "egress_otel_records_total",
                "Audit records sent to the OTLP collector, by outcome (exported, failed)",
            ),
            &["outcome"],
        )?;
        let dropped = IntCounter::new(
            "egress_otel_records_dropped_total",
            "Audit records the OTel exporter fell too far behind to take",
        )?;
        let m = shared.metrics();
        m.register(Box::new(records.clone()))?;
        m.register(Box::new(dropped.clone()))?;
        Ok(Counts { records, dropped })
    }
}

/// The running export; dropped at exit (the metrics provider flushes what it holds).
pub struct Otel {
    _metrics: opentelemetry_sdk::metrics::SdkMeterProvider,
    logs: tokio::task::JoinHandle<()>,
}

impl Otel {
    /// Start exporting (on the current runtime). The headers file is read now: a file that
    /// cannot be read or parsed stops the start with an error naming it (never its content).
    pub fn start(cfg: &OtelConfig, shared: &Arc<Shared>) -> anyhow::Result<Otel> {
        let headers = match &cfg.headers_file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("otel.headers_file {}", p.display()))?;
                parse_headers(&text)
                    .map_err(|e| anyhow::anyhow!("otel.headers_file {}: {e}", p.display()))?
            }
            None => Vec::new(),
        };
        let counts = Counts::new(shared)?;
        let exporter = logs::exporter(cfg, &headers)?;
        let lines = shared.sink.log.observe();
        let logs = tokio::spawn(logs::run(cfg.clone(), exporter, lines, counts));
        let metrics = metrics::start(cfg, &headers, shared.sink.usage.clone())?;
        tracing::info!(
            endpoint = %cfg.endpoint,
            protocol = ?cfg.protocol,
            "exporting audit records and usage counters over OTLP"
        );
        Ok(Otel {
            _metrics: metrics,
            logs,
        })
    }
}

impl Drop for Otel {
    fn drop(&mut self) {
        self.logs.abort();
    }
}

/// The gRPC metadata or HTTP headers of every export.
fn header_map(headers: &[(String, String)]) -> HashMap<String, String> {
    headers.iter().cloned().collect()
}

/// The metadata of a gRPC export (header names are lower-case ASCII already).
fn metadata(headers: &[(String, String)]) -> anyhow::Result<MetadataMap> {
    let mut h = http::HeaderMap::new();
    for (k, v) in headers {
        let name = http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| anyhow::anyhow!("otel.headers_file: `{k}` is not a header name"))?;
        let value = http::HeaderValue::from_str(v)
            .map_err(|_| anyhow::anyhow!("otel.headers_file: the value of `{k}` is not valid"))?;
        h.append(name, value);
    }
    Ok(MetadataMap::from_headers(h))
}

use opentelemetry_otlp::tonic_types::metadata::MetadataMap;

/// Build an OTLP exporter of type `$kind` (`LogExporter`, `MetricExporter`) for `signal`, over
/// the configured protocol, with the headers and the timeout.
macro_rules! otlp_exporter {
    ($kind:ty, $cfg:expr, $headers:expr, $signal:literal) => {{
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
        let (cfg, headers) = ($cfg, $headers);
        let url = $crate::otel::signal_url(cfg, $signal);
        let built = match cfg.protocol {
            $crate::config::otel::OtelProtocol::Grpc => <$kind>::builder()
                .with_tonic()
                .with_endpoint(url)
                .with_timeout(cfg.timeout)
                .with_metadata($crate::otel::metadata(headers)?)
                .build(),
            $crate::config::otel::OtelProtocol::Http => <$kind>::builder()
                .with_http()
                .with_endpoint(url)
                .with_timeout(cfg.timeout)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_headers($crate::otel::header_map(headers))
                .build(),
        };
        built.map_err(|e| anyhow::anyhow!("otel: cannot build the {} exporter: {e}", $signal))
    }};
}
pub(crate) use otlp_exporter;

/// The URL of a signal for OTLP/HTTP (`/v1/logs`, `/v1/metrics`); gRPC takes the endpoint.
fn signal_url(cfg: &OtelConfig, signal: &str) -> String {
    match cfg.protocol {
        OtelProtocol::Http => format!("{}/v1/{signal}", cfg.endpoint),
        OtelProtocol::Grpc => cfg.endpoint.clone(),
    }
}
