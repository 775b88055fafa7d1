//! Why a registration call failed, and the admin API's status for each kind.

use crate::config::ConfigErrors;
use crate::policy::cause::{of, Why};

use super::registry;

/// Why a registration call failed; [`ChangeError::status`] is its HTTP status in the admin API.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// 400: the body is invalid (every error listed).
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// 400: something else about the request is wrong (with the parser's error as its cause,
    /// when one said so).
    #[error(transparent)]
    BadRequest(Why),
    /// 409: the id belongs to a file-defined sandbox, or its `sources` overlap another's.
    #[error(transparent)]
    Conflict(Why),
    /// 429: `runtime.max_sandboxes` are registered already.
    #[error(transparent)]
    Full(Why),
    /// 404
    #[error("no such registered sandbox")]
    NotFound,
    /// 500: the new set did not compile, or could not be persisted (with the error of the
    /// layer below as its cause).
    #[error(transparent)]
    Failed(Why),
    /// 503: the control plane (etcd) cannot take the change now — nothing was sent.
    #[error(transparent)]
    Unavailable(Why),
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
            Rejected::InvalidId(_) | Rejected::OutsideCeiling(_) => ChangeError::BadRequest(of(r)),
            Rejected::Invalid(errs) => ChangeError::Invalid(errs),
            Rejected::FileDefined { .. } | Rejected::Overlap { .. } => ChangeError::Conflict(of(r)),
            Rejected::Full { .. } => ChangeError::Full(of(r)),
            Rejected::Compile(_) | Rejected::NotCompiled(_) => ChangeError::Failed(of(r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cause::caused;

    #[test]
    fn a_failure_reads_as_before_and_keeps_its_cause() {
        let e = ChangeError::Failed(caused(
            "cannot persist to state_dir",
            std::io::Error::other("disk full"),
        ));
        assert_eq!(e.to_string(), "cannot persist to state_dir: disk full");
        assert_eq!(e.status(), 500);
        let source = std::error::Error::source(&e).expect("the io error is kept");
        assert_eq!(source.to_string(), "disk full");
        let words = ChangeError::BadRequest("no \"id\"".into());
        assert_eq!(words.to_string(), "no \"id\"");
        assert!(std::error::Error::source(&words).is_none());
    }
}
