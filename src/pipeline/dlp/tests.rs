//! Unit tests of [`super`].

use super::*;
use crate::config::decider::{resolve_dlp, RawDlp, RawDlpRule, RawEntropy};
use base64::Engine;

fn cfg() -> Arc<DlpConfig> {
    let raw = RawDlp {
        rules: vec![RawDlpRule {
            name: "private_key".into(),
            pattern: "-----BEGIN [A-Z ]*PRIVATE KEY-----".into(),
            action: None,
        }],
        entropy: Some(RawEntropy {
            min_length: Some(32),
            bits_per_char: Some(4.5),
            action: Some("report".into()),
        }),
        max_bytes: Some(1 << 20),
    };
    resolve_dlp(&raw, &mut Vec::new()).unwrap()
}

#[test]
fn a_pattern_split_across_chunks_is_found_and_denies() {
    let mut s = Scanner::new(cfg(), false);
    assert!(s
        .scan(&Bytes::from_static(b"hello -----BEGIN RSA PRIV"))
        .is_ok());
    assert!(s.scan(&Bytes::from_static(b"ATE KEY-----\nMIIE")).is_err());
    let f = s.found.lock().unwrap();
    assert_eq!(f.blocked.as_deref(), Some("private_key"));
}

/// Review 7a W2, W3: a key in UTF-16 (either order) or UTF-32 JSON, and a key percent-
/// encoded twice or three times.
#[test]
fn wide_text_and_repeated_escapes_are_read() {
    let key = "-----BEGIN RSA PRIVATE KEY-----";
    let json = format!("{{\"k\": \"{key}\"}}");
    let le: Vec<u8> = json.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let be: Vec<u8> = json.encode_utf16().flat_map(u16::to_be_bytes).collect();
    let wide: Vec<u8> = json
        .chars()
        .flat_map(|c| (c as u32).to_le_bytes())
        .collect();
    let once: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let twice = once.replace('%', "%25");
    let thrice = twice.replace('%', "%25");
    for body in [le, be, wide, twice.into_bytes(), thrice.into_bytes()] {
        let mut s = Scanner::new(cfg(), false);
        assert!(s.scan(&Bytes::from(body.clone())).is_err(), "{body:?}");
    }
}

/// Review 7a B7: base64 at any offset of a run, padded or not, either alphabet, mixed,
/// and wrapped MIME lines are decoded.
#[test]
fn base64_is_decoded_at_any_offset_with_or_without_padding() {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
    let key = b"-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA";
    for prefix in [&b""[..], b"x", b"xy", b"xyz"] {
        let data = [prefix, &key[..]].concat();
        for enc in [
            STANDARD.encode(&data),
            URL_SAFE.encode(&data),
            URL_SAFE_NO_PAD.encode(&data),
            format!("abc{}", STANDARD.encode(&data)),
            format!("ab{}", URL_SAFE_NO_PAD.encode(&data)),
        ] {
            for body in [enc.clone(), format!("k={enc}&x=1")] {
                let mut s = Scanner::new(cfg(), false);
                assert!(s.scan(&Bytes::from(body.clone())).is_err(), "{body}");
            }
        }
    }
    // The key at the very end of a padded payload (its last bytes in the `==` quantum).
    let tail = [
        &b"some text before the "[..],
        b"-----BEGIN RSA PRIVATE KEY-----",
    ]
    .concat();
    let mut s = Scanner::new(cfg(), false);
    assert!(s.scan(&Bytes::from(STANDARD.encode(&tail))).is_err());
    // MIME base64, wrapped at 76 columns, inside a multipart part.
    let long = [&[b'.'; 50][..], &key[..]].concat();
    let wrapped: Vec<String> = STANDARD
        .encode(&long)
        .as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    let part = format!(
        "--b\r\nContent-Transfer-Encoding: base64\r\n\r\n{}\r\n--b--\r\n",
        wrapped.join("\r\n")
    );
    let mut s = Scanner::new(cfg(), false);
    assert!(s.scan(&Bytes::from(part)).is_err());
}

#[test]
fn encoded_keys_are_found_in_bodies_targets_and_headers() {
    let key = b"-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA";
    let b64 = base64::engine::general_purpose::STANDARD.encode(key);
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key);
    let pct: String = key.iter().map(|b| format!("%{b:02X}")).collect();
    let json = "\\u002d\\u002d\\u002d\\u002d\\u002dBEGIN RSA PRIVATE KEY-----";
    for body in [
        b64.clone(),
        url.clone(),
        pct.clone(),
        json.to_string(),
        format!("x={}", pct),
    ] {
        let mut s = Scanner::new(cfg(), false);
        assert!(s.scan(&Bytes::from(body.clone())).is_err(), "{body}");
    }
    let mut s = Scanner::new(cfg(), false);
    let uri: http::Uri = format!("/upload?k={pct}").parse().unwrap();
    assert!(s.head(&uri, &http::HeaderMap::new()).is_err());
    let mut h = http::HeaderMap::new();
    h.insert("x-data", b64.parse().unwrap());
    let mut s = Scanner::new(cfg(), false);
    assert!(s.head(&"/".parse().unwrap(), &h).is_err());
    // The proxy's own credentials are not the origin's to see, nor DLP's to judge.
    let mut h = http::HeaderMap::new();
    h.insert("proxy-authorization", b64.parse().unwrap());
    let mut s = Scanner::new(cfg(), false);
    assert!(s.head(&"/".parse().unwrap(), &h).is_ok());
}

#[test]
fn compressed_bodies_are_undone_and_unknown_codings_are_named() {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"-----BEGIN PRIVATE KEY-----").unwrap();
    let gz = gz.finish().unwrap();
    let mut h = http::HeaderMap::new();
    h.insert("content-encoding", "gzip".parse().unwrap());
    let c = Coding::of(&h);
    assert_eq!(c, Coding::Gzip);
    let plain = c.decode(&gz, 1 << 20).unwrap();
    assert!(Scanner::new(cfg(), false)
        .scan(&Bytes::from(plain))
        .is_err());
    h.insert("content-encoding", "gzip, br".parse().unwrap());
    assert!(Coding::of(&h).decode(&gz, 1 << 20).is_err());
    h.insert("content-encoding", "identity".parse().unwrap());
    assert_eq!(Coding::of(&h), Coding::Identity);
    assert!(Coding::Gzip.decode(b"not gzip", 100).is_err());
}

#[test]
fn high_entropy_tokens_are_reported_and_text_is_not() {
    let mut s = Scanner::new(cfg(), false);
    s.scan(&Bytes::from_static(
        b"the quick brown fox jumps over the lazy dog again and again",
    ))
    .unwrap();
    assert!(s.found.lock().unwrap().names.is_empty());
    s.scan(&Bytes::from_static(
        b"token=q8Zr3LkP0vXw9TnB2sYh7JdM4cFg6AeRtUiOpQlKz",
    ))
    .unwrap();
    assert_eq!(
        s.found.lock().unwrap().names,
        vec![HIGH_ENTROPY.to_string()]
    );
    // Report mode: a deny rule only reports.
    let mut r = Scanner::new(cfg(), true);
    assert!(r
        .scan(&Bytes::from_static(b"-----BEGIN PRIVATE KEY-----"))
        .is_ok());
    assert_eq!(
        r.found.lock().unwrap().names,
        vec!["private_key".to_string()]
    );
}
