//! The middle of the pipeline, shared by both data-plane listeners: decide on the name,
//! resolve once, decide on every resolved address (address rules, then the guard), and dial
//! only an address that was checked — never re-resolving between check and dial.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use tokio::net::TcpStream;

use crate::audit::Record;
use crate::guard::GuardVerdict;
use crate::policy::{Decision, Outcome, Reason, Verdict};
use crate::policy_set::{PolicySet, Sandbox};
use crate::resolve::ResolveError;
use crate::shared::Shared;
use crate::target::{Host, Target};

/// A refusal from [`check`]: the decision, and a detail worth adding to the explanation.
pub type Refused = (Decision, Option<String>);

/// Decide on `target` for `sb`. Resolved addresses are recorded in `rec`. In transparent mode
/// `original_dst` is the address the client chose: whether it is among the resolved addresses
/// is recorded, and with `strict_sni_dst` a mismatch is refused.
pub async fn check(
    shared: &Shared,
    set: &PolicySet,
    sb: &Sandbox,
    target: &Target,
    rec: &mut Record,
    original_dst: Option<IpAddr>,
) -> Result<Outcome, Refused> {
    let t0 = Instant::now();
    let mut outcome = set.decide(sb, target, None);
    shared
        .metrics
        .decision_seconds
        .observe(t0.elapsed().as_secs_f64());
    if outcome.decision.verdict == Verdict::Deny && !outcome.needs_addresses {
        return Err((outcome.decision, None));
    }
    if let Host::Name(name) = &target.host {
        let t1 = Instant::now();
        let resolved = shared.resolver.resolve(name).await;
        shared
            .metrics
            .dns_seconds
            .observe(t1.elapsed().as_secs_f64());
        let addrs = match resolved {
            Ok(a) => a,
            Err(e) => {
                let detail = match &e {
                    ResolveError::Failed(d) => Some(d.clone()),
                    _ => None,
                };
                return Err((Decision::deny(e.reason(), None), detail));
            }
        };
        rec.resolved = addrs.iter().map(IpAddr::to_string).collect();
        if let Some(orig) = original_dst {
            let matched = addrs.contains(&orig);
            rec.dst_in_resolved = Some(matched);
            if !matched && sb.binding.strict_sni_dst {
                return Err((Decision::deny(Reason::DestinationMismatch, None), None));
            }
        }
        let t2 = Instant::now();
        outcome = set.decide(sb, target, Some(&addrs));
        shared
            .metrics
            .decision_seconds
            .observe(t2.elapsed().as_secs_f64());
    }
    if !outcome.refused.is_empty() {
        // Record what the guard kept us from dialling (DESIGN §3), allowed or not.
        let list: Vec<String> = outcome
            .refused
            .iter()
            .map(|(ip, v)| match v {
                GuardVerdict::Prohibited(range) => format!("{ip} ({range})"),
                GuardVerdict::Loop => format!("{ip} (this proxy)"),
                GuardVerdict::Permit => ip.to_string(),
            })
            .collect();
        rec.detail = Some(format!("guard refused {}", list.join(", ")));
    }
    if outcome.decision.verdict == Verdict::Deny {
        return Err((outcome.decision, None));
    }
    Ok(outcome)
}

/// Connect to the first checked address that answers (`prefer` first when it is one of
/// them), within `timeouts.connect` each.
pub async fn dial(
    shared: &Shared,
    addrs: &[IpAddr],
    port: u16,
    prefer: Option<IpAddr>,
) -> Result<(TcpStream, SocketAddr), Reason> {
    let mut order = addrs.to_vec();
    if let Some(i) = prefer.and_then(|p| order.iter().position(|a| *a == p)) {
        order.swap(0, i);
    }
    let mut last = Reason::DestinationNotFound;
    for ip in order {
        let addr = SocketAddr::new(ip, port);
        let t = Instant::now();
        let r =
            tokio::time::timeout(shared.settings.timeouts.connect, TcpStream::connect(addr)).await;
        shared
            .metrics
            .dial_seconds
            .observe(t.elapsed().as_secs_f64());
        match r {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, addr));
            }
            Ok(Err(_)) => last = Reason::ConnectionRefused,
            Err(_) => last = Reason::ConnectionTimeout,
        }
    }
    Err(last)
}
