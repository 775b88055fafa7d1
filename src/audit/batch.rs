//! The writer thread's side of the audit sink ([`super::writer`]): entries encoded (and
//! chained) into a backlog of complete lines, written to the log and the checkpoint file in
//! one piece per batch, and — when a write fails — kept and tried again with backoff
//! (`audit.on_failure: refuse`) or dropped and counted (`continue`). Health
//! ([`super::health`]) follows every attempt.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::chain::Chain;
use super::output::Output;
use super::record::Entry;
use super::writer::Inner;
use crate::config::audit::{Format, OnFailure};

/// The first and the longest wait before a failed batch is written again.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Encoded lines not yet in their output.
#[derive(Default)]
struct Backlog {
    bytes: Vec<u8>,
    /// Records among them (signed lines are not records).
    records: usize,
}

/// The writer thread's side: the outputs, the chain, and what is encoded but not written.
pub(super) struct Writer {
    pub(super) out: Output,
    /// `audit.checkpoint_file`: a second copy of every signed line (`run_start`,
    /// `checkpoint`), on another volume or a pipe to a shipper, so that a cut or replaced
    /// tail of the main log can be told (`audit verify --checkpoints`).
    anchor: Option<Output>,
    line: Vec<u8>,
    pub(super) chain: Option<Chain>,
    format: Format,
    main: Backlog,
    /// Signed lines not yet in the anchor.
    side: Vec<u8>,
    /// The output (a stream) ends inside a line: what follows starts with a line end.
    mid_line: bool,
    /// While failing: the next attempt, and the wait after it.
    pub(super) retry_at: Option<Instant>,
    pub(super) retry_wait: Duration,
    /// `audit.spill_file`: where what is still unwritten goes when the proxy stops.
    spill: Option<std::path::PathBuf>,
}

impl Writer {
    pub(super) fn new(
        out: Output,
        anchor: Option<Output>,
        chain: Option<Chain>,
        format: Format,
        spill: Option<std::path::PathBuf>,
    ) -> Self {
        Writer {
            out,
            anchor,
            line: Vec::with_capacity(1024),
            chain,
            format,
            main: Backlog::default(),
            side: Vec::new(),
            mid_line: false,
            retry_at: None,
            retry_wait: RETRY_FIRST,
            spill,
        }
    }

    /// The proxy stops and the trail still cannot take the backlog: its lines — complete,
    /// chained and signed as they would have been written, the run's final checkpoint among
    /// them — are appended to the spill file and synced, for the next start to put back
    /// ([`restore_spill`]). Returns how many records went there (0 when none could).
    pub(super) fn spill(&mut self, inner: &Inner) -> usize {
        let Some(path) = &self.spill else { return 0 };
        if self.main.bytes.is_empty() {
            return 0;
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| {
                f.write_all(&self.main.bytes)?;
                f.sync_all()
            });
        match written {
            Ok(()) => {
                let n = std::mem::take(&mut self.main.records);
                inner.health.pending.fetch_sub(n, Ordering::Relaxed);
                self.main.bytes.clear();
                let _ = writeln!(
                    std::io::stderr(),
                    "audit: {n} records the trail could not take before exit are kept in {}; the next start puts them back",
                    path.display()
                );
                n
            }
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "audit: cannot keep the unwritten records in {}: {e}",
                    path.display()
                );
                let loss = super::loss::Loss {
                    run: super::record::run_id().to_string(),
                    records: self.main.records as u64,
                };
                self.note_loss(path.clone(), &loss);
                0
            }
        }
    }

    /// Say that `loss` records are lost where the next start and `audit verify` will see it:
    /// the note beside the spill file, and a line in the checkpoint file.
    fn note_loss(&mut self, spill: std::path::PathBuf, loss: &super::loss::Loss) {
        let noted = super::loss::leave(&spill, loss);
        // The signed lines not yet copied there never reached the log either: they are not
        // copied (the checkpoint file holds only what the log holds, and this loss).
        self.side.clear();
        let anchored = self
            .anchor
            .as_mut()
            .is_some_and(|a| a.commit(&super::loss::anchor_line(loss)).is_ok() && a.sync().is_ok());
        let said = match (noted, anchored) {
            (true, true) => "noted beside the spill file and in the checkpoint file",
            (true, false) => "noted beside the spill file",
            (false, true) => "noted in the checkpoint file",
            (false, false) => "and nowhere could note it: set state_dir or audit.spill_file on another volume, or audit.checkpoint_file",
        };
        let _ = writeln!(
            std::io::stderr(),
            "audit: {} records are lost ({said}); the next start names the loss in its run_start",
            loss.records
        );
    }

    /// Whether a failed batch waits to be written again (new entries wait in the queue).
    pub(super) fn stalled(&self) -> bool {
        !self.main.bytes.is_empty() || !self.side.is_empty()
    }

    /// Add a signed checkpoint (when the chain has a key) for the log and the anchor.
    pub(super) fn checkpoint(&mut self, last: bool) {
        if let Some(cp) = self.chain.as_mut().and_then(|c| c.checkpoint(last)) {
            self.main.bytes.extend_from_slice(&cp);
            if self.anchor.is_some() {
                self.side.extend_from_slice(&cp);
            }
        }
    }

    /// Encode (and chain) `batch` into the backlog, emptying it. A checkpoint goes before
    /// any line that would otherwise leave more than the interval's records or time unsigned,
    /// so a verifier can hold the file to the interval the run signed.
    pub(super) fn encode(&mut self, inner: &Inner, batch: &mut Vec<Entry>) {
        // Read in place and dropped together after: a drain moved each 416-byte entry out
        // of the batch (three copies of it, about 240 instructions a record).
        for e in batch.iter() {
            if self.chain.as_ref().is_some_and(Chain::checkpoint_due) {
                self.checkpoint(false);
            }
            let line = &mut self.line;
            line.clear();
            let encoded = match self.format {
                Format::Json => e.encode(line),
                Format::Ocsf => super::ocsf::encode(e, line),
            };
            if encoded.is_ok() && inner.observers.receiver_count() > 0 {
                observe(inner, e, line, self.format);
            }
            match encoded {
                Ok(()) => {
                    if let Some(c) = self.chain.as_mut() {
                        c.seal(line);
                    }
                    self.main.bytes.extend_from_slice(line);
                    self.main.records += 1;
                }
                Err(err) => {
                    let _ = writeln!(std::io::stderr(), "audit: cannot encode a record: {err}");
                    inner.health.dropped(1);
                    inner.health.pending.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        batch.clear();
    }

    /// Write the backlog to the log and the anchor, unless a retry is not due yet (`force`
    /// ignores the wait). On failure the backlog is kept (`refuse`) or dropped and counted
    /// (`continue`).
    pub(super) fn flush(&mut self, inner: &Inner, force: bool) {
        if !self.stalled() || (!force && self.retry_at.is_some_and(|t| Instant::now() < t)) {
            return;
        }
        let mut error = None;
        if !self.main.bytes.is_empty() {
            match self.out.commit(&self.main.bytes) {
                Ok(()) => {
                    let n = std::mem::take(&mut self.main.records);
                    inner.health.pending.fetch_sub(n, Ordering::Relaxed);
                    self.main.bytes.clear();
                }
                Err(f) => {
                    // A stream took part of a line (or the line end a drop still owes).
                    self.mid_line = match f.kept {
                        0 => self.main.bytes == b"\n",
                        k => self.main.bytes[k - 1] != b'\n',
                    };
                    self.main.bytes.drain(..f.kept);
                    if self.main.bytes.is_empty() {
                        // Written whole; what failed came after (a sync, a rotation).
                        let n = std::mem::take(&mut self.main.records);
                        inner.health.pending.fetch_sub(n, Ordering::Relaxed);
                    }
                    error = Some(f.error);
                }
            }
        }
        // The checkpoint file holds only what the log holds: its copies wait while the log's
        // lines do (a signed line the log lacks would read as the log's end cut off).
        let logged = self.main.bytes.is_empty();
        if let Some(a) = self
            .anchor
            .as_mut()
            .filter(|_| logged && !self.side.is_empty())
        {
            match a.commit(&self.side) {
                Ok(()) => self.side.clear(),
                Err(f) => {
                    self.side.drain(..f.kept);
                    error = error.or(Some(f.error));
                }
            }
        }
        match error {
            None => self.recovered(inner),
            Some(e) => self.failed(inner, &e),
        }
    }

    pub(super) fn failed(&mut self, inner: &Inner, e: &std::io::Error) {
        let health = &inner.health;
        let started = health.failed(e);
        match health.on_failure() {
            OnFailure::Refuse => {
                if started {
                    let _ = writeln!(
                        std::io::stderr(),
                        "audit: write failed: {e}; new connections, requests and DNS queries are refused (audit_unavailable) until the trail can be written; no record is dropped (audit.on_failure: refuse)"
                    );
                }
                self.retry_at = Some(Instant::now() + self.retry_wait);
                self.retry_wait = (self.retry_wait * 2).min(RETRY_MAX);
            }
            OnFailure::Continue => {
                if started {
                    let _ = writeln!(
                        std::io::stderr(),
                        "audit: write failed: {e}; records are dropped and counted (egress_audit_dropped_total) until the trail can be written (audit.on_failure: continue)"
                    );
                }
                let n = std::mem::take(&mut self.main.records);
                health.dropped(n);
                health.pending.fetch_sub(n, Ordering::Relaxed);
                // A stream that took part of a line gets the rest of that line cut: the next
                // batch starts on a line of its own.
                self.main.bytes.clear();
                if std::mem::take(&mut self.mid_line) {
                    self.main.bytes.push(b'\n');
                }
                self.side.clear();
            }
        }
    }

    pub(super) fn recovered(&mut self, inner: &Inner) {
        self.retry_at = None;
        self.retry_wait = RETRY_FIRST;
        if let Some(took) = inner.health.recovered() {
            let st = inner.health.status();
            let _ = writeln!(
                std::io::stderr(),
                "audit: writing again after {:.1} s of failure ({} records dropped in all)",
                took.as_secs_f64(),
                st.dropped
            );
        }
    }
}

/// Send a record's JSON line to the observers.
fn observe(inner: &Inner, e: &Entry, line: &[u8], format: Format) {
    let mut json = Vec::new();
    let as_json = match format {
        Format::Json => {
            json.extend_from_slice(line);
            Ok(())
        }
        Format::Ocsf => e.encode(&mut json),
    };
    if as_json.is_ok() {
        let _ = inner.observers.send(bytes::Bytes::from(json));
    }
}

/// At start, before the run's first line: the lines a previous run spilled at its stop
/// ([`Writer::spill`]) are appended to the log they belong to (they continue its chain) and
/// the spill file is removed. A spill that cannot be put back is an error: the proxy does
/// not start and write after it, which would leave those records out of order or lost.
pub(super) fn restore_spill(log: &std::path::Path, spill: &std::path::Path) -> std::io::Result<()> {
    let lines = match std::fs::read(spill) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !lines.is_empty() {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        f.write_all(&lines)?;
        f.sync_all()?;
        let _ = writeln!(
            std::io::stderr(),
            "audit: {} records kept in {} at the last stop are back in {}",
            lines.iter().filter(|b| **b == b'\n').count(),
            spill.display(),
            log.display()
        );
    }
    std::fs::remove_file(spill)
}
