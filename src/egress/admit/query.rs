//! The sequence for a DNS query, which carries no credential and holds no connection: who
//! asks (the source address's sandbox, else the default one — identified once per query),
//! its query rate, what the policy lets it learn about the name (report mode included), and
//! which resolved addresses it may be told — each step recorded on the query's guard. The DNS
//! listener keeps only the wire format: rcodes, Extended DNS Errors, TTLs and records.

use std::net::IpAddr;

use crate::audit::metrics::Metrics;
use crate::audit::AuditGuard;
use crate::egress::identity::{self, Identified};
use crate::egress::limits::Limiters;
use crate::policy::dns_view::NameView;
use crate::policy::reason::Reason;
use crate::policy::{Decision, Enforcement, ListKind, Verdict};
use crate::sandboxes::set::{PolicySet, Sandbox};

use crate::egress::handles::Handles;

/// Step 1 for a query: the sandbox of the source address, else the default one
/// (`listen.default_sandbox`).
pub fn query_asker(
    set: &PolicySet,
    default_sandbox: Option<&str>,
    source: IpAddr,
) -> Result<Identified, identity::Unidentified> {
    identity::identify(set, None, source, default_sandbox)
}

/// Step 2 for a query: the sandbox's query rate (`limits.dns_queries_per_second`), a refusal
/// counted under `egress_rate_limited_total{limit="dns"}` when `count` (a repeat served from
/// a cache leaves the refusal to the full way, which counts and records it).
pub fn query_rate(
    limiters: &Limiters,
    metrics: &Metrics,
    sb: &Sandbox,
    count: bool,
) -> Result<(), RateRefused> {
    if sb.limiter(limiters).admit_query(limiters.now()).is_ok() {
        return Ok(());
    }
    if count {
        metrics.rate_limited(&sb.binding.id, "dns");
    }
    Err(RateRefused)
}

/// Over a sandbox's query rate.
#[derive(Debug, Clone, Copy)]
pub struct RateRefused;

/// Steps 1 and 2 on the query's record: `who` (identified once, by the listener) is recorded,
/// then its rate is taken. `Err`: the refusal, recorded — an unidentified source in its
/// source's periodic sum, a sandbox over its rate as `rate_limited`.
pub fn query_enter(
    who: Result<Identified, identity::Unidentified>,
    limiters: &Limiters,
    metrics: &Metrics,
    q: &mut AuditGuard,
) -> Result<Identified, Decision> {
    let who = match who {
        Ok(w) => w,
        Err(refused) => {
            let d = Decision::deny(refused.reason, None);
            q.identity_refused(refused.method);
            q.decision(&d);
            q.aggregated();
            return Err(d);
        }
    };
    q.asked_by(who.sandbox.binding.id.clone(), who.method);
    if query_rate(limiters, metrics, &who.sandbox, true).is_err() {
        let d = Decision::deny(Reason::RateLimited, None);
        q.decision(&d);
        q.detail("over limits.dns_queries_per_second");
        return Err(d);
    }
    Ok(who)
}

/// What the policy lets a sandbox learn about a name.
#[derive(Debug, Clone)]
pub struct NameAllowed {
    /// The decision recorded (allow, or report in report mode).
    pub decision: Decision,
    /// Only address rules could allow it: every address it resolves to must be covered.
    pub address_only: bool,
}

/// Step 3 for a query: what the policy lets `sb` learn about `name`, recorded. In report mode
/// a reportable refusal is answered, recorded `report`. `Err` with the refusal, recorded.
pub fn query_name(
    set: &PolicySet,
    sb: &Sandbox,
    name: &str,
    q: &mut AuditGuard,
) -> Result<NameAllowed, Decision> {
    let report = sb.binding.enforcement == Enforcement::Report;
    let (decision, address_only) = match set.dns_view(sb, name) {
        NameView::Named(rule) => {
            let granted = rule.source.list == ListKind::Grant;
            let reason = [Reason::RuleMatched, Reason::GrantMatched][usize::from(granted)];
            (Decision::allow(reason, Some(rule)), false)
        }
        NameView::AllowAll => (Decision::allow(Reason::AllowAllMode, None), false),
        NameView::AddressRules => (Decision::allow(Reason::RuleMatched, None), true),
        NameView::Refused(d) if report && d.reason.reportable() => {
            let reported = Decision {
                verdict: Verdict::Report,
                ..d
            };
            (reported, false)
        }
        NameView::Refused(d) => {
            q.decision(&d);
            return Err(d);
        }
    };
    q.decision(&decision);
    Ok(NameAllowed {
        decision,
        address_only,
    })
}

/// A name allowed only by address rules that is refused all the same, recorded with
/// `detail`: it has no addresses, or not every address is covered. Refused alike whether it
/// exists or not, so that the answer is no oracle for internal names.
pub fn query_not_covered(q: &mut AuditGuard, detail: &'static str) -> Decision {
    let d = Decision::deny(Reason::NoRuleMatched, None);
    q.decision(&d);
    q.detail(detail);
    d
}

/// What a sandbox may be told of the addresses a name resolved to.
#[derive(Debug)]
pub enum Told {
    /// These addresses (the guard and deny rules passed them), in the resolver's order.
    Addresses(Vec<IpAddr>),
    /// Allowed only by address rules, and not every address is covered: refused.
    NotCovered(Decision),
    /// Every address is refused (private, metadata, reserved or denied).
    NoneAllowed,
}

/// Step 4 for a query: of the addresses `found`, those `sb` may be told — none the guard or
/// a deny rule refuses, and all of them covered when only address rules allowed the name.
/// Recorded: what was resolved, and why addresses were removed or refused.
pub fn query_addresses(
    set: &PolicySet,
    sb: &Sandbox,
    found: &[IpAddr],
    address_only: bool,
    q: &mut AuditGuard,
) -> Told {
    q.looked_up(found, &[], None);
    if address_only && !found.iter().all(|ip| sb.policy.covers_address(*ip)) {
        let detail = "resolved to try address rules; not every address is covered";
        return Told::NotCovered(query_not_covered(q, detail));
    }
    let kept: Vec<IpAddr> = found
        .iter()
        .copied()
        .filter(|ip| sb.policy.answerable(*ip, &set.guard))
        .collect();
    if kept.is_empty() && !found.is_empty() {
        q.decision(&Decision::deny(Reason::DestinationIpProhibited, None));
        return Told::NoneAllowed;
    }
    if kept.len() < found.len() {
        q.detail("addresses the guard or a deny rule refuses were removed");
    }
    Told::Addresses(kept)
}
