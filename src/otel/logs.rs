//! Audit records as OTel logs: one task reads the audit writer's observer channel (each
//! record's JSON line), gathers up to [`BATCH`] lines or [`LINGER`], and exports them grouped
//! by sandbox — each group with the resource `service.name` and `sandbox.id` — as log records
//! whose body is the record's JSON line and whose attributes are its main fields
//! (`sandbox.id`, `egress.decision`, `egress.reason`, `egress.mode`, `server.address`,
//! `server.port`, `egress.bytes_up`, `egress.bytes_down`). A deny is `WARN`, the rest `INFO`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::LogExporter;
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use opentelemetry_sdk::Resource;
use tokio::sync::broadcast::{error::RecvError, Receiver};

use super::Counts;
use crate::config::otel::OtelConfig;

/// Most records in one export.
const BATCH: usize = 512;
/// Longest a record waits for its batch to fill.
const LINGER: Duration = Duration::from_millis(500);
/// After a failed export, batches are counted as failed without being built or sent for this
/// long, doubling up to [`MAX_BACKOFF`] while exports keep failing: a collector that is down
/// costs (almost) nothing.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The OTLP log exporter `cfg` names.
pub(super) fn exporter(
    cfg: &OtelConfig,
    headers: &[(String, String)],
) -> anyhow::Result<LogExporter> {
    super::otlp_exporter!(LogExporter, cfg, headers, "logs")
}

/// Export until the task is aborted or the audit log closes.
pub(super) async fn run(
    cfg: OtelConfig,
    mut exporter: LogExporter,
    mut lines: Receiver<Bytes>,
    counts: Counts,
) {
    // Log records are made by a logger; this provider has no processor of its own.
    let provider = SdkLoggerProvider::builder().build();
    let logger = provider.logger("egress-proxy");
    let scope = InstrumentationScope::builder("egress-proxy")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut backoff = FIRST_BACKOFF;
    let mut resume_at: Option<tokio::time::Instant> = None;
    let mut health = super::health::Health::default();
    loop {
        let mut batch: Vec<Bytes> = Vec::with_capacity(BATCH);
        match lines.recv().await {
            Ok(l) => batch.push(l),
            Err(RecvError::Lagged(n)) => {
                counts.dropped.inc_by(n);
                continue;
            }
            Err(RecvError::Closed) => return,
        }
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, lines.recv()).await {
                Ok(Ok(l)) => batch.push(l),
                Ok(Err(RecvError::Lagged(n))) => counts.dropped.inc_by(n),
                Ok(Err(RecvError::Closed)) | Err(_) => break,
            }
        }
        if resume_at.is_some_and(|t| tokio::time::Instant::now() < t) {
            counts
                .records
                .with_label_values(&["failed"])
                .inc_by(batch.len() as u64);
            health.skipped(batch.len() as u64);
            continue;
        }
        let mut by_sandbox: BTreeMap<String, Vec<SdkLogRecord>> = BTreeMap::new();
        for line in &batch {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            let sandbox = v["sandbox"].as_str().unwrap_or_default().to_string();
            let mut rec = logger.create_log_record();
            fill(&mut rec, &v, line);
            by_sandbox.entry(sandbox).or_default().push(rec);
        }
        let failed = export(
            &cfg,
            &mut exporter,
            &scope,
            by_sandbox,
            &counts,
            &mut health,
        )
        .await;
        if failed {
            resume_at = Some(tokio::time::Instant::now() + backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            resume_at = None;
            backoff = FIRST_BACKOFF;
        }
    }
}

/// Export one batch, grouped per sandbox (each group with its resource); whether an export
/// failed. Each outcome is counted and told to `health`.
async fn export(
    cfg: &OtelConfig,
    exporter: &mut LogExporter,
    scope: &InstrumentationScope,
    by_sandbox: BTreeMap<String, Vec<SdkLogRecord>>,
    counts: &Counts,
    health: &mut super::health::Health,
) -> bool {
    let mut failed = false;
    for (sandbox, records) in by_sandbox {
        let mut resource = Resource::builder_empty().with_service_name(cfg.service_name.clone());
        if !sandbox.is_empty() {
            resource = resource.with_attribute(KeyValue::new("sandbox.id", sandbox));
        }
        exporter.set_resource(&resource.build());
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            records.iter().map(|r| (r, scope)).collect();
        let n = refs.len() as u64;
        let sent = tokio::time::timeout(cfg.timeout, exporter.export(LogBatch::new(&refs))).await;
        let outcome = match sent {
            Ok(Ok(())) => {
                health.exported(&cfg.endpoint);
                "exported"
            }
            Ok(Err(e)) => {
                failed = true;
                health.failed(&cfg.endpoint, &e.to_string(), n);
                "failed"
            }
            Err(_) => {
                failed = true;
                let why = format!(
                    "no answer within otel.timeout_ms ({} ms)",
                    cfg.timeout.as_millis()
                );
                health.failed(&cfg.endpoint, &why, n);
                "failed"
            }
        };
        counts.records.with_label_values(&[outcome]).inc_by(n);
    }
    failed
}

/// One record's fields on its log record.
fn fill(rec: &mut SdkLogRecord, v: &serde_json::Value, line: &[u8]) {
    let text = String::from_utf8_lossy(line).trim_end().to_string();
    rec.set_body(AnyValue::String(text.into()));
    rec.set_event_name("egress.record");
    let ts = v["ts"]
        .as_str()
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .map(SystemTime::from)
        .unwrap_or_else(SystemTime::now);
    rec.set_timestamp(ts);
    rec.set_observed_timestamp(SystemTime::now());
    let deny = v["decision"] == "deny";
    rec.set_severity_number(if deny { Severity::Warn } else { Severity::Info });
    rec.set_severity_text(if deny { "WARN" } else { "INFO" });
    for (key, field) in [
        ("sandbox.id", "sandbox"),
        ("egress.event", "event"),
        ("egress.decision", "decision"),
        ("egress.reason", "reason"),
        ("egress.mode", "mode"),
        ("server.address", "target_host"),
    ] {
        if let Some(s) = v[field].as_str() {
            rec.add_attribute(key, AnyValue::String(s.to_string().into()));
        }
    }
    let process = &v["process"];
    for (key, value) in [
        ("process.executable.path", &process["exe"]),
        ("egress.exec", &process["exec"]),
    ] {
        if let Some(s) = value.as_str() {
            rec.add_attribute(key, AnyValue::String(s.to_string().into()));
        }
    }
    if let Some(pid) = process["pid"].as_i64() {
        rec.add_attribute("process.pid", AnyValue::Int(pid));
    }
    for (key, field) in [
        ("server.port", "target_port"),
        ("egress.bytes_up", "bytes_up"),
        ("egress.bytes_down", "bytes_down"),
    ] {
        if let Some(n) = v[field].as_i64() {
            rec.add_attribute(key, AnyValue::Int(n));
        }
    }
}
