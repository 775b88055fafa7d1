//! The decider at the verdict point: host level for CONNECT tunnels, transparent and SOCKS5
//! connections (`protocol: connect`). A connection has no body to give nor headers the proxy
//! can change: `need_body` and `remove_headers` are answers this point cannot honour (a
//! failure, `on_error`), and `set_headers` alone is allowed without the headers, the record
//! saying so. Requests — forwarded plain HTTP, and each request the proxy reads inside a
//! tunnel — are asked about in the request pipeline's decider phase ([`crate::pipeline::ask`]),
//! after their rules, not here.

use std::sync::Arc;

use super::{noted, About, Answer, Deciders, NoBody, Outcome, Question};
use crate::egress::verdict::{Judgement, Point, Stage};
use crate::policy::reason::Reason;
use crate::policy::refusal::Refusal;
use crate::policy::Verdict;

/// The verdict stage that asks the sandbox's decider about a connection it has one for.
pub struct DeciderStage {
    /// The deciders of the configuration in force.
    pub deciders: Arc<Deciders>,
}

/// What an outcome means where nothing can be changed: the judgement, with the record's note.
pub fn judgement(o: Outcome, changes_possible: bool) -> Judgement {
    let note = noted(&o);
    let refuse = |reason, detail: String| Judgement::Noted {
        note: note.clone(),
        refuse: Some(Refusal::new(reason, detail)),
    };
    match o {
        Outcome::Answer(Answer::Allow(e)) if e.is_empty() || changes_possible => {
            Judgement::Noted { note, refuse: None }
        }
        // Headers to add are a decoration the exchange can go without: allowed, and the record
        // says they were not added (clients review F10: this was a 503). Headers to remove
        // are a protection: still refused below, rather than sent with what the decider
        // wanted gone.
        Outcome::Answer(Answer::Allow(e)) if e.remove.is_empty() => Judgement::Noted {
            note: format!(
                "{note}; the headers were not set: the proxy changes headers only inside terminated tunnels"
            ),
            refuse: None,
        },
        Outcome::Answer(Answer::Deny { status, reason }) => refuse(
            Reason::DeniedByDecider,
            format!("the decider refused it ({status}): {reason}"),
        ),
        Outcome::FailedOpen(_) => Judgement::Noted { note, refuse: None },
        Outcome::Failed(why) => refuse(Reason::DeciderUnavailable, format!("decider: {why}")),
        Outcome::Answer(Answer::Allow(_)) => refuse(
            Reason::DeciderUnavailable,
            "decider: its remove_headers cannot be honoured on a tunnel or forwarded request (only inside terminated tunnels), so the request is not sent with them".into(),
        ),
        Outcome::Answer(Answer::NeedBody) => refuse(
            Reason::DeciderUnavailable,
            "decider: it asked for the body of a tunnel or forwarded request, which the proxy cannot give there".into(),
        ),
    }
}

impl Stage for DeciderStage {
    fn name(&self) -> &'static str {
        "the decider"
    }

    fn judge(&self, at: &Point<'_>) -> Judgement {
        let b = &at.sandbox.binding;
        let Some(cfg) = b.decider.clone() else {
            return Judgement::Pass;
        };
        // A forwarded request is asked about by the pipeline, after its rules.
        if at.request.is_some() {
            return Judgement::Pass;
        }
        let mut q = Question::new(
            b,
            About {
                protocol: "connect",
                host: at.target.host.to_string(),
                port: at.target.port,
                request: None,
                decision: if at.decision.verdict == Verdict::Report {
                    "report"
                } else {
                    "allow"
                },
                rule: at.decision.rule.as_ref().map(|r| r.text.clone()),
            },
        );
        let deciders = self.deciders.clone();
        let within = cfg.timeout + std::time::Duration::from_millis(50);
        Judgement::Hold {
            answer: Box::pin(async move {
                let o = deciders.consult::<NoBody>(&cfg, &mut q, None).await;
                judgement(o, false)
            }),
            within,
            on_timeout: Reason::DeciderUnavailable,
        }
    }
}
