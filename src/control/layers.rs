//! Policy layers at run time (DESIGN §4.5, §10): `PUT`/`DELETE /v1/layers/{id}` and the
//! values under `{prefix}layers/` in etcd. A change builds every layer again over the file's
//! ([`Config::with_runtime_layers`]), re-parses every registration under the new chains and
//! publishes the set like a reload — so the open tunnels and requests of every member are
//! re-decided at once, and a tightened ceiling cuts what it no longer admits. A change is
//! refused whole, with every reason, when a layer would be unsound or a member would name a
//! layer that no longer exists (delete the members, or move them, first). Without etcd the
//! runtime layers are kept in `state_dir/layers.json` and restored before the registrations.

use crate::policy::cause::{self as cause, caused, of, worded};
use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::config::layers::{RawLayer, RUNTIME};
use crate::config::Config;
use crate::control::error::{store, ControlError};
use crate::control::{ChangeError, Controller};

/// The file runtime layers are kept in, under `state_dir`.
pub const LAYERS_FILE: &str = "layers.json";

/// A layer's body (`PUT /v1/layers/{id}`): JSON of [`RawLayer`], its `id` the path's.
pub fn parse_layer(id: &str, body: &str) -> Result<RawLayer, ChangeError> {
    let mut v: Value = serde_json::from_str(body)
        .map_err(|e| ChangeError::BadRequest(caused("not valid JSON", e)))?;
    match v.get("id") {
        None => v["id"] = json!(id),
        Some(Value::String(s)) if s == id => {}
        Some(_) => {
            let why = format!("`id` in the body must be `{id}`, as in the path");
            return Err(ChangeError::BadRequest(why.into()));
        }
    }
    serde_json::from_value(v).map_err(|e| ChangeError::BadRequest(caused(format!("layer {id}"), e)))
}

/// The runtime layers kept in `dir` (none when the file is absent).
pub fn read_kept(dir: &Path) -> Result<BTreeMap<String, RawLayer>, ControlError> {
    let path = dir.join(LAYERS_FILE);
    let failed =
        |e: Box<dyn std::error::Error + Send + Sync>| store(caused(path.display().to_string(), e));
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| failed(e.into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(failed(e.into())),
    }
}

/// Keep the runtime layers in `dir` (a whole new file, renamed over the old one).
fn keep(dir: &Path, layers: &BTreeMap<String, RawLayer>) -> Result<(), ControlError> {
    let path = dir.join(LAYERS_FILE);
    let text = serde_json::to_vec_pretty(layers).map_err(|e| store(cause::of(e)))?;
    crate::config::files::replace(&path, &text)
        .map_err(|e| store(caused(path.display().to_string(), e)))
}

/// One layer as the admin API shows it.
fn view(config: &Config, id: &str, members: &[String]) -> Option<Value> {
    let chain = config.layers.get(id)?;
    let layer = chain.last()?;
    let texts = |l: &[(String, crate::policy::entry::Entry)]| {
        l.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>()
    };
    Some(json!({
        "id": id,
        "origin": if &*layer.file == RUNTIME { "api" } else { "file" },
        "parent": chain.len().checked_sub(2).and_then(|i| chain.get(i)).map(|p| &*p.id),
        "chain": chain.iter().map(|l| &*l.id).collect::<Vec<_>>(),
        "ceiling": layer.ceiling.as_deref().map(texts),
        "deny": texts(&layer.deny),
        "approvers": layer.approvers.iter().map(|a| &**a).collect::<Vec<_>>(),
        "http": layer.http.iter().map(|r| &r.text).collect::<Vec<_>>(),
        "limits": &layer.limits,
        "members": members,
    }))
}

impl Controller {
    /// The configuration in force.
    pub fn config(&self) -> std::sync::Arc<Config> {
        self.view.load().config.clone()
    }

    /// `GET /v1/layers`: every layer (file and runtime) with its members.
    pub fn layers(&self) -> Value {
        let config = self.view.load().config.clone();
        let members = self.members();
        let list: Vec<Value> = (config.layers.keys())
            .filter_map(|id| view(&config, id, members.get(id).map_or(&[], |m| m)))
            .collect();
        json!({ "layers": list })
    }

    /// `GET /v1/layers/{id}`.
    pub fn layer(&self, id: &str) -> Option<Value> {
        let config = self.view.load().config.clone();
        let members = self.members();
        view(&config, id, members.get(id).map_or(&[], |m| m))
    }

    /// Sandboxes by the layer they are members of (directly).
    fn members(&self) -> BTreeMap<String, Vec<String>> {
        let set = self.shared.policy.load();
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for id in set.ids() {
            let last = set
                .get(id)
                .and_then(|sb| sb.policy.layers().last().cloned());
            if let Some(l) = last {
                out.entry(l.id.to_string())
                    .or_default()
                    .push(id.to_string());
            }
        }
        out
    }

    /// A runtime layer's change checked against the configuration in force, without
    /// applying it (what a write to etcd is validated by before it is sent).
    pub fn check_layer(&self, id: &str, layer: Option<&RawLayer>) -> Result<(), ChangeError> {
        let config = self.view.load().config.clone();
        let mut runtime = config.layers.runtime.clone();
        changed(&mut runtime, id, layer.cloned())?;
        let config = (config.with_runtime_layers(runtime))
            .map_err(|e| ChangeError::BadRequest(e.join("; ").into()))?;
        let registered = self.view.load().runtime.clone();
        for (rid, r) in registered.iter() {
            let what = format!("registered sandbox {rid}");
            if let Err(e) = config.parse_runtime_binding(&r.json, &what, rid) {
                return Err(ChangeError::Conflict(of(e)));
            }
        }
        Ok(())
    }

    /// Set (or, with `None`, delete) runtime layer `id` here. Returns whether it is new.
    pub fn set_layer(&self, id: &str, layer: Option<RawLayer>) -> Result<bool, ChangeError> {
        // One lock for the read and the write: two changes at once never lose one another.
        let st = self.lock()?;
        let mut runtime = st.config.layers.runtime.clone();
        let created = changed(&mut runtime, id, layer)?;
        self.layers_locked(st, runtime)?;
        Ok(created)
    }

    /// Make `runtime` the runtime layers (all of them: etcd's list), re-deciding every member.
    /// Refused whole when anything does not stand.
    pub fn apply_layers(&self, runtime: BTreeMap<String, RawLayer>) -> Result<(), ChangeError> {
        let st = self.lock()?;
        self.layers_locked(st, runtime)
    }

    fn layers_locked(
        &self,
        mut st: super::Locked<'_>,
        runtime: BTreeMap<String, RawLayer>,
    ) -> Result<(), ChangeError> {
        if st.config.layers.runtime == runtime {
            return Ok(());
        }
        let config = (st.config.with_runtime_layers(runtime))
            .map_err(|e| ChangeError::BadRequest(e.join("; ").into()))?;
        let (old, registered) = (st.config.clone(), st.runtime.clone());
        let built = self.build_with(config, &old, &registered);
        let done = self.apply_reload(&mut st, "layers", built);
        let kept = match (&done, st.config.etcd.is_none(), st.config.state_dir.clone()) {
            (Ok(_), true, Some(dir)) => keep(&dir, &st.config.layers.runtime),
            _ => Ok(()),
        };
        drop(st);
        let done = self
            .removed(done)
            .map_err(|e| ChangeError::Conflict(worded(e.messages().join("; "), e)));
        done.and(kept.map_err(|e| ChangeError::Failed(of(e))))
            .map(|_| ())
    }

    /// At start, before the registrations: the runtime layers kept in `state_dir`.
    pub(super) fn restore_layers(&self, config: &Config) -> Result<Option<Config>, ControlError> {
        let Some(dir) = config
            .state_dir
            .as_deref()
            .filter(|_| config.etcd.is_none())
        else {
            return Ok(None);
        };
        let kept = read_kept(dir)?;
        if kept.is_empty() {
            return Ok(None);
        }
        config
            .with_runtime_layers(kept)
            .map(Some)
            .map_err(|e| store(e.join("; ")))
    }
}

/// Apply one change to `runtime`: whether the layer is new; a delete of an absent one is 404.
fn changed(
    runtime: &mut BTreeMap<String, RawLayer>,
    id: &str,
    layer: Option<RawLayer>,
) -> Result<bool, ChangeError> {
    match layer {
        Some(l) => Ok(runtime.insert(id.to_string(), l).is_none()),
        None if runtime.remove(id).is_some() => Ok(false),
        None => Err(ChangeError::NotFound),
    }
}
