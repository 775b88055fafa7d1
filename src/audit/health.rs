//! Whether the audit trail can take records now: the one answer the listeners ask before they
//! serve anything ([`Health::unavailable`]), `/readyz` shows and the metrics export.
//!
//! The writer thread sets it: a failed write (a full disk, an I/O error, a read-only
//! remount, a closed pipe, a file that cannot be opened again) marks the sink *failing*
//! until a write succeeds again. With `audit.on_failure: refuse` (the default) a failing
//! sink makes the proxy refuse new connections, requests and DNS queries
//! (`audit_unavailable`), as a full queue does; with `continue` it serves on and counts the
//! records it drops.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::audit::OnFailure;

/// Why records cannot be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// `queue_max` records wait for the writer.
    Saturated,
    /// The sink fails, and `on_failure` is `refuse`.
    Failing,
}

impl Unavailable {
    /// One sentence for the refusal and the log.
    pub fn explain(self) -> &'static str {
        match self {
            Unavailable::Saturated => {
                "the audit trail is behind (audit.queue_max records wait to be written); nothing is served that could not be recorded"
            }
            Unavailable::Failing => {
                "the audit trail cannot be written (its sink fails; see /readyz); nothing is served that could not be recorded (audit.on_failure: refuse)"
            }
        }
    }
}

/// The sink's state, shared by the writer thread (which sets it) and the data plane.
pub struct Health {
    on_failure: OnFailure,
    queue_max: usize,
    /// Records queued and not yet written (the queue plus the batch being written).
    pub(super) pending: AtomicUsize,
    failing: AtomicBool,
    /// When the current failure began (ms since the epoch; 0 when healthy).
    failing_since_ms: AtomicU64,
    /// Records given up on (`on_failure: continue`, or at close).
    dropped: AtomicU64,
    /// The last write error (never a record's content).
    error: Mutex<String>,
}

/// A snapshot for `/readyz` and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// How long the sink has been failing (`None`: it writes).
    pub failing_for: Option<Duration>,
    /// The last write error while failing.
    pub error: String,
    /// Records dropped since start.
    pub dropped: u64,
    /// Records waiting to be written.
    pub pending: usize,
    /// What the proxy does when records cannot be written.
    pub on_failure: OnFailure,
}

impl Health {
    /// The health of a writer with `queue_max` places, acting by `on_failure`.
    pub fn new(on_failure: OnFailure, queue_max: usize) -> Self {
        Health {
            on_failure,
            queue_max: queue_max.max(1),
            pending: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            failing_since_ms: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            error: Mutex::new(String::new()),
        }
    }

    /// `Some` when nothing new may be served: the queue is full, or the sink fails and
    /// `on_failure` is `refuse`. Two relaxed loads: asked once per connection, request and
    /// query.
    pub fn unavailable(&self) -> Option<Unavailable> {
        if self.failing.load(Ordering::Relaxed) && self.on_failure == OnFailure::Refuse {
            Some(Unavailable::Failing)
        } else if self.pending.load(Ordering::Relaxed) >= self.queue_max {
            Some(Unavailable::Saturated)
        } else {
            None
        }
    }

    /// What the proxy does when records cannot be written.
    pub fn on_failure(&self) -> OnFailure {
        self.on_failure
    }

    /// Whether the sink is failing now.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// A write failed. Returns true when this starts a failure episode (log it once).
    pub(super) fn failed(&self, error: &std::io::Error) -> bool {
        if let Ok(mut e) = self.error.lock() {
            *e = error.to_string();
        }
        let started = !self.failing.swap(true, Ordering::AcqRel);
        if started {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(1)
                .max(1);
            self.failing_since_ms.store(now, Ordering::Relaxed);
        }
        started
    }

    /// Everything written again. Returns how long the episode lasted when one ended.
    pub(super) fn recovered(&self) -> Option<Duration> {
        if !self.failing.swap(false, Ordering::AcqRel) {
            return None;
        }
        let since = self.failing_since_ms.swap(0, Ordering::Relaxed);
        Some(since_ms(since))
    }

    /// `n` records will never be written.
    pub(super) fn dropped(&self, n: usize) {
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The numbers `/healthz` and the metrics show.
    pub fn status(&self) -> Status {
        let failing = self.failing.load(Ordering::Acquire);
        let since = self.failing_since_ms.load(Ordering::Relaxed);
        Status {
            failing_for: (failing && since > 0).then(|| since_ms(since)),
            error: if failing {
                self.error.lock().map(|e| e.clone()).unwrap_or_default()
            } else {
                String::new()
            },
            dropped: self.dropped.load(Ordering::Relaxed),
            pending: self.pending.load(Ordering::Relaxed),
            on_failure: self.on_failure,
        }
    }
}

fn since_ms(ms: u64) -> Duration {
    let then = UNIX_EPOCH + Duration::from_millis(ms);
    SystemTime::now().duration_since(then).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_sink_refuses_only_under_refuse() {
        let err = std::io::Error::from_raw_os_error(28);
        let h = Health::new(OnFailure::Refuse, 10);
        assert_eq!(h.unavailable(), None);
        assert!(h.failed(&err));
        assert!(!h.failed(&err), "one episode is started once");
        assert_eq!(h.unavailable(), Some(Unavailable::Failing));
        assert!(h.status().failing_for.is_some());
        assert!(h.status().error.contains("space"), "{}", h.status().error);
        assert!(h.recovered().is_some());
        assert_eq!(h.unavailable(), None);
        assert_eq!(h.status().failing_for, None);

        let c = Health::new(OnFailure::Continue, 10);
        c.failed(&err);
        assert_eq!(c.unavailable(), None);
        c.pending.store(10, Ordering::Relaxed);
        assert_eq!(c.unavailable(), Some(Unavailable::Saturated));
    }
}
