//! What a redirected connection is, from its first bytes (transparent mode): a TLS
//! ClientHello (→ SNI), an HTTP/1.x request (→ `Host`), or something else. Pure functions
//! over a buffer; the caller reads more while the answer is `Incomplete`, up to 64 KiB.

use crate::wire::sni::{self, ClientHello, Hello};

/// Largest prefix we buffer before deciding.
pub const MAX_PEEK: usize = 64 * 1024;

/// The classification of a stream's first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peeked {
    /// Read more.
    Incomplete,
    Tls(ClientHello),
    /// An HTTP/1.x request head; `host` is its `Host` header, if any.
    Http {
        host: Option<String>,
    },
    /// Neither TLS nor HTTP (or a broken hello/head): decide on the original destination.
    Other {
        detail: &'static str,
    },
}

/// Classify the bytes received so far.
pub fn classify(buf: &[u8]) -> Peeked {
    match sni::parse(buf) {
        Hello::Incomplete => return Peeked::Incomplete,
        Hello::Parsed(h) => return Peeked::Tls(h),
        Hello::Malformed(detail) => return Peeked::Other { detail },
        Hello::NotTls => {}
    }
    if !looks_like_http(buf) {
        return Peeked::Other {
            detail: "neither TLS nor HTTP",
        };
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() < MAX_PEEK => Peeked::Incomplete,
        Ok(httparse::Status::Partial) => Peeked::Other {
            detail: "HTTP request head larger than 64 KiB",
        },
        Ok(httparse::Status::Complete(_)) => {
            let hosts: Vec<&[u8]> = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"))
                .map(|h| h.value)
                .collect();
            match hosts.as_slice() {
                [one] => Peeked::Http {
                    host: std::str::from_utf8(one).ok().map(|s| s.trim().to_string()),
                },
                [] => Peeked::Http { host: None },
                _ => Peeked::Other {
                    detail: "several Host headers",
                },
            }
        }
        Err(_) => Peeked::Other {
            detail: "malformed HTTP request head",
        },
    }
}

/// An uppercase method token and a space.
fn looks_like_http(buf: &[u8]) -> bool {
    let token: Vec<u8> = buf
        .iter()
        .take_while(|b| b.is_ascii_uppercase())
        .copied()
        .collect();
    if token.is_empty() {
        return false;
    }
    match buf.get(token.len()) {
        Some(b' ') => true,
        // Still reading the method.
        None => token.len() < 16,
        Some(_) => false,
    }
}

/// Split a `Host` header value into host and optional port (`[v6]:p`, `name:p`, `name`).
pub fn split_host_header(value: &str) -> (&str, Option<&str>) {
    if value.starts_with('[') {
        if let Some(end) = value.find(']') {
            let rest = &value[end + 1..];
            return (&value[..=end], rest.strip_prefix(':'));
        }
        return (value, None);
    }
    match value.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (value, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_host() {
        let req = b"GET /x HTTP/1.1\r\nHost: Api.Example.com:8080\r\nUser-Agent: t\r\n\r\n";
        assert_eq!(
            classify(req),
            Peeked::Http {
                host: Some("Api.Example.com:8080".into())
            }
        );
        for n in 0..req.len() {
            assert_eq!(classify(&req[..n]), Peeked::Incomplete, "prefix {n}");
        }
        assert_eq!(
            classify(b"GET / HTTP/1.0\r\n\r\n"),
            Peeked::Http { host: None }
        );
        assert!(matches!(
            classify(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Peeked::Other { .. }
        ));
        assert!(matches!(
            classify(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"),
            Peeked::Other { .. }
        ));
    }

    #[test]
    fn other_protocols() {
        // Postgres startup, SSH banner, random bytes.
        assert!(matches!(
            classify(b"\x00\x00\x00\x08\x04\xd2\x16\x2f"),
            Peeked::Other { .. }
        ));
        assert!(matches!(
            classify(b"SSH-2.0-OpenSSH_9.2\r\n"),
            Peeked::Other { .. }
        ));
        assert!(matches!(classify(b"\xff\xfe"), Peeked::Other { .. }));
        assert!(matches!(
            classify(include_bytes!("../../tests/data/hello-openssl.bin")),
            Peeked::Tls(_)
        ));
    }

    #[test]
    fn host_header_split() {
        assert_eq!(split_host_header("a.example:81"), ("a.example", Some("81")));
        assert_eq!(split_host_header("a.example"), ("a.example", None));
        assert_eq!(split_host_header("[::1]:80"), ("[::1]", Some("80")));
        assert_eq!(split_host_header("[::1]"), ("[::1]", None));
        assert_eq!(split_host_header("::1"), ("::1", None));
    }
}
