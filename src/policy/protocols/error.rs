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

/// A protocol rule or body error: its kind, the words that explain it and, for a rule that
/// does not compile, the error of the layer below (a glob's) kept as its source.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{detail}")]
pub struct ProtocolError {
    kind: ProtocolErrorKind,
    detail: String,
    #[source]
    cause: Option<crate::policy::cause::Cause>,
}

/// Errors are equal by kind and words (the cause is how it came about, not what it says).
impl PartialEq for ProtocolError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.detail == other.detail
    }
}

impl Eq for ProtocolError {}

impl ProtocolError {
    /// A rule that cannot be compiled.
    pub fn rule(detail: impl Into<String>) -> Self {
        Self::new(ProtocolErrorKind::Rule, detail)
    }

    /// A rule that cannot be compiled because of `cause` (a glob's error): read as
    /// `what: cause`, with the cause kept as the source.
    pub fn rule_caused(
        what: impl std::fmt::Display,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ProtocolError {
            kind: ProtocolErrorKind::Rule,
            detail: format!("{what}: {cause}"),
            cause: Some(std::sync::Arc::new(cause)),
        }
    }

    /// A rule that cannot be compiled because of `cause` alone: its words, and it as the
    /// source.
    pub fn rule_of(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        ProtocolError {
            kind: ProtocolErrorKind::Rule,
            detail: cause.to_string(),
            cause: Some(std::sync::Arc::new(cause)),
        }
    }

    /// A body that is not the protocol's, as `cause` (the parser's error) says: read as
    /// `what: cause`, with the cause kept as the source.
    pub fn malformed_caused(
        what: impl std::fmt::Display,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ProtocolError {
            kind: ProtocolErrorKind::Malformed,
            ..Self::rule_caused(what, cause)
        }
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
            cause: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_that_does_not_compile_keeps_the_globs_error() {
        let glob = globset::Glob::new("a[").unwrap_err();
        let words = glob.to_string();
        let e = ProtocolError::rule_caused(format_args!("tool `a[`"), glob);
        assert_eq!(e.to_string(), format!("tool `a[`: {words}"));
        assert_eq!(e.kind(), ProtocolErrorKind::Rule);
        let source = std::error::Error::source(&e).expect("the glob's error is kept");
        assert_eq!(source.to_string(), words);
        assert_eq!(e, ProtocolError::rule(format!("tool `a[`: {words}")));
    }
}
