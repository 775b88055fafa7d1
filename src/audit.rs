//! The audit log: exactly one JSON line per connection (per forwarded request in HTTP mode),
//! written when it ends, plus one `open` line when a tunnel is established (DESIGN §7).
//!
//! Records are appended to an in-memory queue that one writer thread drains every few
//! milliseconds, so the data plane never blocks on disk, never wakes the writer per record
//! (a context switch per connection was the largest cost at high connection rates), and no
//! record is dropped; shutdown waits for the writer to drain and flush. Nothing in a record
//! is a secret: no token, no Authorization header.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Close {
    /// Both sides finished normally (or the request was answered).
    Eof,
    Idle,
    Error,
    Revoked,
    Shutdown,
    Limit,
}

/// One audit record. Field names are the contract (DESIGN §7).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Record {
    pub ts: String,
    /// `open` (tunnel established) or `end` (the one final record).
    pub event: &'static str,
    pub conn_id: u64,
    pub sandbox: Option<String>,
    /// token | source | default | none
    pub identity: &'static str,
    pub client: String,
    /// connect | http | sni | host
    pub mode: &'static str,
    pub target_host: Option<String>,
    pub target_port: Option<u16>,
    pub sni: Option<String>,
    pub original_dst: Option<String>,
    /// Transparent mode: whether `original_dst` was among the resolved addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_in_resolved: Option<bool>,
    /// Transparent TLS: ALPN protocols offered, and whether the hello carried ECH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpn: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ech: Option<bool>,
    pub resolved: Vec<String>,
    pub dialed: Option<String>,
    /// allow | deny | report
    pub decision: &'static str,
    pub reason: &'static str,
    pub rule: Option<String>,
    pub rule_source: Option<String>,
    pub policy_version: String,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// eof | idle | error | revoked | shutdown | limit (absent on `open` records)
    pub close: Option<Close>,
    /// A short human-readable detail (never a secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// RFC 3339 UTC timestamp with milliseconds.
pub fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        d.subsec_millis()
    )
}

/// How long the writer sleeps between drains: the most a record waits before it is written.
const DRAIN_EVERY: Duration = Duration::from_millis(5);

/// Records waiting for the writer, and whether the log is closing.
#[derive(Default)]
struct Queue {
    records: Vec<Record>,
    closing: bool,
}

/// The audit sink.
pub struct AuditLog {
    queue: Arc<Mutex<Queue>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl AuditLog {
    /// Open `path` for appending, or stdout when `None`.
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match path {
            Some(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
            None => Box::new(std::io::stdout()),
        };
        let queue = Arc::new(Mutex::new(Queue::default()));
        let q = queue.clone();
        let writer = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(q, out))?;
        Ok(AuditLog {
            queue,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Queue a record (stamped with the current time).
    pub fn write(&self, mut record: Record) {
        if record.ts.is_empty() {
            record.ts = now_rfc3339();
        }
        match self.queue.lock() {
            Ok(mut q) => q.records.push(record),
            Err(_) => tracing::error!("audit queue poisoned; a record was lost"),
        }
    }

    /// Close the log and wait until every queued record is written and flushed.
    pub fn close(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.closing = true;
        }
        let handle = self.writer.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn write_loop(queue: Arc<Mutex<Queue>>, out: Box<dyn Write + Send>) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    let mut batch: Vec<Record> = Vec::new();
    loop {
        let closing = match queue.lock() {
            Ok(mut q) => {
                std::mem::swap(&mut q.records, &mut batch);
                q.closing
            }
            Err(_) => true,
        };
        write_batch(&mut out, &mut batch);
        if closing {
            // Anything queued after the flag was seen goes out too, then stop.
            if let Ok(mut q) = queue.lock() {
                std::mem::swap(&mut q.records, &mut batch);
            }
            write_batch(&mut out, &mut batch);
            return;
        }
        std::thread::sleep(DRAIN_EVERY);
    }
}

/// Write and flush `batch` (emptying it).
fn write_batch(out: &mut BufWriter<Box<dyn Write + Send>>, batch: &mut Vec<Record>) {
    if batch.is_empty() {
        return;
    }
    let mut line = Vec::with_capacity(1024);
    for r in batch.drain(..) {
        line.clear();
        match serde_json::to_writer(&mut line, &r) {
            Ok(()) => {
                line.push(b'\n');
                if let Err(e) = out.write_all(&line) {
                    eprintln!("audit: write failed: {e}");
                }
            }
            Err(e) => eprintln!("audit: cannot encode a record: {e}"),
        }
    }
    if let Err(e) = out.flush() {
        eprintln!("audit: flush failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_look_like_rfc3339() {
        let ts = now_rfc3339();
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(
            ts.starts_with("20") && ts.ends_with('Z') && &ts[10..11] == "T",
            "{ts}"
        );
    }

    #[test]
    fn every_record_reaches_the_file_before_close_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(Some(&path)).unwrap();
        for i in 0..1000 {
            log.write(Record {
                conn_id: i,
                event: "end",
                decision: "allow",
                reason: "rule_matched",
                close: Some(Close::Eof),
                ..Record::default()
            });
        }
        log.close();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[999]["conn_id"], 999);
        assert_eq!(lines[0]["close"], "eof");
        for key in [
            "ts",
            "conn_id",
            "sandbox",
            "identity",
            "client",
            "mode",
            "target_host",
            "target_port",
            "sni",
            "original_dst",
            "resolved",
            "dialed",
            "decision",
            "reason",
            "rule",
            "rule_source",
            "policy_version",
            "bytes_up",
            "bytes_down",
            "duration_ms",
            "close",
        ] {
            assert!(lines[0].get(key).is_some(), "missing {key}");
        }
    }
}
