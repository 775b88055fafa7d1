//! The decision report shared by `egress-proxy check` and `POST /v1/check`: the data plane's
//! own [`crate::egress::decide`] — resolving a name when a resolver is given — described as
//! JSON (`decision, reason, rule, rule_source, sandbox, target, enforcement`, plus
//! `explanation`, `resolved`, `dial`, `policy_version`).

use serde_json::{json, Value};

use crate::egress::resolve::Resolver;
use crate::egress::{self, Lookup};
use crate::policy::set::{PolicySet, Sandbox};
use crate::policy::target::{Host, Target};

/// Decide and describe. Without a resolver nothing is looked up: a name is decided by name
/// rules alone, and the explanation says when address rules were not consulted.
pub async fn check(
    set: &PolicySet,
    sb: &Sandbox,
    target_text: &str,
    resolver: Option<&Resolver>,
) -> Value {
    let sandbox = sb.binding.id.as_str();
    let enforcement = sb.policy.enforcement().as_str();
    let target = match Target::parse(target_text, Some(443)) {
        Ok(t) => t,
        // An invalid target is a decision (invalid_target), not a usage error.
        Err(e) => {
            return json!({
                "decision": "deny", "reason": "invalid_target", "rule": null, "rule_source": null,
                "sandbox": sandbox, "target": target_text, "enforcement": enforcement,
                "explanation": format!("invalid target: {e}"), "policy_version": set.version(),
            })
        }
    };
    let lookup = Lookup {
        resolver,
        metrics: None,
    };
    let decided = egress::decide(set, sb, &target, None, lookup).await;
    let d = &decided.decision;
    let mut explanation = d.explain(sandbox, sb.policy.file(), target.port);
    if !decided.addresses_consulted && !d.verdict.proceeds() {
        explanation.push_str(" (address rules not consulted: add --resolve)");
    }
    let mut out = json!({
        "decision": d.verdict.as_str(),
        "reason": d.reason.code(),
        "rule": d.rule.as_ref().map(|r| r.text.clone()),
        "rule_source": d.rule.as_ref().map(|r| r.source.to_string()),
        "sandbox": sandbox,
        "target": target.to_string(),
        "enforcement": enforcement,
        "explanation": explanation,
        "policy_version": set.version(),
    });
    let resolved_name = matches!(target.host, Host::Name(_)) && resolver.is_some();
    if let Some(e) = decided.resolver_error.as_ref().filter(|_| resolved_name) {
        out["resolved"] = json!({ "error": e.to_string() });
    } else if resolved_name && !decided.resolved.is_empty() {
        out["resolved"] = json!(decided
            .resolved
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>());
    }
    if matches!(target.host, Host::Ip(_)) || resolver.is_some() {
        out["dial"] = json!(decided
            .dial
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>());
    }
    out
}

/// `validate`'s warnings for `dns.hosts` names that a sandbox reaches only because an address
/// rule covers every address they resolve to: such a rule allows *every* name that resolves
/// there (a common surprise with loopback and private services).
pub fn address_only_hosts(config: &crate::config::Config, set: &PolicySet) -> Vec<String> {
    use crate::policy::dns_view::NameView;
    let mut out = Vec::new();
    for id in set.ids() {
        let Some(sb) = set.get(id) else { continue };
        for (name, addrs) in &config.dns.hosts {
            let by_address = matches!(sb.policy.name_view(name), NameView::AddressRules)
                && !addrs.is_empty()
                && addrs.iter().all(|a| sb.policy.covers_address(*a));
            if by_address {
                let shown: Vec<String> = addrs.iter().map(ToString::to_string).collect();
                out.push(format!(
                    "sandbox {id}: `{name}` (dns.hosts: {}) is allowed only because an address rule of network.egress covers its addresses; every other name resolving there is allowed too. Add `{name}` as a name rule, or deny the names that must not pass",
                    shown.join(", ")
                ));
            }
        }
    }
    out
}
