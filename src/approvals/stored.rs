//! Grants as they are kept outside the process — in `state_dir/grants.json` and under the
//! etcd prefix's `grants/` keys — so that a restart and every replica enforce the same ones;
//! and the journal of spent `once` grants (`state_dir/grants.spent`, [`SpentFile`]): one id
//! per line, appended and synced before the exchange that spends a grant leaves, read back
//! over `grants.json` at start, so neither a stop nor a kill gives a spent grant back.

use crate::policy::cause::caused;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::approvals::error::{store, ApprovalError};
use crate::policy::granted::{GrantEntry, GrantKind, SpendJournal};
use crate::policy::target::Host;

/// One grant, serialisable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredGrant {
    /// The grant's id (`g-…`).
    pub id: String,
    /// The sandbox it is for.
    pub sandbox: String,
    /// The host it allows.
    pub host: String,
    /// The port it allows.
    pub port: u16,
    /// The methods it allows (empty: any).
    #[serde(default)]
    pub methods: Vec<String>,
    /// The path globs it allows (empty: any).
    #[serde(default)]
    pub paths: Vec<String>,
    /// How long it stands.
    pub kind: GrantKind,
    /// Unix milliseconds; absent: permanent.
    #[serde(default)]
    pub expires_ms: Option<u64>,
    /// Who approved it.
    pub approver: String,
    /// Whether a `once` grant was spent.
    #[serde(default)]
    pub used: bool,
}

impl StoredGrant {
    /// The grant as `GET /v1/grants` shows it (`expires` an RFC 3339 time, absent when
    /// permanent).
    pub fn view(&self) -> serde_json::Value {
        let expires = self.expires_ms.map(|ms| {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            crate::audit::record::rfc3339(t)
        });
        serde_json::json!({
            "id": self.id,
            "sandbox": self.sandbox,
            "host": self.host,
            "port": self.port,
            "methods": self.methods,
            "paths": self.paths,
            "kind": self.kind.as_str(),
            "expires": expires,
            "approver": self.approver,
            "used": self.used,
        })
    }

    /// The stored form of `g`, a grant of `sandbox`.
    pub fn of(sandbox: &str, g: &GrantEntry) -> Self {
        StoredGrant {
            id: g.id.to_string(),
            sandbox: sandbox.to_string(),
            host: crate::policy::granted::host_text(&g.host)
                .trim_matches(['[', ']'])
                .to_string(),
            port: g.port,
            methods: g.methods.clone(),
            paths: g.paths.clone(),
            kind: g.kind,
            expires_ms: g.expires.map(millis),
            approver: g.approver.to_string(),
            used: g.used(),
        }
    }

    /// The entry the data plane reads (its spending recorded in `journal`); `None` for a
    /// value that does not parse.
    pub fn entry(&self, journal: Option<Arc<dyn SpendJournal>>) -> Option<Arc<GrantEntry>> {
        let host = Host::parse(&self.host).ok()?;
        let g = GrantEntry::new(
            &self.sandbox,
            &self.id,
            host,
            self.port,
            self.methods.clone(),
            self.paths.clone(),
            self.kind,
            self.expires_ms
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            &self.approver,
        )
        .journaled(journal);
        if self.used {
            g.mark_used();
        }
        Some(Arc::new(g))
    }
}

/// Milliseconds since the Unix epoch.
pub fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `state_dir/grants.json`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join("grants.json")
}

/// Write every grant (a temporary file renamed over the old one: never half a file).
pub fn save(path: &Path, grants: &[StoredGrant]) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(grants).map_err(std::io::Error::other)?;
    crate::config::files::replace(path, &text)
}

/// Read the grants kept (none when there is no file).
pub fn load(path: &Path) -> Result<Vec<StoredGrant>, ApprovalError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| store(caused(path.display().to_string(), e)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(store(caused(path.display().to_string(), e))),
    }
}

/// `state_dir/grants.spent`: the journal of spent `once` grants.
#[derive(Debug)]
pub struct SpentFile {
    path: PathBuf,
}

impl SpentFile {
    /// The journal in `state_dir`.
    pub fn in_dir(state_dir: &Path) -> Self {
        SpentFile {
            path: state_dir.join("grants.spent"),
        }
    }

    /// The ids recorded (none when there is no file; a line cut by a crash is skipped).
    pub fn read(&self) -> std::io::Result<std::collections::HashSet<String>> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(text
                .split_terminator('\n')
                .filter(|l| crate::approvals::request::valid_id(l))
                .map(str::to_string)
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
            Err(e) => Err(e),
        }
    }

    /// Where it is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Start afresh, once `grants.json` holds what the journal said.
    pub fn clear(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl SpendJournal for SpentFile {
    /// One line, appended (`O_APPEND`: writers never interleave) and synced.
    fn spent(&self, id: &str) -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(format!("{id}\n").as_bytes())?;
        f.sync_data()
    }
}
