//! The one refusal: a [`Reason`] and one sentence of detail (with, when it concerns one, the
//! credential, and what the sandbox is shown when it must not read all of the detail). Every
//! stage and phase that refuses says it with this; each listener answers it in its protocol's
//! shape ([`crate::relay::deny`] for HTTP, a SOCKS5 reply, a reset).

use super::reason::Reason;

/// Why an exchange or a request is refused — by the first bytes of a tunnel, a stage of
/// admission, a phase of the request pipeline — for its answer and its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The reason recorded and shown.
    pub reason: Reason,
    /// Why, in one sentence.
    pub detail: String,
    /// The credential it concerns, when it is about one.
    pub credential: Option<String>,
    /// What the sandbox is told when it must not read all of `detail` (an operator's
    /// address); `None`: the detail itself.
    pub shown: Option<String>,
}

impl Refusal {
    /// A refusal for `reason` with `detail`.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Refusal {
            reason,
            detail: detail.into(),
            credential: None,
            shown: None,
        }
    }

    /// What the sandbox reads of it.
    pub fn shown(&self) -> &str {
        self.shown.as_deref().unwrap_or(&self.detail)
    }
}
