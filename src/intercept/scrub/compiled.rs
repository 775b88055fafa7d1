//! Scrubbers compiled once per sandbox binding and host, shared by every tunnel of that
//! sandbox to that host. Building one (an Aho–Corasick automaton over every form of every
//! secret) cost more than the rest of a request's phases together, and a client that opens a
//! connection per call paid it per call.
//!
//! Nothing crosses a trust boundary: an entry is keyed by the binding itself (the `Arc` the
//! policy set holds for one sandbox at one version) and the host, so a reload that rotates a
//! secret or changes what is bound makes a new binding and a new scrubber, and two sandboxes
//! never share one. Entries hold the binding weakly: the secrets they compiled are dropped
//! with the last tunnel of a binding that is gone, at the next [`Compiled::prune`] (the
//! upstream sweep) or the next miss. Minted secrets change without a new binding, so their
//! scrubbers are never kept here ([`crate::intercept::exchange`] rebuilds them per token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::Scrubber;
use crate::config::Binding;

/// At most this many (binding, host) entries; past it, the map starts again.
const MAX_ENTRIES: usize = 4096;

struct Entry {
    binding: Weak<Binding>,
    scrubber: Option<Arc<Scrubber>>,
}

/// The scrubbers kept, per sandbox and host.
#[derive(Default)]
pub struct Compiled {
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("entries", &self.len())
            .finish()
    }
}

impl Compiled {
    /// The scrubber of `binding` for `host`: the one built for this very binding, or
    /// `build()`'s, kept for the next tunnel.
    pub fn get_or_build(
        &self,
        binding: &Arc<Binding>,
        host: &str,
        build: impl FnOnce() -> Option<Scrubber>,
    ) -> Option<Arc<Scrubber>> {
        let key = (binding.id.to_string(), host.to_ascii_lowercase());
        let weak = Arc::downgrade(binding);
        if let Ok(entries) = self.entries.lock() {
            // A `Weak` keeps its allocation: the pointer cannot be another binding's.
            if let Some(e) = entries.get(&key).filter(|e| e.binding.ptr_eq(&weak)) {
                return e.scrubber.clone();
            }
        }
        // Built outside the lock: two tunnels that miss together both build, one is kept.
        let scrubber = build().map(Arc::new);
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| e.binding.strong_count() > 0);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            let entry = Entry {
                binding: weak,
                scrubber: scrubber.clone(),
            };
            entries.insert(key, entry);
        }
        scrubber
    }

    /// Drop the entries of bindings no longer held (a sandbox gone, a reload that replaced
    /// it): their secrets leave memory. How many were dropped.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercept::credential::{self, MintCx};

    /// Sandboxes `a` and `b`, each with its own secret for `llm.test`.
    fn bindings(secret_a: &str) -> Vec<Arc<Binding>> {
        let dir = tempfile::tempdir().expect("dir");
        crate::intercept::ca::init(dir.path(), &[]).expect("ca");
        let cred = |s: &str| {
            let f = dir.path().join(s);
            std::fs::write(&f, s).expect("secret file");
            format!(
                "[{{ name: k, hosts: [llm.test], inject: {{ header: Authorization, format: \"Bearer {{secret}}\" }}, source: {{ file: {} }} }}]",
                f.display()
            )
        };
        let text = format!(
            "tls_intercept: {{ ca_cert_file: {d}/ca.crt, ca_key_file: {d}/ca.key }}\nsandboxes:\n  - {{ id: a, credentials: {}, policy: {{ provider: local, config: {{}} }} }}\n  - {{ id: b, credentials: {}, policy: {{ provider: local, config: {{}} }} }}\n",
            cred(secret_a),
            cred("sk-bbbbbbbbbbbbbbbbbbbbbbbb"),
            d = dir.path().display(),
        );
        let c =
            crate::config::load_str(&text, "t", std::path::Path::new("."), None).expect("config");
        c.bindings.into_iter().map(Arc::new).collect()
    }

    fn build(b: &Arc<Binding>) -> Option<Scrubber> {
        let cx = MintCx::for_tests();
        let bound: Vec<_> = b
            .credentials
            .iter()
            .map(|c| credential::bound(c, b.id.as_str(), &cx))
            .collect();
        Scrubber::new(bound.iter())
    }

    fn scrubbed(s: &Scrubber, text: &str) -> String {
        let mut buf = text.as_bytes().to_vec();
        s.scrub(&mut buf, &mut Vec::new());
        String::from_utf8_lossy(&buf).into_owned()
    }

    #[test]
    fn one_binding_builds_once_and_sandboxes_never_share() {
        let cache = Compiled::default();
        let bs = bindings("sk-aaaaaaaaaaaaaaaaaaaaaaaa");
        let (a, b) = (&bs[0], &bs[1]);
        let first = cache.get_or_build(a, "llm.test", || build(a)).expect("a");
        let again = cache
            .get_or_build(a, "LLM.test", || panic!("built twice"))
            .expect("a again");
        assert!(Arc::ptr_eq(&first, &again));
        let other = cache.get_or_build(b, "llm.test", || build(b)).expect("b");
        assert!(!Arc::ptr_eq(&first, &other));
        // Each scrubs its own sandbox's secret.
        assert!(!scrubbed(&other, "x sk-bbbbbbbbbbbbbbbbbbbbbbbb").contains("sk-bbbb"));
        assert!(scrubbed(&other, "x sk-aaaaaaaaaaaaaaaaaaaaaaaa").contains("sk-aaaa"));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_rotated_secret_is_a_new_binding_and_the_old_one_leaves() {
        let cache = Compiled::default();
        let old = bindings("sk-aaaaaaaaaaaaaaaaaaaaaaaa");
        cache.get_or_build(&old[0], "llm.test", || build(&old[0]));
        let new = bindings("sk-cccccccccccccccccccccccc");
        // Same sandbox and host, another binding: built anew, never the old scrubber.
        let s = cache
            .get_or_build(&new[0], "llm.test", || build(&new[0]))
            .expect("new");
        assert!(!scrubbed(&s, "sk-cccccccccccccccccccccccc").contains("sk-cccc"));
        assert_eq!(cache.len(), 1);
        cache.get_or_build(&old[1], "llm.test", || build(&old[1]));
        assert_eq!(cache.len(), 2);
        drop(old);
        assert_eq!(
            cache.prune(),
            1,
            "the entry of a binding no longer held is dropped"
        );
        assert_eq!(cache.len(), 1);
    }
}
