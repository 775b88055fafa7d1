//! What can go wrong in the control plane outside a registration call ([`super::ChangeError`]
//! has those, each with its HTTP status): input it refuses (a target, a duration, a query
//! parameter), the `state_dir` log, and etcd's sessions and values. Each carries the words an
//! operator or the admin API's caller reads.

use crate::policy::cause::Why;

/// A control-plane failure, by where it happened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// Input refused: a `check` target, a CLI duration, an admin API query parameter (with the
    /// parser's error as its cause, when one said so).
    #[error(transparent)]
    Invalid(Why),
    /// The `state_dir` registration log could not be opened or a line of it read (with the
    /// file's error as its cause).
    #[error(transparent)]
    Store(Why),
    /// etcd could not be reached or a watch broke (retried), with etcd's error as its cause.
    #[error(transparent)]
    Etcd(Why),
    /// A value read from etcd that this replica cannot put in force (kept out, reported), with
    /// why as its cause.
    #[error(transparent)]
    Rejected(Why),
    /// A step a signed-in person may not take: a viewer's answer, or a request whose layers
    /// name other approvers (the console).
    #[error(transparent)]
    Forbidden(Why),
}

pub(crate) fn invalid(why: impl Into<Why>) -> ControlError {
    ControlError::Invalid(why.into())
}

pub(crate) fn forbidden(why: impl Into<Why>) -> ControlError {
    ControlError::Forbidden(why.into())
}

pub(crate) fn store(why: impl Into<Why>) -> ControlError {
    ControlError::Store(why.into())
}

pub(crate) fn etcd(why: impl Into<Why>) -> ControlError {
    ControlError::Etcd(why.into())
}
