//! The policy set in force, and who is told when it changes: [`LivePolicy`] swaps each new
//! [`PolicySet`] in atomically and wakes the live exchanges a publication concerns
//! ([`Scope`]); each exchange then re-decides itself ([`crate::relay::watch`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::policy::sandbox_id::SandboxId;
use crate::sandboxes::set::PolicySet;

/// Who a publication concerns.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Anything may have changed (a file reload, a restore): every live exchange re-checks.
    All,
    /// Only these sandboxes changed (registrations, removals or edits that cannot change how
    /// any other client is identified): only their exchanges are woken.
    Sandboxes(&'a [SandboxId]),
}

/// The policy set in force. Connections take a snapshot from the `ArcSwap` (cheap, lock
/// free). Live exchanges hold two receivers: the set-wide `watch` (woken by [`Scope::All`]
/// publications, and always holding the newest set) and their own sandbox's (woken by
/// [`Scope::Sandbox`] publications), so that registering one sandbox does not wake the
/// tunnels of every other. Publications are serialised by the caller ([`crate::control`]
/// holds one lock).
pub struct LivePolicy {
    current: ArcSwap<PolicySet>,
    changes: watch::Sender<Arc<PolicySet>>,
    /// One channel per sandbox that has (or had) live exchanges.
    per_sandbox: std::sync::Mutex<std::collections::HashMap<SandboxId, watch::Sender<()>>>,
    /// The last generation handed out.
    generation: AtomicU64,
    /// Told of every publication, whatever its scope (housekeeping: minted tokens).
    every: watch::Sender<()>,
}

impl LivePolicy {
    /// The live policy, starting from `set`.
    pub fn new(mut set: PolicySet) -> Self {
        set.generation = 1;
        let set = Arc::new(set);
        LivePolicy {
            current: ArcSwap::new(set.clone()),
            changes: watch::channel(set).0,
            per_sandbox: std::sync::Mutex::new(std::collections::HashMap::new()),
            generation: AtomicU64::new(1),
            every: watch::channel(()).0,
        }
    }

    /// The set in force now.
    pub fn load(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    /// Make `set` the one in force: new connections see it at once, and the exchanges `scope`
    /// names are told.
    pub fn publish(&self, mut set: PolicySet, scope: Scope<'_>) -> Arc<PolicySet> {
        set.generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let set = Arc::new(set);
        self.current.store(set.clone());
        self.every.send_replace(());
        match scope {
            Scope::All => {
                self.changes.send_replace(set.clone());
                if let Ok(mut m) = self.per_sandbox.lock() {
                    // Forget the channels nobody listens to any more.
                    m.retain(|_, tx| tx.receiver_count() > 0);
                }
            }
            Scope::Sandboxes(ids) => {
                // Update the newest set without waking anyone, then wake these sandboxes'.
                self.changes.send_if_modified(|v| {
                    *v = set.clone();
                    false
                });
                if let Ok(mut m) = self.per_sandbox.lock() {
                    for id in ids {
                        if let Some(tx) = m.get(id) {
                            if tx.send(()).is_err() {
                                m.remove(id);
                            }
                        }
                    }
                }
            }
        }
        set
    }

    /// A receiver told of every later publication, set-wide or of some sandboxes only.
    pub fn subscribe_every(&self) -> watch::Receiver<()> {
        self.every.subscribe()
    }

    /// A receiver of every later set-wide publication (and of the newest set).
    pub fn subscribe(&self) -> watch::Receiver<Arc<PolicySet>> {
        self.changes.subscribe()
    }

    /// A receiver of the publications that concern sandbox `id` only.
    pub fn subscribe_sandbox(&self, id: &SandboxId) -> watch::Receiver<()> {
        match self.per_sandbox.lock() {
            Ok(mut m) => m
                .entry(id.clone())
                .or_insert_with(|| watch::channel(()).0)
                .subscribe(),
            // Never notified: the set-wide channel still reaches the exchange.
            Err(_) => watch::channel(()).1,
        }
    }
}
