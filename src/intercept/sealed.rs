//! Sealed token responses: when a sandbox calls the token endpoint of one of its minting
//! credentials itself, the tokens in the answer (`access_token`, `refresh_token`,
//! `id_token`, GitHub's `token`) are replaced by sealed placeholders before a byte reaches
//! it. The proxy keeps the real token; a request to a host the credential is bound to that
//! carries the sealed placeholder (`Authorization: Bearer egp_sealed_…`) gets the real token
//! in its place. A sealed placeholder is redeemed only for the sandbox and credential it was
//! sealed for, and only until the token's own lifetime ends; anywhere else it is an opaque
//! string (`credential_misuse` on a host of another credential of the sandbox).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::config::credentials::Secret;
use crate::intercept::credential_error::{caused, seal, CredentialError};

/// What every sealed placeholder starts with.
pub const PREFIX: &str = "egp_sealed_";
/// The most tokens held sealed; the oldest to expire go first when full.
const MAX_SEALED: usize = 16_384;
/// How long a token whose answer names no lifetime stays redeemable.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// How long a refresh token stays redeemable.
const REFRESH_LIFETIME: Duration = Duration::from_secs(30 * 86_400);

struct Held {
    sandbox: String,
    credential: String,
    token: Secret,
    until: Instant,
}

/// The sealed tokens of the process.
#[derive(Default)]
pub struct Sealed {
    held: Mutex<HashMap<String, Held>>,
    next: std::sync::atomic::AtomicU64,
}

/// Why a sealed placeholder is not redeemed.
#[derive(Debug, PartialEq)]
pub enum Unsealed {
    /// No such token, or it expired.
    Unknown,
    /// A token sealed for another sandbox or credential.
    Elsewhere,
}

impl Sealed {
    /// A placeholder for `token` of `credential` of `sandbox`, redeemable for `lifetime`.
    fn seal(&self, sandbox: &str, credential: &str, token: &str, lifetime: Duration) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let mut h = Sha256::new();
        h.update(token.as_bytes());
        h.update(nanos.to_be_bytes());
        h.update(n.to_be_bytes());
        h.update(std::process::id().to_be_bytes());
        let placeholder = format!("{PREFIX}{}", hex::encode(&h.finalize()[..20]));
        let now = Instant::now();
        if let Ok(mut held) = self.held.lock() {
            held.retain(|_, h| h.until > now);
            if held.len() >= MAX_SEALED {
                if let Some(k) = held
                    .iter()
                    .min_by_key(|(_, h)| h.until)
                    .map(|(k, _)| k.clone())
                {
                    held.remove(&k);
                }
            }
            held.insert(
                placeholder.clone(),
                Held {
                    sandbox: sandbox.to_string(),
                    credential: credential.to_string(),
                    token: Secret::new(token),
                    until: now + lifetime,
                },
            );
        }
        placeholder
    }

    /// The live tokens sealed for this sandbox and credential (the scrubber looks for them).
    pub fn tokens_of(&self, sandbox: &str, credential: &str) -> Vec<Secret> {
        let now = Instant::now();
        self.held
            .lock()
            .map(|held| {
                held.values()
                    .filter(|h| h.until > now && h.sandbox == sandbox && h.credential == credential)
                    .map(|h| h.token.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The real token behind `placeholder`, if it was sealed for this sandbox and credential.
    pub fn redeem(
        &self,
        sandbox: &str,
        credential: &str,
        placeholder: &str,
    ) -> Result<Secret, Unsealed> {
        let held = self.held.lock().map_err(|_| Unsealed::Unknown)?;
        match held.get(placeholder) {
            Some(h) if h.until <= Instant::now() => Err(Unsealed::Unknown),
            Some(h) if h.sandbox == sandbox && h.credential == credential => Ok(h.token.clone()),
            Some(_) => Err(Unsealed::Elsewhere),
            None => Err(Unsealed::Unknown),
        }
    }

    /// A token endpoint's JSON answer with its tokens sealed; `Err` when it is not a JSON
    /// object (a token answer that cannot be sealed is not passed).
    pub fn seal_answer(
        &self,
        sandbox: &str,
        credential: &str,
        body: &[u8],
    ) -> Result<Bytes, CredentialError> {
        let mut v: serde_json::Value = serde_json::from_slice(body)
            .map_err(|_| seal("the token endpoint's answer is not JSON; it cannot be sealed"))?;
        let Some(obj) = v.as_object_mut() else {
            return Err(seal(
                "the token endpoint's answer is not a JSON object; it cannot be sealed",
            ));
        };
        let lifetime = obj
            .get("expires_in")
            .and_then(|e| e.as_u64())
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_LIFETIME);
        for (field, life) in [
            ("access_token", lifetime),
            ("id_token", lifetime),
            ("token", lifetime),
            ("refresh_token", REFRESH_LIFETIME),
        ] {
            if let Some(serde_json::Value::String(t)) = obj.get_mut(field) {
                *t = self.seal(sandbox, credential, t, life);
            }
        }
        serde_json::to_vec(&v)
            .map(Bytes::from)
            .map_err(|e| seal(caused("sealing", e)))
    }
}

/// The sealed placeholders a header value carries (as a whole token after `Bearer `, or
/// anywhere in the value).
pub fn find(value: &[u8]) -> Option<&str> {
    let at = memchr::memmem::find(value, PREFIX.as_bytes())?;
    let rest = &value[at..];
    let end = rest
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
        .unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_sealed_and_redeemed_only_for_their_sandbox_and_credential() {
        let s = Sealed::default();
        let out = s
            .seal_answer(
                "a",
                "api",
                br#"{"access_token":"real-1","refresh_token":"r-1","expires_in":60,"token_type":"Bearer"}"#,
            )
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let at = v["access_token"].as_str().unwrap();
        assert!(at.starts_with(PREFIX) && !String::from_utf8_lossy(&out).contains("real-1"));
        assert_eq!(v["token_type"], "Bearer");
        assert_eq!(s.redeem("a", "api", at).unwrap().expose(), "real-1");
        assert_eq!(s.redeem("b", "api", at).unwrap_err(), Unsealed::Elsewhere);
        assert_eq!(s.redeem("a", "gh", at).unwrap_err(), Unsealed::Elsewhere);
        assert_eq!(
            s.redeem("a", "api", "egp_sealed_00").unwrap_err(),
            Unsealed::Unknown
        );
        assert_eq!(find(format!("Bearer {at}").as_bytes()), Some(at));
        assert!(s.seal_answer("a", "api", b"access_token=x").is_err());
        assert!(s.seal_answer("a", "api", b"[1]").is_err());
    }
}
