//! Step 5 of the admission sequence: open what was decided — a kept connection, a checked
//! address, a parent's tunnel to it — or, for a forwarded request through a parent, a
//! connection to the parent the request goes to in absolute form; and the refusal when that
//! fails.

use std::net::IpAddr;
use std::sync::Arc;

use crate::audit::AuditGuard;
use crate::config::upstream::UpstreamProxy;
use crate::egress::Decided;
use crate::policy::target::Target;
use crate::policy::Decision;
use crate::sandboxes::set::Sandbox;

use super::{refusal, Ask, Cx, Refused, Route, Through};

/// Step 5: open what was decided — a kept connection of this sandbox to this authority at an
/// address just checked (forwarded requests), else a checked address, directly or through
/// the parent — and say in the record which way (or why not). Returns the route and the
/// address the grant is watched with.
pub(super) async fn open(
    cx: &Cx<'_>,
    sb: &Arc<Sandbox>,
    ask: &Ask<'_>,
    parent: Option<&Arc<UpstreamProxy>>,
    decided: &Decided,
    target: &Target,
    audit: &mut AuditGuard,
) -> Result<(Route, IpAddr), Refused> {
    if ask.reuse && parent.is_none() {
        let authority = target.to_string();
        if let Some(up) = cx
            .upstreams
            .take(&sb.binding.id, &authority, &decided.dial, target.port)
        {
            audit.dialed(up.addr);
            let checked = up.addr.ip();
            return Ok((Route::Kept(up), checked));
        }
    }
    let opened = crate::egress::parent::open(
        parent.map(|p| &**p),
        decided,
        target,
        ask.original,
        &cx.set.guard,
        cx.resolver,
        cx.connect_timeout,
        cx.metrics,
    )
    .await;
    match opened {
        Ok(o) => {
            if let Some(via) = o.via {
                audit.detail(via);
            }
            audit.dialed(o.dialed.addr);
            Ok((Route::Dialed(o.dialed), o.checked))
        }
        Err(failed) => Err(parent_failed(sb, target, failed, audit)),
    }
}

/// The refusal for what could not be opened (directly or through the parent).
fn parent_failed(
    sb: &Arc<Sandbox>,
    target: &Target,
    failed: crate::egress::parent::ParentFailed,
    audit: &mut AuditGuard,
) -> Refused {
    let d = Decision::deny(failed.reason, None);
    let mut why = d.explain(&sb.binding.id, sb.policy.file(), target.port);
    if !failed.detail.is_empty() {
        audit.detail(failed.detail.clone());
        why = format!("{why}: {}", failed.detail);
    }
    audit.decision(&d);
    refusal(d, Some(sb.clone()), why, None)
}

/// Step 5 for a forwarded request through a parent: a kept connection of this sandbox to the
/// parent for this authority, else a new one to one of the parent's permitted addresses; the
/// request then goes to it in absolute form. The grant is watched with the checked address
/// asked of the parent, or the parent's own when the parent resolves the name.
pub(super) async fn requests_through(
    cx: &Cx<'_>,
    sb: &Arc<Sandbox>,
    parent: &Arc<UpstreamProxy>,
    decided: &Decided,
    target: &Target,
    audit: &mut AuditGuard,
) -> Result<(Route, IpAddr, Option<Through>), Refused> {
    use crate::egress::upstream_pool::authority;
    use crate::policy::target::Host;
    let asked = crate::egress::parent::asked(decided, target);
    let addrs = crate::egress::parent::addresses(parent, &cx.set.guard, cx.resolver)
        .await
        .map_err(|f| parent_failed(sb, target, f, audit))?;
    let key = authority(target, Some(parent));
    audit.detail(format!(
        "through upstream proxy {} (GET in absolute form for {asked})",
        parent.shown()
    ));
    let route = match cx.upstreams.take(&sb.binding.id, &key, &addrs, parent.port) {
        Some(up) => Route::Kept(up),
        None => {
            let dialed =
                crate::egress::parent::reach(parent, &addrs, cx.connect_timeout, cx.metrics)
                    .await
                    .map_err(|f| parent_failed(sb, target, f, audit))?;
            Route::Dialed(dialed)
        }
    };
    let at = match &route {
        Route::Kept(up) => up.addr,
        Route::Dialed(d) => d.addr,
    };
    audit.dialed(at);
    let checked = match asked.host {
        Host::Ip(ip) => ip,
        Host::Name(_) => at.ip(),
    };
    let through = Through {
        parent: parent.clone(),
        asked,
    };
    Ok((route, checked, Some(through)))
}
