//! Live policy (DESIGN §10, §11): reloads (file change, SIGHUP, `POST /v1/reload`), runtime
//! registrations (`PUT`/`DELETE /v1/sandboxes/{id}`) and their persistence in `state_dir`.
//!
//! Every change builds the new policy set first, compiling only what changed: a registration
//! compiles its one sandbox, a reload every sandbox whose binding text or referenced files
//! changed (all of them when `defaults` change), and shares the rest with the set in force.
//! If anything is invalid the running policy stays, the errors are logged and
//! `egress_config_reloads_total{result="error"}` counts them. A valid set is published
//! ([`crate::sandboxes::set::LivePolicy`]): new connections see it at once (a connection being
//! decided sees the old or the new set, never a mix), and the live exchanges of the changed
//! sandboxes (of every sandbox when defaults or `sources` changed) re-decide themselves and
//! are reset if no longer allowed (`close: "revoked"`). Changes are serialised by one lock,
//! taken on a blocking thread (the admin API and the file watcher call in from
//! `spawn_blocking`), never on a data-plane worker.
//!
//! Nothing is parsed or compiled under that lock: a registration (API or etcd) is parsed and
//! compiled against the configuration in force first, and the lock is held only to check
//! what depends on the other registrations (room, `sources`) and to apply it — done again
//! if a reload changed the configuration meanwhile. Readers never take it: every change
//! publishes a [`View`] (the configuration and the registrations, persistent maps cloned in
//! O(1)) that `GET /v1/sandboxes` and the etcd write checks read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use serde_json::{json, Value};

use crate::config::{Binding, Config};
use crate::control::state_store::StateStore;
use crate::egress::handles::Handles;
use crate::policy::cause::caused;
use crate::policy::sandbox_id::SandboxId;
use crate::runtime::Shared;
use crate::sandboxes::set::{Changes, CompileError, PolicySet, Scope};
pub use change_error::ChangeError;
pub use error::ControlError;
use registry::{Origin, Ready};
use reload::fingerprint;
pub use reload::{ReloadError, Reloaded};

pub(crate) mod admin;
pub mod admin_client;
mod admin_flows;
mod admin_keys;
mod admin_layers;
mod admin_paths;
mod admin_requests;
mod admin_usage;
mod change_error;
pub mod check;
pub mod console;
mod error;
pub(crate) mod etcd;
mod layers;
pub mod observe;
pub mod observe_client;
pub mod policy_diff;
mod policy_diff_layer;
pub(crate) mod registry;
mod reload;
pub mod replay;
pub mod shown;
mod simulate;
pub(crate) mod state_store;

pub use etcd::apply::RemoteChange;

/// A sandbox registered through the API: the binding and its body (canonical JSON).
#[derive(Clone)]
pub(crate) struct Registered {
    /// Shared with the compiled sandbox.
    binding: Arc<Binding>,
    json: Arc<str>,
    /// The etcd revision it was written at (0: registered locally).
    revision: i64,
}

/// The registrations in force, by id: a persistent map, so that the [`View`] shares it.
pub(crate) type Registrations = imbl::OrdMap<String, Registered>;

/// Values under the etcd prefix that are not in force, by id: their revision and why.
type Skipped = imbl::OrdMap<String, (i64, String)>;

/// What readers need of the controller's state, published after every change.
struct View {
    config: Arc<Config>,
    runtime: Registrations,
    skipped: Skipped,
}

/// The controller's state, locked. Whoever changes it (`DerefMut`) publishes a new [`View`]
/// when the guard drops: no change can leave readers on an old one.
struct Locked<'a> {
    state: MutexGuard<'a, State>,
    view: &'a ArcSwap<View>,
    changed: bool,
}

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.changed = true;
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if self.changed {
            self.view.store(Arc::new(View {
                config: self.state.config.clone(),
                runtime: self.state.runtime.clone(),
                skipped: self.state.skipped.clone(),
            }));
        }
    }
}

/// How often a change parsed before the lock is parsed again because a reload changed the
/// configuration meanwhile, before it gives up (503: nothing was applied).
const RETRIES: usize = 3;

/// What the controller guards.
struct State {
    config: Arc<Config>,
    runtime: Registrations,
    /// Restored registrations that are not in force (invalid under this configuration, or
    /// clashing with a file-defined id): kept in the log, reported, retried at the next start.
    unparsed: BTreeMap<String, String>,
    /// The `state_dir` log, opened by [`Controller::restore`]; or why it could not be.
    store: Result<Option<StateStore>, ControlError>,
    /// (path, modified, length) of every file the configuration was read from.
    fingerprint: Vec<(PathBuf, Option<(SystemTime, u64)>)>,
    /// Values under the etcd prefix that are not in force, by id: their revision and why.
    skipped: Skipped,
}

/// Why a policy set could not be built from a configuration and the registrations.
#[derive(Debug, thiserror::Error)]
pub enum CompileFailure {
    /// A sandbox defined both in a file and through the API.
    #[error("sandbox {id} is defined both in {origin} and through the API")]
    DefinedTwice {
        /// The sandbox's id.
        id: String,
        /// The file that defines it.
        origin: String,
    },
    /// A sandbox's policy did not compile.
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
    /// The state as of the last change, for readers (see [`Locked`]).
    view: ArcSwap<View>,
    /// Counts successful reloads (the control plane re-reads etcd after one, so that values
    /// a reload made valid are applied).
    reloads: tokio::sync::watch::Sender<u64>,
}

impl Controller {
    /// A controller over `config`, with the live policy it publishes to.
    pub fn new(
        shared: Arc<Shared>,
        path: Option<PathBuf>,
        config: Config,
        listeners: Vec<SocketAddr>,
    ) -> Self {
        let fp = fingerprint(&config.files);
        let config = Arc::new(config);
        Controller {
            shared,
            path,
            listeners,
            view: ArcSwap::from_pointee(View {
                config: config.clone(),
                runtime: Registrations::new(),
                skipped: Skipped::new(),
            }),
            state: Mutex::new(State {
                config,
                runtime: Registrations::new(),
                unparsed: BTreeMap::new(),
                store: Ok(None),
                fingerprint: fp,
                skipped: Skipped::new(),
            }),
            reloads: tokio::sync::watch::channel(0).0,
        }
    }

    /// Take the lock (on a blocking thread: see the module doc).
    fn lock(&self) -> Result<Locked<'_>, ChangeError> {
        let state = self
            .state
            .lock()
            .map_err(|_| ChangeError::Failed("lock poisoned".into()))?;
        Ok(Locked {
            state,
            view: &self.view,
            changed: false,
        })
    }

    /// Compile `config` plus runtime registrations, reusing every sandbox of the set in force
    /// whose binding did not change.
    fn compile(
        &self,
        config: &Config,
        runtime: &Registrations,
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
        for _ in 0..RETRIES {
            // Parsed and compiled with no lock held, against the configuration in force.
            let config = self.view.load().config.clone();
            let ready = registry::prepare(&config, id, body, Origin::Api).map_err(|e| {
                if matches!(e, registry::Rejected::NotCompiled(_)) {
                    self.count(false);
                }
                ChangeError::from(e)
            })?;
            let mut st = self.lock()?;
            if !Arc::ptr_eq(&st.config, &config) {
                // A reload came in between: parse under the new configuration.
                continue;
            }
            return self.apply_put(&mut st, ready);
        }
        Err(ChangeError::Unavailable(
            "the configuration was reloaded while this registration was checked; retry".into(),
        ))
    }

    /// Admit and apply a registration prepared under `st.config`.
    fn apply_put(&self, st: &mut Locked<'_>, ready: Ready) -> Result<bool, ChangeError> {
        let Ready {
            id: sid,
            binding,
            json,
            sandbox,
        } = ready;
        let id = sid.as_str();
        registry::room_for(&st.config, &st.runtime, id, &binding, Origin::Api)?;
        // Only this sandbox changes; the new set shares every other one with the current set
        // (which this lock keeps in step with `st`).
        let mut edit = self.shared.policy.load().edit();
        edit.insert(sandbox);
        let set = edit.finish();
        let new_in_log = !st.runtime.contains_key(id) && !st.unparsed.contains_key(id);
        if let Some(store) = store_of(st)? {
            store
                .put(id, &json, new_in_log)
                .map_err(|e| ChangeError::Failed(caused("cannot persist to state_dir", e)))?;
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
        compact_if_due(st);
        tracing::info!(sandbox = id, created, "sandbox registered");
        Ok(created)
    }

    /// Remove a registered sandbox; its open exchanges are closed (`revoked`). Returns how
    /// many were open.
    pub fn delete(&self, id: &str) -> Result<u32, ChangeError> {
        let sid = SandboxId::new(id).map_err(|_| ChangeError::NotFound)?;
        let mut st = self.lock()?;
        if !st.runtime.contains_key(id) && st.unparsed.contains_key(id) {
            // Restored but never in force: only the log holds it.
            if let Some(store) = store_of(&mut st)? {
                store
                    .delete(id)
                    .map_err(|e| ChangeError::Failed(caused("cannot persist to state_dir", e)))?;
            }
            st.unparsed.remove(id);
            tracing::info!(sandbox = id, "restored registration removed");
            return Ok(0);
        }
        if !st.runtime.contains_key(id) {
            if st.config.bindings.iter().any(|b| b.id == id) {
                return Err(ChangeError::Conflict(
                    format!(
                        "sandbox {id} is defined in {}; remove it there",
                        st.config.origin
                    )
                    .into(),
                ));
            }
            return Err(ChangeError::NotFound);
        }
        let current = self.shared.policy.load();
        let set = current.without(id);
        if let Some(store) = store_of(&mut st)? {
            store
                .delete(id)
                .map_err(|e| ChangeError::Failed(caused("cannot persist to state_dir", e)))?;
        }
        st.runtime.remove(id);
        let open = current
            .get(id)
            .map(|sb| sb.limiter(&self.shared.limiters).active())
            .unwrap_or(0);
        self.count(true);
        self.publish(set, Scope::Sandboxes(std::slice::from_ref(&sid)));
        compact_if_due(&mut st);
        drop(st);
        tracing::info!(sandbox = id, revoked = open, "sandbox removed");
        self.sandbox_removed(&sid);
        Ok(open)
    }

    /// A sandbox left the registrations: its grants and requests end with it (the desk
    /// publishes through this controller's lock, so this runs with the lock released).
    pub fn sandbox_removed(&self, sid: &SandboxId) {
        if let Some(desk) = self.shared.desk.get() {
            desk.sandbox_removed(sid);
        }
    }

    /// Put sandbox `id`'s grants in force (the approvals desk's publisher): only its
    /// exchanges re-check themselves, and those a removed grant allowed are cut.
    pub fn publish_grants(&self, id: &SandboxId, granted: crate::policy::granted::Granted) {
        let Ok(_st) = self.lock() else {
            tracing::error!(sandbox = %id, "cannot publish grants: the controller's lock is poisoned");
            return;
        };
        // Kept even for a sandbox not (yet) in the set: a registration that brings it in
        // finds them (a reload keeps only the grants of sandboxes it has).
        let mut edit = self.shared.policy.load().edit();
        edit.grants(id, granted);
        let set = edit.finish();
        self.publish(set, Scope::Sandboxes(std::slice::from_ref(id)));
    }

    /// `GET /v1/sandboxes` (no lock: the published view).
    pub fn list(&self) -> Value {
        let set = self.shared.policy.load();
        let view = self.view.load();
        let items: Vec<Value> = set
            .ids()
            .into_iter()
            .filter_map(|id| set.get(id))
            .map(|sb| {
                let b = &sb.binding;
                json!({
                    "id": b.id,
                    "origin": origin(&view.runtime, b.id.as_str()),
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

    /// `GET /v1/sandboxes/{id}` (no lock: the published view).
    pub fn get(&self, id: &str) -> Option<Value> {
        let set = self.shared.policy.load();
        let sb = set.get(id)?;
        let b = &sb.binding;
        let view = self.view.load();
        let revision = view.runtime.get(id).map(|r| r.revision).filter(|r| *r > 0);
        let origin = origin(&view.runtime, id);
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
                "scoped": b.network.scoped.iter().map(|s| json!({
                    "binaries": s.scope.binaries(),
                    "execs": s.scope.execs(),
                    "children": s.scope.children(),
                    "egress": s.egress.iter().map(|(t, _)| t).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            },
            "policy": serde_json::from_str::<Value>(&b.block_json).unwrap_or(Value::Null),
            "layers": b.network.layers.iter().map(|l| &*l.id).collect::<Vec<_>>(),
            "policy_file": &*b.policy_file,
            "policy_ref": b.policy_ref,
            "policy_version": set.version(),
        }))
    }
}

/// Where sandbox `id` comes from: the configuration file, the API (this process) or etcd.
fn origin(runtime: &Registrations, id: &str) -> &'static str {
    match runtime.get(id) {
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
        Err(why) => Err(ChangeError::Failed(
            format!("state_dir is not available ({why}); changes cannot be kept").into(),
        )),
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
        .map(|(id, r)| (id.as_str(), &*r.json))
        .chain(unparsed.iter().map(|(id, t)| (id.as_str(), t.as_str())));
    if let Err(e) = store.compact(live) {
        tracing::error!(error = %e, "cannot compact the state_dir log");
    }
}

#[cfg(test)]
mod tests;
