//! The decision report shared by `egress-proxy check` and `POST /v1/check`: the data plane's
//! own [`crate::egress::decide`] — resolving a name when a resolver is given — described as
//! JSON (`decision, reason, rule, rule_source, sandbox, target, enforcement`, plus
//! `explanation`, `resolved`, `dial`, `policy_version`).

use serde_json::{json, Value};

use crate::control::error::{invalid, ControlError};
use crate::egress::resolve::Resolver;
use crate::egress::{self, Lookup};
use crate::policy::cause::{caused, of};
use crate::policy::process::{Observed, Process, Seen, Vouched};
use crate::policy::target::{Host, Target};
use crate::sandboxes::set::{PolicySet, Sandbox};
use std::sync::Arc;

/// A target as `check` takes it: `host[:port]`, an address, or a URL
/// (`scheme://host[:port][/path]`, the port defaulting to the scheme's: 80 for `http` and
/// `ws`, 443 for `https` and `wss`). The path does not take part in the network decision. A
/// URL with credentials in it, or another scheme, is invalid.
pub fn parse_target(text: &str) -> Result<Target, ControlError> {
    let Some((scheme, _)) = text.split_once("://") else {
        return Target::parse(text, Some(443)).map_err(|e| invalid(of(e)));
    };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => 80,
        "https" | "wss" => 443,
        other => {
            return Err(invalid(format!(
                "unsupported URL scheme `{other}` (http, https, ws, wss)"
            )))
        }
    };
    let uri: http::Uri = text
        .parse()
        .map_err(|e| invalid(caused("malformed URL", e)))?;
    let authority = uri
        .authority()
        .ok_or_else(|| invalid("a URL without a host"))?;
    if authority.as_str().contains('@') {
        return Err(invalid("a URL with credentials in it"));
    }
    Target::parse(authority.as_str(), Some(default)).map_err(|e| invalid(of(e)))
}

/// The process a check asks about (`network.scoped` entries and scoped `network.http` rules
/// decide by it): an executable and its ancestors as the kernel would show them, and a command
/// the runtime would vouch for. `None` when neither is given (a connection of unknown process).
pub fn asked_process(
    binary: Option<&str>,
    ancestors: &[String],
    exec: Option<&str>,
) -> Option<Process> {
    if binary.is_none() && exec.is_none() {
        return None;
    }
    let observed = binary.map(|exe| {
        Observed::Seen(Arc::new(Seen {
            pid: 0,
            exe: exe.into(),
            ancestors: ancestors.iter().map(|a| Arc::from(a.as_str())).collect(),
            cgroup: None,
            uid: 0,
        }))
    });
    let vouched = exec.map(|e| Vouched {
        exec: e.into(),
        parent: None,
    });
    Some(Process { vouched, observed })
}

/// `POST /v1/check`'s body (`target`, and optionally `binary`, `ancestors`, `exec`) checked.
pub async fn check_json(
    set: &PolicySet,
    sb: &Sandbox,
    body: &Value,
    resolver: Option<&Resolver>,
) -> Value {
    let ancestors: Vec<String> = body["ancestors"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let process = asked_process(body["binary"].as_str(), &ancestors, body["exec"].as_str());
    let target = body["target"].as_str().unwrap_or_default();
    check(set, sb, target, resolver, process.as_ref()).await
}

/// Decide and describe. Without a resolver nothing is looked up: a name is decided by name
/// rules alone, and the explanation says when address rules were not consulted.
pub async fn check(
    set: &PolicySet,
    sb: &Sandbox,
    target_text: &str,
    resolver: Option<&Resolver>,
    process: Option<&Process>,
) -> Value {
    let sandbox = sb.binding.id.as_str();
    let enforcement = sb.policy.enforcement().as_str();
    let target = match parse_target(target_text) {
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
        process,
    };
    let decided = egress::decide(set, sb, &target, None, lookup).await;
    let d = &decided.decision;
    let mut explanation = decided.explain(sandbox, sb.policy.file(), &target);
    if !decided.addresses_consulted && !d.verdict.proceeds() {
        explanation.push_str(" (address rules not consulted: add --resolve)");
    }
    if let Some(scope) = d.rule.as_ref().and_then(|r| sb.policy.scope_of(r)) {
        let who = process.map_or("a connection of unknown process".into(), |p| p.to_string());
        explanation.push_str(&format!(" (the entry's scope: {scope}; asked for: {who})"));
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
    if let Some(f) = sb.binding.network.flows.as_deref() {
        out["flows"] = flows_of(f, &target);
    }
    if !sb.binding.network.layers.is_empty() {
        out["layers"] = layers_of(sb, &target);
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

/// What the sandbox's layers add to its own policy at `target`: the chain (root first), the
/// `network.http` rules of each layer that requests there must pass before the sandbox's own,
/// and the limits in force (its own capped by the layers').
fn layers_of(sb: &Sandbox, target: &Target) -> Value {
    let chain = &sb.binding.network.layers;
    let host = target.host.to_string();
    let http: Vec<Value> = chain
        .iter()
        .flat_map(|l| {
            (l.http.iter())
                .filter(|r| r.host.matches(&host))
                .map(|r| json!({ "layer": &*l.id, "rule": r.text }))
        })
        .collect();
    let limits = crate::egress::layer_limits::bounded(&sb.binding.limits, chain);
    json!({
        "chain": chain.iter().map(|l| &*l.id).collect::<Vec<_>>(),
        "http": http,
        "limits": {
            "bytes_per_day": limits.bytes_per_day,
            "requests_per_day": limits.requests_per_day,
            "tokens_per_day": limits.tokens_per_day,
            "cost_per_day": limits.cost_per_day,
            "max_connections": limits.max_connections,
            "connections_per_second": limits.connections_per_second,
        },
    })
}

/// What the sandbox's flow rules make of `target`: the labels a request there arms (its path
/// unknown, so a member with paths counts), and the rules that would refuse a write (or a
/// read) there once their labels are armed.
fn flows_of(f: &crate::policy::flows::Flows, target: &Target) -> Value {
    use crate::policy::flows::{Act, Dest};
    let host = target.host.to_string();
    let dest = Dest {
        host: &host,
        port: Some(target.port),
        request: None,
    };
    let refusing = |act| {
        let mut by: Vec<usize> = f
            .rules
            .iter()
            .filter_map(|r| f.refusing(r.after, &dest, act).map(|x| x.rule))
            .collect();
        by.dedup();
        by.iter()
            .map(|&i| json!({ "rule": &*f.rules[i].name, "says": f.explain(&f.rules[i]) }))
            .collect::<Vec<_>>()
    };
    json!({
        "arms": f.names(f.arms(&dest)),
        "writes_refused_by": refusing(Act::Write),
        "reads_refused_by": refusing(Act::Read),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_targets_with_their_schemes_port() {
        let t = |s: &str| parse_target(s).map(|t| t.to_string());
        assert_eq!(
            t("https://api.example.com/v1/x?y=1").unwrap(),
            "api.example.com:443"
        );
        assert_eq!(t("http://api.example.com/").unwrap(), "api.example.com:80");
        assert_eq!(
            t("HTTP://Api.Example.com:8080").unwrap(),
            "api.example.com:8080"
        );
        assert_eq!(
            t("wss://[2001:db8::1]/socket").unwrap(),
            "[2001:db8::1]:443"
        );
        assert_eq!(t("api.example.com").unwrap(), "api.example.com:443");
        assert!(t("https://user:pw@api.example.com/").is_err());
        assert!(t("ftp://api.example.com/").is_err());
        assert!(t("https:///path").is_err());
    }
}
