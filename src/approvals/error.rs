//! What can go wrong in approvals: an access request that is not one, a webhook that could
//! not be reached or whose reply is not trusted, and grants kept on disk that cannot be read.
//! The one error type of [`super`]; the words go to the agent (a request's 400), the log, or
//! the start-up report.

/// An approvals failure, by where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// An access request the endpoint refuses (400): the words say what to fix.
    #[error("{0}")]
    Request(String),
    /// The webhook could not be reached, did not answer in time, or its reply is not trusted.
    #[error("{0}")]
    Webhook(String),
    /// The grants kept in `state_dir` (or their journal) could not be read.
    #[error("{0}")]
    Store(String),
}

impl ApprovalError {
    /// The words, owned (a refusal's body).
    pub fn into_detail(self) -> String {
        match self {
            ApprovalError::Request(s) | ApprovalError::Webhook(s) | ApprovalError::Store(s) => s,
        }
    }
}

pub(crate) fn request(why: impl Into<String>) -> ApprovalError {
    ApprovalError::Request(why.into())
}

pub(crate) fn webhook(why: impl Into<String>) -> ApprovalError {
    ApprovalError::Webhook(why.into())
}

pub(crate) fn store(why: impl Into<String>) -> ApprovalError {
    ApprovalError::Store(why.into())
}
