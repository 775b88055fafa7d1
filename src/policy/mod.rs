//! The policy engine: a sandbox's `network.egress` / `network.deny` entries compiled into
//! matchers, and `decide`, which turns a target (and, once resolved, its addresses) into a
//! [`Decision`] plus the list of addresses that may be dialled.
//!
//! Order of evaluation (DESIGN §2): deny rules → mode → name rules → address rules → the
//! address guard. The reason reported is the first step that refused. Report mode relaxes the
//! allowlist steps only; the guard always applies. This module does no I/O.

pub(crate) mod addr_table;
pub mod cause;
mod compact_map;
pub mod decision;
pub mod dns_view;
pub mod entry;
pub mod flows;
pub mod git_http;
pub mod granted;
pub mod guard;
pub mod hostname;
pub mod http_rules;
pub mod layer;
pub mod name_matcher;
pub mod ports;
pub mod process;
pub mod protocols;
pub mod reason;
pub mod refusal;
mod rule_source;
pub mod sandbox_id;
mod scoped;
pub mod service_ports;
pub mod target;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

pub use crate::policy::rule_source::{ListKind, RuleSource, Spell};

use crate::policy::addr_table::AddrTable;
use crate::policy::guard::{address_forms, Guard, GuardVerdict};
use crate::policy::target::{Host, Target};
pub use decision::{Decision, Reason, Verdict};

/// Why a piece of the rule grammar (a port list, an HTTP rule, a bound host) was refused; the
/// message is meant for the operator who wrote it.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct ParseError(pub cause::Why);

/// Two parse errors are the same when they say the same (their causes are not comparable).
impl PartialEq for ParseError {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ParseError {}
use entry::{Entry, HostPattern};
use name_matcher::{NameMatcher, NameMatcherBuilder};
use ports::PortSet;

/// `network.mode` (seed-002 compatible).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Only what the allowlist names.
    Restricted,
    /// Nothing at all.
    DenyAll,
    /// Everything but `network.deny` and the guard.
    AllowAll,
}

impl Mode {
    /// The name written in configuration and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Restricted => "restricted",
            Mode::DenyAll => "deny-all",
            Mode::AllowAll => "allow-all",
        }
    }
}

/// Whether would-be denials are enforced or only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Refusals are enforced.
    #[default]
    Enforce,
    /// Refusals that may be are only reported (`decision: report`).
    Report,
}

impl Enforcement {
    /// The name written in configuration and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Enforce => "enforce",
            Enforcement::Report => "report",
        }
    }
}

/// One compiled rule: its text as written, effective ports, and provenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The entry as written.
    pub text: String,
    /// The ports it allows.
    pub ports: PortSet,
    /// Where it was written.
    pub source: RuleSource,
    /// What flows may be a protocol the proxy cannot read (opaque TCP): the entry declares it
    /// (`tcp://db.internal:5432`) or is an address or range. Any other entry — with a port
    /// or without — allows only TLS or HTTP the proxy reads and checks.
    pub allows_opaque: bool,
}

/// The network part of a sandbox, parsed and ready to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkSpec {
    /// Restricted, deny-all or allow-all.
    pub mode: Mode,
    /// (entry text, parsed entry) in file order.
    pub egress: Vec<(String, Entry)>,
    /// The `network.deny` entries, each as written and parsed.
    pub deny: Vec<(String, Entry)>,
    /// `network.resolve_for_address_rules`: any name may be resolved to try address rules.
    pub resolve_for_address_rules: bool,
    /// `network.http`: method/path rules on terminated hosts.
    pub http: std::sync::Arc<[http_rules::HttpRule]>,
    /// `network.scoped`: egress entries for some processes only.
    pub scoped: Vec<ScopedSpec>,
    /// The layers above the sandbox, root first ([`layer`]): empty without `layer:`.
    pub layers: Arc<[Arc<layer::Layer>]>,
    /// `network.flows`: labels and the rules over them ([`flows`]); `None`: no flow rules.
    pub flows: Option<Arc<flows::Flows>>,
}

/// One `network.scoped` entry: egress entries allowed to the processes of a scope only.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopedSpec {
    /// Which processes.
    pub scope: process::Scope,
    /// (entry text, parsed entry) in file order.
    pub egress: Vec<(String, Entry)>,
}

/// One list (egress or deny) compiled.
#[derive(Debug, Default)]
struct RuleSet {
    names: NameMatcher,
    addrs: AddrTable<Arc<Rule>>,
    /// The same address rules' networks.
    nets: AddrTable<IpNet>,
    /// Match address rules against embedded IPv4 forms too (deny rules only).
    match_embedded: bool,
    /// The distinct port sets of its address rules (a name is resolved to try them only for a
    /// port one of them allows).
    addr_ports: Vec<PortSet>,
}

impl RuleSet {
    fn compile(
        entries: &[(String, Entry)],
        list: ListKind,
        file: &Arc<str>,
        sandbox: &Arc<str>,
        default_ports: &PortSet,
    ) -> Result<Self, globset::Error> {
        let mut set = RuleSet {
            match_embedded: matches!(list, ListKind::Deny | ListKind::LayerDeny),
            ..RuleSet::default()
        };
        let mut names = NameMatcherBuilder::default();
        for (index, (text, entry)) in entries.iter().enumerate() {
            // Deny rules without a port refuse every port; egress rules get the defaults.
            let ports = match (&entry.ports, list) {
                (Some(p), _) => p.clone(),
                (None, ListKind::Deny | ListKind::LayerDeny) => PortSet::any(),
                (None, _) => default_ports.clone(),
            };
            let allows_opaque =
                entry.opaque || matches!(entry.host, HostPattern::Net(_) | HostPattern::Localhost);
            let rule = Arc::new(Rule {
                text: text.clone(),
                allows_opaque,
                ports,
                source: RuleSource {
                    file: file.clone(),
                    sandbox: sandbox.clone(),
                    list,
                    index,
                },
            });
            match &entry.host {
                HostPattern::Exact(n) => names.add_exact(n, rule),
                HostPattern::Subdomains(s) => names.add_suffix(s, false, rule),
                HostPattern::ApexAndSubdomains(s) => names.add_suffix(s, true, rule),
                HostPattern::Glob {
                    pattern,
                    fixed_suffix,
                } => names.add_glob(pattern, fixed_suffix, rule),
                HostPattern::Net(net) => {
                    if !set.addr_ports.contains(&rule.ports) {
                        set.addr_ports.push(rule.ports.clone());
                    }
                    set.nets.insert(*net, *net);
                    set.addrs.insert(*net, rule)
                }
                HostPattern::Localhost => {
                    if !set.addr_ports.contains(&rule.ports) {
                        set.addr_ports.push(rule.ports.clone());
                    }
                    names.add_exact("localhost", rule.clone());
                    let v4 = IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8));
                    let v6 = IpNet::V6(Ipv6Net::from(Ipv6Addr::LOCALHOST));
                    set.addrs.insert(v4, rule.clone());
                    set.addrs.insert(v6, rule);
                    set.nets.insert(v4, v4);
                    set.nets.insert(v6, v6);
                }
            }
        }
        set.names = names.build()?;
        set.addrs.shrink_to_fit();
        set.nets.shrink_to_fit();
        Ok(set)
    }

    /// The best address rule for `ip:port`: (rule allowing the port, rule matching any port).
    /// Deny rules are matched against every form of the address (the canonical one and any
    /// IPv4 address embedded in it: NAT64, 6to4, Teredo); allow rules against the canonical
    /// address only, so that `8.8.8.8` never allows a 6to4 /48 or a Teredo address that
    /// merely embeds it.
    fn addr_lookup(&self, ip: IpAddr, port: u16) -> (Option<&Arc<Rule>>, Option<&Arc<Rule>>) {
        let mut any = None;
        let canonical = ip.to_canonical();
        let forms: Vec<IpAddr> = if self.match_embedded {
            address_forms(ip).collect()
        } else {
            vec![canonical]
        };
        for form in forms {
            for r in self.addrs.matches(form) {
                if r.ports.contains(port) {
                    return (Some(r), Some(r));
                }
                any.get_or_insert(r);
            }
        }
        (None, any)
    }

    fn covers_any_port(&self, ip: IpAddr) -> bool {
        self.addrs.contains(ip.to_canonical())
    }

    /// The networks of the address rules that cover the canonical `ip` on any port (the
    /// guard opens a prohibited range only for a rule inside it).
    pub(crate) fn covering(&self, ip: IpAddr) -> impl Iterator<Item = IpNet> + '_ {
        self.nets.matches(ip.to_canonical()).copied()
    }
}

/// A sandbox's compiled network policy.
#[derive(Debug)]
pub struct CompiledPolicy {
    sandbox: Arc<str>,
    /// The file the policy block was written in (for "which file to change").
    file: Arc<str>,
    mode: Mode,
    enforcement: Enforcement,
    allow: RuleSet,
    deny: RuleSet,
    /// `network.scoped`: each scope with its entries.
    scoped: Vec<(process::Scope, RuleSet)>,
    /// The layers above it, root first (compiled once, shared by every member).
    layers: Arc<[Arc<layer::Layer>]>,
}

/// Everything `decide` found out.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The verdict and its reason.
    pub decision: Decision,
    /// Addresses that passed the guard, in resolver order (only when addresses were given).
    pub dial: Vec<IpAddr>,
    /// Addresses the guard refused, with its verdict.
    pub refused: Vec<(IpAddr, GuardVerdict)>,
    /// True when no addresses were given and the decision cannot be final without them
    /// (a name target that is allowed, reported, or may still be allowed by address rules).
    pub needs_addresses: bool,
    /// Address rules might have allowed the name, but it was not resolved to try them: it is
    /// outside `dns.address_rule_zones` (and `network.resolve_for_address_rules` is off).
    pub outside_zones: bool,
}

impl CompiledPolicy {
    /// Compile one sandbox's network spec.
    pub fn compile(
        sandbox: &str,
        file: &str,
        spec: &NetworkSpec,
        enforcement: Enforcement,
        default_ports: &PortSet,
    ) -> Result<Self, globset::Error> {
        let sb: Arc<str> = sandbox.into();
        let f: Arc<str> = file.into();
        let mut scoped = Vec::with_capacity(spec.scoped.len());
        for (i, s) in spec.scoped.iter().enumerate() {
            let list = ListKind::Scoped(i);
            let rules = RuleSet::compile(&s.egress, list, &f, &sb, default_ports)?;
            scoped.push((s.scope.clone(), rules));
        }
        Ok(CompiledPolicy {
            scoped,
            layers: spec.layers.clone(),
            allow: RuleSet::compile(&spec.egress, ListKind::Egress, &f, &sb, default_ports)?,
            deny: RuleSet::compile(&spec.deny, ListKind::Deny, &f, &sb, default_ports)?,
            sandbox: sb,
            file: f,
            mode: spec.mode,
            enforcement,
        })
    }

    /// The scope of a `network.scoped` entry's rule (none for any other rule).
    pub fn scope_of(&self, rule: &Rule) -> Option<&process::Scope> {
        match rule.source.list {
            ListKind::Scoped(i) => self.scoped.get(i).map(|(s, _)| s),
            _ => None,
        }
    }

    /// Whether it has `network.scoped` entries.
    pub fn has_scopes(&self) -> bool {
        !self.scoped.is_empty()
    }

    /// The sandbox this policy is of.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }
    /// The file it was read from.
    pub fn file(&self) -> &str {
        &self.file
    }
    /// Its network mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }
    /// Whether refusals are enforced or reported.
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }

    /// Decide on `target`. `addrs` is `None` before resolution (name targets are then decided
    /// by name rules alone) and the resolved addresses after; IP-literal targets need none.
    pub fn decide(&self, target: &Target, addrs: Option<&[IpAddr]>, guard: &Guard) -> Outcome {
        self.decide_for(None, target, addrs, guard)
    }

    /// [`CompiledPolicy::decide`] for a connection of `process`: `network.scoped` entries
    /// whose scope admits it allow too (none does for an unknown process).
    pub fn decide_for(
        &self,
        process: Option<&process::Process>,
        target: &Target,
        addrs: Option<&[IpAddr]>,
        guard: &Guard,
    ) -> Outcome {
        with_literal(target, addrs, |addrs| {
            let (policy, pending) = self.policy_step(target, addrs);
            let (policy, pending) = match self.scoped.is_empty() {
                true => (policy, pending),
                false => scoped::step(&self.scoped, process, target, addrs, policy, pending),
            };
            let policy = layer::narrow(&self.layers, policy, target, addrs);
            self.finish(policy, pending, target, addrs, guard, |a| {
                self.allow.covering(a)
            })
        })
    }

    /// Decide on `target` for a grant ([`granted`]) of this sandbox: the grant's decision,
    /// then the guard as for any rule — except that a grant opens no prohibited range, even
    /// where an address rule of the sandbox does.
    pub fn decide_granted(
        &self,
        decision: Decision,
        target: &Target,
        addrs: Option<&[IpAddr]>,
        guard: &Guard,
    ) -> Outcome {
        with_literal(target, addrs, |addrs| {
            let decision = layer::narrow(&self.layers, decision, target, addrs);
            self.finish(decision, false, target, addrs, guard, |_| None)
        })
    }

    /// The layers' refusal of `target` by name (or its literal address): a `deny` of a layer,
    /// or a ceiling it is outside of. What an access request and a grant are judged by.
    pub fn layers_refuse(&self, target: &Target) -> Option<Decision> {
        let allowed = Decision::allow(Reason::RuleMatched, None);
        let d = with_literal(target, None, |addrs| {
            layer::narrow(&self.layers, allowed, target, addrs)
        });
        (d.verdict == Verdict::Deny).then_some(d)
    }

    /// The layers above this sandbox, root first.
    pub fn layers(&self) -> &[Arc<layer::Layer>] {
        &self.layers
    }

    /// What follows the policy step: report mode, then every address through the guard.
    fn finish<I: IntoIterator<Item = IpNet>>(
        &self,
        policy: Decision,
        pending: bool,
        target: &Target,
        addrs: Option<&[IpAddr]>,
        guard: &Guard,
        covering: impl Fn(IpAddr) -> I,
    ) -> Outcome {
        let mut outcome = Outcome {
            decision: policy,
            dial: Vec::new(),
            refused: Vec::new(),
            needs_addresses: false,
            outside_zones: false,
        };
        // Report mode relaxes the sandbox's own allowlist refusals only, never a layer's.
        let by_layer = (outcome.decision.rule.as_ref()).is_some_and(|r| r.source.list.is_layer());
        if outcome.decision.verdict == Verdict::Deny
            && self.enforcement == Enforcement::Report
            && outcome.decision.reason.reportable()
            && !by_layer
        {
            outcome.decision.verdict = Verdict::Report;
        }
        let Some(addrs) = addrs else {
            outcome.needs_addresses = outcome.decision.verdict.proceeds() || pending;
            return outcome;
        };
        if !outcome.decision.verdict.proceeds() {
            return outcome;
        }
        for ip in addrs {
            match guard.check(*ip, target.port, &covering) {
                GuardVerdict::Permit => outcome.dial.push(*ip),
                v => outcome.refused.push((*ip, v)),
            }
        }
        if outcome.dial.is_empty() {
            let reason = if addrs.is_empty() {
                Reason::DestinationNotFound
            } else if outcome
                .refused
                .iter()
                .any(|(_, v)| *v == GuardVerdict::Loop)
            {
                Reason::ProxyLoop
            } else {
                Reason::DestinationIpProhibited
            };
            outcome.decision = Decision::deny(reason, None);
        }
        outcome
    }

    /// Deny rules, mode, name rules, address rules. Returns the decision and, when no
    /// addresses were given, whether address rules could still allow the target.
    fn policy_step(&self, target: &Target, addrs: Option<&[IpAddr]>) -> (Decision, bool) {
        let port = target.port;
        // 1. Deny rules: names, then every address.
        if let Host::Name(name) = &target.host {
            if let Some(r) = self.deny.names.lookup(name, port).with_port {
                return (Decision::deny(Reason::DeniedByRule, Some(r.clone())), false);
            }
        }
        for ip in addrs.unwrap_or(&[]) {
            if let (Some(r), _) = self.deny.addr_lookup(*ip, port) {
                return (Decision::deny(Reason::DeniedByRule, Some(r.clone())), false);
            }
        }
        // 2. Mode.
        match self.mode {
            Mode::DenyAll => return (Decision::deny(Reason::DenyAllMode, None), false),
            Mode::AllowAll => return (Decision::allow(Reason::AllowAllMode, None), false),
            Mode::Restricted => {}
        }
        // 3. Name rules (never for IP literals).
        let mut near_miss: Option<Arc<Rule>> = None;
        if let Host::Name(name) = &target.host {
            let hit = self.allow.names.lookup(name, port);
            if let Some(r) = hit.with_port {
                return (Decision::allow(Reason::RuleMatched, Some(r.clone())), false);
            }
            near_miss = hit.name_only.cloned();
        }
        // 4. Address rules: every address must be covered, with the port.
        let refuse = |near: Option<Arc<Rule>>| match near {
            Some(r) => Decision::deny(Reason::PortNotAllowed, Some(r)),
            None => Decision::deny(Reason::NoRuleMatched, None),
        };
        let Some(addrs) = addrs else {
            // Address rules could allow it only if one of them allows this port.
            let pending = self.allow.addr_ports.iter().any(|p| p.contains(port));
            return (refuse(near_miss), pending);
        };
        if addrs.is_empty() || self.allow.addrs.is_empty() {
            return (refuse(near_miss), false);
        }
        let mut first: Option<Arc<Rule>> = None;
        for ip in addrs {
            match self.allow.addr_lookup(*ip, port) {
                (Some(r), _) => {
                    first.get_or_insert_with(|| r.clone());
                }
                (None, any) => return (refuse(near_miss.or_else(|| any.cloned())), false),
            }
        }
        (Decision::allow(Reason::RuleMatched, first), false)
    }
}

/// Call `f` with the addresses to decide on: an IP-literal target's own address, else `addrs`.
fn with_literal<R>(
    target: &Target,
    addrs: Option<&[IpAddr]>,
    f: impl FnOnce(Option<&[IpAddr]>) -> R,
) -> R {
    match &target.host {
        Host::Ip(ip) => f(Some(&[*ip])),
        Host::Name(_) => f(addrs),
    }
}

#[cfg(test)]
mod tests;
