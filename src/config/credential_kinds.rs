//! The credential kinds that are more than a static secret (`kind:` of a `credentials[]`
//! entry), validated and read here; what they do on a request is
//! `crate::intercept::credential`'s:
//!
//! - `aws_sigv4`: real keys (`source.access_key_id_file`, `secret_access_key_file`,
//!   `session_token_file?`); the sandbox holds AWS-shaped placeholder keys and signs with them,
//!   the proxy re-signs;
//! - `oauth2`: `grant` (`client_credentials`, `refresh_token`, `jwt_bearer`), `token_url`,
//!   `client_id`, `scopes`, and one of `source.client_secret_file`, `refresh_token_file`,
//!   `private_key_file`; the proxy mints the access token;
//! - `github_app`: `app_id`, `installation_id`, `api_url?`, `source.private_key_file`; the
//!   proxy signs the app's JWT and mints installation tokens.

use sha2::{Digest, Sha256};

use super::credentials::{printable, CredentialKind, Inject, RawCredential, Reader, Secret};

/// The real AWS keys of an `aws_sigv4` credential, and the placeholder secret key the sandbox
/// signs with (its placeholder key id is the credential's `placeholder`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsKeys {
    /// The access key id.
    pub access_key_id: Secret,
    /// The secret access key.
    pub secret_access_key: Secret,
    /// The session token, for temporary credentials.
    pub session_token: Option<Secret>,
    /// Not a secret of the proxy's: what the sandbox's SDK signs with.
    pub placeholder_secret: String,
}

impl AwsKeys {
    /// Every secret value (for scrubbing).
    pub fn secrets(&self) -> Vec<&Secret> {
        let mut out = vec![&self.access_key_id, &self.secret_access_key];
        out.extend(self.session_token.as_ref());
        out
    }
}

/// How an `oauth2` credential obtains its access token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The client credentials grant.
    ClientCredentials,
    /// The refresh token grant.
    RefreshToken,
    /// RFC 7523: a JWT signed with the private key is the assertion.
    JwtBearer,
}

/// What a minting credential mints from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mint {
    /// `kind: oauth2`.
    OAuth2 {
        /// Which grant.
        grant: Grant,
        /// The token endpoint.
        token_url: http::Uri,
        /// The client id.
        client_id: String,
        /// The scopes asked for.
        scopes: Vec<String>,
    },
    /// `kind: github_app`.
    GithubApp {
        /// The App's id.
        app_id: u64,
        /// The installation tokens are minted for.
        installation_id: u64,
        /// `https://api.github.com` unless `api_url` says otherwise.
        api_url: http::Uri,
    },
}

/// A minting credential: what it mints from, with which secret (client secret, refresh token
/// or private key PEM), and the header the minted token goes in (`oauth2`: `inject`, else
/// `Authorization: Bearer {secret}`; `github_app`: the same, and Basic auth for git).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minting {
    /// What is minted, and from where.
    pub how: Mint,
    /// The secret it is minted with (client secret, refresh token, private key).
    pub secret: Secret,
    /// Where the minted token goes on a request.
    pub inject: Inject,
}

impl Minting {
    /// The host and path of the token endpoint (a sandbox's own calls there are sealed).
    pub fn token_endpoint(&self) -> Option<(String, String)> {
        let url: http::Uri = self.token_url().parse().ok()?;
        Some((url.host()?.to_ascii_lowercase(), url.path().to_string()))
    }

    /// The URL tokens are minted at.
    pub fn token_url(&self) -> String {
        match &self.how {
            Mint::OAuth2 { token_url, .. } => token_url.to_string(),
            Mint::GithubApp {
                api_url,
                installation_id,
                ..
            } => format!(
                "{}/app/installations/{installation_id}/access_tokens",
                api_url.to_string().trim_end_matches('/')
            ),
        }
    }
}

/// The placeholder access key id of an `aws_sigv4` credential: `AKIA` and 16 characters of
/// AWS's alphabet, derived like every placeholder (stable while the CA key is).
pub fn aws_placeholder_key_id(key: &[u8], sandbox: &str, name: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let d = derive(key, sandbox, name, b"aws key id");
    let tail: String = d[..16]
        .iter()
        .map(|b| ALPHABET[usize::from(b % 32)] as char)
        .collect();
    format!("AKIA{tail}")
}

/// The placeholder secret access key: 40 characters, like AWS's.
pub fn aws_placeholder_secret(key: &[u8], sandbox: &str, name: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut d = derive(key, sandbox, name, b"aws secret").to_vec();
    d.extend(derive(key, sandbox, name, b"aws secret 2"));
    d[..40]
        .iter()
        .map(|b| ALPHABET[usize::from(b % 64)] as char)
        .collect()
}

fn derive(key: &[u8], sandbox: &str, name: &str, what: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"egress-proxy placeholder v1\0");
    h.update(what);
    h.update(key);
    h.update(sandbox.as_bytes());
    h.update(b"\0");
    h.update(name.as_bytes());
    h.finalize().into()
}

/// Read one `source.<what>` file that must be named.
fn required(
    file: &Option<String>,
    what: &str,
    read: &mut Reader<'_>,
    errors: &mut Vec<String>,
) -> Option<Secret> {
    let Some(f) = file else {
        errors.push(format!("source.{what}: required for this kind"));
        return None;
    };
    let text = read.file(f, what).map_err(|e| errors.push(e)).ok()?;
    printable_or_pem(text, what, errors)
}

/// A secret, or a PEM key (several lines).
fn printable_or_pem(text: String, what: &str, errors: &mut Vec<String>) -> Option<Secret> {
    if text.starts_with("-----BEGIN") {
        return Some(Secret(text.into()));
    }
    printable(text, &format!("source.{what}"), errors)
}

/// The keys no kind but `static` takes, and the settings only minting kinds take.
fn refuse_foreign(raw: &RawCredential, kind: &str, errors: &mut Vec<String>) {
    let s = &raw.source;
    if s.file.is_some() || s.env.is_some() {
        errors.push(format!(
            "source.file and source.env are the static kind's; {kind} names its files"
        ));
    }
    let oauth = raw.grant.is_some()
        || raw.token_url.is_some()
        || raw.client_id.is_some()
        || !raw.scopes.is_empty();
    let github = raw.app_id.is_some() || raw.installation_id.is_some() || raw.api_url.is_some();
    if (oauth && kind != "oauth2") || (github && kind != "github_app") {
        errors.push(format!(
            "grant, token_url, client_id and scopes are oauth2's; app_id, installation_id and api_url github_app's (this is {kind})"
        ));
    }
}

/// `kind: aws_sigv4`.
pub(super) fn aws(
    raw: &RawCredential,
    read: &mut Reader<'_>,
    errors: &mut Vec<String>,
) -> Option<CredentialKind> {
    refuse_foreign(raw, "aws_sigv4", errors);
    if raw.inject.is_some() {
        errors.push("inject: aws_sigv4 re-signs requests; it takes no inject".into());
    }
    let s = &raw.source;
    let access_key_id = required(&s.access_key_id_file, "access_key_id_file", read, errors);
    let secret_access_key = required(
        &s.secret_access_key_file,
        "secret_access_key_file",
        read,
        errors,
    );
    let session_token = match &s.session_token_file {
        Some(_) => Some(required(
            &s.session_token_file,
            "session_token_file",
            read,
            errors,
        )?),
        None => None,
    };
    Some(CredentialKind::AwsSigV4(AwsKeys {
        access_key_id: access_key_id?,
        secret_access_key: secret_access_key?,
        session_token,
        placeholder_secret: String::new(),
    }))
}

/// `kind: oauth2` and `kind: github_app`.
pub(super) fn minted(
    raw: &RawCredential,
    read: &mut Reader<'_>,
    errors: &mut Vec<String>,
) -> Option<CredentialKind> {
    let kind = raw.kind.as_deref().unwrap_or_default();
    refuse_foreign(raw, kind, errors);
    let inject = match &raw.inject {
        Some(i) if kind == "oauth2" => match super::credentials::inject(i, errors)? {
            Inject::Header { name, format } => Inject::Header { name, format },
            Inject::ReplacePlaceholder { .. } => {
                errors.push("inject: a minted token goes in a header ({ header, format })".into());
                return None;
            }
        },
        Some(_) => {
            errors.push("inject: github_app sets Authorization itself".into());
            return None;
        }
        None => Inject::Header {
            name: http::header::AUTHORIZATION,
            format: "Bearer {secret}".into(),
        },
    };
    let s = &raw.source;
    let (how, secret) = match kind {
        "github_app" => {
            let (Some(app_id), Some(installation_id)) = (raw.app_id, raw.installation_id) else {
                errors.push("github_app needs app_id and installation_id".into());
                return None;
            };
            let api_url = https_url(
                raw.api_url.as_deref().unwrap_or("https://api.github.com"),
                "api_url",
                errors,
            )?;
            let key = required(&s.private_key_file, "private_key_file", read, errors)?;
            signing_key(&key, errors)?;
            let how = Mint::GithubApp {
                app_id,
                installation_id,
                api_url,
            };
            (how, key)
        }
        _ => oauth2(raw, read, errors)?,
    };
    Some(CredentialKind::Minted(std::sync::Arc::new(Minting {
        how,
        secret,
        inject,
    })))
}

/// `kind: oauth2`: its grant, endpoint and the one secret the grant needs.
fn oauth2(
    raw: &RawCredential,
    read: &mut Reader<'_>,
    errors: &mut Vec<String>,
) -> Option<(Mint, Secret)> {
    let s = &raw.source;
    let (grant, file, what) = match raw.grant.as_deref() {
        Some("client_credentials") => (
            Grant::ClientCredentials,
            &s.client_secret_file,
            "client_secret_file",
        ),
        Some("refresh_token") => (
            Grant::RefreshToken,
            &s.refresh_token_file,
            "refresh_token_file",
        ),
        Some("jwt_bearer") => (Grant::JwtBearer, &s.private_key_file, "private_key_file"),
        other => {
            errors.push(format!(
                "grant `{}`: one of client_credentials, refresh_token, jwt_bearer",
                other.unwrap_or_default()
            ));
            return None;
        }
    };
    let named = [
        ("client_secret_file", &s.client_secret_file),
        ("refresh_token_file", &s.refresh_token_file),
        ("private_key_file", &s.private_key_file),
    ];
    for (n, f) in named {
        if f.is_some() && n != what {
            errors.push(format!("source.{n}: grant {:?} reads {what}", grant));
        }
    }
    let Some(url) = raw.token_url.as_deref() else {
        errors.push("token_url: required for oauth2".into());
        return None;
    };
    let token_url = https_url(url, "token_url", errors)?;
    let Some(client_id) = raw.client_id.clone().filter(|c| !c.is_empty()) else {
        errors.push("client_id: required for oauth2".into());
        return None;
    };
    let secret = required(file, what, read, errors)?;
    if grant == Grant::JwtBearer {
        signing_key(&secret, errors)?;
    }
    let how = Mint::OAuth2 {
        grant,
        token_url,
        client_id,
        scopes: raw.scopes.clone(),
    };
    Some((how, secret))
}

/// An `https://` URL with a host.
fn https_url(url: &str, what: &str, errors: &mut Vec<String>) -> Option<http::Uri> {
    match url.parse::<http::Uri>() {
        Ok(u) if u.scheme_str() == Some("https") && u.host().is_some() => Some(u),
        _ => {
            errors.push(format!("{what} `{url}`: an https:// URL"));
            None
        }
    }
}

/// Whether the PEM key signs JWTs (RSA for RS256, or an EC P-256 key for ES256).
fn signing_key(pem: &Secret, errors: &mut Vec<String>) -> Option<()> {
    let b = pem.expose().as_bytes();
    let ok = jsonwebtoken::EncodingKey::from_rsa_pem(b).is_ok()
        || jsonwebtoken::EncodingKey::from_ec_pem(b).is_ok();
    if !ok {
        errors.push("source.private_key_file: not an RSA or EC private key in PEM".into());
    }
    ok.then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_placeholders_look_like_aws_keys_and_differ_per_sandbox() {
        let id = aws_placeholder_key_id(b"k", "s1", "aws");
        assert_eq!(id.len(), 20);
        assert!(id.starts_with("AKIA"));
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()));
        assert_ne!(id, aws_placeholder_key_id(b"k", "s2", "aws"));
        assert_eq!(id, aws_placeholder_key_id(b"k", "s1", "aws"));
        let secret = aws_placeholder_secret(b"k", "s1", "aws");
        assert_eq!(secret.len(), 40);
        assert_ne!(secret, aws_placeholder_secret(b"k", "s2", "aws"));
    }
}
