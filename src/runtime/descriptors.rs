//! The descriptor reserve: the process keeps `admission.descriptor_reserve` of its descriptor
//! limit for the data plane. The admin listener and DNS over TCP are refused first when open
//! descriptors reach the rest (`egress_admission_refused_total{why="descriptors"}`), so a
//! flood of either can no longer starve CONNECTs of descriptors (`accept failed: Too many
//! open files`). Open descriptors are counted from `/proc/self/fd` four times a second: cheap,
//! and a flood cannot race far past the mark in a quarter second with per-source caps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often open descriptors are counted.
const EVERY: Duration = Duration::from_millis(250);

/// Below this many open descriptors (at the last count) the directory is read on the worker
/// the tick woke: an `openat`, two `getdents64` and a `close`.
const READ_IN_PLACE: usize = 256;

/// Open descriptors against the limit.
#[derive(Debug)]
pub struct Descriptors {
    /// Descriptors the control plane (admin, DNS over TCP) may see open before it is refused.
    mark: usize,
    open: AtomicUsize,
}

impl Descriptors {
    /// `reserve`: the share of the soft `RLIMIT_NOFILE` kept for the data plane.
    pub fn new(reserve: f64) -> Arc<Self> {
        let limit = rlimit::Resource::NOFILE
            .get()
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let mark = (limit as f64 * (1.0 - reserve)) as usize;
        let d = Descriptors {
            mark,
            open: AtomicUsize::new(0),
        };
        d.count();
        Arc::new(d)
    }

    fn count(&self) {
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open.store(dir.count(), Ordering::Relaxed);
        }
    }

    /// Whether the control plane must be refused now (the reserve is being reached).
    pub fn low(&self) -> bool {
        self.open.load(Ordering::Relaxed) >= self.mark
    }

    /// A control-plane connection is about to be admitted: count its descriptor now (the
    /// next sample corrects the count), so a burst cannot run past the mark between samples;
    /// `false` (nothing counted) when the reserve is reached.
    pub fn take(&self) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.mark).then_some(n + 1)
            })
            .is_ok()
    }

    /// Count every [`EVERY`] until the process ends.
    pub async fn sample(self: Arc<Self>) {
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tick.tick().await;
            if self.open.load(Ordering::Relaxed) < READ_IN_PLACE {
                // A short directory (an idle or lightly used proxy): read where the tick
                // woke, without waking a blocking thread and then this task again.
                self.count();
                continue;
            }
            let d = self.clone();
            // A directory of thousands of entries: off the reactor.
            let _ = tokio::task::spawn_blocking(move || d.count()).await;
        }
    }
}
