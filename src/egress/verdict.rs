//! The one verdict point: after the policy decided that an exchange may proceed and before
//! anything is dialled or answered, an ordered list of [`Stage`]s each passes it, refuses it
//! with a reason, or *holds* it (answers later: an approval, an external decider). Every
//! listener reaches it through [`crate::egress::admit`], so a stage added here applies to
//! CONNECT tunnels, forwarded requests, HTTP/2 streams and transparent connections at once.
//!
//! What a stage cannot do is as important: it never runs for an exchange the policy refused
//! (deny rules, the address guard and the limits come first), and [`Judgement`] has no way to
//! allow what the policy did not — a stage can only narrow. In report mode a refusal whose
//! reason is reportable lets the exchange proceed and is recorded as `report`, as the policy's
//! own refusals are.
//!
//! The built-in stages: what the first bytes carry ([`FirstBytesStage`], when the listener
//! has read them before dialling) and no credential in clear
//! ([`crate::intercept::InClear`], a forwarded plain-HTTP request). The server builds the
//! list ([`Verdicts::new`]); a stage is any type that implements [`Stage`], wherever it lives.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Uri};

use crate::audit::AuditGuard;
use crate::config::Binding;
use crate::policy::granted::GrantEntry;
use crate::policy::reason::Reason;
use crate::policy::refusal::Refusal;
use crate::policy::target::Target;
use crate::policy::{Decision, Enforcement, Verdict};
use crate::sandboxes::set::Sandbox;
use crate::wire::first_bytes::{self, FirstBytes};

/// A stage's answer that comes later.
pub type Later = Pin<Box<dyn Future<Output = Judgement> + Send>>;

/// What one stage says of an exchange.
pub enum Judgement {
    /// Nothing against it: the next stage judges.
    Pass,
    /// Refused, with the reason (the response's code) and the record's detail.
    Refuse(Refusal),
    /// A decider's answer: its words go in the record (`decider`); refused when it says so.
    Noted {
        /// The decider's words.
        note: String,
        /// The refusal, when it refused.
        refuse: Option<Refusal>,
    },
    /// Answered later, within `within`; past it the exchange is refused with `on_timeout`.
    Hold {
        /// The answer to wait for.
        answer: Later,
        /// The longest wait.
        within: Duration,
        /// The reason refused with past `within`.
        on_timeout: Reason,
    },
}

/// What a stage sees: the exchange as the policy decided it.
pub struct Point<'a> {
    /// The sandbox, identified.
    pub sandbox: &'a Sandbox,
    /// The target the client named (the CONNECT authority, the SNI, the `Host`, or the
    /// original address of a nameless connection).
    pub asked: &'a Target,
    /// The target decided (a nameless connection may be decided by a DNS answer's name).
    pub target: &'a Target,
    /// The policy's decision (allow, or report in report mode).
    pub decision: &'a Decision,
    /// The rule that allowed it lets opaque TCP flow.
    pub opaque: bool,
    /// The connection's first bytes, when the listener read them before deciding.
    pub first: Option<&'a FirstBytes>,
    /// A forwarded plain-HTTP request's target and headers.
    pub request: Option<(&'a Uri, &'a HeaderMap)>,
    /// A forwarded plain-HTTP request's method.
    pub method: Option<&'a http::Method>,
    /// The grant that allowed it (decision `grant_matched`).
    pub grant: Option<&'a Arc<GrantEntry>>,
    /// The sandbox's limits and daily quotas.
    pub limiter: &'a crate::egress::limits::SandboxLimiter,
    /// The process the exchange is attributed to, if any.
    pub process: Option<&'a crate::policy::process::Process>,
}

/// One stage of the verdict point.
pub trait Stage: Send + Sync {
    /// Its name, for the record's detail when it holds past its limit.
    fn name(&self) -> &'static str;
    /// Judge the exchange at `at`.
    fn judge(&self, at: &Point<'_>) -> Judgement;
}

/// The ordered stages every admitted exchange passes.
#[derive(Clone)]
pub struct Verdicts {
    stages: Vec<Arc<dyn Stage>>,
}

impl Verdicts {
    /// These stages, in this order.
    pub fn new(stages: Vec<Arc<dyn Stage>>) -> Self {
        Verdicts { stages }
    }

    /// Add a stage after the others.
    pub fn then(mut self, stage: Arc<dyn Stage>) -> Self {
        self.stages.push(stage);
        self
    }

    /// Run every stage in order on an exchange the policy let proceed. `Ok` when it may go
    /// ahead (a report-mode refusal recorded on `audit`); `Err` with the refusal, recorded on
    /// `audit` with its detail.
    pub async fn judge(&self, at: &Point<'_>, audit: &mut AuditGuard) -> Result<(), Refusal> {
        for stage in &self.stages {
            let judgement = match stage.judge(at) {
                Judgement::Hold {
                    answer,
                    within,
                    on_timeout,
                } => match tokio::time::timeout(within, answer).await {
                    Ok(Judgement::Hold { .. }) | Err(_) => Judgement::Refuse(Refusal::new(
                        on_timeout,
                        format!("{} did not answer within {within:?}", stage.name()),
                    )),
                    Ok(j) => j,
                },
                j => j,
            };
            match judgement {
                Judgement::Refuse(m) => refused(at.sandbox, at.decision, m, audit)?,
                Judgement::Noted { note, refuse } => {
                    audit.decider(note);
                    if let Some(m) = refuse {
                        refused(at.sandbox, at.decision, m, audit)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Record a stage's refusal: `Err` with it, recorded as a denial; in report mode, when the
/// reason may be reported, `Ok` — the exchange proceeds, recorded as `report` (unless the
/// policy itself already reported it: its record stands).
pub fn refused(
    sandbox: &Sandbox,
    policy: &Decision,
    m: Refusal,
    audit: &mut AuditGuard,
) -> Result<(), Refusal> {
    let report = sandbox.binding.enforcement == Enforcement::Report && m.reason.reportable();
    audit.detail(m.detail.clone());
    let d = Decision::deny(m.reason, None);
    if !report {
        audit.decision(&d);
        return Err(m);
    }
    if policy.verdict == Verdict::Allow {
        audit.decision(&Decision {
            verdict: Verdict::Report,
            ..d
        });
    }
    Ok(())
}

/// What a connection's first bytes carry, by the one checker ([`first_bytes::verify`]): a
/// port of `require_tls_ports` takes nothing but TLS, a ClientHello with ECH is refused under
/// `refuse_ech`, the SNI or `Host` must name the target, and anything the proxy does not read
/// passes only where the rule lets opaque TCP flow.
pub fn first_bytes_of(
    binding: &Binding,
    asked: &Target,
    first: &FirstBytes,
    opaque: bool,
) -> Result<(), Refusal> {
    let rules = first_bytes::Rules {
        require_tls: binding.require_tls_ports.contains(&asked.port),
        refuse_ech: binding.refuse_ech,
        opaque,
    };
    first_bytes::verify(asked, first, rules)
}

/// The first bytes, judged before dialling when the listener read them first (transparent
/// mode). A CONNECT tunnel's arrive after its `200`: the tunnel judges them with the same
/// [`first_bytes_of`].
pub struct FirstBytesStage;

impl Stage for FirstBytesStage {
    fn name(&self) -> &'static str {
        "first bytes"
    }

    fn judge(&self, at: &Point<'_>) -> Judgement {
        let Some(first) = at.first else {
            return Judgement::Pass;
        };
        match first_bytes_of(&at.sandbox.binding, at.asked, first, at.opaque) {
            Ok(()) => Judgement::Pass,
            Err(m) => Judgement::Refuse(m),
        }
    }
}
