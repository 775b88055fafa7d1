//! The decision report shared by `egress-proxy check` and `POST /v1/check`: decide on a
//! target for a sandbox — resolving a name when a resolver is given, exactly as the data plane
//! would — and describe the result as JSON (`decision, reason, rule, rule_source, sandbox,
//! target, enforcement`, plus `explanation`, `resolved`, `dial`, `policy_version`).

use serde_json::{json, Value};

use crate::policy::Decision;
use crate::policy_set::{PolicySet, Sandbox};
use crate::resolve::Resolver;
use crate::target::{Host, Target};

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
    let mut outcome = set.decide(sb, &target, None);
    let mut resolved: Option<Value> = None;
    let mut consulted = matches!(target.host, Host::Ip(_));
    if let (Some(r), Host::Name(name), true) = (resolver, &target.host, outcome.needs_addresses) {
        consulted = true;
        match r.resolve(name).await {
            Ok(addrs) => {
                resolved = Some(json!(addrs
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()));
                outcome = set.decide(sb, &target, Some(&addrs));
            }
            Err(e) => {
                resolved = Some(json!({ "error": e.to_string() }));
                outcome.decision = Decision::deny(e.reason(), None);
            }
        }
    }
    let d = &outcome.decision;
    let mut explanation = d.explain(sandbox, sb.policy.file(), target.port);
    if resolver.is_none() && outcome.needs_addresses && !d.verdict.proceeds() {
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
    if let Some(r) = resolved {
        out["resolved"] = r;
    }
    if consulted {
        out["dial"] = json!(outcome
            .dial
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>());
    }
    out
}
