//! Why a decider gave no usable answer: the one error type of [`super`], by stage (the ask
//! could not be sent, the decider is busy or slow, its answer is not a verdict, the body could
//! not be shown). Each becomes the `decider_unavailable` refusal's detail, or passes under
//! `on_error: allow` unless the sandbox's own load caused it.

use crate::policy::cause::Why;

/// What caused a failure: the error of the layer below, kept as the source.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A decider's failure to answer.
#[derive(Debug, thiserror::Error)]
pub enum DeciderError {
    /// The decider could not be reached, or the exchange with it broke: what was being done,
    /// and the error of the layer below.
    #[error("{doing}: {source}")]
    Unreachable {
        /// What the proxy was doing (`reading the decider's answer`).
        doing: &'static str,
        /// Why it failed.
        source: Cause,
    },
    /// Too many asks are in flight (per process or per sandbox): failed at once, not queued.
    #[error("{}", busy(*.in_flight, *.per_sandbox))]
    Busy {
        /// The limit that was reached.
        in_flight: usize,
        /// Whether it is the sandbox's own (`decider.max_in_flight_per_sandbox`).
        per_sandbox: bool,
    },
    /// The decider did not answer within `timeout_ms`.
    #[error("the decider did not answer within {0} ms")]
    Timeout(u128),
    /// It answered with an HTTP status that is not a success.
    #[error("the decider answered HTTP {0}")]
    Status(u16),
    /// Its answer is not a verdict this proxy can apply.
    #[error(transparent)]
    Answer(Why),
    /// Its answer does not parse as the verdict's JSON.
    #[error("the answer is not a verdict: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The body it asked for could not be read.
    #[error(transparent)]
    Body(crate::pipeline::ask::ShowError),
    /// It asked for a body where none can be shown (the verdict point: a tunnel, a head).
    #[error("no body can be shown here")]
    NoBody,
}

pub(crate) fn unreachable(doing: &'static str, source: impl Into<Cause>) -> DeciderError {
    DeciderError::Unreachable {
        doing,
        source: source.into(),
    }
}

pub(crate) fn bad_answer(why: impl Into<Why>) -> DeciderError {
    DeciderError::Answer(why.into())
}

/// What a [`DeciderError::Busy`] says.
fn busy(in_flight: usize, per_sandbox: bool) -> String {
    match per_sandbox {
        true => format!(
            "the sandbox has {in_flight} asks in flight already (decider.max_in_flight_per_sandbox)"
        ),
        false => format!("{in_flight} asks already in flight (decider.max_in_flight)"),
    }
}
