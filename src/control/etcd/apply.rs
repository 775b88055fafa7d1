//! Registrations kept in the shared control plane ([`crate::control::etcd`]): the checks made
//! before a write, and the application of what etcd sends back.
//!
//! Every replica applies the same values in the same (revision) order with the same rules, so
//! they agree on what is in force without talking to each other. A value is validated on its
//! own: an invalid one (bad JSON, an invalid policy, the id of a file-defined sandbox, another
//! sandbox's `sources`) is skipped — and a sandbox whose new value is invalid is removed, not
//! left on its old policy — while the rest of the batch applies. A batch is compiled
//! incrementally (only the changed sandboxes) and published once. Every value is parsed and
//! compiled before the controller's lock is taken: a hostile value costs its own parse
//! (bounded before it, see [`crate::control::etcd`]) and never delays a DELETE behind it by
//! more than that; the write checks read the published view and take no lock at all.

use std::collections::HashSet;

use crate::config::Config;
use crate::control::registry::{self, Origin, Ready};
use crate::control::ControlError;
use crate::control::{ChangeError, Controller, Locked, Registered, State, RETRIES};
use crate::egress::handles::Handles;
use crate::policy::cause::of;
use crate::policy::sandbox_id::SandboxId;
use crate::sandboxes::set::{Scope, SetEdit};

/// One change read from etcd.
#[derive(Debug, Clone)]
pub enum RemoteChange {
    /// The value of `{prefix}sandboxes/{id}` at `revision`.
    Put {
        /// The sandbox's id.
        id: String,
        /// The registration, as written.
        text: String,
        /// The revision it was written at.
        revision: i64,
    },
    /// The key was deleted (or its lease expired).
    Delete {
        /// The sandbox's id.
        id: String,
    },
}

/// What applying a batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Sandboxes added, replaced or removed.
    pub changed: usize,
    /// Values skipped as invalid.
    pub skipped: usize,
    /// Sandboxes removed (not replaced): their grants end with them.
    pub removed: Vec<SandboxId>,
}

/// A registration checked and ready to be written.
#[derive(Debug)]
pub struct Prepared {
    /// The body as stored (canonical JSON).
    pub json: String,
    /// The revision at which this replica last saw the key (0: absent).
    pub seen_revision: i64,
}

impl Controller {
    /// Check a registration as `put` would, without changing anything: with etcd the value is
    /// written there and applied when the watch brings it back. Reads the published view: no
    /// lock.
    pub fn prepare_put(&self, id: &str, body: &str) -> Result<Prepared, ChangeError> {
        let view = self.view.load();
        let ready = registry::prepare(&view.config, id, body, Origin::Api)?;
        registry::room_for(
            &view.config,
            &view.runtime,
            ready.id.as_str(),
            &ready.binding,
            Origin::Api,
        )?;
        let id = ready.id.as_str();
        Ok(Prepared {
            seen_revision: view
                .runtime
                .get(id)
                .map(|r| r.revision)
                .or_else(|| view.skipped.get(id).map(|(r, _)| *r))
                .unwrap_or(0),
            json: ready.json.to_string(),
        })
    }

    /// Check a removal: 404 for an id that cannot exist, 409 for a file-defined sandbox.
    /// Returns how many exchanges of the sandbox are open now.
    pub fn prepare_delete(&self, id: &str) -> Result<u32, ChangeError> {
        SandboxId::new(id).map_err(|_| ChangeError::NotFound)?;
        let view = self.view.load();
        if view.config.bindings.iter().any(|b| b.id == id) {
            return Err(ChangeError::Conflict(
                format!(
                    "sandbox {id} is defined in {}; remove it there",
                    view.config.origin
                )
                .into(),
            ));
        }
        Ok(self
            .shared
            .policy
            .load()
            .get(id)
            .map(|sb| sb.limiter(&self.shared.limiters).active())
            .unwrap_or(0))
    }

    /// After revision `revision` of sandbox `id` was applied: why this replica skipped it, or
    /// `None` when it is in force (or was replaced since).
    pub fn skipped_at(&self, id: &str, revision: i64) -> Option<String> {
        match self.view.load().skipped.get(id) {
            Some((r, why)) if *r == revision => Some(why.clone()),
            _ => None,
        }
    }

    /// Told of every successful reload.
    pub fn subscribe_reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Whether some value in etcd is not in force (a reload may have made it valid).
    pub fn has_skipped(&self) -> bool {
        !self.view.load().skipped.is_empty()
    }

    /// Why the value of sandbox `id` in etcd is not in force, if it was skipped.
    pub fn skipped(&self, id: &str) -> Option<(i64, String)> {
        self.view.load().skipped.get(id).cloned()
    }

    /// Apply changes read from etcd, in order. With `full`, `changes` is the whole prefix
    /// (a list): every registration it does not hold is removed (and its exchanges revoked),
    /// and skipped values are checked again (the configuration may have changed).
    pub fn apply_remote(&self, changes: Vec<RemoteChange>, full: bool) -> Applied {
        for attempt in 0..=RETRIES {
            // Parse and compile every changed value with no lock held (the last attempt,
            // after reloads kept changing the configuration, does it under the lock).
            let view = self.view.load_full();
            let ready: Vec<Option<Result<Ready, ControlError>>> = changes
                .iter()
                .map(|c| match c {
                    RemoteChange::Put { id, text, revision } if attempt < RETRIES => {
                        let unchanged = view
                            .runtime
                            .get(id)
                            .is_some_and(|r| r.revision == *revision)
                            || (!full && view.skipped.get(id).is_some_and(|(r, _)| r == revision));
                        (!unchanged).then(|| prepare_remote(&view.config, id, text))
                    }
                    _ => None,
                })
                .collect();
            let Ok(mut st) = self.lock() else {
                return Applied::default();
            };
            if attempt < RETRIES && !std::sync::Arc::ptr_eq(&st.config, &view.config) {
                continue;
            }
            let applied = self.apply_ready(&mut st, &changes, ready, full);
            drop(st);
            for sid in &applied.removed {
                self.sandbox_removed(sid);
            }
            return applied;
        }
        Applied::default()
    }

    /// Apply `changes` under the lock, with the values prepared for them (`None`: not
    /// prepared, done here).
    fn apply_ready(
        &self,
        st: &mut Locked<'_>,
        changes: &[RemoteChange],
        ready: Vec<Option<Result<Ready, ControlError>>>,
        full: bool,
    ) -> Applied {
        let st: &mut State = st;
        let mut edit = self.shared.policy.load().edit();
        let mut touched: Vec<SandboxId> = Vec::new();
        let mut set_wide = false;
        let mut applied = Applied::default();
        if full {
            set_wide |= remove_unlisted(st, &mut edit, changes, &mut applied.removed);
            touched.extend(applied.removed.iter().cloned());
        }
        for (change, prepared) in changes.iter().zip(ready) {
            match change {
                RemoteChange::Put { id, text, revision } => {
                    let revision = *revision;
                    let unchanged = st.runtime.get(id).is_some_and(|r| r.revision == revision)
                        || (!full && st.skipped.get(id).is_some_and(|(r, _)| *r == revision));
                    if unchanged {
                        continue;
                    }
                    let prepared = prepared.unwrap_or_else(|| prepare_remote(&st.config, id, text));
                    let admitted = prepared.and_then(|ready| {
                        registry::room_for(
                            &st.config,
                            &st.runtime,
                            id,
                            &ready.binding,
                            Origin::Etcd,
                        )
                        .map_err(|e| ControlError::Rejected(of(e)))?;
                        Ok(ready)
                    });
                    set_wide |= remove(st, &mut edit, id);
                    match admitted {
                        Ok(ready) => {
                            set_wide |= !ready.binding.sources.is_empty();
                            edit.insert(ready.sandbox);
                            st.runtime.insert(
                                id.clone(),
                                Registered {
                                    binding: ready.binding,
                                    json: ready.json,
                                    revision,
                                },
                            );
                        }
                        Err(why) => {
                            tracing::error!(sandbox = %id, revision, error = %why, "control plane: value skipped; the sandbox is not in force");
                            st.skipped.insert(id.clone(), (revision, why.to_string()));
                            applied.skipped += 1;
                        }
                    }
                    touched.extend(SandboxId::new(id).ok());
                }
                RemoteChange::Delete { id } => {
                    if st.runtime.contains_key(id) || st.skipped.contains_key(id) {
                        set_wide |= remove(st, &mut edit, id);
                        touched.extend(SandboxId::new(id).ok());
                        applied.removed.extend(SandboxId::new(id).ok());
                    }
                }
            }
        }
        applied.changed = touched.len();
        if touched.is_empty() {
            return applied;
        }
        let scope = if set_wide {
            Scope::All
        } else {
            Scope::Sandboxes(&touched)
        };
        self.publish(edit.finish(), scope);
        applied
    }
}

/// A full list: remove every registration it does not hold (into `removed`); whether one
/// had `sources`.
fn remove_unlisted(
    st: &mut State,
    edit: &mut SetEdit,
    changes: &[RemoteChange],
    removed: &mut Vec<SandboxId>,
) -> bool {
    let listed: HashSet<&str> = changes
        .iter()
        .map(|c| match c {
            RemoteChange::Put { id, .. } | RemoteChange::Delete { id } => id.as_str(),
        })
        .collect();
    let gone: Vec<String> = st
        .runtime
        .keys()
        .chain(st.skipped.keys())
        .filter(|id| !listed.contains(id.as_str()))
        .cloned()
        .collect();
    let mut set_wide = false;
    for id in gone {
        set_wide |= remove(st, edit, &id);
        removed.extend(SandboxId::new(&id).ok());
    }
    set_wide
}

/// Remove `id` from the registrations and from `edit`; whether it had `sources` (then
/// every exchange must re-check, not only its own).
fn remove(st: &mut State, edit: &mut SetEdit, id: &str) -> bool {
    st.skipped.remove(id);
    match st.runtime.remove(id) {
        Some(old) => {
            edit.remove(id);
            !old.binding.sources.is_empty()
        }
        None => false,
    }
}

/// Parse and compile a value read from etcd (no room check: every replica must reach the
/// same set).
fn prepare_remote(config: &Config, id: &str, text: &str) -> Result<Ready, ControlError> {
    registry::prepare(config, id, text, Origin::Etcd).map_err(|e| ControlError::Rejected(of(e)))
}
