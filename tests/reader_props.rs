//! Property test of the first-bytes reader (issue 90): for random request heads shaped like
//! the ones the review sent (a method token, white space, a target, a version, a `Host`, with
//! leading empty lines, tabs, PROXY headers), whenever a model of nginx, Go net/http or Python
//! http.server would read a request, the proxy either reads the same method and `Host` or
//! refuses it — it never calls it "another protocol", which a `tcp://` entry would relay
//! unread. The models are written here from each server's request-line parser.

use egress_proxy::wire::peek::{classify, Peeked};
use proptest::prelude::*;

/// RFC 9110 `tchar`s, upper and lower case.
const TCHAR: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~";

const PREFIXES: &[&[u8]] = &[
    b"",
    b"",
    b"\r\n",
    b"\n",
    b"\t",
    b" ",
    b"PROXY TCP4 6.6.6.6 10.0.0.1 1234 80\r\n",
    b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c\x06\x06\x06\x06\x0a\0\0\x01\x04\xd2\0\x50",
];
const SEPARATORS: &[&[u8]] = &[
    b" ", b" ", b" ", b"\t", b"  ", b"\x0b", b"\x0c", b"\x1c", b"\x1f", b" \t", b"\xa0",
];
const TARGETS: &[&str] = &["/", "*", "/admin?x=1", "http://forbidden.test/"];
const ENDS: &[&[u8]] = &[b"\r\n", b"\n"];

/// Python's `str.split()` white space, on a Latin-1 decoded line.
fn python_space(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f | 0x85 | 0xa0
    )
}

fn first_line(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    &buf[..end]
}

/// Python http.server: the first line split on any white space; three words, the last
/// `HTTP/…`.
fn python_reads(buf: &[u8]) -> bool {
    let words: Vec<&[u8]> = first_line(buf)
        .split(|&b| python_space(b))
        .filter(|w| !w.is_empty())
        .collect();
    words.len() == 3 && words[2].starts_with(b"HTTP/")
}

/// nginx: empty lines skipped; a method of `A-Z`, `_`, `-`; one or more spaces; a target;
/// spaces; `HTTP/`.
fn nginx_reads(buf: &[u8]) -> bool {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let line = first_line(&buf[start..]);
    let m = line
        .iter()
        .take_while(|&&b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
        .count();
    let words: Vec<&[u8]> = line[m..]
        .split(|&b| b == b' ')
        .filter(|w| !w.is_empty())
        .collect();
    m > 0 && line.get(m) == Some(&b' ') && words.len() == 2 && words[1].starts_with(b"HTTP/")
}

/// Go net/http: `METHOD SP TARGET SP PROTO`, single spaces, the method any token.
fn go_reads(buf: &[u8]) -> bool {
    let line = first_line(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let parts: Vec<&[u8]> = line.splitn(3, |&b| b == b' ').collect();
    parts.len() == 3
        && !parts[0].is_empty()
        && parts[0].iter().all(|b| TCHAR.as_bytes().contains(b))
        && parts[2].starts_with(b"HTTP/")
}

fn head() -> impl Strategy<Value = (Vec<u8>, String, bool)> {
    (
        prop::sample::select(PREFIXES),
        prop::collection::vec(prop::sample::select(TCHAR.as_bytes().to_vec()), 1..9),
        prop::sample::select(SEPARATORS),
        prop::sample::select(TARGETS),
        prop::sample::select(SEPARATORS),
        prop::sample::select(ENDS),
    )
        .prop_map(|(prefix, method, sep1, target, sep2, end)| {
            let method = String::from_utf8(method).unwrap();
            let mut b = prefix.to_vec();
            b.extend_from_slice(method.as_bytes());
            b.extend_from_slice(sep1);
            b.extend_from_slice(target.as_bytes());
            b.extend_from_slice(sep2);
            b.extend_from_slice(b"HTTP/1.1");
            b.extend_from_slice(end);
            b.extend_from_slice(b"Host: forbidden.test\r\n\r\n");
            let plain = prefix.is_empty() && sep1 == b" ";
            (b, method, plain)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn what_an_origin_reads_is_read_the_same_or_refused((buf, method, plain) in head()) {
        let read_by = [python_reads(&buf), nginx_reads(&buf), go_reads(&buf)];
        let got = classify(&buf);
        if read_by.iter().any(|r| *r) {
            prop_assert!(
                !matches!(got, Peeked::Other { .. } | Peeked::Incomplete),
                "{:?} (read by python/nginx/go {read_by:?}) was {got:?}",
                String::from_utf8_lossy(&buf)
            );
        }
        if let Peeked::Http { host } = &got {
            // Read as HTTP only as every origin reads it: no prefix, one space after an
            // upper-case token method, and the Host is the one the origins read.
            prop_assert!(plain && !method.bytes().any(|b| b.is_ascii_lowercase()), "{:?}", String::from_utf8_lossy(&buf));
            prop_assert_eq!(host.as_deref(), Some("forbidden.test"));
        }
    }
}
