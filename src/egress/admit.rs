//! The one admission sequence. Every data-plane listener parses its own protocol into a
//! [`Door`] (who the client is) and an [`Ask`] (which target, its first bytes if read, the
//! request head of a forwarded request) and calls [`admit`] once; it returns an [`Admitted`]
//! exchange (a checked connection, its clearance and its place under the limits) or a [`Refused`]
//! one, already recorded on the audit guard, that the listener turns into its own answer (an
//! HTTP status, a reset). A listener that must read before it knows the target (transparent
//! mode peeks under the sandbox's limits) calls the two halves: [`enter`] (steps 1-2) gives an
//! [`Entered`] exchange, the only way to [`Entered::admit`] (steps 3-6). In order, each step
//! refusing what it must:
//! 1. identify the sandbox (a certificate; else `Proxy-Authorization`, the source address, the
//!    default sandbox), an address failing to authenticate too often being slowed first;
//! 2. the listener's place under the global cap ([`Seat`]), then the sandbox's limits;
//! 3. decide on the name, resolve once, decide on every address (address rules, the guard) —
//!    directly or for a parent proxy; a nameless transparent connection by a name the DNS
//!    listener gave the sandbox for its destination;
//! 4. the verdict point ([`super::verdict`]): stages that may only narrow;
//! 5. open a checked address (or a parent's tunnel to it; or, for a forwarded request, a kept
//!    connection to one of the addresses just checked);
//! 6. the clearance the relay watches.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Uri};
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::metrics::Metrics;
use crate::audit::{AuditGuard, Close};
use crate::config::upstream::UpstreamProxy;
use crate::egress::answers::DnsMemory;
use crate::egress::clearance::Clearance;
use crate::egress::handles::Handles;
use crate::egress::identity::{self, Identified, Method};
use crate::egress::limits::{ConnectionSlot, Exceeded, Limiters};
use crate::egress::quota::until_tomorrow;
use crate::egress::resolve::{ResolveError, Resolver};
use crate::egress::source_caps::Admissions;
use crate::egress::upstream_pool::{Upstream, UpstreamPool};
use crate::egress::verdict::{Point, Verdicts};
use crate::egress::Dialed;
use crate::policy::process::Process;
use crate::policy::reason::Reason;
use crate::policy::target::Target;
use crate::policy::Decision;
use crate::sandboxes::set::{PolicySet, Sandbox};
use crate::wire::first_bytes::FirstBytes;

/// The handles the sequence reads, and nothing else.
pub struct Cx<'a> {
    /// The policy snapshot the exchange is decided under.
    pub set: &'a PolicySet,
    /// The resolver the sequence looks names up with.
    pub resolver: &'a Resolver,
    /// The metrics it counts into.
    pub metrics: &'a Metrics,
    /// The per-sandbox limiters.
    pub limiters: &'a Limiters,
    /// The per-source admission caps.
    pub admissions: &'a Admissions,
    /// The DNS listener's answers (names for nameless transparent connections).
    pub answers: &'a DnsMemory,
    /// Kept upstream connections of forwarded requests.
    pub upstreams: &'a UpstreamPool,
    /// The verdict stages that run after the policy allowed.
    pub verdicts: &'a Verdicts,
    /// `listen.default_sandbox`.
    pub default_sandbox: Option<&'a str>,
    /// The top-level `upstream_proxy`.
    pub parent: Option<&'a Arc<UpstreamProxy>>,
    /// `timeouts.connect_ms`.
    pub connect_timeout: Duration,
    /// `listen.attribution.observe`: names the process behind a connection.
    pub observer: Option<&'a crate::egress::attribution::Observer>,
}

/// What the client presented to say which sandbox it is.
#[derive(Clone, Copy)]
pub enum Evidence<'a> {
    /// A verified client certificate (the TLS listener), naming a sandbox or not: it decides
    /// alone, never falling through to a weaker method.
    Certificate(Option<&'a str>),
    /// `Proxy-Authorization` or a SOCKS5 login if sent; else the source address; else the
    /// default sandbox.
    Presented {
        /// The credentials presented, if any.
        credentials: Option<identity::Credentials<'a>>,
    },
}

/// Who is at the door.
#[derive(Clone, Copy)]
pub struct Door<'a> {
    /// The client's address.
    pub source: IpAddr,
    /// What the connection presented to be identified.
    pub evidence: Evidence<'a>,
    /// The port asked for, if known (for the refusal's sentence).
    pub port: u16,
    /// The client's socket as it sees itself: its address and the address it connected to
    /// (the listener's, or the original destination of a redirected connection), when
    /// attribution by observation is on.
    pub peer: Option<crate::egress::attribution::Peer>,
}

/// What a listener parsed of where the exchange goes.
pub struct Ask<'a> {
    /// The target the client named: a CONNECT authority, an absolute URI's, the SNI or
    /// `Host` of a transparent connection, else its original address.
    pub target: Target,
    /// Transparent mode: where the client's packets were going (dialled first when it is a
    /// checked address; compared with the name's addresses under `strict_sni_dst`).
    pub original: Option<IpAddr>,
    /// Transparent mode, a connection that carried no name: why (for the record), and the
    /// target may be decided by a name the DNS listener gave the sandbox for `original`.
    pub nameless: Option<&'static str>,
    /// The first bytes, when the listener read them before deciding.
    pub first: Option<&'a FirstBytes>,
    /// A forwarded plain-HTTP request's target and headers.
    pub request: Option<(&'a Uri, &'a HeaderMap)>,
    /// A forwarded plain-HTTP request's method.
    pub method: Option<&'a http::Method>,
    /// A forwarded request may go on a kept connection.
    pub reuse: bool,
}

impl Ask<'_> {
    /// A tunnel to `target` the client named, nothing read yet (a SOCKS5 CONNECT).
    pub fn to(target: Target) -> Self {
        Ask {
            target,
            original: None,
            nameless: None,
            first: None,
            request: None,
            method: None,
            reuse: false,
        }
    }
}

/// The global cap (`max_connections`) is full.
#[derive(Debug, Clone, Copy)]
pub struct AtCapacity;

/// How a listener takes its place under the global cap (`max_connections`) once the sandbox
/// is known.
pub trait Seat {
    /// `Ok(Some(place))` for a place of its own, held with the sandbox's slot until the
    /// exchange ends (an HTTP/2 stream).
    fn identified(&mut self) -> Result<Option<OwnedSemaphorePermit>, AtCapacity>;
}

/// The listener already holds its place (taken at accept): nothing to take.
pub struct Seated<F: FnMut()>(pub F);

impl<F: FnMut()> Seat for Seated<F> {
    fn identified(&mut self) -> Result<Option<OwnedSemaphorePermit>, AtCapacity> {
        (self.0)();
        Ok(None)
    }
}

/// How an admitted exchange reaches its target.
pub enum Route {
    /// A connection opened for it (directly, or through a parent proxy).
    Dialed(Dialed),
    /// A kept connection of the same sandbox to the same authority, at an address this
    /// exchange's decision allows (forwarded requests).
    Kept(Upstream),
}

/// An admitted exchange: everything a relay needs.
pub struct Admitted {
    /// The sandbox it belongs to.
    pub sandbox: Arc<Sandbox>,
    /// What the relay watches against every later policy.
    pub clearance: Clearance,
    /// Where it goes: a connection dialled for it, or a kept one.
    pub route: Route,
    /// The sandbox's concurrent-connection slot, held until the exchange ends.
    pub slot: ConnectionSlot,
    /// The policy's decision (allow, or report in report mode).
    pub decision: Decision,
    /// The rule that allowed it lets opaque TCP flow (for a tunnel's first bytes).
    pub opaque: bool,
    /// A forwarded request that goes to a parent proxy as a request.
    pub through: Option<Through>,
}

/// A forwarded plain-HTTP request sent to a parent proxy as a request in absolute form
/// (`GET http://host/path`, with the parent's `Proxy-Authorization`), on a connection to the
/// parent kept like one to an origin.
pub struct Through {
    /// The parent proxy.
    pub parent: Arc<UpstreamProxy>,
    /// The authority the request names to the parent: the checked address when the name was
    /// resolved here, else the decided name.
    pub asked: Target,
}

/// A refused exchange, already recorded on the guard: what the listener answers with.
#[derive(Debug)]
pub struct Refused {
    /// The decision shown to the client (the record keeps the real one: an unknown sandbox is
    /// shown as a failed authentication).
    pub shown: Decision,
    /// The sandbox, once identified.
    pub sandbox: Option<Arc<Sandbox>>,
    /// One sentence for the refusal's body.
    pub explanation: String,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

/// Run the whole sequence for one exchange; see the module's documentation.
pub async fn admit(
    cx: &Cx<'_>,
    door: Door<'_>,
    seat: &mut (dyn Seat + Send),
    ask: Ask<'_>,
    audit: &mut AuditGuard,
) -> Result<Admitted, Refused> {
    enter(cx, door, seat, audit)?.admit(cx, ask, audit).await
}

/// An identified exchange admitted under its limits, not yet decided.
pub struct Entered {
    who: Identified,
    slot: ConnectionSlot,
    process: Option<Arc<Process>>,
}

/// Steps 1-2: identify the sandbox, take the listener's place under the global cap and the
/// sandbox's slot.
pub fn enter(
    cx: &Cx<'_>,
    door: Door<'_>,
    seat: &mut (dyn Seat + Send),
    audit: &mut AuditGuard,
) -> Result<Entered, Refused> {
    let who = identify(cx, door, audit)?;
    let stats = who.sandbox.stats(cx.metrics);
    audit.identified(who.sandbox.binding.id.clone(), who.method, stats);
    let process = attribute(cx, &who, door.peer);
    if let Some(p) = &process {
        audit.process(p.clone());
    }
    let slot = limits(cx, &who.sandbox, seat, audit)?;
    Ok(Entered { who, slot, process })
}

/// Which process made the connection: what the credential vouched for and what the kernel
/// shows, when either says anything.
fn attribute(
    cx: &Cx<'_>,
    who: &Identified,
    peer: Option<crate::egress::attribution::Peer>,
) -> Option<Arc<Process>> {
    let sb = &who.sandbox;
    let scoped = sb.scoped();
    let observed = cx
        .observer
        .zip(peer)
        .map(|(o, peer)| o.observe(&peer, scoped));
    (who.vouched.is_some() || observed.is_some()).then(|| {
        Arc::new(Process {
            vouched: who.vouched.clone(),
            observed,
        })
    })
}

impl Entered {
    /// The sandbox identified.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.who.sandbox
    }

    /// How it was identified.
    pub fn method(&self) -> crate::egress::identity::Method {
        self.who.method
    }

    /// The process it is attributed to, if any.
    pub fn process(&self) -> Option<&Arc<Process>> {
        self.process.as_ref()
    }

    /// Steps 3-6: decide, the verdict point, open, clearance.
    pub async fn admit(
        self,
        cx: &Cx<'_>,
        ask: Ask<'_>,
        audit: &mut AuditGuard,
    ) -> Result<Admitted, Refused> {
        let Entered { who, slot, process } = self;
        let sb = who.sandbox.clone();
        let parent = parent_for(cx.parent, &sb, &ask.target);
        let who_asks = process.as_deref();
        let (target, decided) = decide_target(cx, &sb, &ask, parent, who_asks, audit).await;
        decided.record(audit);
        if !decided.proceeds() {
            let mut why = decided.explain(&sb.binding.id, sb.policy.file(), &target);
            if let Some(ResolveError::Failed(detail)) = &decided.resolver_error {
                why = format!("{why} ({detail})");
            }
            if decided.decision.reason == Reason::ProcessNotAllowed {
                why = process_refusal(&sb, (&decided.decision, &target), who_asks, why, audit);
            }
            return Err(refusal(decided.decision, Some(sb), why, None));
        }
        let opaque = decided.decision.allows_opaque(&target);
        let point = Point {
            sandbox: &sb,
            asked: &ask.target,
            target: &target,
            decision: &decided.decision,
            opaque,
            first: ask.first,
            request: ask.request,
            method: ask.method,
            grant: cx.set.grant_of(&sb, &decided.decision),
            limiter: slot.limiter(),
            process: who_asks,
        };
        if let Err(r) = cx.verdicts.judge(&point, audit).await {
            return Err(refusal(
                Decision::deny(r.reason, None),
                Some(sb),
                r.detail,
                None,
            ));
        }
        let (route, checked, through) = match (ask.request, parent) {
            (Some(_), Some(parent)) => {
                requests_through(cx, &sb, parent, &decided, &target, audit).await?
            }
            _ => {
                let (route, checked) =
                    open(cx, &sb, &ask, parent, &decided, &target, audit).await?;
                (route, checked, None)
            }
        };
        let mut clearance = super::clearance_for(&who, target, checked, cx.set);
        clearance.granted_by = cx
            .set
            .grant_of(&sb, &decided.decision)
            .map(|g| g.id.clone());
        clearance.process = process;
        Ok(Admitted {
            sandbox: sb,
            clearance,
            route,
            slot,
            decision: decided.decision,
            opaque,
            through,
        })
    }
}

/// A `process_not_allowed` refusal's sentence: the entry's scope, and the process this
/// connection is attributed to (its executable, or why none is known) — on the record too.
/// `process_not_allowed`'s sentence, what matters first (a status line cuts the rest): the
/// process, the destination and the scope, then the rule's own explanation.
fn process_refusal(
    sb: &Sandbox,
    (decision, target): (&Decision, &Target),
    process: Option<&Process>,
    why: String,
    audit: &mut AuditGuard,
) -> String {
    let scope = decision
        .rule
        .as_ref()
        .and_then(|r| sb.policy.scope_of(r))
        .map(|s| format!(" (the scope: {s})"))
        .unwrap_or_default();
    let who = match process {
        Some(p) => p.to_string(),
        None => "no process attributed (listen.attribution is off and no exec was vouched)".into(),
    };
    audit.detail(format!("process: {who}"));
    format!("{who} may not reach {target}{scope}; {why}")
}

fn refusal(
    shown: Decision,
    sandbox: Option<Arc<Sandbox>>,
    explanation: String,
    retry_after: Option<u64>,
) -> Refused {
    Refused {
        shown,
        sandbox,
        explanation,
        retry_after,
    }
}

fn seconds(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

/// Step 1: the sandbox. An address that keeps presenting wrong credentials is slowed down
/// before its next credential is even looked at; the client cannot tell an unknown sandbox
/// from a wrong token (the record can).
fn identify(cx: &Cx<'_>, door: Door<'_>, audit: &mut AuditGuard) -> Result<Identified, Refused> {
    let source = door.source;
    let presented = match door.evidence {
        Evidence::Presented { credentials } => credentials,
        Evidence::Certificate(_) => None,
    };
    if presented.is_some() {
        if let Some(wait) = cx.admissions.auth_blocked(source) {
            audit.identity_refused(Method::Token);
            audit.detail("too many failed authentications from this address");
            let d = Decision::deny(Reason::RateLimited, None);
            audit.decision(&d);
            let why = "too many failed authentications from this address; retry later";
            return Err(refusal(d, None, why.into(), Some(seconds(wait))));
        }
    }
    let identified = match door.evidence {
        Evidence::Certificate(named) => identity::by_certificate(cx.set, named),
        Evidence::Presented { credentials } => {
            identity::identify(cx.set, credentials, source, cx.default_sandbox)
        }
    };
    identified.map_err(|refused| {
        audit.identity_refused(refused.method);
        if matches!(refused.reason, Reason::AuthFailed | Reason::UnknownSandbox) {
            cx.admissions.auth_failed(source);
        }
        audit.decision(&Decision::deny(refused.reason, None));
        let public = match refused.reason {
            Reason::UnknownSandbox => Reason::AuthFailed,
            r => r,
        };
        let d = Decision::deny(public, None);
        let why = d.explain("-", "-", door.port);
        refusal(d, None, why, None)
    })
}

/// Step 2: the listener's place under the global cap, then the sandbox's own limits (a place
/// under `max_connections` of its own and a rate token), before any work.
fn limits(
    cx: &Cx<'_>,
    sb: &Arc<Sandbox>,
    seat: &mut (dyn Seat + Send),
    audit: &mut AuditGuard,
) -> Result<ConnectionSlot, Refused> {
    let limited = |audit: &mut AuditGuard, reason, why: String, retry| {
        audit.close(Close::Limit);
        let d = Decision::deny(reason, None);
        audit.decision(&d);
        refusal(d, Some(sb.clone()), why, Some(retry))
    };
    let Ok(place) = seat.identified() else {
        let why = "egress-proxy is at its connection limit (max_connections)".to_string();
        return Err(limited(audit, Reason::ConnectionLimit, why, 1));
    };
    let limiter = sb.limiter(cx.limiters);
    match limiter.take_slot(cx.limiters.now()) {
        Ok(mut slot) => {
            if let Some(place) = place {
                slot.hold(place);
            }
            Ok(slot)
        }
        Err(r) => {
            cx.metrics.rate_limited(&sb.binding.id, r.label());
            let (reason, retry) = match r {
                Exceeded::Connections => (Reason::ConnectionLimit, 1),
                Exceeded::Rate(d) => (Reason::RateLimited, seconds(d)),
                Exceeded::Quota(_) => (Reason::QuotaExceeded, seconds(until_tomorrow())),
            };
            let why = match r {
                // Which quota, and its value, to the client as in the record (F7).
                Exceeded::Quota(spent) => {
                    let spent = limiter.meter().describe(spent);
                    audit.detail(spent.clone());
                    format!("sandbox {}: {spent}", sb.binding.id)
                }
                _ => Decision::deny(reason, None).explain(&sb.binding.id, sb.policy.file(), 0),
            };
            Err(limited(audit, reason, why, retry))
        }
    }
}

mod decide;
mod open;
mod query;
use decide::decide_target;
pub use decide::parent_for;
use open::{open, requests_through};
pub use query::{
    query_addresses, query_asker, query_enter, query_name, query_not_covered, query_rate,
    NameAllowed, RateRefused, Told,
};

#[cfg(test)]
mod tests;
