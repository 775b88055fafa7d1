//! The decider as the request pipeline's [`Asker`]: one request's question
//! ([`Question::new`], `protocol: http` or `https`), consulted with its body when the decider
//! asks for it ([`Deciders::consult`]), and the outcome told as the pipeline acts on it. The
//! pipeline's decider phase ([`crate::pipeline::ask::phase`]) is the one place a request is
//! asked about, on every path.

use super::{noted, About, Answer, DeciderError, Deciders, Outcome, Question, Showable};
use crate::config::Binding;
use crate::pipeline::ask::{self, Asked, Asker, Pending, Shows, Told};
use crate::pipeline::Refusal;
use crate::policy::reason::Reason;

impl Asker for Deciders {
    fn ask<'a>(
        &'a self,
        binding: &'a Binding,
        about: ask::About,
        body: &'a mut dyn Shows,
    ) -> Pending<'a, Asked> {
        Box::pin(async move {
            let Some(cfg) = binding.decider.clone() else {
                let told = Told::Allow {
                    set: Vec::new(),
                    remove: Vec::new(),
                };
                return Asked {
                    note: String::new(),
                    told,
                };
            };
            let mut q = Question::new(
                binding,
                About {
                    protocol: about.protocol,
                    host: about.host,
                    port: about.port,
                    request: Some((&about.method, &about.uri, &about.headers)),
                    decision: "allow",
                    rule: None,
                },
            );
            let o = self.consult(&cfg, &mut q, Some(&mut Shown(body))).await;
            Asked {
                note: noted(&o),
                told: told(o),
            }
        })
    }
}

/// What an outcome asks of the request.
fn told(o: Outcome) -> Told {
    let refuse = |reason, detail: String| Told::Refuse(Refusal::new(reason, detail));
    match o {
        Outcome::Answer(Answer::Allow(e)) => Told::Allow {
            set: e.set,
            remove: e.remove,
        },
        Outcome::FailedOpen(_) => Told::Allow {
            set: Vec::new(),
            remove: Vec::new(),
        },
        Outcome::Answer(Answer::Deny { status, reason }) => refuse(
            Reason::DeniedByDecider,
            format!("the decider refused it ({status}): {reason}"),
        ),
        Outcome::Failed(why) => refuse(Reason::DeciderUnavailable, format!("decider: {why}")),
        Outcome::Answer(Answer::NeedBody) => refuse(
            Reason::DeciderUnavailable,
            "decider: need_body twice".into(),
        ),
    }
}

/// The pipeline's body, shown to the decider that asked for it.
struct Shown<'a>(&'a mut dyn Shows);

impl Showable for Shown<'_> {
    async fn show(&mut self, max: usize) -> Result<(bytes::Bytes, bool), DeciderError> {
        self.0.show(max).await.map_err(DeciderError::Body)
    }
}
