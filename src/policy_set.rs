//! Every sandbox of a configuration compiled, with the address guard and a version hash: the
//! value the data plane reads (and, on reload, swaps atomically). Also the source-address
//! index used to identify sandboxes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::{Binding, Config};
use crate::guard::Guard;
use crate::policy::addr_table::AddrTable;
use crate::policy::{CompiledPolicy, Outcome};
use crate::target::Target;

/// One sandbox: its binding and compiled policy.
#[derive(Debug)]
pub struct Sandbox {
    pub binding: Binding,
    pub policy: CompiledPolicy,
}

/// All sandboxes, compiled.
#[derive(Debug)]
pub struct PolicySet {
    sandboxes: HashMap<String, Arc<Sandbox>>,
    /// Source CIDRs → sandbox id, longest prefix first.
    sources: AddrTable<Arc<str>>,
    pub guard: Guard,
    /// Short hash of everything that decides (ids, modes, rules, identities).
    version: String,
}

/// A policy set failed to compile (a glob the grammar accepted but globset did not).
#[derive(Debug, thiserror::Error)]
#[error("sandbox {sandbox}: cannot compile: {message}")]
pub struct CompileError {
    pub sandbox: String,
    pub message: String,
}

impl PolicySet {
    /// Compile `config`'s bindings plus `extra` (runtime-registered) bindings.
    pub fn compile(
        config: &Config,
        extra: &[Binding],
        listeners: Vec<SocketAddr>,
    ) -> Result<Self, CompileError> {
        let mut sandboxes = HashMap::with_capacity(config.bindings.len() + extra.len());
        let mut sources = AddrTable::new();
        let mut hasher = Sha256::new();
        for b in config.bindings.iter().chain(extra) {
            let policy = CompiledPolicy::compile(
                &b.id,
                &b.policy_file,
                &b.network,
                b.enforcement,
                &config.defaults.ports,
            )
            .map_err(|e| CompileError {
                sandbox: b.id.clone(),
                message: e.to_string(),
            })?;
            let id: Arc<str> = b.id.as_str().into();
            for s in &b.sources {
                sources.insert(*s, id.clone());
            }
            hash_binding(&mut hasher, b);
            sandboxes.insert(
                b.id.clone(),
                Arc::new(Sandbox {
                    binding: b.clone(),
                    policy,
                }),
            );
        }
        hasher.update(format!("{:?}", config.defaults.ports));
        hasher.update(format!(
            "{:?}{:?}",
            config.defaults.prohibited_ranges, config.defaults.guard_allow_ranges
        ));
        let version = hex::encode(&hasher.finalize()[..6]);
        Ok(PolicySet {
            sandboxes,
            sources,
            guard: Guard::new(
                &config.defaults.prohibited_ranges,
                &config.defaults.guard_allow_ranges,
                listeners,
            ),
            version,
        })
    }

    pub fn get(&self, id: &str) -> Option<&Arc<Sandbox>> {
        self.sandboxes.get(id)
    }

    /// Sandbox ids, sorted.
    pub fn ids(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.sandboxes.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    pub fn len(&self) -> usize {
        self.sandboxes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty()
    }

    /// The policy version (hash of the compiled set).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The sandbox whose `sources` contain `ip` (longest prefix wins).
    pub fn by_source(&self, ip: IpAddr) -> Option<&Arc<Sandbox>> {
        let ip = ip.to_canonical();
        self.sources
            .matches(ip)
            .next()
            .and_then(|id| self.sandboxes.get(&**id))
    }

    /// Decide for a sandbox with this set's guard.
    pub fn decide(&self, sandbox: &Sandbox, target: &Target, addrs: Option<&[IpAddr]>) -> Outcome {
        sandbox.policy.decide(target, addrs, &self.guard)
    }
}

fn hash_binding(h: &mut Sha256, b: &Binding) {
    h.update(b.id.as_bytes());
    h.update([0]);
    h.update(b.token_sha256.unwrap_or_default());
    h.update(format!(
        "{:?}{:?}{:?}",
        b.sources, b.enforcement, b.network.mode
    ));
    for (text, _) in b.network.egress.iter() {
        h.update(b"+");
        h.update(text.as_bytes());
    }
    for (text, _) in b.network.deny.iter() {
        h.update(b"-");
        h.update(text.as_bytes());
    }
    h.update(format!("{:?}{}", b.limits, b.strict_sni_dst));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use std::path::Path;

    #[test]
    fn compiles_and_identifies_by_source() {
        let text = "sandboxes:\n  - { id: a, sources: [10.0.0.0/8], policy: { provider: local, config: {}, network: { egress: [x.example.com] } } }\n  - { id: b, sources: [10.1.0.0/16], policy: { provider: local, config: {} } }\n";
        let c = load_str(text, "t", Path::new("."), None).unwrap();
        let set = PolicySet::compile(&c, &[], vec![]).unwrap();
        assert_eq!(set.ids(), ["a", "b"]);
        assert_eq!(
            set.by_source("10.2.0.1".parse().unwrap())
                .unwrap()
                .binding
                .id,
            "a"
        );
        assert_eq!(
            set.by_source("10.1.0.1".parse().unwrap())
                .unwrap()
                .binding
                .id,
            "b"
        );
        assert_eq!(
            set.by_source("::ffff:10.1.0.1".parse().unwrap())
                .unwrap()
                .binding
                .id,
            "b"
        );
        assert!(set.by_source("192.168.0.1".parse().unwrap()).is_none());
        assert_eq!(set.version().len(), 12);
        // A different rule set has a different version; the same one the same.
        let again = PolicySet::compile(&c, &[], vec![]).unwrap();
        assert_eq!(again.version(), set.version());
        let c2 = load_str(
            &text.replace("x.example.com", "y.example.com"),
            "t",
            Path::new("."),
            None,
        )
        .unwrap();
        assert_ne!(
            PolicySet::compile(&c2, &[], vec![]).unwrap().version(),
            set.version()
        );
    }
}
