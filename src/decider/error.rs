//! Why a decider gave no usable answer: the one error type of [`super`], by stage (the ask
//! could not be sent, the decider is busy or slow, its answer is not a verdict, the body could
//! not be shown). Each becomes the `decider_unavailable` refusal's detail, or passes under
//! `on_error: allow` unless the sandbox's own load caused it.

/// A decider's failure to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeciderError {
    /// The decider could not be reached, or the exchange with it broke.
    #[error("{0}")]
    Unreachable(String),
    /// Too many asks are in flight (per process or per sandbox): failed at once, not queued.
    #[error("{0}")]
    Busy(String),
    /// The decider did not answer within `timeout_ms`.
    #[error("the decider did not answer within {0} ms")]
    Timeout(u128),
    /// It answered with an HTTP status that is not a success.
    #[error("the decider answered HTTP {0}")]
    Status(u16),
    /// Its answer is not a verdict this proxy can apply.
    #[error("{0}")]
    Answer(String),
    /// The body it asked for could not be read, or cannot be shown here.
    #[error("{0}")]
    Body(String),
}

pub(crate) fn unreachable(why: impl Into<String>) -> DeciderError {
    DeciderError::Unreachable(why.into())
}

pub(crate) fn bad_answer(why: impl Into<String>) -> DeciderError {
    DeciderError::Answer(why.into())
}
