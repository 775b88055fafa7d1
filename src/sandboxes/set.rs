//! Every sandbox of a configuration compiled, with the address guard and a version hash: the
//! value the data plane reads. Also the source-address index used to identify sandboxes.
//! [`LivePolicy`] ([`super::live`]) publishes each set to every live exchange.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use crate::config::{Binding, Config};
use crate::policy::addr_table::AddrTable;
use crate::policy::dns_view::NameView;
use crate::policy::granted::Granted;
use crate::policy::guard::Guard;
use crate::policy::ports::PortSet;
use crate::policy::reason::Reason;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::{Host, Target};
use crate::policy::{CompiledPolicy, Outcome, Verdict};

pub use super::live::{LivePolicy, Scope};

/// One sandbox: its binding and compiled policy.
#[derive(Debug)]
pub struct Sandbox {
    /// Shared with the registration it came from (one copy per sandbox).
    pub binding: Arc<Binding>,
    /// The sandbox's compiled network policy.
    pub policy: CompiledPolicy,
    /// What a stage above keeps for this compiled sandbox — its limiter and metric handles
    /// (`egress::handles`) — found once per policy version instead of once per connection.
    /// Policy neither builds nor reads it.
    pub runtime: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    /// SHA-256 of everything in its binding that decides (XOR-combined into the version).
    digest: [u8; 32],
}

impl Sandbox {
    /// Whether a decision may depend on the process: `network.scoped` entries, or
    /// `network.http` rules for some processes.
    pub fn scoped(&self) -> bool {
        self.policy.has_scopes() || self.binding.network.http.iter().any(|r| r.scope.is_some())
    }
}

/// All sandboxes, compiled.
#[derive(Debug, Clone)]
pub struct PolicySet {
    /// A persistent map: a change clones it in O(1) and updates it in O(log n), sharing the
    /// rest with the set it came from.
    sandboxes: imbl::HashMap<SandboxId, Arc<Sandbox>>,
    /// Source CIDRs → sandbox id, longest prefix first.
    sources: AddrTable<Arc<str>>,
    /// The address guard every sandbox shares.
    pub guard: Arc<Guard>,
    /// What every sandbox is compiled with (`defaults.ports`).
    default_ports: PortSet,
    /// `dns.address_rule_zones`: names under them may be resolved to try address rules.
    zones: Arc<[String]>,
    /// `dns.hosts` names: answered locally, never a DNS query, so always looked up.
    static_names: Arc<std::collections::HashSet<String>>,
    /// XOR of every sandbox's digest: the version changes with any sandbox, and a change of
    /// one sandbox updates it in O(1).
    sandboxes_digest: [u8; 32],
    /// Digest of the set-wide settings that decide (default ports, guard ranges).
    defaults_digest: [u8; 32],
    /// Grants approved at run time, by sandbox ([`crate::policy::granted`]): carried from
    /// set to set across reloads and registrations; consulted only when a sandbox's own
    /// policy refused for want of a rule.
    grants: imbl::HashMap<SandboxId, Arc<Granted>>,
    /// Digest of every grant (part of the version).
    grants_digest: [u8; 32],
    /// Short hash of everything that decides (ids, modes, rules, identities, defaults, grants).
    version: Arc<str>,
    /// Position in the sequence of published sets (0 until published): an exchange decided
    /// under an older generation re-checks itself.
    pub(super) generation: u64,
    /// How many sandboxes decide by the process ([`Sandbox::scoped`]): while any does, every
    /// connection's first look searches every process (`crate::egress::attribution`).
    scoped: usize,
}

/// A policy set failed to compile (a glob the grammar accepted but globset did not).
#[derive(Debug, thiserror::Error)]
#[error("sandbox {sandbox}: cannot compile: {cause}")]
pub struct CompileError {
    /// The sandbox whose policy did not compile.
    pub sandbox: String,
    /// Why.
    #[source]
    pub cause: globset::Error,
}

impl Sandbox {
    /// Compile one binding with the set's default ports (`defaults.ports`): the work of a
    /// registration, done before the controller's lock is taken ([`SetEdit::insert`]).
    pub fn compile(b: &Arc<Binding>, default_ports: &PortSet) -> Result<Sandbox, CompileError> {
        compile_sandbox(b, default_ports)
    }
}

/// Compile one binding.
fn compile_sandbox(b: &Arc<Binding>, default_ports: &PortSet) -> Result<Sandbox, CompileError> {
    let policy = CompiledPolicy::compile(
        &b.id,
        &b.policy_file,
        &b.network,
        b.enforcement,
        default_ports,
    )
    .map_err(|cause| CompileError {
        sandbox: b.id.to_string(),
        cause,
    })?;
    let mut hasher = Sha256::new();
    digest::hash_binding(&mut hasher, b);
    Ok(Sandbox {
        binding: Arc::clone(b),
        policy,
        runtime: OnceLock::new(),
        digest: hasher.finalize().into(),
    })
}

fn xor(acc: &mut [u8; 32], d: &[u8; 32]) {
    for (a, b) in acc.iter_mut().zip(d) {
        *a ^= b;
    }
}

fn version_of(sandboxes: &[u8; 32], defaults: &[u8; 32], grants: &[u8; 32]) -> Arc<str> {
    let mut h = Sha256::new();
    h.update(sandboxes);
    h.update(defaults);
    if *grants != [0u8; 32] {
        h.update(grants);
    }
    hex::encode(&h.finalize()[..6]).into()
}

/// What a [`PolicySet::recompile`] changed.
#[derive(Debug, Default)]
pub struct Changes {
    /// Sandboxes added, removed or whose binding changed (sorted).
    pub sandboxes: Vec<SandboxId>,
    /// Whether anything beyond those sandboxes' own exchanges may be affected: the defaults
    /// every sandbox is compiled with or the guard changed, or a changed sandbox has (or had)
    /// `sources` (which can move a client from one sandbox to another).
    pub set_wide: bool,
}

impl Changes {
    /// Who the publication of the recompiled set concerns.
    pub fn scope(&self) -> Scope<'_> {
        if self.set_wide {
            Scope::All
        } else {
            Scope::Sandboxes(&self.sandboxes)
        }
    }

    /// The sandboxes of `previous` that `now` no longer has.
    fn removed(&mut self, previous: &PolicySet, now: &imbl::HashMap<SandboxId, Arc<Sandbox>>) {
        for (id, old) in &previous.sandboxes {
            if !now.contains_key(id) {
                self.sandboxes.push(id.clone());
                self.set_wide |= !old.binding.sources.is_empty();
            }
        }
    }
}

/// The address guard: the prohibited ranges less the allowed ones, and the proxy's own
/// endpoints (its listeners, and those `extra` bindings and the config protect).
fn guard_of(config: &Config, extra: &[Arc<Binding>], listeners: Vec<SocketAddr>) -> Guard {
    let own = [listeners, config.protected_endpoints(extra)].concat();
    let defaults = &config.defaults;
    Guard::new(
        &defaults.prohibited_ranges,
        &defaults.guard_allow_ranges,
        own,
    )
}

impl PolicySet {
    /// Compile `config`'s bindings plus `extra` (runtime-registered) bindings.
    pub fn compile(
        config: &Config,
        extra: &[Arc<Binding>],
        listeners: Vec<SocketAddr>,
    ) -> Result<Self, CompileError> {
        Self::build(config, extra, listeners, None).map(|(set, _)| set)
    }

    /// Like [`PolicySet::compile`], but every sandbox whose binding is unchanged (and all of
    /// them only if the defaults they are compiled with are unchanged) is taken from this set
    /// as it is: a reload compiles only what changed.
    pub fn recompile(
        &self,
        config: &Config,
        extra: &[Arc<Binding>],
        listeners: Vec<SocketAddr>,
    ) -> Result<(Self, Changes), CompileError> {
        Self::build(config, extra, listeners, Some(self))
    }

    fn build(
        config: &Config,
        extra: &[Arc<Binding>],
        listeners: Vec<SocketAddr>,
        previous: Option<&PolicySet>,
    ) -> Result<(Self, Changes), CompileError> {
        let ports = &config.defaults.ports;
        let defaults_digest = defaults_digest(config);
        let guard = guard_of(config, extra, listeners);
        let mut changes = Changes {
            set_wide: previous.is_none_or(|p| p.defaults_digest != defaults_digest),
            ..Changes::default()
        };
        let reusable = previous.filter(|_| !changes.set_wide);
        let mut sandboxes = imbl::HashMap::new();
        let mut sources = AddrTable::new();
        let mut sandboxes_digest = [0u8; 32];
        let mut add = |b: &Binding, shared: Option<&Arc<Binding>>| -> Result<(), CompileError> {
            let old = previous.and_then(|p| p.sandboxes.get(b.id.as_str()));
            let sb = match reusable.and(old).filter(|old| *old.binding == *b) {
                Some(same) => same.clone(),
                None => {
                    let arc = shared.cloned().unwrap_or_else(|| Arc::new(b.clone()));
                    changes.sandboxes.push(b.id.clone());
                    changes.set_wide |=
                        !b.sources.is_empty() || old.is_some_and(|o| !o.binding.sources.is_empty());
                    Arc::new(compile_sandbox(&arc, ports)?)
                }
            };
            let id: Arc<str> = b.id.as_str().into();
            for s in &b.sources {
                sources.insert(*s, id.clone());
            }
            xor(&mut sandboxes_digest, &sb.digest);
            sandboxes.insert(b.id.clone(), sb);
            Ok(())
        };
        for b in &config.bindings {
            add(b, None)?;
        }
        for b in extra {
            add(b, Some(b))?;
        }
        if let Some(p) = previous {
            changes.removed(p, &sandboxes);
        }
        changes.sandboxes.sort_unstable();
        let grants = carried_grants(previous, &sandboxes);
        let grants_digest = digest::grants(&grants);
        let set = PolicySet {
            sandboxes,
            sources,
            guard: Arc::new(guard),
            default_ports: ports.clone(),
            zones: config.dns.address_rule_zones.clone().into(),
            static_names: Arc::new(config.dns.hosts.keys().cloned().collect()),
            version: version_of(&sandboxes_digest, &defaults_digest, &grants_digest),
            sandboxes_digest,
            defaults_digest,
            grants,
            grants_digest,
            generation: 0,
            scoped: 0,
        };
        let set = PolicySet {
            scoped: set.sandboxes.values().filter(|s| s.scoped()).count(),
            ..set
        };
        Ok((set, changes))
    }
}

/// Digest of the set-wide settings that decide (default ports, guard ranges, address-rule
/// zones, `dns.hosts` names).
fn defaults_digest(config: &Config) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(format!("{:?}", config.defaults.ports));
    hasher.update(format!(
        "{:?}{:?}{:?}",
        config.defaults.prohibited_ranges,
        config.defaults.guard_allow_ranges,
        config.dns.address_rule_zones,
    ));
    for name in config.dns.hosts.keys() {
        hasher.update(name.as_bytes());
        hasher.update(b"\n");
    }
    hasher.finalize().into()
}

impl PolicySet {
    /// This set with `b` added or replaced: only `b` is compiled; every other sandbox is
    /// shared with this set.
    pub fn with_binding(&self, b: &Arc<Binding>) -> Result<Self, CompileError> {
        let mut edit = self.edit();
        edit.put(b)?;
        Ok(edit.finish())
    }

    /// This set without sandbox `id`.
    pub fn without(&self, id: &str) -> Self {
        let mut edit = self.edit();
        edit.remove(id);
        edit.finish()
    }

    /// A copy of this set to change several sandboxes in (one copy, one version computed,
    /// whatever the number of changes).
    pub fn edit(&self) -> SetEdit {
        let mut next = self.clone();
        next.generation = 0;
        SetEdit(next)
    }

    fn remove_entry(&mut self, id: &str) {
        if let Some(old) = self.sandboxes.remove(id) {
            xor(&mut self.sandboxes_digest, &old.digest);
            self.scoped -= usize::from(old.scoped());
            for s in &old.binding.sources {
                self.sources.remove(*s, |v| &**v == id);
            }
        }
    }

    /// Whether any sandbox decides by the process.
    pub fn any_scoped(&self) -> bool {
        self.scoped > 0
    }

    /// The sandbox with this id, if it is in the set.
    pub fn get(&self, id: &str) -> Option<&Arc<Sandbox>> {
        self.sandboxes.get(id)
    }

    /// Sandbox ids, sorted.
    pub fn ids(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.sandboxes.keys().map(SandboxId::as_str).collect();
        v.sort_unstable();
        v
    }

    /// `defaults.ports`, what every sandbox is compiled with.
    pub fn default_ports(&self) -> &PortSet {
        &self.default_ports
    }

    /// The policy version (hash of the compiled set).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The policy version, shared (audit records hold it).
    pub fn version_arc(&self) -> Arc<str> {
        self.version.clone()
    }

    /// See [`PolicySet::generation`]'s field doc.
    pub fn generation(&self) -> u64 {
        self.generation
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
        self.decide_for(sandbox, None, target, addrs)
    }

    /// [`PolicySet::decide`] for a connection of `process` (scoped entries admit only theirs).
    pub fn decide_for(
        &self,
        sandbox: &Sandbox,
        process: Option<&crate::policy::process::Process>,
        target: &Target,
        addrs: Option<&[IpAddr]>,
    ) -> Outcome {
        let mut outcome = sandbox
            .policy
            .decide_for(process, target, addrs, &self.guard);
        if let Some(granted) = self.granted(sandbox, target, addrs, &outcome) {
            return granted;
        }
        // A name no name rule allows is resolved (to try address rules) only under
        // `dns.address_rule_zones` or with `network.resolve_for_address_rules`: any other
        // lookup would carry the name to whoever serves its zone, for nothing.
        if let Host::Name(name) = &target.host {
            if outcome.needs_addresses
                && outcome.decision.verdict == Verdict::Deny
                && !sandbox.binding.network.resolve_for_address_rules
                && !self.in_address_rule_zone(name)
                && !self.static_names.contains(&**name)
            {
                outcome.needs_addresses = false;
                outcome.outside_zones = true;
            }
        }
        outcome
    }

    /// A grant's decision, when the sandbox's own policy refused `target` for want of a rule
    /// (`no_rule_matched`, `port_not_allowed`) and a grant in force covers it.
    fn granted(
        &self,
        sandbox: &Sandbox,
        target: &Target,
        addrs: Option<&[IpAddr]>,
        own: &Outcome,
    ) -> Option<Outcome> {
        if self.grants.is_empty()
            || own.decision.verdict == Verdict::Allow
            || !matches!(
                own.decision.reason,
                Reason::NoRuleMatched | Reason::PortNotAllowed | Reason::ProcessNotAllowed
            )
        {
            return None;
        }
        let grants = self.grants.get(sandbox.binding.id.as_str())?;
        let grant = grants.find(target, std::time::SystemTime::now())?;
        let decision =
            crate::policy::Decision::allow(Reason::GrantMatched, Some(grant.rule.clone()));
        Some(
            sandbox
                .policy
                .decide_granted(decision, target, addrs, &self.guard),
        )
    }

    /// The grant that made `decision` (a `grant_matched` one) for `sandbox`.
    pub fn grant_of(
        &self,
        sandbox: &Sandbox,
        decision: &crate::policy::Decision,
    ) -> Option<&Arc<crate::policy::granted::GrantEntry>> {
        if decision.reason != Reason::GrantMatched {
            return None;
        }
        let rule = decision.rule.as_ref()?;
        self.grants_of(sandbox.binding.id.as_str())?.by_rule(rule)
    }

    /// The grants of sandbox `id`, if it has any.
    pub fn grants_of(&self, id: &str) -> Option<&Arc<Granted>> {
        self.grants.get(id)
    }

    /// What the DNS listener may tell `sandbox` about `name`: address rules count only for
    /// names that [`PolicySet::decide`] would resolve for them.
    pub fn dns_view(&self, sandbox: &Sandbox, name: &str) -> NameView {
        let view = self.dns_view_own(sandbox, name);
        if let NameView::Refused(d) = &view {
            if matches!(d.reason, Reason::NoRuleMatched | Reason::PortNotAllowed) {
                let now = std::time::SystemTime::now();
                if let Some(g) = self
                    .grants_of(sandbox.binding.id.as_str())
                    .and_then(|g| g.names(name, now))
                {
                    return NameView::Named(g.rule.clone());
                }
            }
        }
        view
    }

    fn dns_view_own(&self, sandbox: &Sandbox, name: &str) -> NameView {
        match sandbox.policy.name_view(name) {
            NameView::AddressRules
                if !sandbox.binding.network.resolve_for_address_rules
                    && !self.in_address_rule_zone(name)
                    && !self.static_names.contains(name) =>
            {
                NameView::Refused(crate::policy::Decision::deny(
                    crate::policy::reason::Reason::NoRuleMatched,
                    None,
                ))
            }
            v => v,
        }
    }

    /// `name` is one of `dns.address_rule_zones` or under one.
    pub fn in_address_rule_zone(&self, name: &str) -> bool {
        self.zones.iter().any(|z| {
            name == z
                || (name.len() > z.len()
                    && name.ends_with(z.as_str())
                    && name.as_bytes()[name.len() - z.len() - 1] == b'.')
        })
    }
}

/// The grants of `previous` whose sandbox is still in `sandboxes` (a reload keeps them).
fn carried_grants(
    previous: Option<&PolicySet>,
    sandboxes: &imbl::HashMap<SandboxId, Arc<Sandbox>>,
) -> imbl::HashMap<SandboxId, Arc<Granted>> {
    previous
        .map(|p| {
            p.grants
                .iter()
                .filter(|(id, _)| sandboxes.contains_key(*id))
                .map(|(id, g)| (id.clone(), g.clone()))
                .collect()
        })
        .unwrap_or_default()
}

mod digest;
mod edit;
pub use edit::SetEdit;
#[cfg(test)]
mod tests;
