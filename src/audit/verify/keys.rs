//! The key files of the audit trail: the Ed25519 public key the verifier checks signatures
//! with, and the private key the proxy (and `audit provenance`) signs with, both PEM.

use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;

/// A file the verifier (or the proxy, for its signing key) cannot use.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a key of the kind needed.
    #[error("{}: not an Ed25519 {what} in PEM", path.display())]
    NotAKey {
        /// The file.
        path: PathBuf,
        /// The kind of key needed (`public key`, `private key`).
        what: &'static str,
    },
}

/// `path`'s text (a key, or the checkpoint file).
pub(super) fn read_text(path: &Path) -> Result<String, KeyFileError> {
    std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Read an Ed25519 public key (SPKI PEM, as `openssl pkey -pubout` writes it).
pub fn read_public_key(path: &Path) -> Result<VerifyingKey, KeyFileError> {
    use ed25519_dalek::pkcs8::DecodePublicKey;
    VerifyingKey::from_public_key_pem(&read_text(path)?).map_err(|_| KeyFileError::NotAKey {
        path: path.to_path_buf(),
        what: "public key (SPKI)",
    })
}

/// Read an Ed25519 private key (PKCS#8 PEM, as `openssl genpkey -algorithm ed25519` writes
/// it).
pub fn read_signing_key(path: &Path) -> Result<ed25519_dalek::SigningKey, KeyFileError> {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    ed25519_dalek::SigningKey::from_pkcs8_pem(&read_text(path)?).map_err(|_| {
        KeyFileError::NotAKey {
            path: path.to_path_buf(),
            what: "private key (PKCS#8)",
        }
    })
}
