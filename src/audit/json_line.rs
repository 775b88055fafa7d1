//! One JSON object written field by field onto the end of a line buffer, for the audit
//! writer: no intermediate value, no `Serialize` walk. Keys are the record's fixed names
//! (plain ASCII, copied as they are); strings are escaped as RFC 8259 §7 requires, spelt as
//! serde_json spells them (`\"`, `\\`, `\b \f \n \r \t`, `\u00XX` for the other control
//! characters; everything else, DEL and non-ASCII included, as it is), so a line is the same
//! bytes the serde encoder wrote and can never hold a raw line break a reader would split
//! on. Numbers go through `itoa`.

use std::fmt::{self, Display, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde::Serialize;

use crate::policy::target::{AddrText, Host};

/// A field's name as written before its value, `,"name":`, made by [`key!`] at compile time:
/// a field then starts with one copy of a constant (a key used to be four pushes and copies,
/// each with its capacity check).
#[derive(Clone, Copy)]
pub struct Key(&'static str);

impl Key {
    /// `text` is `,"name":` with a name of plain ASCII ([`key!`] checks it when it compiles).
    pub const fn of(text: &'static str) -> Key {
        let b = text.as_bytes();
        assert!(b.len() >= 4 && b[0] == b',' && b[1] == b'"');
        assert!(b[b.len() - 2] == b'"' && b[b.len() - 1] == b':');
        let mut i = 2;
        while i < b.len() - 2 {
            assert!(b[i].is_ascii_graphic() && b[i] != b'"' && b[i] != b'\\');
            i += 1;
        }
        Key(text)
    }
}

/// The [`Key`] of the field `name` (a string literal), checked when it compiles.
macro_rules! key {
    ($name:literal) => {{
        const KEY: $crate::audit::json_line::Key =
            $crate::audit::json_line::Key::of(concat!(",\"", $name, "\":"));
        KEY
    }};
}
pub(crate) use key;

/// An object being written; [`Object::close`] ends it.
pub struct Object<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Object<'a> {
    /// Start an object at the end of `out` (its `{` is the first key's comma, rewritten).
    pub fn open(out: &'a mut Vec<u8>) -> Self {
        Object { out, empty: true }
    }

    /// End the object.
    pub fn close(self) {
        if self.empty {
            self.out.push(b'{');
        }
        self.out.push(b'}');
    }

    /// `,"key":` — or `{"key":` for the first. Inlined into
    /// [`crate::audit::record::Entry::encode`] with every method that calls it, so each key's
    /// length is a constant where it is written and the copy is a few stores instead of a
    /// call to `memcpy`.
    #[inline(always)]
    fn key(&mut self, key: Key) {
        let at = self.out.len();
        self.out.extend_from_slice(key.0.as_bytes());
        if self.empty {
            self.out[at] = b'{';
            self.empty = false;
        }
    }

    /// `"key":"value"`.
    #[inline(always)]
    pub fn str(&mut self, key: Key, value: &str) {
        self.key(key);
        quoted(self.out, value);
    }

    /// A fixed spelling from the record's vocabulary (an event, a mode, a reason code): plain
    /// ASCII that needs no escaping, so it is copied without the scan [`Object::str`] makes.
    #[inline(always)]
    pub fn word(&mut self, key: Key, value: &'static str) {
        debug_assert!(value.bytes().all(|b| !needs_escape(b)), "{value:?}");
        self.key(key);
        self.out.push(b'"');
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(b'"');
    }

    /// A fixed spelling, or `null`.
    #[inline(always)]
    pub fn word_or_null(&mut self, key: Key, value: Option<&'static str>) {
        match value {
            Some(v) => self.word(key, v),
            None => self.null(key),
        }
    }

    /// A string whose text `write` appends and which needs no escaping (digits, a fixed
    /// spelling).
    #[inline(always)]
    pub fn plain(&mut self, key: Key, write: impl FnOnce(&mut Vec<u8>)) {
        self.key(key);
        self.out.push(b'"');
        write(self.out);
        self.out.push(b'"');
    }

    /// A string, or `null`.
    #[inline(always)]
    pub fn str_or_null(&mut self, key: Key, value: Option<&str>) {
        match value {
            Some(v) => self.str(key, v),
            None => self.null(key),
        }
    }

    /// A string, or no field at all.
    #[inline(always)]
    pub fn str_if(&mut self, key: Key, value: Option<&str>) {
        if let Some(v) = value {
            self.str(key, v);
        }
    }

    /// A target's host as its `Display` spells it: a name escaped, an address from
    /// [`AddrText`] (nothing in it to escape), without a formatter either way.
    #[inline(always)]
    pub fn host(&mut self, key: Key, host: &Host) {
        match host {
            Host::Name(n) => self.str(key, n),
            Host::Ip(ip) => {
                self.key(key);
                self.out.push(b'"');
                self.out
                    .extend_from_slice(AddrText::of(*ip, true).as_str().as_bytes());
                self.out.push(b'"');
            }
        }
    }

    /// A socket address as its `Display` spells it (`10.1.2.3:40000`, `[fd00::2]:53`), an IPv4
    /// one digit by digit (every record has a client), IPv6 through `Display`.
    pub fn addr(&mut self, key: Key, value: &SocketAddr) {
        self.key(key);
        self.out.push(b'"');
        match value {
            SocketAddr::V4(v4) => {
                push_ipv4(self.out, *v4.ip());
                self.out.push(b':');
                self.out
                    .extend_from_slice(itoa::Buffer::new().format(v4.port()).as_bytes());
            }
            // With its scope, when it has one (`[fe80::1%2]:53`). Writing into a Vec cannot
            // fail.
            SocketAddr::V6(v6) => {
                let _ = write!(Escaped(self.out), "{v6}");
            }
        }
        self.out.push(b'"');
    }

    /// A socket address, or `null`.
    pub fn addr_or_null(&mut self, key: Key, value: Option<&SocketAddr>) {
        match value {
            Some(a) => self.addr(key, a),
            None => self.null(key),
        }
    }

    /// An array of addresses as `Display` spells them ([`push_ip`]): an allowed query's
    /// record lists its answer twice, and the formatter spent about 1,350 instructions on
    /// each IPv4 address.
    pub fn ips(&mut self, key: Key, items: &[IpAddr]) {
        self.key(key);
        self.out.push(b'[');
        for (i, ip) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.push(b'"');
            push_ip(self.out, *ip);
            self.out.push(b'"');
        }
        self.out.push(b']');
    }

    /// A string put together by `write` from escaped text and numbers ([`Text`]), with no
    /// formatter in between.
    #[inline(always)]
    pub fn composed(&mut self, key: Key, write: impl FnOnce(&mut Text<'_>)) {
        self.key(key);
        self.out.push(b'"');
        write(&mut Text(self.out));
        self.out.push(b'"');
    }

    #[inline(always)]
    pub fn u64(&mut self, key: Key, value: u64) {
        self.key(key);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    /// A number, or `null`.
    #[inline(always)]
    pub fn u64_or_null(&mut self, key: Key, value: Option<u64>) {
        match value {
            Some(v) => self.u64(key, v),
            None => self.null(key),
        }
    }

    /// A number, or no field at all.
    #[inline(always)]
    pub fn u64_if(&mut self, key: Key, value: Option<u64>) {
        if let Some(v) = value {
            self.u64(key, v);
        }
    }

    /// A boolean, or no field at all.
    #[inline(always)]
    pub fn bool_if(&mut self, key: Key, value: Option<bool>) {
        if let Some(v) = value {
            self.key(key);
            self.out
                .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
        }
    }

    #[inline(always)]
    pub fn null(&mut self, key: Key) {
        self.key(key);
        self.out.extend_from_slice(b"null");
    }

    /// An array of `Display` texts.
    pub fn list<T: Display>(&mut self, key: Key, items: &[T]) {
        self.key(key);
        self.out.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.push(b'"');
            let _ = write!(Escaped(self.out), "{item}");
            self.out.push(b'"');
        }
        self.out.push(b']');
    }

    /// A rare nested value, through serde (an access request's facts), or no field at all.
    pub fn serialized_if<T: Serialize>(
        &mut self,
        key: Key,
        value: Option<&T>,
    ) -> serde_json::Result<()> {
        if let Some(v) = value {
            self.key(key);
            serde_json::to_writer(&mut *self.out, v)?;
        }
        Ok(())
    }
}

/// The inside of a JSON string being put together ([`Object::composed`]).
pub struct Text<'a>(&'a mut Vec<u8>);

impl Text<'_> {
    /// Append `s`, escaped.
    pub fn text(&mut self, s: &str) {
        escape(self.0, s);
    }

    /// Append `n`'s decimal digits.
    pub fn number(&mut self, n: u64) {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
}

/// An address as `Display` spells it ([`AddrText`]: no formatter for IPv4).
fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    out.extend_from_slice(AddrText::of(ip, false).as_str().as_bytes());
}

fn push_ipv4(out: &mut Vec<u8>, ip: Ipv4Addr) {
    push_ip(out, IpAddr::V4(ip));
}

/// `value` as a JSON string, quotes included.
pub fn quoted(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    escape(out, value);
    out.push(b'"');
}

/// Append `s` escaped for the inside of a JSON string: runs that need nothing are copied
/// whole, found eight bytes at a time ([`clean_run`]).
fn escape(out: &mut Vec<u8>, s: &str) {
    let mut rest = s.as_bytes();
    loop {
        let clean = clean_run(rest);
        out.extend_from_slice(&rest[..clean]);
        let Some(&b) = rest.get(clean) else {
            return;
        };
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            _ => b"",
        };
        if short.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(short);
        }
        rest = &rest[clean + 1..];
    }
}

/// Whether JSON needs `b` escaped inside a string: a control character, `"` or `\`.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// How many bytes at the start of `bytes` need no escaping. Eight at a time: a word with no
/// byte below 0x20 and none equal to `"` or `\` is skipped whole (the classic "has a byte
/// less than" and "has a zero byte" tests: exact for the word, though not for which byte);
/// the word that has one, and the tail, byte by byte.
fn clean_run(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v;
    let mut at = 0;
    for word in bytes.chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let x = u64::from_le_bytes(w);
        let flagged = (x.wrapping_sub(ONES * 0x20) & !x)
            | zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')));
        if flagged & HIGH != 0 {
            if let Some(i) = word.iter().position(|&b| needs_escape(b)) {
                return at + i;
            }
        }
        at += 8;
    }
    at + bytes[at..]
        .iter()
        .position(|&b| needs_escape(b))
        .unwrap_or(bytes.len() - at)
}

/// A `fmt::Write` that escapes what it is given.
struct Escaped<'a>(&'a mut Vec<u8>);

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape(self.0, s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn json_of(s: &str) -> String {
        let mut out = Vec::new();
        quoted(&mut out, s);
        String::from_utf8(out).expect("utf-8 in, utf-8 out")
    }

    #[test]
    fn every_control_character_and_the_two_specials_are_escaped() {
        for b in 0u8..0x20 {
            let s = char::from(b).to_string();
            assert_eq!(
                json_of(&s),
                serde_json::to_string(&s).expect("json"),
                "{b:#x}"
            );
            assert!(!json_of(&s).bytes().any(|c| c < 0x20));
        }
        assert_eq!(json_of("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(json_of("\u{7f}é😀"), "\"\u{7f}é😀\"");
    }

    #[test]
    fn an_empty_object_and_a_first_field_are_spelt_whole() {
        let mut out = b"x".to_vec();
        Object::open(&mut out).close();
        let mut o = Object::open(&mut out);
        o.u64(key!("n"), 1);
        o.close();
        assert_eq!(out, b"x{}{\"n\":1}");
    }

    #[test]
    fn fields_nulls_and_absences_are_spelt_as_serde_would() {
        let mut out = Vec::new();
        let mut o = Object::open(&mut out);
        o.str(key!("a"), "x\ny");
        o.str_or_null(key!("b"), None);
        o.str_if(key!("skipped"), None);
        o.u64(key!("n"), u64::MAX);
        o.u64_or_null(key!("m"), None);
        o.bool_if(key!("t"), Some(true));
        o.bool_if(key!("gone"), None);
        let ips: [std::net::IpAddr; 2] =
            ["10.0.0.1".parse().expect("ip"), "::1".parse().expect("ip")];
        o.list(key!("ips"), &ips);
        o.list::<String>(key!("none"), &[]);
        o.host(key!("s"), &Host::Name("q\"".into()));
        o.host(key!("v6"), &Host::Ip("2001:db8::1".parse().expect("ip")));
        o.close();
        let want = serde_json::json!({
            "a": "x\ny", "b": null, "n": u64::MAX, "m": null, "t": true,
            "ips": ["10.0.0.1", "::1"], "none": [], "s": "q\"", "v6": "[2001:db8::1]",
        });
        let got: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(got, want);
    }

    proptest! {
        /// Any text, forged names and paths included, is the same JSON string serde_json
        /// writes, reads back whole, and never breaks the line.
        #[test]
        fn any_text_is_escaped_exactly_as_serde_json_does(s in any::<String>(), t in "[\\x00-\\x7f]{0,40}") {
            for text in [&s, &t] {
                let ours = json_of(text);
                prop_assert_eq!(&ours, &serde_json::to_string(text).expect("json"));
                prop_assert!(!ours.contains('\n') && !ours.contains('\r'));
                let back: String = serde_json::from_str(&ours).expect("reads back");
                prop_assert_eq!(&back, text);
            }
        }

        /// A client address, and a list of addresses, are spelt as `Display` spells them
        /// (IPv6 scope ids and flow labels included, which `Display` shows as `%scope`).
        #[test]
        fn an_address_is_spelt_as_display_spells_it(
            ip in any::<[u8; 4]>(), v6 in any::<[u8; 16]>(), port in any::<u16>(), scope in 0u32..3,
        ) {
            let scoped = std::net::SocketAddrV6::new(v6.into(), port, 7, scope);
            for a in [SocketAddr::from((ip, port)), SocketAddr::from((v6, port)), SocketAddr::V6(scoped)] {
                let mut out = Vec::new();
                let mut o = Object::open(&mut out);
                o.addr(key!("client"), &a);
                o.ips(key!("ips"), &[a.ip(), IpAddr::from(ip)]);
                o.close();
                let want = format!("{{\"client\":\"{a}\",\"ips\":[\"{}\",\"{}\"]}}", a.ip(), IpAddr::from(ip));
                prop_assert_eq!(String::from_utf8(out).expect("utf-8"), want);
            }
        }

        /// The word-at-a-time scan stops where a byte-by-byte one does, for any bytes.
        #[test]
        fn the_clean_run_is_found_as_byte_by_byte(
            bytes in proptest::collection::vec(prop_oneof![any::<u8>(), Just(b'"'), Just(b'\\'), 0x1fu8..=0x21, 0x5bu8..=0x5d], 0..70)
        ) {
            let naive = bytes.iter().position(|&b| needs_escape(b)).unwrap_or(bytes.len());
            prop_assert_eq!(clean_run(&bytes), naive);
        }
    }
}
