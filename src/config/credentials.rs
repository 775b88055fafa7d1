//! `credentials:` of a binding — secrets the proxy puts on requests to the hosts they are
//! bound to, so that the sandbox only ever holds a placeholder ([`crate::intercept`]) — and
//! the top-level `tls_intercept:` that terminating those hosts needs.
//!
//! Secrets are read when the configuration loads (from a file or an environment variable,
//! never inline, as for tokens) and again on every reload; they are never logged, never in a
//! record and never returned by the admin API ([`Secret`]'s `Debug` says `<redacted>`).

use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use crate::policy::http_rules::{BoundHost, HttpRule};

/// A secret value. Compared by content (a changed file is a changed binding), shown as
/// `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(super) Arc<str>);

impl Secret {
    /// A secret the proxy obtained itself (a minted token).
    pub fn new(s: &str) -> Secret {
        Secret(s.into())
    }

    /// The secret's value (never logged or shown).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How a credential goes on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inject {
    /// Set this header (overwriting what the client sent) to `format` with `{secret}`
    /// replaced.
    Header {
        /// The header.
        name: http::HeaderName,
        /// Its value, with `{secret}` replaced.
        format: String,
    },
    /// Replace the placeholder in these request headers only (`Authorization` with the Basic
    /// scheme: in the decoded user or password). A placeholder anywhere else is refused.
    ReplacePlaceholder {
        /// The headers.
        headers: Vec<http::HeaderName>,
    },
}

/// One credential of a binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The credential's name.
    pub name: String,
    /// The hosts it is bound to.
    pub hosts: Vec<BoundHost>,
    /// What the proxy holds and how it goes on a request.
    pub kind: CredentialKind,
    /// What the sandbox holds instead (`GET /v1/sandboxes/{id}/placeholders`); for
    /// `aws_sigv4`, the placeholder access key id.
    pub placeholder: String,
}

/// The kinds of credential (`kind:`), each put on requests by its own implementation in
/// `crate::intercept::credential`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialKind {
    /// `kind: static` (the default): a secret set in a header or replacing the placeholder.
    Static {
        /// How it is put on requests.
        inject: Inject,
        /// The secret.
        secret: Secret,
    },
    /// `kind: aws_sigv4`: requests signed with the placeholder keys are re-signed.
    AwsSigV4(super::credential_kinds::AwsKeys),
    /// `kind: oauth2` and `kind: github_app`: a token the proxy mints and refreshes.
    Minted(std::sync::Arc<super::credential_kinds::Minting>),
}

impl Credential {
    /// Whether it is bound to `host`.
    pub fn bound_to(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.matches(host))
    }

    /// Whether `host` is this minting credential's token endpoint (its answers to the sandbox
    /// are sealed, so it is terminated).
    pub fn token_host(&self, host: &str) -> bool {
        match &self.kind {
            CredentialKind::Minted(m) => m
                .token_endpoint()
                .is_some_and(|(h, _)| h.eq_ignore_ascii_case(host)),
            _ => false,
        }
    }

    /// What identifies this credential with its secrets, by digest (a rotation or any change
    /// is a new fingerprint): the policy version and the minted-token cache key read it.
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(format!("{}{:?}{:?}", self.name, self.hosts, self.kind));
        for s in self.secrets() {
            h.update(Sha256::digest(s.expose().as_bytes()));
        }
        h.finalize().into()
    }

    /// Every secret the proxy read for this credential.
    pub fn secrets(&self) -> Vec<&Secret> {
        match &self.kind {
            CredentialKind::Static { secret, .. } => vec![secret],
            CredentialKind::AwsSigV4(k) => k.secrets(),
            CredentialKind::Minted(m) => vec![&m.secret],
        }
    }
}

/// `credentials[]` as written.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    /// `name`.
    pub name: String,
    /// `hosts`.
    pub hosts: Vec<String>,
    /// `static` (default), `aws_sigv4`, `oauth2`, `github_app`.
    #[serde(default)]
    pub kind: Option<String>,
    /// `inject`: how it is put on requests.
    #[serde(default)]
    pub inject: Option<RawInject>,
    /// `source`: where its secret is read from.
    pub source: RawSource,
    /// `oauth2`: `client_credentials`, `refresh_token` or `jwt_bearer`.
    #[serde(default)]
    pub grant: Option<String>,
    /// `oauth2`: where tokens are minted.
    #[serde(default)]
    pub token_url: Option<String>,
    /// `oauth2`.
    #[serde(default)]
    pub client_id: Option<String>,
    /// `oauth2`.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// `github_app`.
    #[serde(default)]
    pub app_id: Option<u64>,
    /// `github_app`.
    #[serde(default)]
    pub installation_id: Option<u64>,
    /// `github_app`: the API that mints installation tokens (`https://api.github.com`).
    #[serde(default)]
    pub api_url: Option<String>,
}

/// `inject:` as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    /// `header`: the header to set.
    #[serde(default)]
    pub header: Option<String>,
    /// `format`: its value, with `{secret}`.
    #[serde(default)]
    pub format: Option<String>,
    /// `replace_placeholder`: replace the placeholder instead.
    #[serde(default)]
    pub replace_placeholder: Option<RawReplace>,
}

/// `inject.replace_placeholder` as written: `{ headers: [...] }`. The wave-2 form `true`
/// (replace anywhere) is refused with a message: it let a placeholder in a reflected header
/// or the URL come back as the secret.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(untagged)]
pub enum RawReplace {
    /// `true`: in `Authorization`.
    Flag(bool),
    /// In these headers.
    In(RawReplaceIn),
}

/// `replace_placeholder: { headers }`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawReplaceIn {
    /// The headers the placeholder is replaced in.
    pub headers: Vec<String>,
}

/// `source:` as written: one file or variable per secret the kind needs.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    /// A file holding the secret.
    #[serde(default)]
    pub file: Option<String>,
    /// An environment variable holding it.
    #[serde(default)]
    pub env: Option<String>,
    /// `aws_sigv4`: the access key id's file.
    #[serde(default)]
    pub access_key_id_file: Option<String>,
    /// `aws_sigv4`: the secret access key's file.
    #[serde(default)]
    pub secret_access_key_file: Option<String>,
    /// `aws_sigv4`: the session token's file.
    #[serde(default)]
    pub session_token_file: Option<String>,
    /// `oauth2`: the client secret's file.
    #[serde(default)]
    pub client_secret_file: Option<String>,
    /// `oauth2`: the refresh token's file.
    #[serde(default)]
    pub refresh_token_file: Option<String>,
    /// `github_app`: the App's private key file.
    #[serde(default)]
    pub private_key_file: Option<String>,
}

impl RawSource {
    /// Every file named (watched for rotation).
    pub fn files(&self) -> impl Iterator<Item = &String> {
        [
            &self.file,
            &self.access_key_id_file,
            &self.secret_access_key_file,
            &self.session_token_file,
            &self.client_secret_file,
            &self.refresh_token_file,
            &self.private_key_file,
        ]
        .into_iter()
        .flatten()
    }
}

/// The placeholder of credential `name` of sandbox `sandbox`: opaque, stable for as long as
/// `key` (the interception CA's key) is, and as long as the secret (so that a client that
/// checks a key's length accepts it) — at least 32 characters.
pub fn placeholder(key: &[u8], sandbox: &str, name: &str, secret_len: usize) -> String {
    let mut out = String::from("egp_");
    let mut block = 0u32;
    while out.len() < secret_len.max(32) {
        let mut h = Sha256::new();
        h.update(b"egress-proxy placeholder v1\0");
        h.update(key);
        h.update(sandbox.as_bytes());
        h.update(b"\0");
        h.update(name.as_bytes());
        h.update(block.to_be_bytes());
        out.push_str(&hex::encode(h.finalize()));
        block += 1;
    }
    out.truncate(secret_len.max(32));
    out
}

/// The credential's name checked and the hosts it is bound to parsed (errors in `errors`).
fn binding(raw: &RawCredential, errors: &mut Vec<String>) -> Vec<BoundHost> {
    let valid_name = !raw.name.is_empty()
        && raw.name.len() <= 64
        && raw
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid_name {
        errors.push(format!(
            "name `{}`: letters, digits, _ and - (1 to 64)",
            raw.name
        ));
    }
    if raw.hosts.is_empty() {
        errors.push("hosts: bind the credential to at least one host".into());
    }
    let mut hosts = Vec::new();
    for h in &raw.hosts {
        match BoundHost::parse(h) {
            Ok(b) => hosts.push(b),
            Err(e) => errors.push(format!("hosts: {e}")),
        }
    }
    hosts
}

/// An `aws_sigv4` credential names every host it is bound to: a wildcard is refused.
fn aws_by_name(hosts: &[BoundHost], errors: &mut Vec<String>) {
    for h in hosts.iter().filter(|h| !matches!(h, BoundHost::Exact(_))) {
        errors.push(format!(
            "hosts: `{}`: an aws_sigv4 credential is bound to the AWS endpoints it signs for, by name (s3.eu-west-1.amazonaws.com, sts.amazonaws.com); a wildcard covers names anyone can own (S3 buckets in virtual-host style, API Gateway and Lambda URLs), and the real key id and session token would reach them",
            h.text()
        ));
    }
}

/// What the sandbox is shown in the credential's place: a key id for AWS, a string as long
/// as the secret for a static one, 40 characters for a minted token.
fn placeholder_of(kind: &CredentialKind, key: &[u8], sandbox: &str, name: &str) -> String {
    match kind {
        CredentialKind::AwsSigV4(_) => {
            super::credential_kinds::aws_placeholder_key_id(key, sandbox, name)
        }
        CredentialKind::Static { secret, .. } => {
            placeholder(key, sandbox, name, secret.expose().len())
        }
        CredentialKind::Minted(_) => placeholder(key, sandbox, name, 40),
    }
}

/// Validate and load one credential. `read` reads a file (relative to the config); `key` is
/// what placeholders derive from.
/// Under [`super::Secrets::MayBeAbsent`] a secret that cannot be read is a warning in
/// `warnings` and a stand-in takes its place (review tools decide no differently without it).
pub fn resolve(
    raw: &RawCredential,
    sandbox: &str,
    read_file: super::files::ReadFile<'_>,
    key: &[u8],
    secrets: super::Secrets,
    warnings: &mut Vec<String>,
) -> Result<Credential, Vec<String>> {
    let mut errors = Vec::new();
    let hosts = binding(raw, &mut errors);
    let kind = raw.kind.as_deref().unwrap_or("static");
    let mut read = Reader {
        read_file,
        secrets,
        sandbox,
        name: &raw.name,
        warnings,
    };
    let mut resolved = match kind {
        "static" => static_kind(raw, &mut read, &mut errors),
        "aws_sigv4" => super::credential_kinds::aws(raw, &mut read, &mut errors),
        "oauth2" | "github_app" => super::credential_kinds::minted(raw, &mut read, &mut errors),
        other => {
            errors.push(format!(
                "kind `{other}`: one of static, aws_sigv4, oauth2, github_app"
            ));
            None
        }
    };
    if let Some(CredentialKind::AwsSigV4(k)) = resolved.as_mut() {
        aws_by_name(&hosts, &mut errors);
        k.placeholder_secret =
            super::credential_kinds::aws_placeholder_secret(key, sandbox, &raw.name);
    }
    match (errors.is_empty(), resolved) {
        (true, Some(kind)) => Ok(Credential {
            placeholder: placeholder_of(&kind, key, sandbox, &raw.name),
            name: raw.name.clone(),
            hosts,
            kind,
        }),
        _ => Err(errors),
    }
}

/// Reads a credential's secrets: an error names the file or variable, never a secret; under
/// [`super::Secrets::MayBeAbsent`] an unreadable one is a warning and a stand-in.
pub(super) struct Reader<'a> {
    read_file: super::files::ReadFile<'a>,
    secrets: super::Secrets,
    sandbox: &'a str,
    name: &'a str,
    warnings: &'a mut Vec<String>,
}

impl Reader<'_> {
    /// The trimmed content of file `f` (`what` names the key).
    pub(super) fn file(&mut self, f: &str, what: &str) -> Result<String, String> {
        match (self.read_file)(f) {
            Ok(text) => Ok(text.trim().to_string()),
            Err(e) => self.absent(format!("source.{what}: {e}")),
        }
    }

    /// The trimmed value of variable `v`.
    fn env(&mut self, v: &str) -> Result<String, String> {
        match std::env::var(v) {
            Ok(s) => Ok(s.trim().to_string()),
            Err(_) => self.absent(format!("source.env: the variable {v} is not set")),
        }
    }

    fn absent(&mut self, why: String) -> Result<String, String> {
        match self.secrets {
            super::Secrets::Required => Err(why),
            super::Secrets::MayBeAbsent => {
                self.warnings.push(format!(
                    "sandbox {}: credential {}: {why}; {}",
                    self.sandbox,
                    self.name,
                    super::ABSENT_SECRET_NOTE
                ));
                Ok(ABSENT_SECRET.to_string())
            }
        }
    }
}

/// A secret as read: printable ASCII, not empty.
pub(super) fn printable(s: String, what: &str, errors: &mut Vec<String>) -> Option<Secret> {
    let ok = !s.is_empty() && s.bytes().all(|b| (0x20..0x7f).contains(&b));
    if !ok {
        errors.push(format!(
            "{what}: the secret is empty or not printable ASCII"
        ));
    }
    ok.then(|| Secret(s.into()))
}

/// `kind: static`: `inject` and `source: { file | env }`.
fn static_kind(
    raw: &RawCredential,
    read: &mut Reader<'_>,
    errors: &mut Vec<String>,
) -> Option<CredentialKind> {
    let inject = match &raw.inject {
        Some(i) => inject(i, errors),
        None => {
            errors.push("inject: the static kind needs { header, format } or { replace_placeholder: { headers: [...] } }".into());
            None
        }
    };
    let s = &raw.source;
    let secret = match (&s.file, &s.env) {
        (Some(f), None) => read.file(f, "file"),
        (None, Some(v)) => read.env(v),
        _ => Err("source: exactly one of file, env (never the secret itself)".into()),
    };
    let secret = printable(secret.map_err(|e| errors.push(e)).ok()?, "source", errors)?;
    Some(CredentialKind::Static {
        inject: inject?,
        secret,
    })
}

/// `inject:` — how the credential goes on a request (the kinds, `crate::intercept::credential`).
pub(super) fn inject(raw: &RawInject, errors: &mut Vec<String>) -> Option<Inject> {
    match (&raw.header, &raw.replace_placeholder) {
        (Some(h), None) => match http::HeaderName::from_bytes(h.as_bytes()) {
            Ok(name) => {
                let format = raw.format.clone().unwrap_or_else(|| "{secret}".into());
                if !format.contains("{secret}") {
                    errors.push("inject.format must contain {secret}".into());
                }
                Some(Inject::Header { name, format })
            }
            Err(_) => {
                errors.push(format!("inject.header `{h}` is not a header name"));
                None
            }
        },
        (None, Some(RawReplace::In(r))) if raw.format.is_none() => {
            let mut headers = Vec::new();
            for h in &r.headers {
                match http::HeaderName::from_bytes(h.as_bytes()) {
                    Ok(n) => headers.push(n),
                    Err(_) => errors.push(format!(
                        "inject.replace_placeholder.headers: `{h}` is not a header name"
                    )),
                }
            }
            if r.headers.is_empty() {
                errors.push("inject.replace_placeholder.headers: name at least one header".into());
            }
            Some(Inject::ReplacePlaceholder { headers })
        }
        (None, Some(RawReplace::Flag(_))) => {
            errors.push(
                "inject.replace_placeholder: name the headers the placeholder may be replaced in, e.g. { headers: [Authorization] } (replacing it anywhere let a reflected header or URL return the secret)"
                    .into(),
            );
            None
        }
        _ => {
            errors.push(
                "inject: either { header, format } or { replace_placeholder: { headers: [...] } }"
                    .into(),
            );
            None
        }
    }
}

/// What stands in for a secret that review tools could not read (never used to serve).
pub(super) const ABSENT_SECRET: &str = "secret-absent-on-this-machine";

pub(super) use super::intercept::{resolve_intercept, RawIntercept};
pub use super::intercept::{InterceptConfig, DEFAULT_JUDGE_BODY_BYTES, DEFAULT_SCRUB_BODY_BYTES};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_hosts_match_by_label() {
        let b = BoundHost::parse("*.example.com").unwrap();
        assert!(b.matches("api.example.com"));
        assert!(!b.matches("example.com"));
        assert!(!b.matches("badexample.com"));
        let a = BoundHost::parse("**.example.com").unwrap();
        assert!(a.matches("example.com") && a.matches("x.y.example.com"));
        assert!(BoundHost::parse("10.0.0.0/8").is_err());
        assert!(BoundHost::parse("api.example.com:443").is_err());
    }

    #[test]
    fn placeholders_are_stable_distinct_and_as_long_as_the_secret() {
        let p = placeholder(b"k", "s1", "openai", 51);
        assert_eq!(p.len(), 51);
        assert_eq!(p, placeholder(b"k", "s1", "openai", 51));
        assert_ne!(p, placeholder(b"k", "s2", "openai", 51));
        assert_ne!(p, placeholder(b"k", "s1", "github", 51));
        assert_ne!(p, placeholder(b"other", "s1", "openai", 51));
        assert_eq!(placeholder(b"k", "s", "n", 5).len(), 32);
        assert_eq!(format!("{:?}", Secret("x".into())), "<redacted>");
    }
}
