//! The decider and the body scanner on a request the exchange serves: after the rules allowed
//! it and before any credential is put on it, the pipeline's decider phase
//! ([`crate::pipeline::ask`]: `protocol: https`, or `http` for plain HTTP in a tunnel; the
//! request's method, path and headers without credentials, its body when the decider asks).
//! In report mode its refusal forwards the request without credentials, recorded `report`.
//! The body DLP ([`crate::pipeline::dlp`]) wraps what goes upstream.

use http::Request;

use super::{Exchange, Prepared, Refusal, UpBody};
use crate::audit::AuditGuard;
use crate::pipeline::ask::{self, Asker, Prefix, ShowError};
use crate::pipeline::dlp::{self, Found, Phase, Scanner};
use crate::policy::reason::Reason;
use crate::policy::{Enforcement, Verdict};
use std::sync::{Arc, Mutex};

impl Exchange {
    /// The pipeline's decider phase ([`crate::pipeline::ask::phase`]) on `req` (allowed so
    /// far with `verdict`): the verdict it leaves (report mode: `Report` for a refusal, the
    /// request then sent without credentials), or the refusal.
    pub(super) async fn ask_decider(
        &self,
        p: &Prepared,
        req: &mut Request<UpBody>,
        verdict: Verdict,
        audit: &mut AuditGuard,
    ) -> Result<Verdict, Refusal> {
        let to = (self.dest.scheme, self.dest.host.as_str(), self.dest.port);
        let asker: &dyn Asker = &*self.mint.deciders;
        let how = (verdict, "forwarded without credentials");
        ask::phase(asker, &p.binding, to, req, how, audit).await
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

impl Prefix for UpBody {
    async fn prefix(self, max: usize) -> Result<(Self, bytes::Bytes, bool), ShowError> {
        UpBody::prefix(self, max)
            .await
            .map_err(|e| ShowError::Read(Box::new(e)))
    }

    fn stand_in() -> Self {
        UpBody::Whole(None)
    }
}
