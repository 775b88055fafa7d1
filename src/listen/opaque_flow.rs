//! Flow rules on a connection the proxy does not read — opaque TCP, TLS it does not
//! terminate — in a CONNECT, SOCKS5 or transparent tunnel: the client's bytes are a write to
//! the destination ([`crate::policy::flows::Act::Write`]), judged once when the relay is
//! chosen, and the destination's labels are armed there (its answer is read by the sandbox,
//! unseen). While the tunnel lives, it watches the sandbox's labels: a label armed later
//! (by another connection) that refuses it cuts it.

use crate::audit::{AuditGuard, Close};
use crate::pipeline::flow::{Gate, Phase};
use crate::pipeline::Refusal;
use crate::policy::flows::{Act, Dest};
use crate::policy::reason::Reason;
use crate::policy::target::Target;
use std::future::Future;

/// How the relay goes on in report mode after a refusal.
const REPORTED: &str = "relayed";

/// What a tunnel admitted by its flow rules watches.
pub(super) struct Cut {
    gate: Gate,
    /// Report mode: a later label is recorded, not cut.
    report: bool,
}

impl Cut {
    /// `stop`, or [`Close::Revoked`] as soon as the sandbox's labels refuse the tunnel.
    pub(super) async fn or<F: Future<Output = Close>>(self, stop: F) -> Close {
        tokio::select! {
            close = stop => close,
            _ = self.gate.refused(), if !self.report => Close::Revoked,
        }
    }
}

/// Judge the tunnel to `target` as a write; arm its destination's labels. `Err`: refused,
/// recorded (the caller resets both sides).
///
/// Boxed: a future awaited inline sizes the whole tunnel task by its largest state, so every
/// idle tunnel — of a sandbox with flow rules or not — would carry the judging's (1.7 KiB a
/// tunnel, `benches/idle_ab.sh`).
pub(super) fn admit<'a>(
    flow: &'a Phase<'_>,
    binding: &'a crate::config::Binding,
    target: &'a Target,
    audit: &'a mut AuditGuard,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Cut, ()>> + Send + 'a>> {
    Box::pin(admit_inline(flow, binding, target, audit))
}

/// [`admit`], unboxed.
async fn admit_inline(
    flow: &Phase<'_>,
    binding: &crate::config::Binding,
    target: &Target,
    audit: &mut AuditGuard,
) -> Result<Cut, ()> {
    let host = target.host.to_string();
    let dest = Dest {
        host: &host,
        port: Some(target.port),
        request: None,
    };
    let judged = flow.judge(&dest, Act::Write).await;
    audit.labels(judged.labels);
    if let Some(r) = judged.refused {
        let r = Refusal::new(Reason::FlowRefused, r.detail);
        if crate::pipeline::reported(binding, r, REPORTED, audit).is_err() {
            return Err(());
        }
    }
    let by = || format!("tunnel {host}:{}", target.port);
    match flow.arm(&dest, by, audit.conn_id()).await {
        Ok(armed) => audit.armed(armed),
        Err(e) => {
            let why = format!("the flow label this connection arms could not be kept: {e}");
            audit.refused_in_tunnel(Reason::FlowRefused, why);
            return Err(());
        }
    }
    Ok(Cut {
        gate: Gate::new(flow, &host, target.port),
        report: binding.enforcement == crate::policy::Enforcement::Report,
    })
}
