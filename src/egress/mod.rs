//! The middle of the pipeline, shared by both data-plane listeners and by `check` /
//! `POST /v1/check`: [`decide`] on the name, resolve once, decide on every resolved address
//! (address rules, then the guard); then [`dial`] only an address that was checked — never
//! re-resolving between check and dial. Because `check` calls the same [`decide`], its answer
//! is the data plane's by construction. A dial's stream is egress's too: `server_io` (TCP,
//! or TLS to a parent), `abortable` (its cut switch) and `upstream_pool` (the connections
//! forwarded requests keep), so the relays below the sequence import them, never the reverse.

pub(crate) mod abortable;
pub mod admit;
pub(crate) mod answers;
pub mod attribution;
pub(crate) mod clearance;
pub(crate) mod connect;
pub(crate) mod grant_stage;
pub(crate) mod handles;
pub(crate) mod identity;
pub mod layer_limits;
pub mod limits;
pub(crate) mod parent;
pub mod quota;
pub mod resolve;
pub(crate) mod roots;
pub(crate) mod server_io;
pub(crate) mod source_caps;
pub(crate) mod strangers;
pub mod token_bucket;
pub(crate) mod upstream_pool;
pub mod verdict;

mod io_enum;
pub(crate) use io_enum::delegate_io;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::audit::metrics::{Metrics, Timing};
use crate::audit::AuditGuard;
use crate::egress::clearance::Clearance;
use crate::egress::identity::Identified;
use crate::egress::resolve::{ResolveError, Resolver};
use crate::policy::guard::GuardVerdict;
use crate::policy::reason::Reason;
use crate::policy::target::{Host, Target};
use crate::policy::{Decision, Verdict};
use crate::sandboxes::set::{PolicySet, Sandbox};

/// What [`decide`] found out.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The verdict; when it proceeds, `dial` is not empty (or addresses were not consulted).
    pub decision: Decision,
    /// Addresses that passed the guard, in resolver order: the only ones that may be dialled.
    pub dial: Vec<IpAddr>,
    /// What the name resolved to (empty for IP literals and when nothing was resolved).
    pub resolved: Vec<IpAddr>,
    /// Addresses the guard refused, with its verdict.
    pub guard_refused: Vec<(IpAddr, GuardVerdict)>,
    /// Transparent mode: whether the client's original destination is a resolved address.
    pub dst_in_resolved: Option<bool>,
    /// Why the resolver failed, when it did.
    pub resolver_error: Option<ResolveError>,
    /// False when a name was decided without resolving it (no resolver given) although
    /// address rules could have changed the answer.
    pub addresses_consulted: bool,
    /// Address rules were not tried because the name is outside `dns.address_rule_zones`.
    pub outside_zones: bool,
}

impl Decided {
    /// Put everything the decision found out on the record: the verdict, what the name
    /// resolved to, what the guard refused, and why the resolver failed when it did.
    pub fn record(&self, audit: &mut AuditGuard) {
        audit.decision(&self.decision);
        audit.looked_up(&self.resolved, &self.guard_refused, self.dst_in_resolved);
        if let Some(ResolveError::Failed(e)) = &self.resolver_error {
            audit.detail(e.clone());
        }
    }

    /// Whether the connection may go ahead (allowed, or reported).
    pub fn proceeds(&self) -> bool {
        self.decision.verdict.proceeds()
    }

    fn refused(decision: Decision) -> Self {
        Decided {
            decision,
            dial: Vec::new(),
            resolved: Vec::new(),
            guard_refused: Vec::new(),
            dst_in_resolved: None,
            resolver_error: None,
            addresses_consulted: true,
            outside_zones: false,
        }
    }

    /// The sentence a refusal gives: the decision's explanation, and why address rules were
    /// not tried when that is the cause.
    pub fn explain(&self, sandbox: &str, file: &str, target: &Target) -> String {
        let mut why = self.decision.explain(sandbox, file, target.port);
        if self.outside_zones {
            why.push_str(&format!(
                "; address rules were not tried: `{}` is outside dns.address_rule_zones (add a name rule, or set network.resolve_for_address_rules: true)",
                target.host
            ));
        }
        why
    }
}

/// How to look addresses up: the resolver (none: decide on names alone, no I/O), and where to
/// count timings (none for `check`).
#[derive(Clone, Copy)]
pub struct Lookup<'a> {
    /// The resolver (none: names are decided by name rules alone).
    pub resolver: Option<&'a Resolver>,
    /// The metrics to count the lookup into, if any.
    pub metrics: Option<&'a Metrics>,
    /// The process the connection is attributed to: `network.scoped` entries allow only
    /// theirs (none: an unknown process, which no scoped entry admits).
    pub process: Option<&'a crate::policy::process::Process>,
}

impl Lookup<'_> {
    fn observe(&self, which: Timing, since: Instant) {
        if let Some(m) = self.metrics {
            m.observe(which, since);
        }
    }
}

/// Decide on `target` for `sb`. In transparent mode `original_dst` is the address the client
/// chose: whether it is among the resolved addresses is reported, and with `strict_sni_dst` a
/// mismatch is refused.
pub async fn decide(
    set: &PolicySet,
    sb: &Sandbox,
    target: &Target,
    original_dst: Option<IpAddr>,
    lookup: Lookup<'_>,
) -> Decided {
    let t0 = Instant::now();
    let first = set.decide_for(sb, lookup.process, target, None);
    lookup.observe(Timing::Decision, t0);
    if first.decision.verdict == Verdict::Deny && !first.needs_addresses {
        let mut d = Decided::refused(first.decision);
        d.outside_zones = first.outside_zones;
        return d;
    }
    let mut resolved = Vec::new();
    let mut dst_in_resolved = None;
    let outcome = match (&target.host, lookup.resolver) {
        (Host::Name(_), None) => {
            // Names alone: the first answer is final, but say what was not consulted.
            let mut d = Decided::refused(first.decision);
            d.addresses_consulted = !first.needs_addresses;
            return d;
        }
        (Host::Ip(_), _) => first,
        (Host::Name(name), Some(resolver)) => {
            let t1 = Instant::now();
            let answer = resolver.resolve(name).await;
            lookup.observe(Timing::Dns, t1);
            resolved = match answer {
                Ok(a) => a,
                Err(e) => {
                    // A name no name rule allows was resolved only to try address rules: its
                    // refusal is the policy's, not the resolver's.
                    let refusal = if first.decision.verdict == Verdict::Deny {
                        first.decision
                    } else {
                        Decision::deny(e.reason(), None)
                    };
                    let mut d = Decided::refused(refusal);
                    d.resolver_error = Some(e);
                    return d;
                }
            };
            if let Some(orig) = original_dst {
                let matched = resolved.contains(&orig);
                dst_in_resolved = Some(matched);
                if !matched && sb.binding.strict_sni_dst {
                    let mut d = Decided::refused(Decision::deny(Reason::DestinationMismatch, None));
                    d.resolved = resolved;
                    d.dst_in_resolved = dst_in_resolved;
                    return d;
                }
            }
            let t2 = Instant::now();
            let o = set.decide_for(sb, lookup.process, target, Some(&resolved));
            lookup.observe(Timing::Decision, t2);
            o
        }
    };
    Decided {
        decision: outcome.decision,
        dial: outcome.dial,
        resolved,
        guard_refused: outcome.refused,
        dst_in_resolved,
        resolver_error: None,
        addresses_consulted: true,
        outside_zones: false,
    }
}

/// [`decide`] for an exchange that goes through the parent proxy: a name a name rule allows
/// (or report mode lets through) goes to the parent unresolved — no lookup here, so no DNS
/// query leaks the name and the parent resolves it; anything else (an address, a name only
/// address rules could allow) is decided exactly as without a parent, and the parent is then
/// asked for the checked address.
pub async fn decide_for_parent(
    set: &PolicySet,
    sb: &Sandbox,
    target: &Target,
    lookup: Lookup<'_>,
) -> Decided {
    if let Host::Name(_) = target.host {
        let t0 = Instant::now();
        let first = set.decide_for(sb, lookup.process, target, None);
        lookup.observe(Timing::Decision, t0);
        if first.decision.verdict.proceeds() {
            return Decided::refused(first.decision);
        }
    }
    decide(set, sb, target, None, lookup).await
}

/// Transparent mode, a connection that carries no name: decide it as `name:port` for the first
/// of `names` (what the DNS listener told the sandbox `ip` is) that a name rule allows, with
/// `ip` as the only address, checked by the guard. `None` when no name allows it: the caller
/// decides on the address as before.
pub fn decide_by_answer(
    set: &PolicySet,
    sb: &Sandbox,
    process: Option<&crate::policy::process::Process>,
    names: &[std::sync::Arc<str>],
    ip: IpAddr,
    port: u16,
) -> Option<(Target, Decided)> {
    for name in names {
        let Ok(host) = Host::parse(name) else {
            continue;
        };
        let target = Target { host, port };
        let o = set.decide_for(sb, process, &target, Some(&[ip]));
        if o.decision.verdict == Verdict::Allow {
            let decided = Decided {
                decision: o.decision,
                dial: o.dial,
                resolved: Vec::new(),
                guard_refused: o.refused,
                dst_in_resolved: Some(true),
                resolver_error: None,
                addresses_consulted: true,
                outside_zones: false,
            };
            return Some((target, decided));
        }
    }
    None
}

/// A connection to a checked address.
#[derive(Debug)]
pub struct Dialed {
    /// The connection.
    pub stream: crate::egress::server_io::ServerIo,
    /// The address it was made to.
    pub addr: SocketAddr,
}

/// What an exchange of the sandbox `who` identified is allowed to do: reach `target` at
/// `dialed`, decided under `set`.
pub fn clearance_for(
    who: &Identified,
    target: Target,
    dialed: IpAddr,
    set: &PolicySet,
) -> Clearance {
    Clearance {
        sandbox: who.sandbox.binding.id.clone(),
        proof: who.proof,
        target,
        dialed,
        generation: set.generation(),
        granted_by: None,
        process: None,
    }
}

/// Connect to the first checked address that answers (`prefer` first when it is one of
/// them), within `timeout` each.
pub async fn dial(
    addrs: &[IpAddr],
    port: u16,
    prefer: Option<IpAddr>,
    timeout: Duration,
    metrics: &Metrics,
) -> Result<Dialed, Reason> {
    let (stream, addr) = dial_socket(addrs, port, prefer, timeout, metrics).await?;
    Ok(Dialed {
        stream: crate::egress::server_io::ServerIo::Tcp(stream),
        addr,
    })
}

/// [`dial`], giving the plain socket and the address it reached.
pub(crate) async fn dial_socket(
    addrs: &[IpAddr],
    port: u16,
    prefer: Option<IpAddr>,
    timeout: Duration,
    metrics: &Metrics,
) -> Result<(TcpStream, SocketAddr), Reason> {
    let mut order = addrs.to_vec();
    if let Some(i) = prefer.and_then(|p| order.iter().position(|a| *a == p)) {
        order.swap(0, i);
    }
    let mut last = Reason::DestinationNotFound;
    for ip in order {
        let addr = SocketAddr::new(ip, port);
        let t = Instant::now();
        let r = tokio::time::timeout(timeout, connect::connect(addr)).await;
        metrics.observe(Timing::Dial, t);
        match r {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, addr));
            }
            Ok(Err(_)) => last = Reason::ConnectionRefused,
            Err(_) => last = Reason::ConnectionTimeout,
        }
    }
    Err(last)
}
