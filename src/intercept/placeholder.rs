//! Where a placeholder may become its secret: only in the request headers its credential
//! names (`replace_placeholder: { headers: [...] }`), and in `Authorization: Basic` inside the
//! decoded user or password (git, pip and npm send a token from a URL that way). Searched on
//! raw bytes everywhere, so a non-UTF-8 byte cannot hide a placeholder.

use base64::Engine;
use http::{HeaderName, HeaderValue};

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(hay, needle).is_some()
}

/// Every occurrence of `from` in `hay` replaced by `to`.
pub(crate) fn replace_bytes(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len() + to.len());
    let mut rest = hay;
    while let Some(i) = memchr::memmem::find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The Basic credentials of an `Authorization` value, decoded.
fn basic(value: &[u8]) -> Option<Vec<u8>> {
    let (scheme, rest) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()
}

/// `value` of header `name` with `placeholder` replaced by `secret`, or `None` when it does
/// not carry the placeholder. For `Authorization: Basic`, the replacement is made in the
/// decoded `user:password` and re-encoded.
pub fn replaced(
    name: &HeaderName,
    value: &HeaderValue,
    placeholder: &str,
    secret: &str,
) -> Option<HeaderValue> {
    let raw = value.as_bytes();
    let (p, s) = (placeholder.as_bytes(), secret.as_bytes());
    let bytes = if contains(raw, p) {
        replace_bytes(raw, p, s)
    } else if name == http::header::AUTHORIZATION {
        let decoded = basic(raw).filter(|d| contains(d, p))?;
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(replace_bytes(&decoded, p, s));
        format!("Basic {encoded}").into_bytes()
    } else {
        return None;
    };
    let mut v = HeaderValue::from_bytes(&bytes).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// Whether `value` of `name` carries `placeholder`, plainly or inside Basic credentials.
pub fn carried(name: &HeaderName, value: &HeaderValue, placeholder: &str) -> bool {
    let p = placeholder.as_bytes();
    contains(value.as_bytes(), p)
        || (name == http::header::AUTHORIZATION
            && basic(value.as_bytes()).is_some_and(|d| contains(&d, p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{AUTHORIZATION, ORIGIN};

    #[test]
    fn basic_credentials_are_decoded_replaced_and_reencoded() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let v = HeaderValue::from_str(&format!("Basic {}", b64.encode("git:PH"))).unwrap();
        let out = replaced(&AUTHORIZATION, &v, "PH", "s3cret").unwrap();
        assert_eq!(
            out.as_bytes(),
            format!("Basic {}", b64.encode("git:s3cret")).as_bytes()
        );
        assert!(out.is_sensitive());
        assert!(carried(&AUTHORIZATION, &v, "PH"));
        // Only Authorization is decoded.
        assert!(replaced(&ORIGIN, &v, "PH", "s").is_none());
    }

    #[test]
    fn raw_bytes_cannot_hide_a_placeholder() {
        let v = HeaderValue::from_bytes(b"\xff\xfe PH").unwrap();
        assert!(carried(&ORIGIN, &v, "PH"));
        let out = replaced(&ORIGIN, &v, "PH", "S").unwrap();
        assert_eq!(out.as_bytes(), b"\xff\xfe S");
    }
}
