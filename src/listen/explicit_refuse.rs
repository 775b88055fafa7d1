//! How the explicit proxy refuses a request: the audit guard records the decision, the
//! client gets the §6 deny response ([`crate::relay::deny`]) — as JSON, with the parsed
//! target and the rule, to an agent that asked for it.

use http::{Method, Request};
use hyper::body::Incoming;

use super::explicit::read_target;
use crate::audit::AuditGuard;
use crate::policy::Decision;
use crate::relay::body::Body;
use crate::relay::deny::{self, Wording};
use crate::runtime::Shared;
use crate::sandboxes::set::Sandbox;

/// The text shown for a request in refusals: method and target with its port, never
/// credentials (userinfo) or the query.
pub(super) fn describe(req: &Request<Incoming>) -> String {
    let u = req.uri();
    let host_port = u.authority().map(|a| match a.port_u16() {
        Some(p) => format!("{}:{p}", a.host()),
        None => a.host().to_string(),
    });
    if req.method() == Method::CONNECT {
        return format!("CONNECT {}", host_port.as_deref().unwrap_or("?"));
    }
    match (u.scheme_str(), host_port) {
        (Some(scheme), Some(hp)) => format!("{} {scheme}://{hp}{}", req.method(), u.path()),
        // Origin-form (`GET /`): not a proxy request.
        _ => format!("{} {}", req.method(), u.path()),
    }
}

/// Refuse a request: the guard records the decision, the client gets the §6 response.
pub(super) fn refuse(
    shared: &Shared,
    mut audit: AuditGuard,
    req: &Request<Incoming>,
    sandbox: Option<&Sandbox>,
    decision: Decision,
    explanation: String,
    retry_after: Option<u64>,
) -> http::Response<Body> {
    audit.decision(&decision);
    refuse_as(
        shared,
        audit,
        req,
        sandbox,
        &decision,
        explanation,
        retry_after,
    )
}

/// Answer with `shown` (the guard keeps whatever decision it was given).
pub(super) fn refuse_as(
    shared: &Shared,
    audit: AuditGuard,
    req: &Request<Incoming>,
    sandbox: Option<&Sandbox>,
    shown: &Decision,
    explanation: String,
    retry_after: Option<u64>,
) -> http::Response<Body> {
    drop(audit);
    let refusal = Wording {
        reason: shown.reason,
        what: &describe(req),
        sandbox: sandbox.map(|s| s.binding.id.as_str()),
        explanation: &explanation,
        retry_after,
        ask: shared.ask(),
    };
    // An agent that asked for JSON gets the refusal as an object (its target parsed again:
    // only on this path, and only for it).
    if !deny::wants_json(req.headers()) {
        return deny::response(&refusal);
    }
    let target = read_target(req).ok();
    let structured = deny::Structured {
        target: target.as_ref(),
        rule: shown.rule.as_ref().map(|r| &*r.text),
    };
    deny::response_to(&refusal, Some(structured))
}
