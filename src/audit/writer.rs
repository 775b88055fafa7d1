//! The audit sink: entries are appended to an in-memory queue that one writer thread drains
//! at least every 5 ms — and within 1 ms when a tunnel opens — so the data plane never blocks on
//! disk, never formats JSON, and never wakes the writer per `end` record (a context switch
//! per connection was the largest cost at high connection rates). A second after the last
//! entry the writer sleeps until the next checkpoint is due (at most a second), and the first
//! entry wakes it: an idle proxy is not woken two hundred times a second.
//!
//! The queue is bounded for *new* connections: once `queue_max` entries wait, the sink is
//! [`unavailable`] and the listeners refuse new connections, requests and queries
//! (`audit_unavailable`, counted) instead of growing without limit; connections already
//! accepted still get their records. [`AuditLog::close`] waits at most its deadline for the
//! writer; what the trail still cannot take then is kept in `audit.spill_file` (complete,
//! chained lines, the run's final checkpoint among them), which the next start appends to the
//! trail before its own first line. It says how many records were neither written nor kept.
//!
//! **A sink that fails** (a full disk, an I/O error, a read-only remount, a closed pipe, a
//! file that cannot be opened again) loses nothing under `audit.on_failure: refuse`: the
//! batch that failed is kept, encoded and chained, and written again with backoff (10 ms to
//! 1 s), the records behind it wait in the queue, and meanwhile the sink is unavailable, so
//! nothing new is served unrecorded. The output is cut back to its last complete line first
//! ([`Output::commit`]), so the file stays parsable and its chain verifies. Under `continue`
//! the batch is dropped and counted instead. Each failure episode is logged once when it
//! begins and once when it ends, with its count.
//!
//! Observers ([`AuditLog::observe`], `GET /v1/observe`) get each record's JSON line from the
//! writer thread through a broadcast channel: sending never waits, and an observer that falls
//! behind loses the oldest lines (and is told how many), never slowing the writer.
//!
//! [`unavailable`]: AuditLog::unavailable

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::batch::Writer;
use super::chain::{Chain, Interval, Tail};
use super::health::{Health, Unavailable};
use super::output::Output;
use super::record::{Entry, Event};
use crate::config::audit::{AuditTrail, OnFailure};
use crate::policy::cause::caused;

/// How long the writer sleeps between drains: the most an entry waits before it is written.
const DRAIN_EVERY: Duration = Duration::from_millis(5);
/// The most an `open` entry waits (and the least time between two wake-ups for opens).
const URGENT_EVERY: Duration = Duration::from_millis(1);
/// The longest an idle writer (nothing queued) sleeps: the first entry wakes it before.
const IDLE_AT_MOST: Duration = Duration::from_secs(1);
/// How long the writer drains every [`DRAIN_EVERY`] after the last entry before it sleeps
/// until the next one.
const QUIET_BEFORE_IDLE: Duration = Duration::from_secs(1);
/// How long `close` waits for the spill after its deadline.
pub const SPILL_WAIT: Duration = Duration::from_secs(3);
/// The longest sleep between two tries while closing (`close` may give up meanwhile).
const RETRY_WHILE_CLOSING: Duration = Duration::from_millis(100);

/// Entries waiting for the writer, and whether the log is closing.
#[derive(Default)]
pub(super) struct Queue {
    entries: Vec<Entry>,
    closing: bool,
    /// Write now: an `open` entry arrived, or the first entry after an idle sleep.
    urgent: bool,
    /// The writer waits on the condition variable: an `open` must wake it. When it is busy or
    /// in its pause between urgent batches it reads `urgent` before it waits again, so no
    /// wake is needed (each would be a `futex` call of the data plane's).
    waiting: bool,
    /// The writer waits with nothing queued, [`QUIET_BEFORE_IDLE`] after the last entry, for
    /// up to [`IDLE_AT_MOST`] rather than [`DRAIN_EVERY`]: the first entry wakes it.
    idle: bool,
}

/// What the data plane and the writer thread share.
pub(super) struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Whether records can be taken, and what is pending.
    pub(super) health: Health,
    /// Set by the writer when it has written and flushed everything and stopped.
    done: Mutex<bool>,
    done_cv: Condvar,
    /// Open the file again before the next write (SIGHUP / SIGUSR1).
    reopen: AtomicBool,
    /// `close` waited its deadline: stop retrying, spill what is left.
    give_up: AtomicBool,
    /// Each record's JSON line, for observers (nothing is encoded for them while none is).
    pub(super) observers: tokio::sync::broadcast::Sender<bytes::Bytes>,
}

/// Lines an observer may fall behind by before it loses the oldest.
const OBSERVER_BACKLOG: usize = 4096;

impl Inner {
    fn new(on_failure: OnFailure, queue_max: usize) -> Arc<Self> {
        Arc::new(Inner {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            health: Health::new(on_failure, queue_max),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            reopen: AtomicBool::new(false),
            give_up: AtomicBool::new(false),
            observers: tokio::sync::broadcast::channel(OBSERVER_BACKLOG).0,
        })
    }
}

/// The audit sink.
pub struct AuditLog {
    inner: Arc<Inner>,
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
        if let Some((log, spill)) = path.as_deref().zip(trail.spill_file.as_deref()) {
            super::batch::restore_spill(log, spill).map_err(|e| {
                let what = format!(
                    "the records kept in {} at the last stop cannot be put back into {} (the proxy does not start until they can: free space on the log's volume)",
                    spill.display(),
                    log.display()
                );
                std::io::Error::new(e.kind(), caused(what, e))
            })?;
        }
        let mut out = Output::open(path.as_deref(), trail.rotate, trail.fsync)?;
        let mut anchor = match &trail.checkpoint_file {
            Some(p) => Some(
                Output::open(Some(p), None, crate::config::audit::Fsync::EveryRecord).map_err(
                    |e| std::io::Error::new(e.kind(), caused(p.display().to_string(), e)),
                )?,
            ),
            None => None,
        };
        let chain = if trail.chain {
            let tail = match &path {
                Some(p) => super::chain::last_chain(p),
                None => Tail::default(),
            };
            let mut first = Vec::new();
            if tail.partial {
                // A crash left half a line: end it, and say so in the run_start.
                first.push(b'\n');
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
            // The last run's loss at its stop, if it left a note: named in this run_start.
            let spill = trail.spill_file.as_deref();
            let lost = spill.and_then(super::loss::read).or_else(|| {
                let anchor = trail.checkpoint_file.as_deref()?;
                super::loss::from_anchor(anchor)
            });
            let start = chain.run_start(&tail, lost.as_ref());
            first.extend_from_slice(&start);
            out.commit(&first).map_err(|f| f.error)?;
            if let Some(a) = anchor.as_mut() {
                a.commit(&start).map_err(|f| f.error)?;
            }
            if let (Some(s), Some(l)) = (spill, &lost) {
                let _ = out.sync();
                super::loss::clear(s);
                tracing::warn!(run = %l.run, records = l.records, "audit: the last run lost records at its stop; this run_start says so");
            }
            Some(chain)
        } else {
            None
        };
        let inner = Inner::new(trail.on_failure, queue_max);
        let i = inner.clone();
        let writer = Writer::new(out, anchor, chain, trail.format, trail.spill_file.clone());
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(&i, writer))?;
        Ok(AuditLog { inner })
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

    /// Queue an entry. An `open` entry wakes the writer when it waits, unless a wake is
    /// already pending (a busy writer finds it before it waits again).
    pub fn write(&self, entry: Entry) {
        let urgent = entry.event == Event::Open;
        let mut wake = false;
        match self.inner.queue.lock() {
            Ok(mut q) => {
                q.entries.push(entry);
                wake = q.waiting && (q.idle || (urgent && !q.urgent));
                q.urgent |= urgent || q.idle;
                q.idle = false;
                self.inner.health.pending.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => tracing::error!("audit queue poisoned; a record was lost"),
        }
        if wake {
            self.inner.wake.notify_one();
        }
    }

    /// `Some` when nothing new may be served: `queue_max` entries are waiting, or the sink
    /// fails under `on_failure: refuse`.
    pub fn unavailable(&self) -> Option<Unavailable> {
        self.inner.health.unavailable()
    }

    /// The sink's state, for `/readyz` and the metrics.
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    /// Close the log: wait up to `deadline` for every queued record to be written and
    /// flushed; then (the trail still failing) up to [`SPILL_WAIT`] for the rest to be kept
    /// in `audit.spill_file`. Returns how many records were neither written nor kept (0 when
    /// none was lost).
    pub fn close(&self, deadline: Duration) -> usize {
        if let Ok(mut q) = self.inner.queue.lock() {
            q.closing = true;
        }
        self.inner.wake.notify_one();
        if !self.wait_done(deadline) {
            self.inner.give_up.store(true, Ordering::Release);
            self.wait_done(SPILL_WAIT);
        }
        self.inner.health.pending.load(Ordering::Relaxed)
    }

    /// Wait up to `wait` for the writer to stop; whether it did.
    fn wait_done(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let Ok(mut done) = self.inner.done.lock() else {
            return false;
        };
        while !*done {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.inner.done_cv.wait_timeout(done, left) {
                Ok((d, _)) => done = d,
                Err(_) => return false,
            }
        }
        true
    }
}

fn write_loop(inner: &Inner, mut w: Writer) {
    let mut batch: Vec<Entry> = Vec::new();
    // When a drain last found entries. Only after QUIET_BEFORE_IDLE without any does the
    // writer sleep until the next one: the wake that ends that sleep is the data plane's
    // (a `futex` call, and the writer running beside the request that queued the entry), so
    // traffic of even one request a second keeps the writer on its drains and never pays it.
    let mut last_entries = Instant::now();
    loop {
        let closing = match inner.queue.lock() {
            Ok(mut q) => {
                q.waiting = true;
                q.idle = q.entries.is_empty()
                    && last_entries.elapsed() >= QUIET_BEFORE_IDLE
                    && !w.stalled();
                let wait = wait_for(&w, q.idle);
                let (mut q, _) = match inner.wake.wait_timeout_while(q, wait, |q| {
                    !q.urgent && !q.closing && !inner.reopen.load(Ordering::Acquire)
                }) {
                    Ok(x) => x,
                    Err(_) => break,
                };
                q.waiting = false;
                q.idle = false;
                // While a failed batch waits, the entries behind it stay queued (counted).
                if !w.stalled() || q.closing {
                    std::mem::swap(&mut q.entries, &mut batch);
                    q.urgent = false;
                }
                if !batch.is_empty() {
                    last_entries = Instant::now();
                }
                q.closing
            }
            Err(_) => break,
        };
        if inner.reopen.swap(false, Ordering::AcqRel) {
            if let Err(e) = w.out.reopen() {
                let _ = writeln!(std::io::stderr(), "audit: cannot reopen the file: {e}");
                w.failed(inner, &e);
            }
        }
        let urgent = batch.iter().any(|e| e.event == Event::Open);
        w.flush(inner, false);
        if !w.stalled() {
            w.encode(inner, &mut batch);
            // The interval's time also passes with no new record: sign what went unsigned.
            if !closing && w.chain.as_ref().is_some_and(Chain::checkpoint_due) {
                w.checkpoint(false);
            }
            w.flush(inner, true);
        }
        if closing {
            closing_drain(inner, &mut w, &mut batch);
            break;
        }
        if urgent {
            // Opens are written within URGENT_EVERY, and the writer wakes at most that often:
            // at ten thousand tunnels a second, one wake per tunnel was the data plane's
            // largest cost. Opens that arrive meanwhile keep the flag set and go out next.
            std::thread::sleep(URGENT_EVERY);
        }
    }
    if let Ok(mut d) = inner.done.lock() {
        *d = true;
    }
    inner.done_cv.notify_all();
}

/// How long the writer waits before it looks again: until the failed batch's retry; with
/// nothing queued (`idle`), until the next checkpoint falls due, at most [`IDLE_AT_MOST`];
/// else [`DRAIN_EVERY`].
fn wait_for(w: &Writer, idle: bool) -> Duration {
    let now = Instant::now();
    match w.retry_at {
        Some(t) if w.stalled() => t.saturating_duration_since(now),
        _ if idle => match w.chain.as_ref().and_then(Chain::next_due) {
            Some(due) => due.saturating_duration_since(now).min(IDLE_AT_MOST),
            None => IDLE_AT_MOST,
        },
        _ => DRAIN_EVERY,
    }
}

/// Closing: anything queued after the flag was seen goes out too, then the final
/// checkpoint; a failing sink is retried (with backoff) until `close`'s deadline gives up.
fn closing_drain(inner: &Inner, w: &mut Writer, batch: &mut Vec<Entry>) {
    if let Ok(mut q) = inner.queue.lock() {
        batch.append(&mut q.entries);
    }
    w.encode(inner, batch);
    w.checkpoint(true);
    w.flush(inner, true);
    while w.stalled()
        && inner.health.on_failure() == OnFailure::Refuse
        && !inner.give_up.load(Ordering::Acquire)
    {
        std::thread::sleep(w.retry_wait.min(RETRY_WHILE_CLOSING));
        w.flush(inner, true);
    }
    if w.stalled() {
        w.spill(inner);
    }
    let _ = w.out.sync();
}

#[cfg(test)]
mod tests;
