//! The decider and the body scanner on a terminated request: after the rules allowed it and
//! before any credential is put on it, the binding's decider is asked
//! ([`crate::decider`]: `protocol: https`, the request's method, path and headers without
//! credentials). It may allow (and set or remove headers), deny, or ask for the body: then
//! up to `need_body_max` bytes are read, shown, and the decider asked again — the bytes shown
//! are the bytes sent. In report mode its refusal forwards the request without credentials,
//! recorded `report`. The body DLP ([`crate::pipeline::dlp`]) wraps what goes upstream.

use base64::Engine;
use http::Request;

use super::{Exchange, Prepared, Refusal, UpBody};
use crate::audit::AuditGuard;
use crate::decider::{self, wire, Answer, Ask, Outcome};
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
        let protected = decider::credential_headers(b);
        let touch: Vec<&str> = protected.iter().map(String::as_str).collect();
        let mut ask = Ask {
            version: wire::VERSION,
            sandbox: b.id.to_string(),
            identity: decider::identity(b),
            protocol: "https",
            target: wire::Target {
                host: self.dest.host.clone(),
                port: self.dest.port,
            },
            method: Some(req.method().as_str().to_string()),
            path: Some(req.uri().path().to_string()),
            headers: decider::visible_headers(req.headers(), b, &protected),
            policy: wire::Policy {
                decision: "allow",
                rule: None,
            },
            body: None,
        };
        let mut outcome = self.mint.deciders.ask(&cfg, &ask, &touch).await;
        if outcome == Outcome::Answer(Answer::NeedBody) {
            outcome = self.with_body(&cfg, &mut ask, &touch, req).await;
        }
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

    /// The decider asked for the body: show it up to `need_body_max` bytes (the bytes shown
    /// are the bytes sent) and ask again; a second `need_body` is a failure.
    async fn with_body(
        &self,
        cfg: &std::sync::Arc<crate::config::decider::DeciderConfig>,
        ask: &mut Ask,
        touch: &[&str],
        req: &mut Request<UpBody>,
    ) -> Outcome {
        let failed = |why: String| match cfg.on_error {
            crate::config::decider::OnError::Deny => Outcome::Failed(why),
            crate::config::decider::OnError::Allow => Outcome::FailedOpen(why),
        };
        let body = std::mem::replace(req.body_mut(), UpBody::Whole(None));
        let (body, shown, truncated) = match body.prefix(cfg.need_body_max).await {
            Ok(x) => x,
            // The body could not be read: nothing can be sent either.
            Err(why) => return Outcome::Failed(why),
        };
        *req.body_mut() = body;
        ask.body = Some(wire::Body {
            base64: base64::engine::general_purpose::STANDARD.encode(&shown),
            bytes: shown.len(),
            truncated,
        });
        match self.mint.deciders.ask(cfg, ask, touch).await {
            Outcome::Answer(Answer::NeedBody) => {
                failed("it asked for the body again after seeing it".into())
            }
            o => o,
        }
    }

    /// The DLP phase ([`crate::pipeline::dlp::phase`]) when the binding has `dlp:`: the
    /// target and headers the sandbox sent (before any credential is put on), and the body —
    /// scanned as it streams, or read whole and decoded when compressed. What the scanner
    /// finds in the body is read after the request was sent.
    pub(super) async fn scanned(
        &self,
        p: &Prepared,
        req: Request<UpBody>,
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
            Err(why) => return Err(Refusal::new(Reason::DlpBlocked, why)),
        };
        Ok((Request::from_parts(parts, body), Some(found)))
    }
}
