//! The audit sink: entries are appended to an in-memory queue that one writer thread drains
//! at least every 5 ms — and within 1 ms when a tunnel opens — so the data plane never blocks on
//! disk, never formats JSON, and never wakes the writer per `end` record (a context switch
//! per connection was the largest cost at high connection rates).
//!
//! The queue is bounded for *new* connections: once `queue_max` entries wait, [`saturated`]
//! says so and the listeners refuse new connections (503 / reset, counted) instead of growing
//! without limit; connections already accepted still get their records. [`AuditLog::close`]
//! waits at most its deadline for the writer, then says how many records it could not write.
//!
//! Observers ([`AuditLog::observe`], `GET /v1/observe`) get each record's JSON line from the
//! writer thread through a broadcast channel: sending never waits, and an observer that falls
//! behind loses the oldest lines (and is told how many), never slowing the writer.
//!
//! [`saturated`]: AuditLog::saturated

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::chain::{Chain, Interval, Tail};
use super::output::Output;
use super::record::{Entry, Event};
use crate::config::audit::{AuditTrail, Format};

/// How long the writer sleeps between drains: the most an entry waits before it is written.
const DRAIN_EVERY: Duration = Duration::from_millis(5);
/// The most an `open` entry waits (and the least time between two wake-ups for opens).
const URGENT_EVERY: Duration = Duration::from_millis(1);

/// Entries waiting for the writer, and whether the log is closing.
#[derive(Default)]
struct Queue {
    entries: Vec<Entry>,
    closing: bool,
    /// An `open` entry arrived: write now.
    urgent: bool,
}

/// What the data plane and the writer thread share.
struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Entries queued and not yet written (queue plus the batch being written).
    pending: AtomicUsize,
    /// Set by the writer when it has written and flushed everything and stopped.
    done: Mutex<bool>,
    done_cv: Condvar,
    /// Write errors happened (logged once).
    failing: AtomicBool,
    /// Open the file again before the next write (SIGHUP / SIGUSR1).
    reopen: AtomicBool,
    /// Each record's JSON line, for observers (nothing is encoded for them while none is).
    observers: tokio::sync::broadcast::Sender<bytes::Bytes>,
}

/// Lines an observer may fall behind by before it loses the oldest.
const OBSERVER_BACKLOG: usize = 4096;

impl Inner {
    fn new() -> Arc<Self> {
        Arc::new(Inner {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            pending: AtomicUsize::new(0),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            failing: AtomicBool::new(false),
            reopen: AtomicBool::new(false),
            observers: tokio::sync::broadcast::channel(OBSERVER_BACKLOG).0,
        })
    }
}

/// The audit sink.
pub struct AuditLog {
    inner: Arc<Inner>,
    queue_max: usize,
}

impl AuditLog {
    /// Open `path` for appending, or stdout when `None`.
    pub fn open(path: Option<&std::path::Path>, queue_max: usize) -> std::io::Result<Self> {
        Self::open_with(
            path.map(|p| p.to_path_buf()),
            queue_max,
            &AuditTrail::default(),
            None,
        )
    }

    /// Open the trail as configured: `key` signs checkpoints (with `trail.chain`).
    pub fn open_with(
        path: Option<PathBuf>,
        queue_max: usize,
        trail: &AuditTrail,
        key: Option<ed25519_dalek::SigningKey>,
    ) -> std::io::Result<Self> {
        let mut out = Output::open(path.as_deref(), trail.rotate, trail.fsync)?;
        let mut anchor = match &trail.checkpoint_file {
            Some(p) => Some(Anchor::open(p)?),
            None => None,
        };
        let chain = if trail.chain {
            let tail = match &path {
                Some(p) => super::chain::last_chain(p),
                None => Tail::default(),
            };
            if tail.partial {
                // A crash left half a line: end it, and say so in the run_start.
                out.write_all(b"\n")?;
            }
            let interval = Interval {
                records: trail.checkpoint_every_records.max(1),
                every: trail.checkpoint_every,
            };
            let mut chain = Chain::new(
                super::record::run_id().to_string(),
                tail.chain_bytes(),
                key,
                interval,
            );
            let start = chain.run_start(&tail);
            out.write_all(&start)?;
            out.finish_batch()?;
            if let Some(a) = anchor.as_mut() {
                a.write(&start)?;
            }
            Some(chain)
        } else {
            None
        };
        let inner = Inner::new();
        let i = inner.clone();
        let cfg = LoopConfig {
            format: trail.format,
            anchor,
        };
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(&i, out, chain, cfg))?;
        Ok(AuditLog { inner, queue_max })
    }

    /// Every record written from now on, as its JSON line (this proxy's own record format,
    /// whatever `audit.format` is): the decisions as they happen.
    pub fn observe(&self) -> tokio::sync::broadcast::Receiver<bytes::Bytes> {
        self.inner.observers.subscribe()
    }

    /// Open the file again before the next write (after logrotate moved it).
    pub fn reopen(&self) {
        self.inner.reopen.store(true, Ordering::Release);
        self.inner.wake.notify_one();
    }

    /// Queue an entry. An `open` entry wakes the writer, unless a wake is already pending.
    pub fn write(&self, entry: Entry) {
        let urgent = entry.event == Event::Open;
        let mut wake = false;
        match self.inner.queue.lock() {
            Ok(mut q) => {
                q.entries.push(entry);
                wake = urgent && !q.urgent;
                q.urgent |= urgent;
                self.inner.pending.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => tracing::error!("audit queue poisoned; a record was lost"),
        }
        if wake {
            self.inner.wake.notify_one();
        }
    }

    /// Whether new connections should be refused: `queue_max` entries are waiting.
    pub fn saturated(&self) -> bool {
        self.inner.pending.load(Ordering::Relaxed) >= self.queue_max
    }

    /// Close the log: wait up to `deadline` for every queued record to be written and
    /// flushed. Returns how many records could not be written (0 when all were).
    pub fn close(&self, deadline: Duration) -> usize {
        if let Ok(mut q) = self.inner.queue.lock() {
            q.closing = true;
        }
        self.inner.wake.notify_one();
        let until = Instant::now() + deadline;
        let Ok(mut done) = self.inner.done.lock() else {
            return self.inner.pending.load(Ordering::Relaxed);
        };
        while !*done {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.inner.done_cv.wait_timeout(done, left) {
                Ok((d, _)) => done = d,
                Err(_) => return self.inner.pending.load(Ordering::Relaxed),
            }
        }
        if *done {
            0
        } else {
            self.inner.pending.load(Ordering::Relaxed)
        }
    }
}

/// What the writer loop needs besides the queue.
struct LoopConfig {
    format: Format,
    /// `audit.checkpoint_file`: every signed line is also appended there.
    anchor: Option<Anchor>,
}

/// `audit.checkpoint_file`: a second copy of every signed line (`run_start`, `checkpoint`),
/// on another volume or a pipe to a shipper, so that a cut or replaced tail of the main log
/// can be told (`audit verify --checkpoints`).
struct Anchor {
    file: std::fs::File,
}

impl Anchor {
    fn open(path: &std::path::Path) -> std::io::Result<Anchor> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Anchor { file })
    }

    /// Append one signed line and make it durable (a pipe cannot be synced: that is fine).
    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.file.write_all(line)?;
        let _ = self.file.sync_data();
        Ok(())
    }
}

fn write_loop(inner: &Inner, mut out: Output, chain: Option<Chain>, cfg: LoopConfig) {
    let mut batch: Vec<Entry> = Vec::new();
    let mut enc = Encoder {
        line: Vec::with_capacity(1024),
        chain,
        format: cfg.format,
        anchor: cfg.anchor,
    };
    loop {
        let closing = match inner.queue.lock() {
            Ok(q) => {
                let (mut q, _) = match inner.wake.wait_timeout_while(q, DRAIN_EVERY, |q| {
                    !q.urgent && !q.closing && !inner.reopen.load(Ordering::Acquire)
                }) {
                    Ok(x) => x,
                    Err(_) => break,
                };
                std::mem::swap(&mut q.entries, &mut batch);
                q.urgent = false;
                q.closing
            }
            Err(_) => break,
        };
        if inner.reopen.swap(false, Ordering::AcqRel) {
            if let Err(e) = out.reopen() {
                let _ = writeln!(std::io::stderr(), "audit: cannot reopen the file: {e}");
            }
        }
        let urgent = batch.iter().any(|e| e.event == Event::Open);
        write_batch(inner, &mut out, &mut batch, &mut enc);
        // The interval's time also passes with no new record: sign what went unsigned.
        if !closing && enc.chain.as_ref().is_some_and(Chain::checkpoint_due) {
            if let Err(err) = enc.checkpoint(&mut out, false) {
                report_failure(inner, &err.to_string());
            }
        }
        if urgent && !closing {
            // Opens are written within URGENT_EVERY, and the writer wakes at most that often:
            // at ten thousand tunnels a second, one wake per tunnel was the data plane's
            // largest cost. Opens that arrive meanwhile keep the flag set and go out next.
            std::thread::sleep(URGENT_EVERY);
        }
        if closing {
            // Anything queued after the flag was seen goes out too, then stop.
            if let Ok(mut q) = inner.queue.lock() {
                std::mem::swap(&mut q.entries, &mut batch);
            }
            write_batch(inner, &mut out, &mut batch, &mut enc);
            if let Err(err) = enc.checkpoint(&mut out, true) {
                report_failure(inner, &err.to_string());
            }
            let _ = out.sync();
            break;
        }
    }
    if let Ok(mut d) = inner.done.lock() {
        *d = true;
    }
    inner.done_cv.notify_all();
}

/// Log the first write failure (not eprintln!: it panics when stderr is closed too).
fn report_failure(inner: &Inner, err: &str) {
    if !inner.failing.swap(true, Ordering::Relaxed) {
        let _ = writeln!(std::io::stderr(), "audit: write failed: {err}");
    }
}

/// How records become lines: the format, the chain (if any), and a reused buffer.
struct Encoder {
    line: Vec<u8>,
    chain: Option<Chain>,
    format: Format,
    anchor: Option<Anchor>,
}

impl Encoder {
    /// Write a signed checkpoint (when the chain has a key) to the log and the anchor, and
    /// flush it.
    fn checkpoint(&mut self, out: &mut Output, last: bool) -> std::io::Result<()> {
        let Some(cp) = self.chain.as_mut().and_then(|c| c.checkpoint(last)) else {
            return Ok(());
        };
        out.write_all(&cp)?;
        out.finish_batch()?;
        if let Some(a) = self.anchor.as_mut() {
            a.write(&cp)?;
        }
        Ok(())
    }
}

/// Encode (and chain), write and flush `batch` (emptying it). A checkpoint goes before any
/// line that would otherwise leave more than the interval's records or time unsigned, so a
/// verifier can hold the file to the interval the run signed.
fn write_batch(inner: &Inner, out: &mut Output, batch: &mut Vec<Entry>, enc: &mut Encoder) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len();
    let mut failed = None;
    for e in batch.drain(..) {
        if enc.chain.as_ref().is_some_and(Chain::checkpoint_due) {
            if let Err(err) = enc.checkpoint(out, false) {
                failed = Some(err.to_string());
            }
        }
        let line = &mut enc.line;
        line.clear();
        let encoded = match enc.format {
            Format::Json => e.encode(line),
            Format::Ocsf => super::ocsf::encode(&e, line),
        };
        if encoded.is_ok() && inner.observers.receiver_count() > 0 {
            let mut json = Vec::new();
            let as_json = match enc.format {
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
        match encoded {
            Ok(()) => {
                if let Some(c) = enc.chain.as_mut() {
                    c.seal(line);
                }
                if let Err(err) = out.write_all(line) {
                    failed = Some(err.to_string());
                }
            }
            Err(err) => failed = Some(format!("cannot encode a record: {err}")),
        }
    }
    if let Err(err) = out.finish_batch() {
        failed = Some(err.to_string());
    }
    inner.pending.fetch_sub(n, Ordering::Relaxed);
    if let Some(err) = failed {
        report_failure(inner, &err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::record::{Close, Mode, Record};
    use std::time::SystemTime;

    fn entry(i: u64, event: Event) -> Entry {
        Entry {
            event,
            at: SystemTime::now(),
            record: Record::new(i, "127.0.0.1:1".parse().unwrap(), Mode::Connect, "v".into()),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            close: (event == Event::End).then_some(Close::Eof),
        }
    }

    #[test]
    fn every_entry_reaches_the_file_before_close_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(Some(&path), 10_000).unwrap();
        for i in 0..1000 {
            log.write(entry(i, Event::End));
        }
        assert_eq!(log.close(Duration::from_secs(10)), 0);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[999]["conn_id"], 999);
        assert_eq!(lines[0]["close"], "eof");
    }

    #[test]
    fn an_open_record_is_written_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(Some(&path), 10).unwrap();
        log.write(entry(1, Event::Open));
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&path)
            .unwrap_or_default()
            .is_empty()
        {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        log.close(Duration::from_secs(1));
    }

    /// A sink that never accepts a byte: the queue saturates at `queue_max`, and close gives
    /// up at its deadline, saying how many records were lost.
    #[test]
    fn a_stuck_sink_saturates_the_queue_and_close_keeps_its_deadline() {
        let (reader, writer) = std::io::pipe().unwrap();
        // Fill the pipe so that every further write blocks.
        let mut w = writer.try_clone().unwrap();
        let fill = std::thread::spawn(move || {
            let chunk = vec![b'x'; 65536];
            while w.write_all(&chunk).is_ok() {}
        });
        std::thread::sleep(Duration::from_millis(200));
        let inner = Inner::new();
        let i = inner.clone();
        let cfg = LoopConfig {
            format: Format::Json,
            anchor: None,
        };
        std::thread::spawn(move || write_loop(&i, Output::other(Box::new(writer)), None, cfg));
        let log = AuditLog {
            inner,
            queue_max: 50,
        };
        for i in 0..100 {
            log.write(entry(i, Event::End));
        }
        assert!(log.saturated());
        let started = Instant::now();
        let lost = log.close(Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(lost, 100);
        drop(reader);
        let _ = fill.join();
    }
}
