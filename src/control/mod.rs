//! Live policy (DESIGN §10, §11): reloads (file change, SIGHUP, `POST /v1/reload`), runtime
//! registrations (`PUT`/`DELETE /v1/sandboxes/{id}`) and their persistence in `state_dir`.
//!
//! Every change builds the new policy set first, compiling only what changed: a registration
//! compiles its one sandbox, a reload every sandbox whose binding text or referenced files
//! changed (all of them when `defaults` change), and shares the rest with the set in force.
//! If anything is invalid the running policy stays, the errors are logged and
//! `egress_config_reloads_total{result="error"}` counts them. A valid set is published
//! ([`crate::policy::set::LivePolicy`]): new connections see it at once (a connection being
//! decided sees the old or the new set, never a mix), and the live exchanges of the changed
//! sandboxes (of every sandbox when defaults or `sources` changed) re-decide themselves and
//! are reset if no longer allowed (`close: "revoked"`). Changes are serialised by one lock,
//! taken on a blocking thread (the admin API and the file watcher call in from
//! `spawn_blocking`), never on a data-plane worker.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{json, Value};

use crate::config::{Binding, Config, ConfigErrors};
use crate::control::state_store::StateStore;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::set::{Changes, CompileError, PolicySet, Scope};
use crate::server::shared::Shared;
use registry::{Origin, Valid};
use reload::fingerprint;
pub use reload::{ReloadError, Reloaded};

pub(crate) mod admin;
pub mod check;
pub(crate) mod etcd;
pub(crate) mod registry;
mod reload;
pub(crate) mod state_store;

pub use etcd::apply::RemoteChange;

/// A sandbox registered through the API: the binding and its body (canonical JSON).
#[derive(Clone)]
pub(crate) struct Registered {
    /// Shared with the compiled sandbox.
    binding: Arc<Binding>,
    json: String,
    /// The etcd revision it was written at (0: registered locally).
    revision: i64,
}

/// What the controller guards.
struct State {
    config: Config,
    runtime: BTreeMap<String, Registered>,
    /// Restored registrations that are not in force (invalid under this configuration, or
    /// clashing with a file-defined id): kept in the log, reported, retried at the next start.
    unparsed: BTreeMap<String, String>,
    /// The `state_dir` log, opened by [`Controller::restore`]; or why it could not be.
    store: Result<Option<StateStore>, String>,
    /// (path, modified, length) of every file the configuration was read from.
    fingerprint: Vec<(PathBuf, Option<(SystemTime, u64)>)>,
    /// Values under the etcd prefix that are not in force, by id: their revision and why.
    skipped: BTreeMap<String, (i64, String)>,
}

/// Why a registration call failed; [`ChangeError::status`] is its HTTP status in the admin API.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// 400: the body is invalid (every error listed).
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// 400: something else about the request is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// 409: the id belongs to a file-defined sandbox, or its `sources` overlap another's.
    #[error("{0}")]
    Conflict(String),
    /// 429: `runtime.max_sandboxes` are registered already.
    #[error("{0}")]
    Full(String),
    /// 404
    #[error("no such registered sandbox")]
    NotFound,
    /// 500: the new set did not compile, or could not be persisted.
    #[error("{0}")]
    Failed(String),
    /// 503: the control plane (etcd) cannot take the change now — nothing was sent.
    #[error("{0}")]
    Unavailable(String),
    /// 504: the write was sent to etcd and its fate is not known here (`committed: false`:
    /// etcd did not answer, it may or may not have applied it), or it was committed at
    /// `revision` but this replica has not applied it in time. Never a 503: a runtime that
    /// gives up after a 503 would believe a committed sandbox absent.
    #[error("{detail}")]
    Outcome {
        detail: String,
        committed: bool,
        /// The revision written (committed), or the last one this replica had applied when
        /// it sent the write (unknown): read the key at or after it to learn the outcome.
        revision: i64,
    },
}

impl ChangeError {
    /// The admin API's status for it.
    pub fn status(&self) -> u16 {
        match self {
            ChangeError::Invalid(_) | ChangeError::BadRequest(_) => 400,
            ChangeError::Conflict(_) => 409,
            ChangeError::Full(_) => 429,
            ChangeError::NotFound => 404,
            ChangeError::Failed(_) => 500,
            ChangeError::Unavailable(_) => 503,
            ChangeError::Outcome { .. } => 504,
        }
    }
}

impl From<registry::Rejected> for ChangeError {
    fn from(r: registry::Rejected) -> Self {
        use registry::Rejected;
        match r {
            Rejected::InvalidId(_) => ChangeError::BadRequest(r.to_string()),
            Rejected::Invalid(errs) => ChangeError::Invalid(errs),
            Rejected::FileDefined { .. } | Rejected::Overlap(_) => {
                ChangeError::Conflict(r.to_string())
            }
            Rejected::Full { .. } => ChangeError::Full(r.to_string()),
            Rejected::Compile(_) => ChangeError::Failed(r.to_string()),
        }
    }
}

/// Why a policy set could not be built from a configuration and the registrations.
#[derive(Debug, thiserror::Error)]
pub enum CompileFailure {
    #[error("sandbox {id} is defined both in {origin} and through the API")]
    DefinedTwice { id: String, origin: String },
    #[error(transparent)]
    Compile(#[from] CompileError),
}

/// The live-policy controller.
pub struct Controller {
    shared: Arc<Shared>,
    /// The config file (`None`: the embedded default).
    path: Option<PathBuf>,
    /// Bound listener addresses (loop protection in every compiled set).
    listeners: Vec<SocketAddr>,
    state: Mutex<State>,
    /// Counts successful reloads (the control plane re-reads etcd after one, so that values
    /// a reload made valid are applied).
    reloads: tokio::sync::watch::Sender<u64>,
}

impl Controller {
    pub fn new(
        shared: Arc<Shared>,
        path: Option<PathBuf>,
        config: Config,
        listeners: Vec<SocketAddr>,
    ) -> Self {
        let fp = fingerprint(&config.files);
        Controller {
            shared,
            path,
            listeners,
            state: Mutex::new(State {
                config,
                runtime: BTreeMap::new(),
                unparsed: BTreeMap::new(),
                store: Ok(None),
                fingerprint: fp,
                skipped: BTreeMap::new(),
            }),
            reloads: tokio::sync::watch::channel(0).0,
        }
    }

    /// Compile `config` plus runtime registrations, reusing every sandbox of the set in force
    /// whose binding did not change.
    fn compile(
        &self,
        config: &Config,
        runtime: &BTreeMap<String, Registered>,
    ) -> Result<(PolicySet, Changes), CompileFailure> {
        for id in runtime.keys() {
            if config.bindings.iter().any(|b| &b.id == id) {
                return Err(CompileFailure::DefinedTwice {
                    id: id.clone(),
                    origin: config.origin.to_string(),
                });
            }
        }
        let extra: Vec<Arc<Binding>> = runtime.values().map(|r| r.binding.clone()).collect();
        self.shared
            .policy
            .load()
            .recompile(config, &extra, self.listeners.clone())
            .map_err(CompileFailure::from)
    }

    fn count(&self, ok: bool) {
        self.shared.metrics().reload(ok);
    }

    /// Make `set` the policy in force; the live exchanges `scope` names re-check themselves
    /// against it.
    fn publish(&self, set: PolicySet, scope: Scope<'_>) -> String {
        self.shared.metrics().set_policy_version(set.version());
        self.shared.policy.publish(set, scope).version().to_string()
    }

    /// Register or replace a sandbox. Returns true when it is new.
    pub fn put(&self, id: &str, body: &str) -> Result<bool, ChangeError> {
        let Ok(mut st) = self.state.lock() else {
            return Err(ChangeError::Failed("lock poisoned".into()));
        };
        let Valid {
            id: sid,
            binding,
            json,
        } = registry::validate(&st.config, &st.runtime, id, body, Origin::Api)?;
        let id = sid.as_str();
        let binding = Arc::new(binding);
        // Only this sandbox is compiled; the new set shares every other one with the current
        // set (which this lock keeps in step with `st`).
        let set = self
            .shared
            .policy
            .load()
            .with_binding(&binding)
            .map_err(|e| {
                self.count(false);
                ChangeError::Failed(e.to_string())
            })?;
        let new_in_log = !st.runtime.contains_key(id) && !st.unparsed.contains_key(id);
        if let Some(store) = store_of(&mut st)? {
            store
                .put(id, &json, new_in_log)
                .map_err(|e| ChangeError::Failed(format!("cannot persist to state_dir: {e}")))?;
        }
        st.unparsed.remove(id);
        // New `sources` could take addresses from clients identified as the default sandbox:
        // then every exchange re-checks. Otherwise only this sandbox's exchanges can change.
        let scope = if binding.sources.is_empty() {
            Scope::Sandboxes(std::slice::from_ref(&sid))
        } else {
            Scope::All
        };
        let created = st
            .runtime
            .insert(
                id.to_string(),
                Registered {
                    binding,
                    json,
                    revision: 0,
                },
            )
            .is_none();
        self.count(true);
        self.publish(set, scope);
        compact_if_due(&mut st);
        tracing::info!(sandbox = id, created, "sandbox registered");
        Ok(created)
    }

    /// Remove a registered sandbox; its open exchanges are closed (`revoked`). Returns how
    /// many were open.
    pub fn delete(&self, id: &str) -> Result<u32, ChangeError> {
        let sid = SandboxId::new(id).map_err(|_| ChangeError::NotFound)?;
        let Ok(mut st) = self.state.lock() else {
            return Err(ChangeError::Failed("lock poisoned".into()));
        };
        if !st.runtime.contains_key(id) && st.unparsed.contains_key(id) {
            // Restored but never in force: only the log holds it.
            if let Some(store) = store_of(&mut st)? {
                store.delete(id).map_err(|e| {
                    ChangeError::Failed(format!("cannot persist to state_dir: {e}"))
                })?;
            }
            st.unparsed.remove(id);
            tracing::info!(sandbox = id, "restored registration removed");
            return Ok(0);
        }
        if !st.runtime.contains_key(id) {
            if st.config.bindings.iter().any(|b| b.id == id) {
                return Err(ChangeError::Conflict(format!(
                    "sandbox {id} is defined in {}; remove it there",
                    st.config.origin
                )));
            }
            return Err(ChangeError::NotFound);
        }
        let current = self.shared.policy.load();
        let set = current.without(id);
        if let Some(store) = store_of(&mut st)? {
            store
                .delete(id)
                .map_err(|e| ChangeError::Failed(format!("cannot persist to state_dir: {e}")))?;
        }
        st.runtime.remove(id);
        let open = current
            .get(id)
            .map(|sb| sb.limiter(&self.shared.limiters).active())
            .unwrap_or(0);
        self.count(true);
        self.publish(set, Scope::Sandboxes(std::slice::from_ref(&sid)));
        compact_if_due(&mut st);
        tracing::info!(sandbox = id, revoked = open, "sandbox removed");
        Ok(open)
    }

    /// `GET /v1/sandboxes`
    pub fn list(&self) -> Value {
        let set = self.shared.policy.load();
        let Ok(st) = self.state.lock() else {
            return json!([]);
        };
        let items: Vec<Value> = set
            .ids()
            .into_iter()
            .filter_map(|id| set.get(id))
            .map(|sb| {
                let b = &sb.binding;
                json!({
                    "id": b.id,
                    "origin": origin(&st, b.id.as_str()),
                    "mode": b.network.mode.as_str(),
                    "enforcement": b.enforcement.as_str(),
                    "egress": b.network.egress.len(),
                    "deny": b.network.deny.len(),
                    "policy_file": &*b.policy_file,
                })
            })
            .collect();
        json!({ "policy_version": set.version(), "sandboxes": items })
    }

    /// Make every `state_dir` write durable now (at shutdown, in the batched mode).
    pub fn flush_state(&self) {
        if let Ok(st) = self.state.lock() {
            if let Ok(Some(store)) = &st.store {
                store.flush();
            }
        }
    }

    /// `GET /v1/sandboxes/{id}`
    pub fn get(&self, id: &str) -> Option<Value> {
        let set = self.shared.policy.load();
        let sb = set.get(id)?;
        let b = &sb.binding;
        let (origin, revision) = self
            .state
            .lock()
            .ok()
            .map(|st| {
                let rev = st.runtime.get(id).map(|r| r.revision).filter(|r| *r > 0);
                (origin(&st, id), rev)
            })
            .unwrap_or(("file", None));
        Some(json!({
            "id": b.id,
            "origin": origin,
            "revision": revision,
            "auth": { "token": b.token_sha256.is_some() },
            "sources": b.sources.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "enforcement": b.enforcement.as_str(),
            "limits": b.limits,
            "strict_sni_dst": b.strict_sni_dst,
            "require_tls_ports": &*b.require_tls_ports,
            "refuse_ech": b.refuse_ech,
            "network": {
                "mode": b.network.mode.as_str(),
                "egress": b.network.egress.iter().map(|(t, _)| t).collect::<Vec<_>>(),
                "deny": b.network.deny.iter().map(|(t, _)| t).collect::<Vec<_>>(),
            },
            "policy": serde_json::from_str::<Value>(&b.block_json).unwrap_or(Value::Null),
            "policy_file": &*b.policy_file,
            "policy_ref": b.policy_ref,
            "policy_version": set.version(),
        }))
    }
}

/// Where sandbox `id` comes from: the configuration file, the API (this process) or etcd.
fn origin(st: &State, id: &str) -> &'static str {
    match st.runtime.get(id) {
        None => "file",
        Some(r) if r.revision > 0 => "etcd",
        Some(_) => "api",
    }
}

/// The `state_dir` log to record a change in: `None` without a `state_dir`; an error when
/// one is configured but could not be opened (the change is refused rather than not kept).
fn store_of(st: &mut State) -> Result<Option<&mut StateStore>, ChangeError> {
    match &mut st.store {
        Ok(store) => Ok(store.as_mut()),
        Err(why) => Err(ChangeError::Failed(format!(
            "state_dir is not available ({why}); changes cannot be kept"
        ))),
    }
}

/// Rewrite the log when superseded lines dominate (amortised O(1) per change). A failure is
/// logged: every change is already in the log, only its size is at stake.
fn compact_if_due(st: &mut State) {
    let State {
        store,
        runtime,
        unparsed,
        ..
    } = st;
    let Ok(Some(store)) = store else {
        return;
    };
    if !store.due() {
        return;
    }
    let live = runtime
        .iter()
        .map(|(id, r)| (id.as_str(), r.json.as_str()))
        .chain(unparsed.iter().map(|(id, t)| (id.as_str(), t.as_str())));
    if let Err(e) = store.compact(live) {
        tracing::error!(error = %e, "cannot compact the state_dir log");
    }
}
