//! `identity_token:` of a sandbox — the hosts whose requests get a short-lived JWT naming the
//! sandbox (`crate::intercept::identity_token`) — and `tls_intercept.identity`, the issuer's
//! settings. Validated here.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::credentials::BoundHost;

/// A sandbox's identity token, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityToken {
    /// The hosts the token is sent to.
    pub hosts: Vec<BoundHost>,
    /// `X-Sandbox-Identity` unless named.
    pub header: http::HeaderName,
    /// How long each token is valid.
    pub ttl: Duration,
}

impl IdentityToken {
    /// Whether the token is sent to `host`.
    pub fn bound_to(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.matches(host))
    }
}

/// `identity_token:` as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawIdentityToken {
    /// `hosts`.
    pub hosts: Vec<String>,
    /// `header`: where the token goes (`Authorization: Bearer` by default).
    #[serde(default)]
    pub header: Option<String>,
    /// `ttl_s`.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

/// The issuer: `tls_intercept.identity: { trust_domain, issuer, rotate_s }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuerConfig {
    /// `sub` is `spiffe://TRUST_DOMAIN/sandbox/ID`.
    pub trust_domain: String,
    /// `iss`, and the discovery document's issuer.
    pub issuer: String,
    /// How often the signing key changes (the previous one stays in the JWKS until every
    /// token it signed has expired).
    pub rotate: Duration,
}

impl Default for IssuerConfig {
    fn default() -> Self {
        IssuerConfig {
            trust_domain: "egress-proxy".into(),
            issuer: "egress-proxy".into(),
            rotate: Duration::from_secs(3600),
        }
    }
}

/// `identity.issuer:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIssuer {
    /// `trust_domain`: the SPIFFE trust domain of the `sub` claim.
    #[serde(default)]
    pub trust_domain: Option<String>,
    /// `issuer`: the `iss` claim.
    #[serde(default)]
    pub issuer: Option<String>,
    /// `rotate_s`: how often the signing key changes.
    #[serde(default)]
    pub rotate_s: Option<u64>,
}

/// The longest token lifetime allowed (keys rotate at least this far apart).
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// The issuer's settings, defaults filled in; errors go to `errors`.
pub fn resolve_issuer(raw: Option<RawIssuer>, errors: &mut Vec<String>) -> IssuerConfig {
    let raw = raw.unwrap_or_default();
    let mut out = IssuerConfig::default();
    if let Some(td) = raw.trust_domain {
        let ok = !td.is_empty()
            && td.len() <= 255
            && td
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
        if !ok {
            errors.push(format!(
                "tls_intercept.identity.trust_domain `{td}`: lower-case letters, digits, - . _"
            ));
        }
        out.trust_domain = td;
    }
    if let Some(i) = raw.issuer {
        out.issuer = i;
    }
    if let Some(r) = raw.rotate_s {
        if r < MAX_TTL.as_secs() {
            errors.push(format!(
                "tls_intercept.identity.rotate_s: at least {} (the longest token)",
                MAX_TTL.as_secs()
            ));
        }
        out.rotate = Duration::from_secs(r);
    }
    out
}

/// Validate a sandbox's `identity_token`.
pub fn resolve_token(
    raw: &RawIdentityToken,
    errors: &mut Vec<String>,
) -> Option<Arc<IdentityToken>> {
    let mut hosts = Vec::new();
    for h in &raw.hosts {
        match BoundHost::parse(h) {
            Ok(b) => hosts.push(b),
            Err(e) => errors.push(format!("identity_token.hosts: {e}")),
        }
    }
    if hosts.is_empty() {
        errors.push("identity_token.hosts: name at least one host".into());
    }
    let name = raw.header.as_deref().unwrap_or("x-sandbox-identity");
    let Ok(header) = http::HeaderName::from_bytes(name.as_bytes()) else {
        errors.push(format!(
            "identity_token.header `{name}` is not a header name"
        ));
        return None;
    };
    let ttl = Duration::from_secs(raw.ttl_s.unwrap_or(300));
    if ttl.is_zero() || ttl > MAX_TTL {
        errors.push(format!("identity_token.ttl_s: 1 to {}", MAX_TTL.as_secs()));
    }
    Some(Arc::new(IdentityToken { hosts, header, ttl }))
}

/// HTTP rules and identity tokens apply to terminated hosts: without `tls_intercept` (no
/// placeholder key), an error for each a sandbox has.
pub(super) fn needs_intercept(
    key: Option<&[u8]>,
    (http, identity): (bool, bool),
    (sb, line): (Option<&str>, usize),
    sink: &mut super::error::Sink<'_>,
) {
    if key.is_some() {
        return;
    }
    if http {
        let why = "HTTP rules apply to terminated hosts: configure `tls_intercept` first";
        sink.push(sb, "policy.network.http", why, Some("http:"), line);
    }
    if identity {
        let why = "identity tokens are put on terminated requests: configure `tls_intercept` first";
        sink.push(sb, "identity_token", why, Some("identity_token"), line);
    }
}
