//! Keeping usage across restarts: the ledger ([`crate::audit::usage`]) and each sandbox's
//! daily quota counts ([`crate::egress::quota`]) are saved in `state_dir/usage.state` (JSON) every
//! [`SAVE_EVERY`], within [`SAVE_SOON`] of a request reserved against a quota (or a byte
//! count reaching one), and at shutdown (written to a temporary file, synced and renamed: a
//! crash leaves the previous file whole), and read back at start. A kill (`SIGKILL`, a
//! crash) loses at most the requests reserved in the last [`SAVE_SOON`] and one write, and
//! the bytes moved in the last [`SAVE_EVERY`]. Without a
//! `state_dir` they live in memory only. With etcd, the quota counts are also shared between
//! replicas ([`crate::control::etcd::usage`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::audit::usage::Cell;
use crate::egress::quota::DayCount;
use crate::runtime::Shared;

/// How often the file is written (when something was counted).
pub const SAVE_EVERY: Duration = Duration::from_secs(2);
/// How soon after a request is reserved against a quota the file is written (reservations
/// in the meantime share the write).
pub const SAVE_SOON: Duration = Duration::from_millis(100);
/// The file's name in `state_dir`.
pub const FILE: &str = "usage.state";

/// The saved form.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    version: u32,
    cells: Vec<Cell>,
    quota: Vec<Quota>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quota {
    sandbox: String,
    /// A `per_destination` entry's host (its own meter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    destination: Option<String>,
    day: u32,
    bytes: u64,
    requests: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    tokens: u64,
    /// Nano-dollars.
    #[serde(default, skip_serializing_if = "is_zero")]
    cost: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Quota {
    /// The saved form of meter `key`'s counts.
    fn of(key: String, c: DayCount) -> Quota {
        let (sandbox, destination) = split(key);
        Quota {
            sandbox,
            destination,
            day: c.day,
            bytes: c.bytes,
            requests: c.requests,
            tokens: c.tokens,
            cost: c.cost,
        }
    }
}

/// Where usage is saved, if anywhere.
pub struct Keeper {
    path: Option<PathBuf>,
    shared: Arc<Shared>,
}

impl Keeper {
    /// Read what was saved in `state_dir` (a file that cannot be read is reported and kept
    /// aside as `usage.state.broken`; counting starts afresh). With `etcd`
    /// the quota counts are not taken from the file: etcd still holds them.
    pub fn start(state_dir: Option<&Path>, etcd: bool, shared: Arc<Shared>) -> Arc<Self> {
        let path = state_dir.map(|d| d.join(FILE));
        if let Some(p) = &path {
            match load(p) {
                Ok(Some(saved)) => {
                    let cells = shared.sink.usage.restore(saved.cells);
                    let counts: HashMap<String, DayCount> = saved
                        .quota
                        .into_iter()
                        .map(|q| {
                            let c = DayCount {
                                day: q.day,
                                bytes: q.bytes,
                                requests: q.requests,
                                tokens: q.tokens,
                                cost: q.cost,
                            };
                            (key(q.sandbox, q.destination), c)
                        })
                        .collect();
                    let quotas = counts.len();
                    // With etcd, the day's counts are there (this replica's earlier key).
                    if !etcd {
                        shared.limiters.restore(counts);
                    }
                    tracing::info!(cells, quotas, "usage restored from state_dir");
                }
                Ok(None) => {}
                Err(e) => {
                    // Kept aside for the operator; counting starts afresh.
                    let aside = p.with_extension("state.broken");
                    let _ = std::fs::rename(p, &aside);
                    tracing::warn!(error = %e, kept = %aside.display(), "cannot read the saved usage");
                }
            }
        }
        Arc::new(Keeper { path, shared })
    }

    /// Save now (nothing without a `state_dir`).
    pub fn save(&self) {
        let Some(path) = &self.path else { return };
        let mut quota: Vec<Quota> = self
            .shared
            .limiters
            .counts()
            .into_iter()
            .map(|(key, m)| Quota::of(key, m.mine()))
            .collect();
        let today = crate::egress::quota::today();
        quota.extend(
            self.shared
                .limiters
                .pending()
                .into_iter()
                .filter(|(_, c)| c.day == today)
                .map(|(key, c)| Quota::of(key, c)),
        );
        let saved = Saved {
            version: 1,
            cells: self.shared.sink.usage.cells(),
            quota,
        };
        if let Err(e) = write(path, &saved) {
            tracing::warn!(error = %e, path = %path.display(), "cannot save usage");
        }
    }

    /// Save every [`SAVE_EVERY`] until the task is aborted (then [`Keeper::save`] once more).
    pub async fn run(self: Arc<Self>) {
        if self.path.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(SAVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let counted = crate::egress::quota::counted_signal();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = counted.notified() => tokio::time::sleep(SAVE_SOON).await,
            }
            let keeper = self.clone();
            let _ = tokio::task::spawn_blocking(move || keeper.save()).await;
        }
    }
}

/// A meter's key: the sandbox id, or `id@host` for a `per_destination` entry.
fn key(sandbox: String, destination: Option<String>) -> String {
    match destination {
        Some(d) => format!("{sandbox}@{d}"),
        None => sandbox,
    }
}

fn split(key: String) -> (String, Option<String>) {
    match key.split_once('@') {
        Some((s, d)) => (s.to_string(), Some(d.to_string())),
        None => (key, None),
    }
}

fn load(path: &Path) -> std::io::Result<Option<Saved>> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let saved: Saved = serde_json::from_slice(&text)?;
    if saved.version != 1 {
        let why = format!("unknown version {}", saved.version);
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
    }
    Ok(Some(saved))
}

fn write(path: &Path, saved: &Saved) -> std::io::Result<()> {
    crate::config::files::replace(path, &serde_json::to_vec(saved)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_or_foreign_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE);
        assert!(load(&p).unwrap().is_none());
        std::fs::write(&p, b"{not json").unwrap();
        assert!(load(&p).is_err());
        std::fs::write(&p, br#"{"version":2,"cells":[],"quota":[]}"#).unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("version"));
        let saved = Saved {
            version: 1,
            cells: vec![],
            quota: vec![Quota {
                sandbox: "a".into(),
                destination: None,
                day: 1,
                bytes: 2,
                requests: 3,
                tokens: 0,
                cost: 0,
            }],
        };
        write(&p, &saved).unwrap();
        let back = load(&p).unwrap().unwrap();
        assert_eq!(back.quota[0].requests, 3);
    }
}
