//! Whether the log export is failing, said in the proxy's own log (clients review F9: a dead
//! collector was only counted, `egress_otel_records_total{outcome="failed"}`, and a platform
//! team whose collector showed nothing found no clue in the logs): one `WARN` with the error
//! when exports start failing, again at most every [`REPEAT`] while they keep failing (with
//! how many records failed since), and one `INFO` when they recover.

use std::time::Duration;

use tokio::time::Instant;

/// Least time between two warnings of one failing spell.
pub const REPEAT: Duration = Duration::from_secs(60);

/// The export's health, as the log has told it.
#[derive(Debug, Default)]
pub struct Health {
    /// Since when exports fail, and when that was last said.
    failing: Option<(Instant, Instant)>,
    /// Records failed since the spell began.
    failed: u64,
}

impl Health {
    /// An export of `n` records to `endpoint` failed with `error`.
    pub fn failed(&mut self, endpoint: &str, error: &str, n: u64) {
        let now = Instant::now();
        self.failed += n;
        match &mut self.failing {
            None => {
                tracing::warn!(
                    endpoint,
                    error,
                    "OTLP log export is failing; records are counted in egress_otel_records_total{{outcome=\"failed\"}} and not retried"
                );
                self.failing = Some((now, now));
            }
            Some((since, said)) if now.duration_since(*said) >= REPEAT => {
                tracing::warn!(
                    endpoint,
                    error,
                    failed_records = self.failed,
                    failing_for_s = now.duration_since(*since).as_secs(),
                    "OTLP log export is still failing"
                );
                *said = now;
            }
            Some(_) => {}
        }
    }

    /// An export succeeded.
    pub fn exported(&mut self, endpoint: &str) {
        if let Some((since, _)) = self.failing.take() {
            tracing::info!(
                endpoint,
                failed_records = self.failed,
                failed_for_s = Instant::now().duration_since(since).as_secs(),
                "OTLP log export recovered"
            );
            self.failed = 0;
        }
    }

    /// Records counted as failed without an export (the backoff after a failure).
    pub fn skipped(&mut self, n: u64) {
        self.failed += n;
    }
}
