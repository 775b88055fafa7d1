//! What can go wrong in approvals: an access request that is not one, a webhook that could
//! not be reached or whose reply is not trusted, and grants kept on disk that cannot be read.
//! The one error type of [`super`]; the words go to the agent (a request's 400), the log, or
//! the start-up report.

use crate::policy::cause::Why;

/// An approvals failure, by where it happened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApprovalError {
    /// An access request the endpoint refuses (400): the words say what to fix.
    #[error(transparent)]
    Request(Why),
    /// The webhook could not be reached, did not answer in time, or its reply is not trusted.
    #[error(transparent)]
    Webhook(Why),
    /// The grants kept in `state_dir` (or their journal) could not be read.
    #[error(transparent)]
    Store(Why),
}

impl ApprovalError {
    /// The words, owned (a refusal's body).
    pub fn into_detail(self) -> String {
        self.to_string()
    }
}

pub(crate) fn request(why: impl Into<Why>) -> ApprovalError {
    ApprovalError::Request(why.into())
}

pub(crate) fn webhook(why: impl Into<Why>) -> ApprovalError {
    ApprovalError::Webhook(why.into())
}

pub(crate) fn store(why: impl Into<Why>) -> ApprovalError {
    ApprovalError::Store(why.into())
}
