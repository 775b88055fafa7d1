//! The flow phase: where the proxy asks a sandbox's flow rules ([`crate::policy::flows`])
//! and keeps its labels. One [`Ledger`] per process holds every sandbox's [`Labels`]; a
//! [`Phase`] is one sandbox's rules with its state, used by every path that judges:
//!
//! - the driver ([`super::driver`]) judges each request it reads (forwarded, plain HTTP in a
//!   tunnel, terminated h1/h2) and arms the labels of its destination once every other phase
//!   let it through — before it is sent, so no response can race its label;
//! - a connection the proxy does not read (opaque TCP, TLS it does not terminate) is a write
//!   to its destination, judged when its relay is chosen, and arms its labels there;
//! - the DNS listener judges a query as a write to the name;
//! - a WebSocket message is a write.
//!
//! A label newly armed is kept (`state_dir/flows.json`, written whole) before the request
//! that armed it is sent: a crash or a kill cannot launder it. Each sandbox's state has a
//! change signal ([`Track::changed`]): live connections a new label now refuses watch it
//! and are cut ([`super::flow_gate`]). Without a `state_dir` the labels live in memory only.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::policy::flows::state::{Armed, Labels, Waive, Waiver};

/// The file's name in `state_dir`.
pub const FILE: &str = "flows.json";

/// The kept form.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Kept {
    version: u32,
    sandboxes: std::collections::BTreeMap<String, Labels>,
}

/// One sandbox's labels, and the signal live connections watch.
#[derive(Debug)]
pub struct Track {
    labels: Mutex<Labels>,
    changed: watch::Sender<()>,
}

impl Track {
    fn new(labels: Labels) -> Self {
        Track {
            labels: Mutex::new(labels),
            changed: watch::channel(()).0,
        }
    }

    /// A copy of the labels now.
    pub fn labels(&self) -> Labels {
        self.labels.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Resolves (with `Ok`) each time the labels change.
    pub fn changed(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}

/// A change of one sandbox's labels, as replicas share it.
#[derive(Debug, Clone)]
pub enum Change {
    /// A label armed.
    Armed(Armed),
    /// A label reset.
    Disarmed(String),
    /// A waiver given.
    Waived(Waiver),
    /// A label's waiver spent (`once`) or ended.
    Unwaived(String),
    /// The sandbox was removed: all of it.
    Forgotten,
}

/// Where a fleet shares its labels (etcd, [`crate::control::etcd::flows`]): each change made
/// here is sent (an arming is awaited before its request is sent), and what the others
/// sent is applied ([`Ledger::adopt`]).
pub trait Share: Send + Sync {
    /// Send `change` of sandbox `id`; resolves once written (or given up on, logged).
    fn send(&self, id: &str, change: Change) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Every sandbox's labels, kept across reloads (and restarts, with a `state_dir`).
#[derive(Default)]
pub struct Ledger {
    by_id: Mutex<HashMap<String, Arc<Track>>>,
    file: Option<PathBuf>,
    /// One write at a time, in order.
    writing: tokio::sync::Mutex<()>,
    /// The fleet's, when replicas share labels.
    share: std::sync::OnceLock<Arc<dyn Share>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// Why a waiver was not given.
#[derive(Debug, thiserror::Error)]
pub enum WaiveError {
    /// The label is not armed on the sandbox.
    #[error("label `{label}` is not armed on sandbox {sandbox}")]
    NotArmed {
        /// The sandbox.
        sandbox: String,
        /// The label.
        label: String,
    },
    /// The state could not be kept.
    #[error("cannot keep the flow state")]
    Keep(#[source] std::io::Error),
}

impl Ledger {
    /// The ledger, with what `state_dir` kept (a file that cannot be read is an error: the
    /// proxy does not start with labels forgotten).
    pub fn open(state_dir: Option<&Path>) -> std::io::Result<Ledger> {
        let file = state_dir.map(|d| d.join(FILE));
        let mut by_id = HashMap::new();
        if let Some(path) = &file {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let kept: Kept = serde_json::from_slice(&bytes)?;
                    if kept.version != 1 {
                        let why = format!("{}: unknown version {}", path.display(), kept.version);
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
                    }
                    for (id, labels) in kept.sandboxes {
                        by_id.insert(id, Arc::new(Track::new(labels)));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Ledger {
            by_id: Mutex::new(by_id),
            file,
            writing: Default::default(),
            share: Default::default(),
        })
    }

    /// Share changes with the fleet through `share` (set once, at start).
    pub fn set_share(&self, share: Arc<dyn Share>) {
        let _ = self.share.set(share);
    }

    /// Send `change` of sandbox `id` to the fleet, if it shares.
    async fn send(&self, id: &str, change: Change) {
        if let Some(s) = self.share.get() {
            s.send(id, change).await;
        }
    }

    /// Apply what another replica did to sandbox `id`'s labels (then kept here too).
    pub async fn adopt(&self, id: &str, change: Change) {
        let changed = match change {
            Change::Forgotten => self
                .by_id
                .lock()
                .ok()
                .and_then(|mut m| m.remove(id))
                .is_some(),
            change => {
                let track = self.track(id);
                let changed = match track.labels.lock() {
                    Ok(mut l) => match change {
                        Change::Armed(a) => l.adopt_armed(a),
                        Change::Disarmed(label) => l.disarm(&label),
                        Change::Waived(w) => l.adopt_waiver(w),
                        Change::Unwaived(label) => l.unwaive(&label),
                        Change::Forgotten => false,
                    },
                    Err(_) => false,
                };
                if changed {
                    track.changed.send_replace(());
                }
                changed
            }
        };
        if changed {
            if let Err(e) = self.keep().await {
                tracing::warn!(sandbox = id, error = %e, "cannot keep the flow state");
            }
        }
    }

    /// The track of sandbox `id` (made when first asked).
    pub fn track(&self, id: &str) -> Arc<Track> {
        match self.by_id.lock() {
            Ok(map) if map.contains_key(id) => map
                .get(id)
                .cloned()
                .unwrap_or_else(|| Arc::new(Track::new(Labels::default()))),
            Ok(mut map) => map
                .entry(id.to_string())
                .or_insert_with(|| Arc::new(Track::new(Labels::default())))
                .clone(),
            Err(_) => Arc::new(Track::new(Labels::default())),
        }
    }

    /// Every track of sandbox `id`: its own, and its processes' (`id~…`, `scope: exec`).
    pub fn tracks(&self, id: &str) -> Vec<(String, Arc<Track>)> {
        let Ok(map) = self.by_id.lock() else {
            return Vec::new();
        };
        let mine = |k: &str| k == id || k.strip_prefix(id).is_some_and(|r| r.starts_with('~'));
        map.iter()
            .filter(|(k, _)| mine(k))
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect()
    }

    /// The labels of sandbox `id` (every process's armed labels with its own), if any.
    pub fn labels(&self, id: &str) -> Option<Labels> {
        let tracks = self.tracks(id);
        if tracks.is_empty() {
            return None;
        }
        let mut out = Labels::default();
        for (key, t) in tracks {
            let l = t.labels();
            if key == id {
                out.waivers = l.waivers;
            }
            out.armed.extend(l.armed);
        }
        Some(out)
    }

    /// Forget sandbox `id` (it was removed) with its processes' labels, and keep that.
    pub async fn forget(&self, id: &str) -> std::io::Result<()> {
        let keys: Vec<String> = self.tracks(id).into_iter().map(|(k, _)| k).collect();
        if let Ok(mut m) = self.by_id.lock() {
            for k in &keys {
                m.remove(k);
            }
        }
        // The sandbox's own keys in etcd, and each of its processes'.
        self.send(id, Change::Forgotten).await;
        for k in keys.iter().filter(|k| k.as_str() != id) {
            self.send(k, Change::Forgotten).await;
        }
        match keys.is_empty() {
            false => self.keep().await,
            true => Ok(()),
        }
    }

    /// Waive (or reset) `label` of sandbox `id` for `by`; kept before it returns.
    pub async fn waive(
        &self,
        id: &str,
        label: &str,
        how: Waive,
        by: &str,
    ) -> Result<Labels, WaiveError> {
        let track = self.track(id);
        let (now, at) = now();
        let armed = self
            .labels(id)
            .is_some_and(|l| l.armed.iter().any(|a| a.label == label));
        if !armed {
            return Err(WaiveError::NotArmed {
                sandbox: id.into(),
                label: label.into(),
            });
        }
        if how == Waive::Reset {
            // Disarmed wherever it is armed: the sandbox's own track and every process's.
            for (key, t) in self.tracks(id) {
                let changed = match t.labels.lock() {
                    Ok(mut l) => l.disarm(label) | l.unwaive(label),
                    Err(_) => false,
                };
                if changed {
                    t.changed.send_replace(());
                    self.send(&key, Change::Disarmed(label.into())).await;
                }
            }
            self.send(id, Change::Unwaived(label.into())).await;
        } else {
            let w = match track.labels.lock() {
                Ok(mut l) => {
                    l.add_waiver(label, how, by, &at, now);
                    l.waivers.iter().rev().find(|w| w.label == label).cloned()
                }
                Err(_) => return Err(WaiveError::Keep(poisoned())),
            };
            if let Some(w) = w {
                self.send(id, Change::Waived(w)).await;
            }
        }
        track.changed.send_replace(());
        self.keep().await.map_err(WaiveError::Keep)?;
        Ok(self.labels(id).unwrap_or_default())
    }

    /// Write every sandbox's labels to `state_dir` (nothing without one).
    pub async fn keep(&self) -> std::io::Result<()> {
        let Some(path) = self.file.clone() else {
            return Ok(());
        };
        let _one = self.writing.lock().await;
        let kept = Kept {
            version: 1,
            sandboxes: self
                .by_id
                .lock()
                .map_err(|_| poisoned())?
                .iter()
                .map(|(id, t)| (id.clone(), t.labels()))
                .filter(|(_, l)| !l.armed.is_empty() || !l.waivers.is_empty())
                .collect(),
        };
        let bytes = serde_json::to_vec_pretty(&kept)?;
        tokio::task::spawn_blocking(move || crate::config::files::replace(&path, &bytes))
            .await
            .map_err(std::io::Error::other)?
    }
}

fn poisoned() -> std::io::Error {
    std::io::Error::other("the flow state's lock was poisoned")
}

/// Unix seconds and RFC 3339 now.
pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Unix seconds and RFC 3339 now (what a change records).
pub(super) fn now() -> (u64, String) {
    let t = SystemTime::now();
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    (secs, crate::audit::record::rfc3339(t))
}

mod phase;
pub use phase::{FlowVerdict, Phase};

pub use super::flow_gate::{Gate, Gated};
