//! What each minting credential sends to its token endpoint, and what it reads back:
//!
//! - OAuth2 `client_credentials` (RFC 6749 §4.4): the client authenticates with HTTP Basic
//!   (`client_secret_basic`, the method every server supports);
//! - OAuth2 `refresh_token` (§6): a rotated refresh token in the answer replaces the one held;
//! - OAuth2 `jwt_bearer` (RFC 7523): a JWT signed with the private key (RS256 or ES256) is the
//!   assertion, `iss` and `sub` the client id, `aud` the token URL, five minutes long;
//! - GitHub App: the app's JWT (RS256, `iss` the app id, nine minutes long) buys an
//!   installation token (`POST /app/installations/{id}/access_tokens`).
//!
//! An error names the endpoint's status and its OAuth `error` code, never a token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::HeaderName;
use serde::Serialize;

use crate::config::credential_kinds::{Grant, Mint, Minting};
use crate::config::credentials::Secret;
use crate::intercept::credential_error::{caused, mint, CredentialError};

/// What a token endpoint sent: the token, how long it lives, and a rotated refresh token.
pub struct Minted {
    pub token: Secret,
    pub lifetime: Duration,
    pub refresh: Option<Secret>,
}

/// The request to mint with: headers and a body.
pub struct Ask {
    pub headers: Vec<(HeaderName, String)>,
    pub body: Vec<u8>,
}

/// The lifetime assumed when an answer names none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sub: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
    iat: u64,
    exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
}

/// A JWT signed with `pem` (RS256 for an RSA key, ES256 for an EC one).
fn sign(pem: &Secret, claims: &Claims<'_>) -> Result<String, CredentialError> {
    let b = pem.expose().as_bytes();
    let (alg, key) = match jsonwebtoken::EncodingKey::from_rsa_pem(b) {
        Ok(k) => (jsonwebtoken::Algorithm::RS256, k),
        Err(_) => match jsonwebtoken::EncodingKey::from_ec_pem(b) {
            Ok(k) => (jsonwebtoken::Algorithm::ES256, k),
            Err(_) => return Err(mint("the private key is neither RSA nor EC")),
        },
    };
    jsonwebtoken::encode(&jsonwebtoken::Header::new(alg), claims, &key)
        .map_err(|e| mint(caused("signing the JWT", e)))
}

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut f = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        f.append_pair(k, v);
    }
    f.finish().into_bytes()
}

/// A unique `jti`.
fn jti() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The request minting `m` sends; `refresh` is the refresh token in force (rotated or read).
pub fn ask(m: &Minting, refresh: &Secret) -> Result<Ask, CredentialError> {
    match &m.how {
        Mint::OAuth2 {
            grant,
            token_url,
            client_id,
            scopes,
        } => oauth2(m, refresh, *grant, (token_url, client_id), scopes),
        Mint::GithubApp { app_id, .. } => github_app(m, *app_id),
    }
}

/// An OAuth 2.0 token request (RFC 6749 §4.4, §6; RFC 7523 §2.1): a form, the client's
/// secret in Basic, the refresh token or a signed assertion, as the grant says.
fn oauth2(
    m: &Minting,
    refresh: &Secret,
    grant: Grant,
    (token_url, client_id): (&http::Uri, &str),
    scopes: &[String],
) -> Result<Ask, CredentialError> {
    let scope = scopes.join(" ");
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let form_type = (CONTENT_TYPE, "application/x-www-form-urlencoded".into());
    let mut headers = vec![form_type, (ACCEPT, "application/json".into())];
    let assertion;
    match grant {
        Grant::ClientCredentials => {
            pairs.push(("grant_type", "client_credentials"));
            let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                enc(client_id),
                enc(m.secret.expose())
            ));
            headers.push((AUTHORIZATION, format!("Basic {basic}")));
        }
        Grant::RefreshToken => {
            pairs.push(("grant_type", "refresh_token"));
            pairs.push(("refresh_token", refresh.expose()));
            pairs.push(("client_id", client_id));
        }
        Grant::JwtBearer => {
            let aud = token_url.to_string();
            let t = now();
            let claims = Claims {
                iss: client_id,
                sub: Some(client_id),
                aud: Some(&aud),
                iat: t,
                exp: t + 300,
                jti: Some(jti()),
            };
            assertion = sign(&m.secret, &claims)?;
            pairs.push(("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"));
            pairs.push(("assertion", &assertion));
        }
    }
    if !scope.is_empty() {
        pairs.push(("scope", &scope));
    }
    Ok(Ask {
        headers,
        body: form(&pairs),
    })
}

/// A GitHub App's installation token request: a bearer JWT the App signed, no body.
fn github_app(m: &Minting, app_id: u64) -> Result<Ask, CredentialError> {
    let t = now();
    let iss = app_id.to_string();
    let claims = Claims {
        iss: &iss,
        sub: None,
        aud: None,
        iat: t.saturating_sub(60),
        exp: t + 540,
        jti: None,
    };
    let jwt = sign(&m.secret, &claims)?;
    Ok(Ask {
        headers: vec![
            (AUTHORIZATION, format!("Bearer {jwt}")),
            (ACCEPT, "application/vnd.github+json".into()),
        ],
        body: Vec::new(),
    })
}

/// Read a token endpoint's answer for `m`.
pub fn read(m: &Minting, status: u16, body: &[u8]) -> Result<Minted, CredentialError> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if !(200..300).contains(&status) {
        // Only the OAuth error code (RFC 6749 §5.2), which is not secret, and bounded.
        let code: String = v
            .get("error")
            .and_then(|e| e.as_str())
            .unwrap_or("no OAuth error code")
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        return Err(mint(format!(
            "the token endpoint answered {status} ({code})"
        )));
    }
    let field = match m.how {
        Mint::OAuth2 { .. } => "access_token",
        Mint::GithubApp { .. } => "token",
    };
    let token = v
        .get(field)
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty() && t.bytes().all(|b| (0x21..0x7f).contains(&b)))
        .ok_or_else(|| mint(format!("the token endpoint's answer has no usable {field}")))?;
    let lifetime = match m.how {
        Mint::OAuth2 { .. } => v
            .get("expires_in")
            .and_then(|e| e.as_u64())
            .map(Duration::from_secs),
        Mint::GithubApp { .. } => v
            .get("expires_at")
            .and_then(|e| e.as_str())
            .and_then(|e| {
                time::OffsetDateTime::parse(e, &time::format_description::well_known::Rfc3339).ok()
            })
            .map(|at| {
                Duration::from_secs(
                    u64::try_from(at.unix_timestamp())
                        .unwrap_or(0)
                        .saturating_sub(now()),
                )
            }),
    };
    let refresh = v
        .get("refresh_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .map(Secret::new);
    Ok(Minted {
        token: Secret::new(token),
        lifetime: lifetime.unwrap_or(DEFAULT_LIFETIME),
        refresh,
    })
}
