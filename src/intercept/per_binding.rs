//! What is built once per sandbox binding and host and shared by every tunnel of that sandbox
//! to that host: its scrubber ([`super::scrub::Compiled`]) and its upstream TLS session store
//! ([`super::resumption`]). Building either per tunnel cost a client that opens a connection
//! per call a share of every call.
//!
//! Nothing crosses a trust boundary: an entry is keyed by the binding itself (the `Arc` the
//! policy set holds for one sandbox at one version) and the host, so a reload that rotates a
//! secret or changes what is bound makes a new binding and a new entry, a sandbox registered
//! again under an old name gets none of its predecessor's, and two sandboxes never share one.
//! Entries hold the binding weakly: what they hold is dropped with the last tunnel of a
//! binding that is gone, at the next [`PerBinding::prune`] (the upstream sweep) or the next
//! miss.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::config::Binding;

/// At most this many (binding, host) entries; past it, the map starts again.
const MAX_ENTRIES: usize = 4096;

struct Entry<T> {
    binding: Weak<Binding>,
    value: T,
}

/// Values kept per sandbox binding and host.
pub struct PerBinding<T> {
    entries: Mutex<HashMap<(String, String), Entry<T>>>,
}

impl<T> Default for PerBinding<T> {
    fn default() -> Self {
        PerBinding {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> std::fmt::Debug for PerBinding<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerBinding")
            .field("entries", &self.len())
            .finish()
    }
}

impl<T: Clone> PerBinding<T> {
    /// The value of `binding` for `host`: the one built for this very binding, or `build()`'s,
    /// kept for the next tunnel.
    pub fn get_or_build(&self, binding: &Arc<Binding>, host: &str, build: impl FnOnce() -> T) -> T {
        let key = (binding.id.to_string(), host.to_ascii_lowercase());
        let weak = Arc::downgrade(binding);
        if let Ok(entries) = self.entries.lock() {
            // A `Weak` keeps its allocation: the pointer cannot be another binding's.
            if let Some(e) = entries.get(&key).filter(|e| e.binding.ptr_eq(&weak)) {
                return e.value.clone();
            }
        }
        // Built outside the lock: two tunnels that miss together both build, one is kept.
        let value = build();
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| e.binding.strong_count() > 0);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            let entry = Entry {
                binding: weak,
                value: value.clone(),
            };
            entries.insert(key, entry);
        }
        value
    }
}

impl<T> PerBinding<T> {
    /// Drop the entries of bindings no longer held (a sandbox gone, a reload that replaced
    /// it): what they held leaves memory. How many were dropped.
    pub fn prune(&self) -> usize {
        let Ok(mut entries) = self.entries.lock() else {
            return 0;
        };
        let before = entries.len();
        entries.retain(|_, e| e.binding.strong_count() > 0);
        before - entries.len()
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
