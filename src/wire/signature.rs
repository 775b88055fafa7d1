//! The signature the proxy puts on what it sends to operators' services (the approvals
//! webhook, the decider) and checks on their replies: `X-Egress-Proxy-Timestamp:
//! UNIX_SECONDS` and `X-Egress-Proxy-Signature: sha256=HEX(HMAC_SHA256(secret, TIMESTAMP +
//! "." + BODY))`. A wire format shared by two folders, so it lives below both.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a reply's timestamp may be from now.
pub const SKEW: Duration = Duration::from_secs(300);
/// The header that carries the signature.
pub const SIGNATURE: &str = "x-egress-proxy-signature";
/// The header that carries the timestamp signed.
pub const TIMESTAMP: &str = "x-egress-proxy-timestamp";

/// `sha256=HEX` of `timestamp.body` under `secret`.
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    match mac(secret, timestamp, body) {
        Some(m) => format!("sha256={}", hex::encode(m.finalize().into_bytes())),
        None => String::new(),
    }
}

/// The HMAC of `timestamp.body` under `secret`, not yet finalised (HMAC takes keys of any
/// length: `None` never happens).
fn mac(secret: &[u8], timestamp: u64, body: &[u8]) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(mac)
}

/// Whether `signature` is `timestamp.body`'s under `secret` (in constant time), and the
/// timestamp is within [`SKEW`] of `now`.
pub fn verify(secret: &[u8], timestamp: &str, signature: &str, body: &[u8], now: u64) -> bool {
    let Ok(ts) = timestamp.trim().parse::<u64>() else {
        return false;
    };
    if ts.abs_diff(now) > SKEW.as_secs() {
        return false;
    }
    let Some(hex_sig) = signature.trim().strip_prefix("sha256=") else {
        return false;
    };
    let Ok(given) = hex::decode(hex_sig) else {
        return false;
    };
    mac(secret, ts, body).is_some_and(|m| m.verify_slice(&given).is_ok())
}

/// Seconds since the Unix epoch (0 before it).
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_body_secret_and_time() {
        let now = 1_800_000_000;
        let sig = sign(b"k", now, b"{}");
        assert!(verify(b"k", &now.to_string(), &sig, b"{}", now + 10));
        assert!(!verify(b"other", &now.to_string(), &sig, b"{}", now));
        assert!(!verify(b"k", &now.to_string(), &sig, b"{ }", now));
        assert!(!verify(b"k", &(now + 1).to_string(), &sig, b"{}", now));
        assert!(!verify(b"k", &now.to_string(), &sig, b"{}", now + 301));
        assert!(!verify(b"k", &now.to_string(), "sha256=zz", b"{}", now));
    }
}
