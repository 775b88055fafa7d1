//! What can go wrong reading a protocol's rule or a request's body: the one error type of
//! [`super`], opaque with a kind (hyper's shape). A [`ProtocolError`] is a rule that does not
//! compile (reported at load) or a body that cannot be read as the protocol says (refused,
//! never guessed at); the words are for the refusal's detail or the load error.

/// What went wrong, for a caller that acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolErrorKind {
    /// A rule that cannot be compiled: a bad glob, an unknown operation, a missing list.
    Rule,
    /// A body or query that is not the protocol's (not JSON, duplicate keys, not JSON-RPC 2.0,
    /// a GraphQL document that does not parse).
    Malformed,
    /// A well-formed message the rule does not allow.
    NotAllowed,
}

/// A protocol rule or body error: its kind and the words that explain it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct ProtocolError {
    kind: ProtocolErrorKind,
    detail: String,
}

impl ProtocolError {
    /// A rule that cannot be compiled.
    pub fn rule(detail: impl Into<String>) -> Self {
        Self::new(ProtocolErrorKind::Rule, detail)
    }

    /// A body that is not the protocol's.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(ProtocolErrorKind::Malformed, detail)
    }

    /// A message the rule does not allow.
    pub fn not_allowed(detail: impl Into<String>) -> Self {
        Self::new(ProtocolErrorKind::NotAllowed, detail)
    }

    fn new(kind: ProtocolErrorKind, detail: impl Into<String>) -> Self {
        ProtocolError {
            kind,
            detail: detail.into(),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ProtocolErrorKind {
        self.kind
    }

    /// The words, owned (a refusal's detail).
    pub fn into_detail(self) -> String {
        self.detail
    }
}
