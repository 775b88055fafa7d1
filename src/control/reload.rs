//! How does a new configuration, or the `state_dir` log at start, come into force? A reload
//! builds the whole new set first (re-validating every runtime registration when what they
//! are parsed with changed) and publishes it only if everything compiles; otherwise the
//! running policy stays. Settings read only at start are reported as needing a restart.
//! The files are read and parsed, the registrations re-parsed and the set compiled with no
//! lock held; the lock is taken to publish, and the work is done again if a registration or
//! another reload came in meanwhile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::{self, Config, ConfigErrors};
use crate::control::registry::{self, Origin};
use crate::control::state_store::{StateStore, LOG_FILE};
use crate::control::{CompileFailure, Controller, Locked, Registered, Registrations, RETRIES};
use crate::egress::resolve::Resolver;
use crate::sandboxes::set::{Changes, PolicySet};

/// Why a reload was refused; the running policy stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration files do not load.
    #[error("{0}")]
    Config(ConfigErrors),
    /// Registrations made through the API are invalid under the new configuration.
    #[error("{0}")]
    Registrations(ConfigErrors),
    /// The layers defined at run time do not stand over the new configuration.
    #[error("{}", .0.join("; "))]
    Layers(Vec<String>),
    /// The new configuration did not compile.
    #[error(transparent)]
    Compile(#[from] CompileFailure),
    /// The controller's lock is poisoned (a panic while it was held).
    #[error("the controller's lock is poisoned")]
    Poisoned,
}

impl ReloadError {
    /// Every problem, one message each (for the admin API and the logs).
    pub fn messages(&self) -> Vec<String> {
        match self {
            ReloadError::Config(e) | ReloadError::Registrations(e) => {
                e.0.iter().map(|e| e.to_string()).collect()
            }
            ReloadError::Layers(e) => e.clone(),
            other => vec![other.to_string()],
        }
    }
}

/// A successful reload: the new policy version, and the settings that changed but only take
/// effect at the next start.
#[derive(Debug)]
pub struct Reloaded {
    /// The policy version now in force.
    pub version: String,
    /// Settings that changed and only take effect at a restart.
    pub needs_restart: Vec<&'static str>,
    /// Sandboxes the reload removed: their grants end with them.
    pub removed: Vec<crate::policy::sandbox_id::SandboxId>,
}

/// Settings that changed between `old` and `new` and are read only at start: the listeners
/// and what they were built with. (`dns:` and every sandbox take effect on reload.)
fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |name: &'static str, changed: bool| {
        if changed {
            out.push(name);
        }
    };
    check("listen", old.listen != new.listen);
    check(
        "admin_token_file",
        old.admin_token_file != new.admin_token_file,
    );
    check(
        "audit",
        old.audit_path != new.audit_path
            || old.audit_queue_max != new.audit_queue_max
            || old.audit_dns != new.audit_dns
            || old.audit_trail != new.audit_trail,
    );
    check(
        "max_connections",
        old.max_connections != new.max_connections,
    );
    check("admission", old.admission != new.admission);
    check("upstream_proxy", old.upstream_proxy != new.upstream_proxy);
    check(
        "runtime.max_binding_bytes",
        old.runtime.max_binding_bytes != new.runtime.max_binding_bytes,
    );
    check("state_dir", old.state_dir != new.state_dir);
    check("admin", old.console != new.console);
    check("control_plane", old.etcd != new.etcd);
    check("tls_intercept", old.intercept != new.intercept);
    check(
        "runtime.state_sync_ms",
        old.runtime.state_sync != new.runtime.state_sync,
    );
    check(
        "defaults.timeouts",
        old.defaults.timeouts != new.defaults.timeouts,
    );
    out
}

pub(super) fn fingerprint(files: &[PathBuf]) -> Vec<(PathBuf, Option<(SystemTime, u64)>)> {
    files
        .iter()
        .map(|f| {
            let meta = std::fs::metadata(f).ok();
            (
                f.clone(),
                meta.and_then(|m| Some((m.modified().ok()?, m.len()))),
            )
        })
        .collect()
}

/// A reload built before the lock: the configuration, the registrations under it, and the
/// set they compile to.
pub(super) struct Built {
    pub(super) config: Config,
    pub(super) runtime: Registrations,
    pub(super) set: PolicySet,
    changes: Changes,
}

impl Controller {
    /// Restore API-registered sandboxes from the `state_dir` log (at start) and keep the log
    /// open for the changes to come. A corrupt line or an invalid registration is reported and
    /// skipped, never fatal to the others; the set is compiled and published once.
    pub fn restore(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let Ok(mut guard) = self.lock() else {
            return problems;
        };
        let st = &mut *guard;
        if st.config.etcd.is_some() {
            // etcd keeps the registrations ([`crate::control::etcd`]).
            return problems;
        }
        let Some(dir) = st.config.state_dir.clone() else {
            return problems;
        };
        match self.restore_layers(&st.config) {
            Ok(Some(config)) => st.config = std::sync::Arc::new(config),
            Ok(None) => {}
            Err(e) => problems.push(format!("runtime layers not restored: {e}")),
        }
        let (store, restored) = match StateStore::open(&dir, st.config.runtime.state_sync) {
            Ok(x) => x,
            Err(e) => {
                let why = format!("state_dir {}: {e}", dir.display());
                problems.push(why.clone());
                st.store = Err(crate::control::ControlError::Store(why.into()));
                return problems;
            }
        };
        st.store = Ok(Some(store));
        problems.extend(restored.problems);
        // Each registration is validated and its policy compiled once, on its own; the whole
        // set is compiled and published once at the end (linear in the number of registrations).
        let mut runtime = st.runtime.clone();
        let log = dir.join(LOG_FILE).display().to_string();
        for (id, text) in restored.entries {
            let checked =
                registry::validate(&st.config, &runtime, &id, &text, Origin::StateLog(&log))
                    .and_then(|v| v.compiles(&st.config.defaults.ports).map(|()| v));
            match checked {
                Ok(v) => {
                    let registered = Registered {
                        binding: Arc::new(v.binding),
                        json: v.json.into(),
                        revision: 0,
                    };
                    runtime.insert(id, registered);
                }
                Err(why) => {
                    problems.push(format!("{log} (sandbox {id}): skipped: {why}"));
                    st.unparsed.insert(id, text);
                }
            }
        }
        match self.compile(&st.config, &runtime) {
            Ok((set, changes)) => {
                st.runtime = runtime;
                self.publish(set, changes.scope());
            }
            Err(e) => problems.push(e.to_string()),
        }
        problems
    }

    /// Reload the configuration from disk (or the embedded default) and re-validate every
    /// runtime registration against it. Returns the new policy version.
    pub fn reload(&self, why: &str) -> Result<Reloaded, ReloadError> {
        for _ in 0..RETRIES {
            let view = self.view.load_full();
            let built = self.build(&view.config, &view.runtime);
            let mut st = self.lock().map_err(|_| ReloadError::Poisoned)?;
            if Arc::ptr_eq(&st.config, &view.config) && st.runtime.ptr_eq(&view.runtime) {
                let done = self.apply_reload(&mut st, why, built);
                drop(st);
                return self.removed(done);
            }
        }
        // Registrations kept coming in: build under the lock.
        let mut st = self.lock().map_err(|_| ReloadError::Poisoned)?;
        let (config, runtime) = (st.config.clone(), st.runtime.clone());
        let built = self.build(&config, &runtime);
        let done = self.apply_reload(&mut st, why, built);
        drop(st);
        self.removed(done)
    }

    /// After a reload, with the lock released: the sandboxes it removed take their grants
    /// and requests with them, as a `DELETE` does.
    pub(super) fn removed(
        &self,
        done: Result<Reloaded, ReloadError>,
    ) -> Result<Reloaded, ReloadError> {
        if let Ok(r) = &done {
            for sid in &r.removed {
                self.sandbox_removed(sid);
            }
        }
        done
    }

    /// Read the configuration and build the set it makes with `runtime` (re-parsing each
    /// registration if what they are parsed with changed since `old`).
    fn build(&self, old: &Config, runtime: &Registrations) -> Result<Built, ReloadError> {
        let config = config::load(self.path.as_deref()).map_err(ReloadError::Config)?;
        // The layers defined at run time stay over whatever the file now says.
        let config = match old.layers.runtime.is_empty() {
            true => config,
            false => (config.with_runtime_layers(old.layers.runtime.clone()))
                .map_err(ReloadError::Layers)?,
        };
        self.build_with(config, old, runtime)
    }

    /// [`Controller::build`] with the configuration given (a runtime layer's change).
    pub(super) fn build_with(
        &self,
        config: Config,
        old: &Config,
        runtime: &Registrations,
    ) -> Result<Built, ReloadError> {
        let mut errors = Vec::new();
        // Registrations parse the same under the new file unless what they are parsed
        // with changed: then every one is parsed (and validated) again.
        let runtime = if config.parses_runtime_bindings_like(old) {
            runtime.clone()
        } else {
            let mut again = Registrations::new();
            for (id, r) in runtime.iter() {
                match config.parse_runtime_binding(&r.json, &format!("registered sandbox {id}"), id)
                {
                    Ok((binding, json)) => {
                        let registered = Registered {
                            binding: Arc::new(binding),
                            json: json.into(),
                            revision: r.revision,
                        };
                        again.insert(id.clone(), registered);
                    }
                    Err(e) => errors.extend(e.0),
                }
            }
            again
        };
        if !errors.is_empty() {
            return Err(ReloadError::Registrations(ConfigErrors(errors)));
        }
        let (set, changes) = self.compile(&config, &runtime)?;
        Ok(Built {
            config,
            runtime,
            set,
            changes,
        })
    }

    /// Publish a built reload (or report why it was refused), under the lock.
    pub(super) fn apply_reload(
        &self,
        st: &mut Locked<'_>,
        why: &str,
        built: Result<Built, ReloadError>,
    ) -> Result<Reloaded, ReloadError> {
        // Whatever happened, the files as they are now have been seen.
        match built {
            Ok(Built {
                config,
                runtime,
                set,
                changes,
            }) => {
                st.fingerprint = fingerprint(&config.files);
                if config.dns != st.config.dns {
                    let (resolver, warning) = Resolver::new(&config.dns);
                    if let Some(w) = warning {
                        tracing::warn!(warning = %w, "dns");
                    }
                    self.shared.set_resolver(resolver);
                }
                if config.approvals != st.config.approvals {
                    if let Some(desk) = self.shared.desk.get() {
                        desk.set_cfg(config.approvals.clone());
                    }
                }
                let needs_restart = needs_restart(&st.config, &config);
                for setting in &needs_restart {
                    tracing::warn!(
                        trigger = why,
                        setting,
                        "changed in the configuration but needs a restart to take effect"
                    );
                }
                let removed = changes
                    .sandboxes
                    .iter()
                    .filter(|id| set.get(id.as_str()).is_none())
                    .cloned()
                    .collect();
                st.config = Arc::new(config);
                st.runtime = runtime;
                // Counted before it is published: whoever sees its effects sees the count.
                self.count(true);
                let version = self.publish(set, changes.scope());
                self.reloads.send_modify(|n| *n += 1);
                tracing::info!(
                    trigger = why,
                    policy_version = %version,
                    changed = changes.sandboxes.len(),
                    set_wide = changes.set_wide,
                    "policy reloaded"
                );
                Ok(Reloaded {
                    version,
                    needs_restart,
                    removed,
                })
            }
            Err(errors) => {
                st.fingerprint = fingerprint(&st.config.files.clone());
                if let Some(p) = &self.path {
                    // Watch the file that failed too, so fixing it triggers a reload.
                    if !st.fingerprint.iter().any(|(f, _)| f == p) {
                        st.fingerprint.extend(fingerprint(std::slice::from_ref(p)));
                    }
                }
                self.count(false);
                for e in errors.messages() {
                    tracing::error!(trigger = why, error = %e, "reload refused; the running policy stays");
                }
                Err(errors)
            }
        }
    }

    /// Whether any watched file changed since the last load.
    pub fn files_changed(&self) -> bool {
        let Ok(st) = self.state.lock() else {
            return false;
        };
        let files: Vec<PathBuf> = st.fingerprint.iter().map(|(f, _)| f.clone()).collect();
        fingerprint(&files) != st.fingerprint
    }
}
