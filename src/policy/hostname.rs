//! Host-name normalisation, shared by policy entries and connection targets.
//!
//! A name is lowercased, loses one trailing dot, goes through IDNA (UTS-46) to punycode when it
//! is not ASCII, and must then consist of labels of letters, digits, hyphens and underscores,
//! each 1–63 bytes, 253 bytes in all. Names that merely look numeric (`127.1`, `0x7f.1`,
//! `2130706433`) are refused: resolvers and URL parsers disagree about them, so they are never
//! names. This module does no I/O and knows nothing about policy.

use std::sync::Arc;

use thiserror::Error;

/// Longest name DNS can carry, in presentation form without the trailing dot.
pub const MAX_NAME_LEN: usize = 253;
/// Longest single DNS label.
pub const MAX_LABEL_LEN: usize = 63;

/// Why a string is not a usable host name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// An empty name.
    #[error("empty name")]
    Empty,
    /// A name over the DNS length limit.
    #[error("name is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    /// A name with an empty label (`a..b`).
    #[error("name has an empty label")]
    EmptyLabel,
    /// A label over 63 bytes.
    #[error("a label is longer than {MAX_LABEL_LEN} bytes")]
    LabelTooLong,
    /// A character a host name may not hold.
    #[error("invalid character {0:?} in name (allowed: letters, digits, '-', '_')")]
    BadChar(char),
    /// A numeric name that is not a canonical address (`0x7f.1`, `127.1`).
    #[error("numeric-looking name is not a canonical IP address")]
    Numeric,
    /// An internationalised name that is not valid IDNA.
    #[error("internationalised name is not valid IDNA")]
    Idna,
}

/// Normalise a host name (no wildcards allowed).
pub fn normalize_name(input: &str) -> Result<String, NameError> {
    normalize(input, false)
}

/// [`normalize_name`] as one shared allocation (a DNS query's name, held by its decision and
/// its record). A name already in normal form (the common case: a resolver's query is
/// lowercase ASCII) passes the syntax check as it is and is copied once, with no lowercased
/// copy in between: the check accepts only lowercase ASCII labels, which lowercasing and IDNA
/// leave unchanged. Anything else takes [`normalize_name`]'s way, errors included.
pub fn normalize_name_shared(input: &str) -> Result<Arc<str>, NameError> {
    let trimmed = input.strip_suffix('.').unwrap_or(input);
    if check_syntax(trimmed, false).is_ok() {
        return Ok(Arc::from(trimmed));
    }
    normalize(input, false).map(Arc::from)
}

/// Normalise a name pattern: like [`normalize_name`], but labels may contain `*`.
pub fn normalize_pattern(input: &str) -> Result<String, NameError> {
    normalize(input, true)
}

fn normalize(input: &str, wildcards: bool) -> Result<String, NameError> {
    let trimmed = input.strip_suffix('.').unwrap_or(input);
    if trimmed.is_empty() {
        return Err(NameError::Empty);
    }
    let ascii: String = if trimmed.is_ascii() {
        trimmed.to_ascii_lowercase()
    } else if wildcards && trimmed.contains('*') {
        // Wildcard labels must be ASCII; convert the others one label at a time.
        let mut out = Vec::new();
        for label in trimmed.split('.') {
            if label.is_ascii() {
                out.push(label.to_ascii_lowercase());
            } else {
                out.push(idna_label(label)?);
            }
        }
        out.join(".")
    } else {
        let converted = idna::domain_to_ascii(trimmed).map_err(|_| NameError::Idna)?;
        // UTS-46 maps some dots (U+3002 …) to '.', which may leave a new trailing dot.
        converted
            .strip_suffix('.')
            .unwrap_or(&converted)
            .to_string()
    };
    check_syntax(&ascii, wildcards)?;
    Ok(ascii)
}

fn idna_label(label: &str) -> Result<String, NameError> {
    let converted = idna::domain_to_ascii(label).map_err(|_| NameError::Idna)?;
    if converted.contains('.') {
        return Err(NameError::Idna);
    }
    Ok(converted)
}

/// The bytes a label may hold: lowercase letters, digits, `-` and `_`, and `*` where
/// `wildcards`. A table of 256 answers: every DNS query's name is checked byte by byte here.
const fn label_bytes(wildcards: bool) -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_';
        b += 1;
    }
    t[b'*' as usize] = wildcards;
    t
}
static NAME_BYTES: [bool; 256] = label_bytes(false);
static PATTERN_BYTES: [bool; 256] = label_bytes(true);

/// Check an already-lowercased ASCII name or pattern.
fn check_syntax(name: &str, wildcards: bool) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    let allowed = if wildcards {
        &PATTERN_BYTES
    } else {
        &NAME_BYTES
    };
    // Label by label, byte by byte: every allowed character is ASCII, so the first byte that
    // is not allowed starts the character named in the error.
    let mut start = 0;
    let mut last: &[u8] = &[];
    for label in name.as_bytes().split(|&b| b == b'.') {
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(NameError::LabelTooLong);
        }
        if let Some(at) = label.iter().position(|&b| !allowed[usize::from(b)]) {
            let c = name.get(start + at..).and_then(|r| r.chars().next());
            return Err(NameError::BadChar(c.unwrap_or(char::REPLACEMENT_CHARACTER)));
        }
        start += label.len() + 1;
        last = label;
    }
    if looks_numeric(last) {
        return Err(NameError::Numeric);
    }
    Ok(())
}

/// True when the last label is a number (decimal, or `0x` hex): WHATWG URL parsers would
/// treat the whole name as an IPv4 address in some legacy notation.
fn looks_numeric(last: &[u8]) -> bool {
    if !last.is_empty() && last.iter().all(u8::is_ascii_digit) {
        return true;
    }
    if let Some(hex) = last.strip_prefix(b"0x") {
        return hex.iter().all(u8::is_ascii_hexdigit);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases_and_strips_one_trailing_dot() {
        assert_eq!(
            normalize_name("API.Example.COM.").as_deref(),
            Ok("api.example.com")
        );
        assert_eq!(normalize_name("a.b..").unwrap_err(), NameError::EmptyLabel);
    }

    #[test]
    fn idna_goes_to_punycode() {
        assert_eq!(
            normalize_name("Bücher.example").as_deref(),
            Ok("xn--bcher-kva.example")
        );
        assert_eq!(
            normalize_name("münchen.de").as_deref(),
            Ok("xn--mnchen-3ya.de")
        );
        // Full-width dot is a label separator under UTS-46.
        assert_eq!(normalize_name("ex\u{3002}com").as_deref(), Ok("ex.com"));
    }

    #[test]
    fn numeric_looking_names_are_refused() {
        for n in [
            "2130706433",
            "127.1",
            "0x7f.1",
            "1.2.3",
            "0x7f",
            "foo.0x10",
            "1.2.3.4.5",
        ] {
            assert_eq!(normalize_name(n).unwrap_err(), NameError::Numeric, "{n}");
        }
        assert!(normalize_name("3com.com").is_ok());
        assert!(normalize_name("0x.example").is_ok());
    }

    #[test]
    fn bad_characters_are_refused() {
        for n in [
            "a@b",
            "a%2eb",
            "a b",
            "a\nb",
            "a/b",
            "a:b",
            "exa\u{0}mple.com",
        ] {
            assert!(
                matches!(
                    normalize_name(n),
                    Err(NameError::BadChar(_)) | Err(NameError::Idna)
                ),
                "{n}"
            );
        }
        assert!(normalize_name("_dmarc.example.com").is_ok());
        assert!(normalize_name("*.example.com").is_err());
        assert!(normalize_pattern("*.example.com").is_ok());
    }

    #[test]
    fn length_limits() {
        let label = "a".repeat(64);
        assert_eq!(normalize_name(&label).unwrap_err(), NameError::LabelTooLong);
        let long = vec!["abcdefgh"; 40].join(".");
        assert_eq!(normalize_name(&long).unwrap_err(), NameError::TooLong);
        assert_eq!(normalize_name("").unwrap_err(), NameError::Empty);
        assert_eq!(normalize_name(".").unwrap_err(), NameError::Empty);
    }

    /// The checks as they were written before they went byte by byte: label by label, then
    /// character by character.
    fn check_by_chars(name: &str, wildcards: bool) -> Result<(), NameError> {
        for label in name.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel);
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(NameError::LabelTooLong);
            }
            for c in label.chars() {
                let ok = c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || c == '-'
                    || c == '_'
                    || (wildcards && c == '*');
                if !ok {
                    return Err(NameError::BadChar(c));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_shared_form_is_the_normal_form() {
        for n in [
            "api.example.com",
            "api.example.com.",
            "API.Example.COM.",
            "Bücher.example",
        ] {
            assert_eq!(
                normalize_name_shared(n).as_deref(),
                normalize_name(n).as_deref(),
                "{n}"
            );
        }
        for bad in [
            "",
            ".",
            "a..b",
            "a.b..",
            "127.1",
            "a b.example",
            "a.b.c.0x7f",
        ] {
            assert!(normalize_name_shared(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// The shared form's shortcut gives what the full normalisation gives, errors
        /// included, for any text: names in normal form, mixed case, IDNA, and junk.
        #[test]
        fn the_shared_form_agrees_with_the_full_one(
            name in "([a-z0-9_.-]|[A-Z*]|\\PC){0,80}\\.?",
        ) {
            let full = normalize_name(&name);
            let shared = normalize_name_shared(&name);
            proptest::prop_assert_eq!(shared.as_deref(), full.as_deref());
        }

        /// The byte-by-byte check gives the same verdict, and the same character in its
        /// error, as the character-by-character one, for any text (non-ASCII included).
        #[test]
        fn the_byte_check_agrees_with_the_char_check(
            name in "([a-z0-9_*.A-Z-]|\\PC){1,80}",
            long in "[a-z]{60,70}(\\.[a-zé]{0,3}){0,2}",
            wildcards in proptest::bool::ANY,
        ) {
            for n in [&name, &long] {
                let want = check_by_chars(n, wildcards);
                let got = check_syntax(n, wildcards);
                let got = match (got, &want) {
                    // What check_syntax checks after the labels.
                    (Err(NameError::Numeric | NameError::Empty | NameError::TooLong), _) => continue,
                    (g, _) => g,
                };
                proptest::prop_assert_eq!(got, want, "{:?}", n);
            }
        }
    }
}
