//! A terminated tunnel's requests (and plain HTTP served request by request inside a tunnel)
//! as the pipeline's driver sees them ([`crate::pipeline::driver::Path`]): judged under the
//! tunnel's scheme at its decided host; refused before the rules for another authority or a
//! placeholder outside its credential ([`Exchange::refusal`]); everything served, an inference
//! call metered (and its output bounded) in the call phase; reserved against the tunnel's
//! quotas. A request refused in report mode goes on without credentials. What follows the
//! driver is the same path's too: its response phases (`response.rs`: filtered, sealed,
//! metered, scrubbed) and a WebSocket's upgrade (`socket.rs`) are methods of [`Terminated`];
//! [`Exchange`] keeps the tunnel's state and its entry, `handle`.

use http::Request;
use hyper::body::Incoming;

use super::inference::Metered;
use super::{Exchange, Prepared, UpBody};
use crate::audit::AuditGuard;
use crate::pipeline::body::Allowed;
use crate::pipeline::driver::{Needs, Path};
use crate::pipeline::Refusal;
use crate::policy::Verdict;

/// How a request refused in report mode goes on, for its record.
pub(super) const WITHOUT_CREDENTIALS: &str = "forwarded without credentials";

/// One tunnel's exchange under the binding prepared for its host.
pub(super) struct Terminated<'a> {
    pub(super) ex: &'a Exchange,
    pub(super) p: &'a Prepared,
}

impl Path for Terminated<'_> {
    type Body = UpBody;
    type Call = Option<Metered>;
    const REPORTED: &'static str = WITHOUT_CREDENTIALS;

    fn to(&self) -> (&'static str, &str, u16) {
        let d = &self.ex.dest;
        (d.scheme, d.host.as_str(), d.port)
    }

    fn streamed(body: Incoming) -> UpBody {
        UpBody::Streamed(body)
    }

    fn before_head(&self, req: &Request<Incoming>) -> Option<Refusal> {
        self.ex.refusal(self.p, req)
    }

    fn unserved(&self, _: Needs) -> Option<Refusal> {
        None
    }

    async fn call(
        &self,
        allowed: &mut Allowed,
        verdict: Verdict,
        req: Request<UpBody>,
        audit: &mut AuditGuard,
    ) -> Result<(Request<UpBody>, Option<Metered>), Refusal> {
        let metered = Metered::admit(&self.ex.live, self.p, allowed, verdict).await?;
        let req = match &metered {
            Some(m) if m.bound.is_some() => m.bound_request(req, audit)?,
            _ => req,
        };
        Ok((req, metered))
    }

    fn reserve(&self) -> impl std::future::Future<Output = Result<(), Refusal>> + Send {
        self.ex.live.reserve_waiting()
    }
}
