//! Why a bound credential could not be put on a request: the error of the plug-in trait
//! ([`super::credential::Kind::apply`]) and of what its kinds call (minting, signing, issuing,
//! sealing). Typed by stage, as rustls nests its kinds; the words go into the refusal's
//! detail (`credential NAME: …`) and never carry a secret.

/// A credential that could not be had or applied; the request is refused
/// (`credential_unavailable`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Minting failed: the token endpoint could not be reached, refused, or answered in a way
    /// that cannot be read; or the grant could not be signed.
    #[error("{0}")]
    Mint(String),
    /// The token endpoint could not be reached (resolved, connected to, spoken TLS or HTTP
    /// with): the text names its address, which is the operator's, not the sandbox's.
    #[error("{0}")]
    Unreachable(String),
    /// The request could not be signed (SigV4), or its signed body could not be framed.
    #[error("{0}")]
    Sign(String),
    /// An identity token could not be issued.
    #[error("{0}")]
    Issue(String),
    /// The credential's value cannot be written into the request.
    #[error("{0}")]
    Write(String),
    /// A token answer could not be sealed (it is not passed at all).
    #[error("{0}")]
    Seal(String),
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

pub(crate) fn mint(why: impl Into<String>) -> CredentialError {
    CredentialError::Mint(why.into())
}

pub(crate) fn unreachable(why: impl Into<String>) -> CredentialError {
    CredentialError::Unreachable(why.into())
}

pub(crate) fn sign(why: impl Into<String>) -> CredentialError {
    CredentialError::Sign(why.into())
}

pub(crate) fn issue(why: impl Into<String>) -> CredentialError {
    CredentialError::Issue(why.into())
}

pub(crate) fn seal(why: impl Into<String>) -> CredentialError {
    CredentialError::Seal(why.into())
}
