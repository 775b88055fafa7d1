//! The view of response bytes the secret scanner searches: the escapes an upstream (or a
//! framework, or a template) may wrap a reflected secret in are undone — percent-encoding of
//! any subset of bytes (`%2B`, `%2f`), JSON's `\/` and `\uXXXX` — and every decoded byte
//! remembers where in the original it came from, so a match is replaced in the original bytes
//! (escapes and all) without changing their length. Letter case is left to the matcher (it
//! compares without regard to ASCII case), and hex and base64 are patterns of their own.

/// Whether `buf` holds anything [`decode`] would change.
pub fn has_escapes(buf: &[u8]) -> bool {
    memchr::memchr2(b'%', b'\\', buf).is_some()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// The escape at `buf[i..]`: its decoded bytes and its length in `buf`.
fn escape_at(buf: &[u8], i: usize) -> Option<(char, usize)> {
    match buf.get(i)? {
        b'%' => {
            let (h, l) = (hex(*buf.get(i + 1)?)?, hex(*buf.get(i + 2)?)?);
            Some((char::from(h * 16 + l), 3))
        }
        b'\\' => match buf.get(i + 1)? {
            b'/' => Some(('/', 2)),
            b'u' => {
                let digits = buf.get(i + 2..i + 6)?;
                let mut v = 0u32;
                for d in digits {
                    v = v * 16 + u32::from(hex(*d)?);
                }
                Some((char::from_u32(v)?, 6))
            }
            _ => None,
        },
        _ => None,
    }
}

/// `buf` with its escapes undone, and for each decoded byte the offset in `buf` where the
/// escape (or byte) it came from begins; the map has one more entry, `buf.len()`.
pub fn decode(buf: &[u8]) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::with_capacity(buf.len());
    let mut map = Vec::with_capacity(buf.len() + 1);
    let mut i = 0;
    while i < buf.len() {
        match escape_at(buf, i) {
            Some((c, len)) => {
                // A code point becomes its UTF-8 bytes (a `%XX` byte is one byte: as Latin-1
                // it stays below 0x100, and only ASCII secrets can match it).
                let mut utf8 = [0u8; 4];
                let bytes: &[u8] = if len == 3 {
                    utf8[0] = c as u32 as u8;
                    &utf8[..1]
                } else {
                    c.encode_utf8(&mut utf8).as_bytes()
                };
                for b in bytes {
                    out.push(*b);
                    map.push(i);
                }
                i += len;
            }
            None => {
                out.push(buf[i]);
                map.push(i);
                i += 1;
            }
        }
    }
    map.push(buf.len());
    (out, map)
}

/// Where an escape that `buf` ends in the middle of begins (`%`, `%2`, `\`, `\u`, `\u00`…):
/// those bytes must wait for the rest before they can be judged.
pub fn incomplete_escape(buf: &[u8]) -> Option<usize> {
    let from = buf.len().saturating_sub(5);
    (from..buf.len()).find(|&i| {
        let rest = &buf[i..];
        match rest {
            [b'%', tail @ ..] => tail.len() < 2 && tail.iter().all(|c| hex(*c).is_some()),
            [b'\\'] => true,
            [b'\\', b'u', tail @ ..] => tail.len() < 4 && tail.iter().all(|c| hex(*c).is_some()),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone_and_mapped_back() {
        let (out, map) = decode(br#"a%2Fb%2bc\/d\u0041e%zz\q"#);
        assert_eq!(out, br#"a/b+c/dAe%zz\q"#);
        assert_eq!(map[1], 1, "the / of %2F begins at the %");
        assert_eq!(map[7], 12, "the A of \\u0041 begins at the backslash");
        assert_eq!(*map.last().unwrap(), 24);
        assert!(!has_escapes(b"plain text"));
        assert!(has_escapes(b"50%"));
    }

    #[test]
    fn an_escape_cut_at_the_end_is_found() {
        assert_eq!(incomplete_escape(b"abc%"), Some(3));
        assert_eq!(incomplete_escape(b"abc%2"), Some(3));
        assert_eq!(incomplete_escape(b"abc%2F"), None);
        assert_eq!(incomplete_escape(b"ab\\u00"), Some(2));
        assert_eq!(incomplete_escape(b"ab\\"), Some(2));
        assert_eq!(incomplete_escape(b"ab\\u0041"), None);
        assert_eq!(incomplete_escape(b"a%zz"), None);
    }
}
