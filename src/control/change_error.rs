//! Why a registration call failed, and the admin API's status for each kind.

use crate::config::ConfigErrors;

use super::registry;

/// Why a registration call failed; [`ChangeError::status`] is its HTTP status in the admin API.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// 400: the body is invalid (every error listed).
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// 400: something else about the request is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// 409: the id belongs to a file-defined sandbox, or its `sources` overlap another's.
    #[error("{0}")]
    Conflict(String),
    /// 429: `runtime.max_sandboxes` are registered already.
    #[error("{0}")]
    Full(String),
    /// 404
    #[error("no such registered sandbox")]
    NotFound,
    /// 500: the new set did not compile, or could not be persisted.
    #[error("{0}")]
    Failed(String),
    /// 503: the control plane (etcd) cannot take the change now — nothing was sent.
    #[error("{0}")]
    Unavailable(String),
    /// 504: the write was sent to etcd and its fate is not known here (`committed: false`:
    /// etcd did not answer, it may or may not have applied it), or it was committed at
    /// `revision` but this replica has not applied it in time. Never a 503: a runtime that
    /// gives up after a 503 would believe a committed sandbox absent.
    #[error("{detail}")]
    Outcome {
        /// What is known of the write.
        detail: String,
        /// Whether etcd committed it.
        committed: bool,
        /// The revision written (committed), or the last one this replica had applied when
        /// it sent the write (unknown): read the key at or after it to learn the outcome.
        revision: i64,
    },
}

impl ChangeError {
    /// The admin API's status for it.
    pub fn status(&self) -> u16 {
        match self {
            ChangeError::Invalid(_) | ChangeError::BadRequest(_) => 400,
            ChangeError::Conflict(_) => 409,
            ChangeError::Full(_) => 429,
            ChangeError::NotFound => 404,
            ChangeError::Failed(_) => 500,
            ChangeError::Unavailable(_) => 503,
            ChangeError::Outcome { .. } => 504,
        }
    }
}

impl From<registry::Rejected> for ChangeError {
    fn from(r: registry::Rejected) -> Self {
        use registry::Rejected;
        match r {
            Rejected::InvalidId(_) | Rejected::OutsideCeiling(_) => {
                ChangeError::BadRequest(r.to_string())
            }
            Rejected::Invalid(errs) => ChangeError::Invalid(errs),
            Rejected::FileDefined { .. } | Rejected::Overlap(_) => {
                ChangeError::Conflict(r.to_string())
            }
            Rejected::Full { .. } => ChangeError::Full(r.to_string()),
            Rejected::Compile(_) | Rejected::NotCompiled(_) => ChangeError::Failed(r.to_string()),
        }
    }
}
