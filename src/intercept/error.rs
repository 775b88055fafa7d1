//! What can go wrong setting up interception, issuing a certificate, or opening the upstream's
//! HTTP connection. Messages name the setting or file involved and never a key's bytes.

use std::path::PathBuf;

/// An interception failure.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    /// A file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file's content is not what it must be.
    #[error("{what}: {why}")]
    Content { what: &'static str, why: String },
    /// `ca init` would overwrite a CA.
    #[error("{} already holds a CA: remove it first (sandboxes that trust it must be told)", .0.display())]
    Exists(PathBuf),
    /// A certificate could not be made or signed.
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    /// rustls refused a configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The upstream's HTTP handshake failed (inside its TLS).
    #[error("{version} handshake with the upstream: {source}")]
    Upstream {
        version: &'static str,
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

    pub(crate) fn content(what: &'static str, why: impl std::fmt::Display) -> Self {
        InterceptError::Content {
            what,
            why: why.to_string(),
        }
    }
}
