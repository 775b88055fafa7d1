//! What can go wrong setting up interception, issuing a certificate, opening the upstream's
//! HTTP connection, or reading a body the exchange must read (a credential's own failures are
//! [`super::CredentialError`]). Messages name the setting or file involved and never a key's bytes.

use std::path::PathBuf;

/// An interception failure.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    /// A file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    File {
        /// The setting the file is named by.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file's content is not what it must be.
    #[error("{what}: {why}")]
    Content {
        /// The setting the file is named by.
        what: &'static str,
        /// What is wrong with it (and the parser's error, as the source).
        #[source]
        why: crate::policy::cause::Why,
    },
    /// `ca init` would overwrite a CA.
    #[error("{} already holds a CA: remove it first (sandboxes that trust it must be told)", .0.display())]
    Exists(PathBuf),
    /// A certificate could not be made or signed.
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    /// rustls refused a configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// A body the exchange must read (to filter, seal or show it) could not be read: the
    /// exchange is refused, never passed unread.
    #[error(transparent)]
    Body(crate::policy::cause::Why),
    /// A credential could not be had or applied (minting, signing, issuing, sealing).
    #[error(transparent)]
    Credential(#[from] super::CredentialError),
    /// The upstream's HTTP handshake failed (inside its TLS).
    #[error("{version} handshake with the upstream: {source}")]
    Upstream {
        /// `HTTP/1.1` or `HTTP/2`.
        version: &'static str,
        /// Why.
        #[source]
        source: hyper::Error,
    },
}

impl InterceptError {
    pub(crate) fn file(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        InterceptError::File {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn body(why: impl Into<crate::policy::cause::Why>) -> Self {
        InterceptError::Body(why.into())
    }

    /// A body could not be read while doing `what`, because of `cause` (kept as the source).
    pub(crate) fn body_caused(
        what: &str,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        InterceptError::Body(crate::policy::cause::caused(what, cause))
    }

    pub(crate) fn content(what: &'static str, why: impl Into<crate::policy::cause::Why>) -> Self {
        InterceptError::Content {
            what,
            why: why.into(),
        }
    }

    /// The file named by `what` is not what it must be (`words`), as `cause` says.
    pub(crate) fn content_caused(
        what: &'static str,
        words: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::content(what, crate::policy::cause::caused(words, cause))
    }
}
