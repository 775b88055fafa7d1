//! `tls_intercept:` — the CA that signs the certificates shown for terminated hosts, the
//! hosts never terminated, how much of a body is judged and scrubbed, and the identity-token
//! issuer: read, checked and resolved (the CA key is read now, for the placeholder key).

use std::path::PathBuf;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::credentials::BoundHost;

/// `tls_intercept:` — the CA that signs the certificates presented for terminated hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterceptConfig {
    /// The interception CA's certificate.
    pub ca_cert_file: PathBuf,
    /// Its private key.
    pub ca_key_file: PathBuf,
    /// Extra roots for verifying upstreams (private PKI, tests), besides the public ones.
    pub upstream_ca_file: Option<PathBuf>,
    /// Hosts never terminated (pinned clients, mutual-TLS upstreams).
    pub never: Vec<BoundHost>,
    /// Bytes of each response body scanned for reflected secrets (`scrub_body_bytes`).
    pub scrub_body_bytes: u64,
    /// Bytes of a request body a protocol rule judges, and of an MCP message it filters
    /// (`judge_body_bytes`).
    pub judge_body_bytes: u64,
    /// The issuer of sandbox identity tokens (`identity`).
    pub identity: super::identity_token::IssuerConfig,
    /// `refusals_inside`: a refused CONNECT is answered `200`, then refused inside the tunnel
    /// (TLS with a leaf from this CA, or plain HTTP) with the whole refusal text, for clients
    /// that print only a refused CONNECT's status code (curl, Node's undici).
    pub refusals_inside: bool,
    /// `upstream_keepalive`: upstream connections of terminated tunnels kept idle for the next
    /// tunnel of the same sandbox to the same host (`crate::intercept::kept`).
    pub upstream_keepalive: super::ForwardKeepalive,
}

/// The default of `tls_intercept.scrub_body_bytes`: 64 MiB.
pub const DEFAULT_SCRUB_BODY_BYTES: u64 = 64 << 20;

/// The default of `tls_intercept.judge_body_bytes`: 1 MiB.
pub const DEFAULT_JUDGE_BODY_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIntercept {
    pub ca_cert_file: String,
    pub ca_key_file: String,
    #[serde(default)]
    pub upstream_ca_file: Option<String>,
    #[serde(default)]
    pub never: Vec<String>,
    #[serde(default)]
    pub scrub_body_bytes: Option<u64>,
    #[serde(default)]
    pub judge_body_bytes: Option<u64>,
    #[serde(default)]
    pub identity: Option<super::identity_token::RawIssuer>,
    #[serde(default)]
    pub refusals_inside: bool,
    #[serde(default)]
    pub upstream_keepalive: super::raw::RawForwardKeepalive,
}

/// Validate `tls_intercept`; returns it and the placeholder key (a digest of the CA key, read
/// now: placeholders are stable for as long as the CA key is). Under
/// [`super::Secrets::MayBeAbsent`] an unreadable CA key is a warning in `warnings`.
pub(super) fn resolve_intercept(
    raw: Option<RawIntercept>,
    rel: &dyn Fn(&str) -> PathBuf,
    sink: &mut super::error::Sink<'_>,
    files: &mut Vec<PathBuf>,
    secrets: super::Secrets,
    warnings: &mut Vec<String>,
) -> (Option<InterceptConfig>, Option<[u8; 32]>) {
    let Some(raw) = raw else {
        return (None, None);
    };
    let key_file = rel(&raw.ca_key_file);
    let key = match std::fs::read(&key_file) {
        Ok(k) => {
            files.push(key_file.clone());
            Some(Sha256::digest(&k).into())
        }
        Err(e) if secrets == super::Secrets::MayBeAbsent => {
            warnings.push(format!(
                "tls_intercept.ca_key_file: cannot read {}: {e}; {}",
                key_file.display(),
                super::ABSENT_SECRET_NOTE
            ));
            Some(Sha256::digest(super::credentials::ABSENT_SECRET.as_bytes()).into())
        }
        Err(e) => {
            sink.top(
                "tls_intercept.ca_key_file",
                format!("cannot read {}: {e}", key_file.display()),
                Some("ca_key_file"),
            );
            None
        }
    };
    let mut errors = Vec::new();
    let identity = super::identity_token::resolve_issuer(raw.identity.clone(), &mut errors);
    for e in errors {
        sink.top("tls_intercept.identity", e, Some("identity"));
    }
    let mut never = Vec::new();
    for h in &raw.never {
        match BoundHost::parse(h) {
            Ok(b) => never.push(b),
            Err(e) => sink.top("tls_intercept.never", e.to_string(), Some(h)),
        }
    }
    (
        Some(InterceptConfig {
            ca_cert_file: rel(&raw.ca_cert_file),
            ca_key_file: key_file,
            upstream_ca_file: raw.upstream_ca_file.as_deref().map(rel),
            never,
            scrub_body_bytes: raw.scrub_body_bytes.unwrap_or(DEFAULT_SCRUB_BODY_BYTES),
            judge_body_bytes: raw.judge_body_bytes.unwrap_or(DEFAULT_JUDGE_BODY_BYTES),
            refusals_inside: raw.refusals_inside,
            upstream_keepalive: super::defaults::resolve_forward_keepalive(
                raw.upstream_keepalive.clone(),
                "tls_intercept.upstream_keepalive",
                sink,
            ),
            identity,
        }),
        key,
    )
}
