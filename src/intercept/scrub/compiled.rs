//! Scrubbers compiled once per sandbox binding and host, shared by every tunnel of that
//! sandbox to that host. Building one (an Aho–Corasick automaton over every form of every
//! secret) cost more than the rest of a request's phases together, and a client that opens a
//! connection per call paid it per call.
//!
//! Kept by [`PerBinding`]: keyed by the binding itself and the host, so a reload that rotates
//! a secret makes a new scrubber, two sandboxes never share one, and the secrets an entry
//! compiled leave memory with the last tunnel of a binding that is gone. Minted secrets change
//! without a new binding, so their scrubbers are never kept here ([`crate::intercept::exchange`] rebuilds them per token).

use std::sync::Arc;

use super::Scrubber;
use crate::intercept::per_binding::PerBinding;

/// The scrubbers kept, per sandbox binding and host.
pub type Compiled = PerBinding<Option<Arc<Scrubber>>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Binding;
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
        let first = cache
            .get_or_build(a, "llm.test", || build(a).map(Arc::new))
            .expect("a");
        let again = cache
            .get_or_build(a, "LLM.test", || panic!("built twice"))
            .expect("a again");
        assert!(Arc::ptr_eq(&first, &again));
        let other = cache
            .get_or_build(b, "llm.test", || build(b).map(Arc::new))
            .expect("b");
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
        cache.get_or_build(&old[0], "llm.test", || build(&old[0]).map(Arc::new));
        let new = bindings("sk-cccccccccccccccccccccccc");
        // Same sandbox and host, another binding: built anew, never the old scrubber.
        let s = cache
            .get_or_build(&new[0], "llm.test", || build(&new[0]).map(Arc::new))
            .expect("new");
        assert!(!scrubbed(&s, "sk-cccccccccccccccccccccccc").contains("sk-cccc"));
        assert_eq!(cache.len(), 1);
        cache.get_or_build(&old[1], "llm.test", || build(&old[1]).map(Arc::new));
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
