//! Step 3 of admission: decide. The parent proxy an exchange goes through, and the decision
//! on its target — by a name the DNS listener gave the sandbox for a nameless transparent
//! connection's destination, else on the name (resolved once) or the address.

use std::sync::Arc;

use super::{Ask, Cx};
use crate::audit::AuditGuard;
use crate::config::upstream::UpstreamProxy;
use crate::egress::{Decided, Lookup};
use crate::policy::process::Process;
use crate::policy::target::Target;
use crate::sandboxes::set::Sandbox;

/// The parent proxy `sandbox`'s exchange with `target` goes through: its own, or the
/// top-level one; none when it is `direct`, the target is bypassed, or none is configured.
pub fn parent_for<'a>(
    top: Option<&'a Arc<UpstreamProxy>>,
    sandbox: &'a Sandbox,
    target: &Target,
) -> Option<&'a Arc<UpstreamProxy>> {
    let parent = sandbox.binding.upstream_proxy.pick(top)?;
    (!crate::egress::parent::bypassed(parent, target)).then_some(parent)
}

/// Step 3: decide. A nameless transparent connection is decided by a name the DNS listener
/// gave this sandbox for its destination, if a name rule allows one; otherwise on the name
/// (resolved once), or on the address. Through a parent a name goes unresolved, unless
/// `strict_sni_dst` must compare the client's destination with its addresses.
pub(super) async fn decide_target(
    cx: &Cx<'_>,
    sb: &Sandbox,
    ask: &Ask<'_>,
    parent: Option<&Arc<UpstreamProxy>>,
    process: Option<&Process>,
    audit: &mut AuditGuard,
) -> (Target, Decided) {
    if let (Some(why), Some(original)) = (ask.nameless, ask.original) {
        let names = cx.answers.names(&sb.binding.id, original);
        let port = ask.target.port;
        let by_answer =
            crate::egress::decide_by_answer(cx.set, sb, process, &names, original, port);
        if let Some((named, decided)) = by_answer {
            audit.target(&named);
            audit.detail(format!(
                "{why}; the name {} came from a DNS answer the proxy gave this sandbox for {original}",
                named.host
            ));
            return (named, decided);
        }
    }
    let lookup = Lookup {
        resolver: Some(cx.resolver),
        metrics: Some(cx.metrics),
        process,
    };
    let strict = ask.original.is_some() && sb.binding.strict_sni_dst;
    let decided = match parent {
        Some(_) if !strict => {
            crate::egress::decide_for_parent(cx.set, sb, &ask.target, lookup).await
        }
        _ => crate::egress::decide(cx.set, sb, &ask.target, ask.original, lookup).await,
    };
    (ask.target.clone(), decided)
}
