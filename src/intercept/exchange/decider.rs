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
use crate::pipeline::dlp;
use crate::policy::Verdict;

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
        let how = (verdict, super::WITHOUT_CREDENTIALS);
        ask::phase(asker, &p.binding, to, req, how, audit).await
    }
}

impl dlp::Rebody for UpBody {
    fn scanned(s: dlp::Scanned<Self>) -> Self {
        UpBody::Scanned(Box::new(s))
    }

    fn whole(b: bytes::Bytes) -> Self {
        UpBody::whole(b)
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
