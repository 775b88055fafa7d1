//! The decider and the body scanner on a terminated request: after the rules allowed it and
//! before any credential is put on it, the binding's decider is asked
//! ([`crate::decider`]: `protocol: https`, the request's method, path and headers without
//! credentials). It may allow (and set or remove headers), deny, or ask for the body: then
//! up to `need_body_max` bytes are read, shown, and the decider asked again — the bytes shown
//! are the bytes sent. In report mode its refusal forwards the request without credentials,
//! recorded `report`. The body DLP ([`crate::pipeline::dlp`]) wraps what goes upstream.

use http::Request;

use super::{Exchange, Prepared, Refusal, UpBody};
use crate::audit::AuditGuard;
use crate::decider::{self, About, Answer, DeciderError, Outcome, Question};
use crate::pipeline::dlp::{self, Found, Phase, Scanner};
use crate::policy::reason::Reason;
use crate::policy::{Enforcement, Verdict};
use std::sync::{Arc, Mutex};

impl Exchange {
    /// Ask the binding's decider about `req` (allowed so far with `verdict`): the verdict it
    /// leaves (report mode: `Report` for a refusal), or the refusal.
    pub(super) async fn ask_decider(
        &self,
        p: &Prepared,
        req: &mut Request<UpBody>,
        verdict: Verdict,
        audit: &mut AuditGuard,
    ) -> Result<Verdict, Refusal> {
        let Some(cfg) = p
            .binding
            .decider
            .clone()
            .filter(|_| verdict == Verdict::Allow)
        else {
            return Ok(verdict);
        };
        let b = &p.binding;
        let mut q = Question::new(
            b,
            About {
                protocol: "https",
                host: self.dest.host.clone(),
                port: self.dest.port,
                request: Some((req.method(), req.uri(), req.headers())),
                decision: "allow",
                rule: None,
            },
        );
        let mut shown = Shown(req);
        let outcome = self
            .mint
            .deciders
            .consult(&cfg, &mut q, Some(&mut shown))
            .await;
        let req = shown.0;
        audit.decider(decider::noted(&outcome));
        let refusal = match outcome {
            Outcome::Answer(Answer::Allow(edits)) => {
                for n in &edits.remove {
                    req.headers_mut().remove(n);
                }
                for (n, v) in edits.set {
                    req.headers_mut().insert(n, v);
                }
                return Ok(verdict);
            }
            Outcome::FailedOpen(_) => return Ok(verdict),
            Outcome::Answer(Answer::Deny { status, reason }) => Refusal::new(
                Reason::DeniedByDecider,
                format!("the decider refused it ({status}): {reason}"),
            ),
            Outcome::Failed(why) => {
                Refusal::new(Reason::DeciderUnavailable, format!("decider: {why}"))
            }
            Outcome::Answer(Answer::NeedBody) => {
                Refusal::new(Reason::DeciderUnavailable, "decider: need_body twice")
            }
        };
        if b.enforcement == Enforcement::Report && refusal.reason.reportable() {
            audit.verdict(Verdict::Report, refusal.reason);
            audit.detail(format!(
                "{} (forwarded without credentials)",
                refusal.detail
            ));
            return Ok(Verdict::Report);
        }
        Err(refusal)
    }

    /// The DLP phase ([`crate::pipeline::dlp::phase`]) when the binding has `dlp:`: the
    /// target and headers the sandbox sent (before any credential is put on), and the body —
    /// scanned as it streams, or read whole and decoded when compressed. What the scanner
    /// finds in the body is read after the request was sent.
    pub(super) async fn scanned(
        &self,
        p: &Prepared,
        req: Request<UpBody>,
        audit: &mut AuditGuard,
    ) -> Result<(Request<UpBody>, Option<Arc<Mutex<Found>>>), Refusal> {
        let Some(cfg) = p.binding.dlp.clone() else {
            return Ok((req, None));
        };
        let report = p.binding.enforcement == Enforcement::Report;
        let scanner = Scanner::new(cfg, report);
        let found = scanner.found.clone();
        let (parts, body) = req.into_parts();
        let body = match dlp::phase(scanner, &parts.uri, &parts.headers, body).await {
            Ok(Phase::Stream(s)) => UpBody::Scanned(Box::new(s)),
            Ok(Phase::Whole(b)) => UpBody::whole(b),
            Err(why) => {
                // The rules that matched the target or headers, named on the record.
                let _ = dlp::recorded(&found, audit);
                return Err(Refusal::new(Reason::DlpBlocked, why.to_string()));
            }
        };
        Ok((Request::from_parts(parts, body), Some(found)))
    }
}

/// A terminated request's body, shown to the decider that asked for it: read up to the
/// limit, and put back whole (the bytes shown are the bytes sent).
struct Shown<'a>(&'a mut Request<UpBody>);

impl decider::Showable for Shown<'_> {
    async fn show(&mut self, max: usize) -> Result<(bytes::Bytes, bool), DeciderError> {
        let body = std::mem::replace(self.0.body_mut(), UpBody::Whole(None));
        let (body, shown, truncated) = body
            .prefix(max)
            .await
            .map_err(|e| DeciderError::Body(e.to_string()))?;
        *self.0.body_mut() = body;
        Ok((shown, truncated))
    }
}
