//! The verdict stage of grants approved at run time ([`crate::policy::granted`]): an exchange
//! the policy allowed by a grant is refused here when the grant limits methods or paths and
//! the exchange is a tunnel (nothing the proxy can check them on) or a request outside them,
//! and when it is a `once` grant whose one exchange was taken. It runs last, so that a `once`
//! grant is spent only by an exchange every other stage passed.

use crate::egress::verdict::{Judgement, Point, Stage};
use crate::policy::granted::NotTaken;
use crate::policy::reason::Reason;
use crate::policy::refusal::Refusal;

/// See the module documentation.
pub struct GrantStage;

impl Stage for GrantStage {
    fn name(&self) -> &'static str {
        "grant"
    }

    fn judge(&self, at: &Point<'_>) -> Judgement {
        let Some(grant) = at.grant else {
            return Judgement::Pass;
        };
        if grant.scoped() {
            let Some(((uri, _), method)) = at.request.zip(at.method) else {
                return Judgement::Refuse(Refusal::new(Reason::NoRuleMatched, format!(
                        "grant {} holds only for the methods and paths it names, which a tunnel cannot be checked against; send plain HTTP, or ask for a grant without them",
                        grant.id
                    )));
            };
            if !grant.allows_request(method.as_str(), uri.path()) {
                return Judgement::Refuse(Refusal::new(
                    Reason::HttpNotAllowed,
                    format!(
                        "grant {} allows methods {:?} and paths {:?} only",
                        grant.id, grant.methods, grant.paths
                    ),
                ));
            }
        }
        match grant.take() {
            Ok(()) => Judgement::Pass,
            Err(NotTaken::Used) => {
                Judgement::Refuse(Refusal::new(Reason::NoRuleMatched, grant.spent_detail()))
            }
            Err(NotTaken::Unrecorded(e)) => {
                tracing::error!(grant = %grant.id, error = %e, "a once grant's spending could not be recorded in state_dir; it counts as spent");
                Judgement::Refuse(Refusal::new(Reason::NoRuleMatched, format!(
                        "grant {} was for one exchange, and its use could not be recorded: it counts as spent",
                        grant.id
                    )))
            }
        }
    }
}
