//! Auto-approval (`approvals.auto`): a request is approved without a person only when a
//! pattern the operator listed covers it and nothing about it adds dangerous reach. The
//! checks, each recorded by name in the approval record (`checks`):
//! - `pattern`: an `approvals.auto` entry allows the host and port;
//! - `not_denied`: `network.deny` does not cover it (checked again: it is refused at the door);
//! - `not_brokered`: no credential or HTTP rule is bound to the host (likewise);
//! - `registrable`: the pattern is not a wildcard above a registrable domain — its fixed
//!   suffix has a registrable domain on the public suffix list, private section included
//!   (`*.github.io` covers other people's sites);
//! - `public_addresses`: the name resolves, and every address passes the guard.
//!
//! A check that fails leaves the request pending for a person, with the failure recorded.

use std::net::IpAddr;

use crate::config::approvals::ApprovalsConfig;
use crate::egress::resolve::Resolver;
use crate::policy::entry::HostPattern;
use crate::policy::guard::GuardVerdict;
use crate::policy::ports::PortSet;
use crate::policy::target::{Host, Target};
use crate::policy::{CompiledPolicy, Enforcement, Mode, NetworkSpec, Verdict};
use crate::sandboxes::set::PolicySet;

/// What the checks found: whether all passed, and each one's line.
#[derive(Debug, Default)]
pub struct Checks {
    /// Whether every check passed (the request is approved at once).
    pub passed: bool,
    /// One line per check, for the record and the person.
    pub lines: Vec<String>,
}

/// Compile `approvals.auto` as a policy of its own (`None` without patterns).
pub fn compile(cfg: &ApprovalsConfig, default_ports: &PortSet) -> Option<CompiledPolicy> {
    if cfg.auto.is_empty() {
        return None;
    }
    let spec = NetworkSpec {
        mode: Mode::Restricted,
        egress: cfg.auto.clone(),
        deny: Vec::new(),
        resolve_for_address_rules: false,
        http: Vec::new().into(),
        scoped: Vec::new(),
        layers: Default::default(),
        flows: None,
    };
    CompiledPolicy::compile(
        "approvals.auto",
        "approvals.auto",
        &spec,
        Enforcement::Enforce,
        default_ports,
    )
    .ok()
}

/// Run the checks for `target`; `terminated`: the sandbox's tunnels to it are terminated.
pub async fn check(
    auto: &CompiledPolicy,
    cfg: &ApprovalsConfig,
    set: &PolicySet,
    own_denied: bool,
    terminated: bool,
    target: &Target,
    resolver: &Resolver,
) -> Checks {
    let mut c = Checks::default();
    let d = auto.decide(target, None, &set.guard);
    let Some(rule) = d
        .decision
        .rule
        .filter(|_| d.decision.verdict == Verdict::Allow)
    else {
        c.lines
            .push("pattern: no approvals.auto entry covers it".into());
        return c;
    };
    c.lines.push(format!("pattern: `{}`", rule.text));
    if own_denied {
        c.lines.push("not_denied: failed (network.deny)".into());
        return c;
    }
    c.lines.push("not_denied: passed".into());
    if terminated {
        c.lines
            .push("not_brokered: failed (a credential or HTTP rule is bound)".into());
        return c;
    }
    c.lines.push("not_brokered: passed".into());
    let entry = cfg
        .auto
        .iter()
        .find(|(t, _)| *t == rule.text)
        .map(|(_, e)| e);
    if let Some(suffix) = entry.and_then(|e| wildcard_suffix(&e.host)) {
        if psl::domain_str(suffix).is_none() {
            c.lines.push(format!(
                "registrable: failed (`{}` is a wildcard above registrable domains: {suffix} is a public suffix)",
                rule.text
            ));
            return c;
        }
    }
    c.lines.push("registrable: passed".into());
    let (passed, line) = match public_addresses(target, set, resolver).await {
        Ok(checked) => (
            true,
            format!("public_addresses: passed ({checked} checked)"),
        ),
        Err(why) => (false, format!("public_addresses: failed ({why})")),
    };
    c.lines.push(line);
    c.passed = passed;
    c
}

/// Why the public-addresses check failed.
enum NotPublic {
    /// The name has no address.
    NoAddresses,
    /// The lookup failed (its reason's code).
    Lookup(&'static str),
    /// The address guard prohibits this one.
    Prohibited(IpAddr),
}

impl std::fmt::Display for NotPublic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotPublic::NoAddresses => f.write_str("no addresses"),
            NotPublic::Lookup(code) => f.write_str(code),
            NotPublic::Prohibited(ip) => write!(f, "{ip} is prohibited by the address guard"),
        }
    }
}

/// Every address `target` resolves to is one the address guard permits: how many were
/// checked, or why not.
async fn public_addresses(
    target: &Target,
    set: &PolicySet,
    resolver: &Resolver,
) -> Result<usize, NotPublic> {
    let addrs: Vec<IpAddr> = match &target.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(n) => match resolver.resolve(n).await {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => return Err(NotPublic::NoAddresses),
            Err(e) => return Err(NotPublic::Lookup(e.reason().code())),
        },
    };
    for ip in &addrs {
        if set.guard.check(*ip, target.port, |_| None) != GuardVerdict::Permit {
            return Err(NotPublic::Prohibited(*ip));
        }
    }
    Ok(addrs.len())
}

/// The fixed suffix of a wildcard pattern (`None`: not a wildcard).
fn wildcard_suffix(h: &HostPattern) -> Option<&str> {
    match h {
        HostPattern::Subdomains(s) | HostPattern::ApexAndSubdomains(s) => Some(s),
        HostPattern::Glob { fixed_suffix, .. } => Some(fixed_suffix.trim_start_matches('.')),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::entry::parse_entry;

    #[test]
    fn a_wildcard_on_a_private_public_suffix_is_above_registrable_domains() {
        let s = |t: &str| wildcard_suffix(&parse_entry(t).unwrap().host).map(str::to_string);
        let github_io = s("*.github.io").unwrap();
        assert!(psl::domain_str(&github_io).is_none(), "{github_io}");
        let example = s("*.example.com").unwrap();
        assert!(psl::domain_str(&example).is_some());
        assert!(s("api.example.com").is_none());
    }
}
