//! TLS for the explicit proxy (`listen.proxy_tls`): `HTTPS_PROXY=https://…` keeps sandbox
//! tokens off the network in cleartext, and a client certificate can identify the sandbox.
//!
//! - The server certificate and key (and the client CA) are read from PEM files and reloaded
//!   when a file changes (a Kubernetes Secret rotation): [`TlsServer::reload_if_changed`],
//!   polled once a second, builds a new rustls configuration and swaps it in; handshakes after
//!   that use it, open connections keep theirs. A file that does not load (a rotation caught
//!   half-written) keeps the configuration in force and is logged.
//! - With `client_ca_file`, clients *may* present a certificate; one that does not verify
//!   fails the handshake. A verified certificate names its sandbox by a URI SAN under
//!   `client_uri_prefix` (SPIFFE style) or by its subject CN ([`TlsServer::client_sandbox`]).
//! - The admin listener (`listen.admin_tls`) uses the same machinery; there a `client_ca_file`
//!   makes a client certificate mandatory.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::{ClientNames, ProxyTls};
use crate::policy::cause::{caused, of, Why};

/// What a client's certificate says about its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCert {
    /// No certificate was presented (or none is asked for).
    Absent,
    /// A verified certificate naming this sandbox id (not yet checked against the policy).
    Names(String),
    /// A verified certificate that names no sandbox the way this listener reads names.
    Unnamed,
}

/// The listener's TLS settings and the configuration in force.
/// Why the TLS listener's files could not be put in force; names the setting and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsLoadError {
    #[error("listen.proxy_tls.{what} {}: {why}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        why: Why,
    },
    #[error("listen.proxy_tls: {0}")]
    Tls(#[from] rustls::Error),
}

fn file_error(what: &'static str, path: &std::path::Path, why: impl Into<Why>) -> TlsLoadError {
    TlsLoadError::File {
        what,
        path: path.to_path_buf(),
        why: why.into(),
    }
}

pub struct TlsServer {
    settings: ProxyTls,
    /// Whether ALPN offers `h2` (the proxy listener; the admin listener speaks HTTP/1.1).
    http2: bool,
    current: ArcSwap<ServerConfig>,
    /// Modification time and length of each file when last loaded.
    stamps: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

impl TlsServer {
    /// Load the certificate, key and client CA; an error says which file and why. `http2`:
    /// offer `h2` before `http/1.1`.
    pub fn load(settings: &ProxyTls, http2: bool) -> Result<Self, TlsLoadError> {
        let config = build(settings, http2)?;
        Ok(TlsServer {
            settings: settings.clone(),
            http2,
            current: ArcSwap::from_pointee(config),
            stamps: Mutex::new(stamps(&files(settings))),
        })
    }

    /// An acceptor with the configuration in force.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }

    /// Reload when a file changed: `None` when nothing changed, else whether the new files
    /// were put in force.
    pub fn reload_if_changed(&self) -> Option<Result<(), TlsLoadError>> {
        let now = stamps(&files(&self.settings));
        {
            let mut seen = self.stamps.lock().ok()?;
            if *seen == now {
                return None;
            }
            *seen = now;
        }
        Some(build(&self.settings, self.http2).map(|c| self.current.store(Arc::new(c))))
    }

    /// The sandbox a verified client certificate names.
    pub fn client_sandbox(&self, peer: Option<&[CertificateDer<'_>]>) -> ClientCert {
        let Some(leaf) = peer.and_then(|c| c.first()) else {
            return ClientCert::Absent;
        };
        match name_in(leaf, &self.settings.client_names) {
            Some(id) => ClientCert::Names(id),
            None => ClientCert::Unnamed,
        }
    }
}

fn files(s: &ProxyTls) -> Vec<PathBuf> {
    let mut v = vec![s.cert_file.clone(), s.key_file.clone()];
    v.extend(s.client_ca_file.clone());
    v
}

fn stamps(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// The rustls configuration for `s`.
fn build(s: &ProxyTls, http2: bool) -> Result<ServerConfig, TlsLoadError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&s.cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error("cert_file", &s.cert_file, of(e)))?;
    if certs.is_empty() {
        return Err(file_error(
            "cert_file",
            &s.cert_file,
            "no certificate in it",
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&s.key_file)
        .map_err(|e| file_error("key_file", &s.key_file, of(e)))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &s.client_ca_file {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| file_error("client_ca_file", ca, of(e)))?;
            for c in cas {
                roots
                    .add(c)
                    .map_err(|e| file_error("client_ca_file", ca, of(e)))?;
            }
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if !s.require_client_cert {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier
                .build()
                .map_err(|e| file_error("client_ca_file", ca, of(e)))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        file_error(
            "key_file",
            &s.key_file,
            caused("certificate and key do not match", e),
        )
    })?;
    // On the proxy listener HTTP/2 first (several tunnels on one connection, RFC 9113 §8.5);
    // HTTP/1.1 otherwise.
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

/// The sandbox id a certificate names, read the configured way.
fn name_in(der: &CertificateDer<'_>, names: &ClientNames) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    match names {
        ClientNames::None => None,
        ClientNames::UriPrefix(prefix) => {
            let san = cert.subject_alternative_name().ok()??;
            san.value.general_names.iter().find_map(|n| match n {
                x509_parser::extensions::GeneralName::URI(uri) => uri
                    .strip_prefix(prefix.as_str())
                    .filter(|id| !id.is_empty())
                    .map(str::to_string),
                _ => None,
            })
        }
        ClientNames::CommonName => cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string),
    }
}
