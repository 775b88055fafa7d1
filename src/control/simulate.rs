//! `POST /v1/sandboxes/{id}/simulate` and `POST /v1/layers/{id}/simulate`, and the check
//! behind `?require_simulation` (DESIGN §7.6): a candidate registration or layer is built
//! exactly as its `PUT` would build it — nothing is applied — and the proxy's own audit trail
//! (the file and its rotated predecessors, oldest first) is replayed under it
//! ([`super::replay`]), with the static diff of what it changes
//! ([`super::policy_diff`]). A change *widens* when the replay finds an exchange it newly
//! allows, or the diff finds an entry added or widened, a deny removed, a ceiling lifted.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::config::layers::RawLayer;
use crate::config::Config;
use crate::control::registry::{self, Origin};
use crate::control::replay::Replay;
use crate::control::{policy_diff, ChangeError, Controller};
use crate::policy::cause::{caused, of, worded};
use crate::sandboxes::set::PolicySet;

/// The trail's files, oldest first (rotated `path.keep` … `path.1`, then `path`).
pub(super) fn trail_files(config: &Config) -> Result<Vec<PathBuf>, ChangeError> {
    let Some(path) = &config.audit_path else {
        return Err(ChangeError::Conflict(
            "the audit trail goes to stdout here: simulate with `egress-proxy simulate` over the collected trail".into(),
        ));
    };
    let keep = config.audit_trail.rotate.as_ref().map_or(0, |r| r.keep);
    let mut files: Vec<PathBuf> = (1..=keep)
        .rev()
        .map(|n| crate::audit::rotated_name(path, n))
        .collect();
    files.push(path.clone());
    Ok(files.into_iter().filter(|f| f.exists()).collect())
}

/// Replay the trail under `set` (`sandbox`'s records only, when named).
fn replay(config: &Config, set: &PolicySet, sandbox: Option<&str>) -> Result<Value, ChangeError> {
    let mut r = Replay::new(set, sandbox);
    for f in trail_files(config)? {
        let file = std::fs::File::open(&f)
            .map_err(|e| ChangeError::Failed(caused(f.display().to_string(), e)))?;
        for line in std::io::BufReader::with_capacity(1 << 20, file).split(b'\n') {
            let line = line.map_err(|e| ChangeError::Failed(caused(f.display().to_string(), e)))?;
            r.line(&String::from_utf8_lossy(&line));
        }
    }
    serde_json::to_value(&r.out).map_err(|e| ChangeError::Failed(of(e)))
}

/// A report: the replay, the diff, and whether the change widens reach.
fn report(simulation: Value, diff: Option<policy_diff::Changed>) -> Value {
    let newly = simulation["newly_allowed"]
        .as_object()
        .is_some_and(|m| !m.is_empty());
    let widens = newly || diff.as_ref().is_some_and(|d| d.widens);
    json!({ "widens": widens, "simulation": simulation, "diff": diff })
}

impl Controller {
    /// What registration `body` for sandbox `id` would do, over the trail.
    pub fn simulate_sandbox(&self, id: &str, body: &str) -> Result<Value, ChangeError> {
        let config = self.view.load().config.clone();
        let ready = registry::prepare(&config, id, body, Origin::Api)?;
        let current = self.shared.policy.load();
        let old = current.get(id).map(|sb| sb.binding.clone());
        let set = (current.with_binding(&ready.binding)).map_err(|e| ChangeError::Failed(of(e)))?;
        let ports = &config.defaults.ports;
        let diff = policy_diff::sandbox_diff(old.as_deref(), Some(&ready.binding), ports);
        Ok(report(replay(&config, &set, Some(id))?, diff))
    }

    /// What runtime layer `layer` (replacing any layer `id`) would do, over the trail.
    pub fn simulate_layer(&self, id: &str, layer: RawLayer) -> Result<Value, ChangeError> {
        let (config, registered) = {
            let view = self.view.load();
            (view.config.clone(), view.runtime.clone())
        };
        let mut runtime = config.layers.runtime.clone();
        runtime.insert(id.to_string(), layer);
        let candidate = (config.with_runtime_layers(runtime))
            .map_err(|e| ChangeError::BadRequest(e.join("; ").into()))?;
        let built = (self.build_with(candidate, &config, &registered))
            .map_err(|e| ChangeError::Conflict(worded(e.messages().join("; "), e)))?;
        let last = |c: &Config| c.layers.get(id).and_then(|c| c.last()).map(Arc::clone);
        let ports = &config.defaults.ports;
        let diff = policy_diff::layer_diff(
            id,
            last(&config).as_ref(),
            last(&built.config).as_ref(),
            ports,
        );
        Ok(report(replay(&config, &built.set, None)?, diff))
    }
}
