//! Sandbox identity tokens: for the hosts a sandbox's `identity_token` names, every
//! terminated request gets a short-lived JWT saying which sandbox is calling — `iss` the
//! proxy (`tls_intercept.identity.issuer`), `sub` `spiffe://TRUST_DOMAIN/sandbox/ID`, `aud`
//! the host, `iat`, `exp`, `jti`, and `policy_version` — signed with Ed25519 (`EdDSA`). The
//! key is made at start and changes every `rotate_s`; the previous key stays published until
//! every token it signed has expired. The admin listener serves the keys
//! (`/.well-known/jwks.json`) and an OpenID discovery document. A header of that name sent by
//! the sandbox itself is refused (`credential_misuse`): only the proxy speaks for a sandbox.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use ring::signature::KeyPair;
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::config::identity_token::{IssuerConfig, MAX_TTL};
use crate::intercept::credential_error::{caused, issue, CredentialError};

struct Key {
    kid: String,
    pkcs8: Vec<u8>,
    public: Vec<u8>,
    born: Instant,
}

impl Key {
    fn generate() -> Result<Key, CredentialError> {
        let rng = ring::rand::SystemRandom::new();
        let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| issue("cannot make an Ed25519 key"))?;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(doc.as_ref())
            .map_err(|_| issue("cannot read the Ed25519 key"))?;
        let public = pair.public_key().as_ref().to_vec();
        Ok(Key {
            kid: hex::encode(&Sha256::digest(&public)[..8]),
            pkcs8: doc.as_ref().to_vec(),
            public,
            born: Instant::now(),
        })
    }

    fn jwk(&self) -> Value {
        json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "alg": "EdDSA",
            "use": "sig",
            "kid": self.kid,
            "x": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&self.public),
        })
    }
}

/// The signing keys: the one in use and the one before it.
pub struct Issuer {
    cfg: IssuerConfig,
    keys: Mutex<(Arc<Key>, Option<Arc<Key>>)>,
    next_jti: AtomicU64,
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: String,
    aud: &'a str,
    iat: u64,
    exp: u64,
    jti: String,
    policy_version: &'a str,
}

impl Issuer {
    /// An issuer with a fresh key.
    pub fn new(cfg: IssuerConfig) -> Result<Issuer, CredentialError> {
        Ok(Issuer {
            cfg,
            keys: Mutex::new((Arc::new(Key::generate()?), None)),
            next_jti: AtomicU64::new(0),
        })
    }

    /// The key in use, changed when it is older than `rotate_s`.
    fn current(&self) -> Result<Arc<Key>, CredentialError> {
        let mut keys = self
            .keys
            .lock()
            .map_err(|_| issue("the keys are unavailable"))?;
        if keys.0.born.elapsed() >= self.cfg.rotate.max(MAX_TTL) {
            let new = Arc::new(Key::generate()?);
            let old = std::mem::replace(&mut keys.0, new);
            keys.1 = Some(old);
        }
        Ok(keys.0.clone())
    }

    /// A token for `sandbox` toward `aud`, living `ttl`.
    pub fn mint(
        &self,
        sandbox: &str,
        aud: &str,
        policy_version: &str,
        ttl: std::time::Duration,
    ) -> Result<String, CredentialError> {
        let key = self.current()?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let n = self.next_jti.fetch_add(1, Ordering::Relaxed);
        let claims = Claims {
            iss: &self.cfg.issuer,
            sub: format!("spiffe://{}/sandbox/{sandbox}", self.cfg.trust_domain),
            aud,
            iat: now,
            exp: now + ttl.as_secs(),
            jti: format!("{}-{n}-{now}", &key.kid),
            policy_version,
        };
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(key.kid.clone());
        let signer = jsonwebtoken::EncodingKey::from_ed_der(&key.pkcs8);
        jsonwebtoken::encode(&header, &claims, &signer).map_err(|e| issue(caused("signing", e)))
    }

    /// `/.well-known/jwks.json`: the key in use and the one before it.
    pub fn jwks(&self) -> Value {
        let keys = match self.keys.lock() {
            Ok(k) => k,
            Err(p) => p.into_inner(),
        };
        let mut out = vec![keys.0.jwk()];
        out.extend(keys.1.as_ref().map(|k| k.jwk()));
        json!({ "keys": out })
    }

    /// `/.well-known/openid-configuration`, `base` the admin listener's URL.
    pub fn discovery(&self, base: &str) -> Value {
        json!({
            "issuer": self.cfg.issuer,
            "jwks_uri": format!("{base}/.well-known/jwks.json"),
            "id_token_signing_alg_values_supported": ["EdDSA"],
            "subject_types_supported": ["public"],
            "response_types_supported": ["id_token"],
            "claims_supported": ["iss", "sub", "aud", "iat", "exp", "jti", "policy_version"],
        })
    }
}

/// The identity token as a credential kind: put on as the request is sent; a header of its
/// name sent by the sandbox is misuse.
pub struct IdentityKind {
    /// The issuer that signs the token.
    pub issuer: Arc<Issuer>,
    /// The sandbox the token names (`sub`).
    pub sandbox: String,
    /// The audience (`aud`): the host it is sent to.
    pub aud: String,
    /// The policy version in force (a claim).
    pub version: Arc<str>,
    /// The binding's `identity_token` settings.
    pub token: Arc<crate::config::identity_token::IdentityToken>,
}

#[async_trait::async_trait]
impl super::credential::Kind for IdentityKind {
    fn misuse(&self, _: &http::Uri, headers: &http::HeaderMap, _: &str) -> Option<String> {
        headers
            .contains_key(&self.token.header)
            .then(|| crate::pipeline::head::identity_header_sent(&self.token.header))
    }

    /// The sandbox holds no placeholder of its identity: the sentence is about the header.
    fn misuse_sentence(&self, _: &str, why: String) -> String {
        why
    }

    async fn apply(
        &self,
        req: &mut http::Request<super::exchange::UpBody>,
        _: &str,
    ) -> Result<bool, CredentialError> {
        let jwt = self
            .issuer
            .mint(&self.sandbox, &self.aud, &self.version, self.token.ttl)?;
        let mut v = http::HeaderValue::from_str(&jwt)
            .map_err(|_| CredentialError::Write("the token is not a header value".into()))?;
        v.set_sensitive(true);
        req.headers_mut().insert(self.token.header.clone(), v);
        Ok(true)
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_with_the_published_key_and_name_the_sandbox() {
        let issuer = Issuer::new(IssuerConfig::default()).unwrap();
        let jwt = issuer
            .mint("dev", "api.test", "v1", std::time::Duration::from_secs(60))
            .unwrap();
        let jwks = issuer.jwks();
        let x = jwks["keys"][0]["x"].as_str().unwrap();
        let key = jsonwebtoken::DecodingKey::from_ed_components(x).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        v.set_audience(&["api.test"]);
        let data = jsonwebtoken::decode::<Value>(&jwt, &key, &v).unwrap();
        assert_eq!(data.claims["sub"], "spiffe://egress-proxy/sandbox/dev");
        assert_eq!(data.claims["policy_version"], "v1");
        v.set_audience(&["other.test"]);
        assert!(jsonwebtoken::decode::<Value>(&jwt, &key, &v).is_err());
    }
}
