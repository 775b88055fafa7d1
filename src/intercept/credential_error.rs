//! Why a bound credential could not be put on a request: the error of the plug-in trait
//! ([`super::credential::Kind::apply`]) and of what its kinds call (minting, signing, issuing,
//! sealing). Typed by stage, as rustls nests its kinds; the words go into the refusal's
//! detail (`credential NAME: …`) and never carry a secret.

pub use crate::policy::cause::{caused, Cause, Why};

/// A credential that could not be had or applied; the request is refused
/// (`credential_unavailable`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CredentialError {
    /// Minting failed: the token endpoint could not be reached, refused, or answered in a way
    /// that cannot be read; or the grant could not be signed.
    #[error(transparent)]
    Mint(Why),
    /// The token endpoint could not be reached (resolved, connected to, spoken TLS or HTTP
    /// with): the text names its address, which is the operator's, not the sandbox's.
    #[error(transparent)]
    Unreachable(Why),
    /// The request could not be signed (SigV4), or its signed body could not be framed.
    #[error(transparent)]
    Sign(Why),
    /// An identity token could not be issued.
    #[error(transparent)]
    Issue(Why),
    /// The credential's value cannot be written into the request.
    #[error(transparent)]
    Write(Why),
    /// A token answer could not be sealed (it is not passed at all).
    #[error(transparent)]
    Seal(Why),
}

impl CredentialError {
    /// Whether the failure was at the token endpoint (a retry may succeed).
    pub fn is_mint(&self) -> bool {
        matches!(
            self,
            CredentialError::Mint(_) | CredentialError::Unreachable(_)
        )
    }

    /// What the sandbox is told (the record keeps the whole text): never the token endpoint's
    /// name or address (clients review F11); its status and OAuth error code are kept.
    pub fn shown(&self) -> std::borrow::Cow<'_, str> {
        match self {
            CredentialError::Unreachable(_) => {
                "the token endpoint could not be reached (where and why: the audit record)".into()
            }
            other => other.to_string().into(),
        }
    }
}

pub(crate) fn mint(why: impl Into<Why>) -> CredentialError {
    CredentialError::Mint(why.into())
}

pub(crate) fn unreachable(why: impl Into<Why>) -> CredentialError {
    CredentialError::Unreachable(why.into())
}

pub(crate) fn sign(why: impl Into<Why>) -> CredentialError {
    CredentialError::Sign(why.into())
}

pub(crate) fn issue(why: impl Into<Why>) -> CredentialError {
    CredentialError::Issue(why.into())
}

pub(crate) fn seal(why: impl Into<Why>) -> CredentialError {
    CredentialError::Seal(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure formatted from another error reads as before (`what: cause`) and keeps that
    /// error as its source; a failure that is only words has no source.
    #[test]
    fn a_caused_failure_keeps_its_source_and_its_words() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = unreachable(caused("connecting to 192.0.2.1:443", io));
        assert_eq!(e.to_string(), "connecting to 192.0.2.1:443: refused");
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "refused");
        assert!(e.is_mint());
        let plain = sign("an aws-chunked chunk has no chunk-signature");
        assert!(std::error::Error::source(&plain).is_none());
        assert_eq!(plain.shown(), "an aws-chunked chunk has no chunk-signature");
    }
}
