//! TLS ClientHello peeking for transparent mode: a pure function over the bytes received so
//! far. It reassembles a hello split across TCP segments *and* across TLS records (large
//! post-quantum key shares make hellos span several), says `Incomplete` until it has enough,
//! and extracts the SNI, the ALPN protocols and whether an ECH extension is present. It never
//! decrypts anything and never panics: every length is checked before it is used.

/// Largest hello we are willing to buffer.
pub const MAX_HELLO: usize = 64 * 1024;

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
/// `encrypted_client_hello` (RFC 9849) and its drafts: 0xfe08 (draft 08) to 0xfe0d (final).
const EXT_ECH_DRAFTS: std::ops::RangeInclusive<u16> = 0xfe08..=0xfe0d;
/// `encrypted_server_name`, the ESNI drafts' code point.
const EXT_ESNI: u16 = 0xffce;
/// Record types that may come before a hello in a first flight a server still reads:
/// change_cipher_spec, alert, application_data, heartbeat.
const OTHER_RECORDS: [u8; 4] = [20, 21, 23, 24];
/// The largest record length a TLS server reads in a first record (Go refuses ≥ 0x3000 there).
const MAX_RECORD: usize = 16384 + 2048;

/// What a ClientHello tells us.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHello {
    /// The `host_name` of the server_name extension (the outer SNI under ECH).
    pub sni: Option<String>,
    /// The protocols offered (ALPN), in order.
    pub alpn: Vec<String>,
    /// An `encrypted_client_hello` extension is present.
    pub ech: bool,
}

/// The verdict on the bytes seen so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Could still be a ClientHello: read more.
    Incomplete,
    /// Does not start like a TLS handshake record.
    NotTls,
    /// A ClientHello, read.
    Parsed(ClientHello),
    /// Starts like TLS but is broken (or too large).
    Malformed(&'static str),
}

/// Parse the start of a TLS stream. Every record of a first flight is read whatever its
/// version bytes (Go's crypto/tls reads a first record of any version); a record that is not a
/// handshake before the hello (an alert, which Go skips) and an SSLv2-format hello (which
/// OpenSSL reads) are `Malformed`: a server may read the hello after them, so they are refused,
/// never taken for another protocol.
pub fn parse(buf: &[u8]) -> Hello {
    match buf {
        [] => return Hello::Incomplete,
        [t, ..] if OTHER_RECORDS.contains(t) => return other_record(buf),
        [t, ..] if *t & 0x80 != 0 => return sslv2(buf),
        [t, ..] if *t != HANDSHAKE => return Hello::NotTls,
        _ => {}
    }
    // Reassemble the handshake message from as many records as needed.
    let mut hs: Vec<u8> = Vec::new();
    let mut rest = buf;
    loop {
        if let Some(verdict) = try_message(&hs) {
            return verdict;
        }
        if rest.len() < 5 {
            return too_large_or_incomplete(buf);
        }
        if rest[0] != HANDSHAKE {
            return Hello::Malformed("non-handshake record before the ClientHello ended");
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD {
            return Hello::Malformed("bad record length");
        }
        if rest.len() < 5 + len {
            return too_large_or_incomplete(buf);
        }
        hs.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
}

/// A first record of another TLS content type: refused when its header is a plausible TLS
/// record header (a small version major and a length a server reads).
fn other_record(buf: &[u8]) -> Hello {
    match buf {
        [_] | [_, _] | [_, _, _] | [_, _, _, _] => Hello::Incomplete,
        [_, major, _, hi, lo, ..] if *major <= 3 => {
            match usize::from(u16::from_be_bytes([*hi, *lo])) <= MAX_RECORD {
                true => {
                    Hello::Malformed("a TLS record that is not a handshake before the ClientHello")
                }
                false => Hello::NotTls,
            }
        }
        _ => Hello::NotTls,
    }
}

/// An SSLv2-format ClientHello: a two-byte length with the high bit set, message type 1 and a
/// version of SSL 2.0 or a TLS version. It carries no SNI to judge.
fn sslv2(buf: &[u8]) -> Hello {
    match buf {
        [_] | [_, _] | [_, _, _] | [_, _, _, _] => Hello::Incomplete,
        [_, _, CLIENT_HELLO, 0, 2, ..] | [_, _, CLIENT_HELLO, 3, 0..=4, ..] => {
            Hello::Malformed("an SSLv2-format ClientHello (it carries no server name)")
        }
        _ => Hello::NotTls,
    }
}

fn too_large_or_incomplete(buf: &[u8]) -> Hello {
    if buf.len() >= MAX_HELLO {
        Hello::Malformed("ClientHello larger than 64 KiB")
    } else {
        Hello::Incomplete
    }
}

/// `Some(verdict)` once the handshake buffer holds a whole message (or is clearly wrong).
fn try_message(hs: &[u8]) -> Option<Hello> {
    if hs.len() < 4 {
        return None;
    }
    if hs[0] != CLIENT_HELLO {
        return Some(Hello::Malformed(
            "first handshake message is not a ClientHello",
        ));
    }
    let len = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
    if len > MAX_HELLO {
        return Some(Hello::Malformed("ClientHello larger than 64 KiB"));
    }
    if hs.len() < 4 + len {
        return None;
    }
    Some(match client_hello(&hs[4..4 + len]) {
        Ok(h) => Hello::Parsed(h),
        Err(e) => Hello::Malformed(e),
    })
}

/// A bounds-checked reader.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("truncated ClientHello");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

fn client_hello(body: &[u8]) -> Result<ClientHello, &'static str> {
    let mut r = Reader(body);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    let mut out = ClientHello::default();
    if r.0.is_empty() {
        return Ok(out); // no extensions at all
    }
    let mut exts = Reader(r.vec16()?);
    let mut seen_sni = false;
    while !exts.0.is_empty() {
        let typ = exts.u16()?;
        let data = exts.vec16()?;
        match typ {
            EXT_SERVER_NAME => {
                if seen_sni {
                    return Err("duplicate server_name extension");
                }
                seen_sni = true;
                out.sni = server_name(data)?;
            }
            EXT_ALPN => {
                let mut list = Reader(Reader(data).vec16()?);
                while !list.0.is_empty() {
                    let p = list.vec8()?;
                    out.alpn.push(String::from_utf8_lossy(p).into_owned());
                }
            }
            t if EXT_ECH_DRAFTS.contains(&t) || t == EXT_ESNI => out.ech = true,
            _ => {}
        }
    }
    Ok(out)
}

fn server_name(data: &[u8]) -> Result<Option<String>, &'static str> {
    let mut list = Reader(Reader(data).vec16()?);
    let mut name = None;
    while !list.0.is_empty() {
        let typ = list.u8()?;
        let value = list.vec16()?;
        if typ == 0 {
            if name.is_some() {
                return Err("two host names in server_name");
            }
            let text = std::str::from_utf8(value).map_err(|_| "server_name is not UTF-8")?;
            if text.is_empty() {
                return Err("empty server_name");
            }
            name = Some(text.to_string());
        }
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURL: &[u8] = include_bytes!("../../tests/data/hello-curl.bin");
    const OPENSSL: &[u8] = include_bytes!("../../tests/data/hello-openssl.bin");
    const OPENSSL_NOSNI: &[u8] = include_bytes!("../../tests/data/hello-openssl-nosni.bin");

    fn parsed(buf: &[u8]) -> ClientHello {
        match parse(buf) {
            Hello::Parsed(h) => h,
            other => panic!("{other:?}"),
        }
    }

    /// Split the records of `hello` into records of at most `size` payload bytes.
    fn refragment(hello: &[u8], size: usize) -> Vec<u8> {
        let mut payload = Vec::new();
        let mut rest = hello;
        while rest.len() >= 5 {
            let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            payload.extend_from_slice(&rest[5..5 + len]);
            rest = &rest[5 + len..];
        }
        let mut out = Vec::new();
        for chunk in payload.chunks(size) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    /// A rustls ClientHello (real client code, in memory).
    fn rustls_hello(name: &str) -> Vec<u8> {
        use std::sync::Arc;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), server).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn captured_hellos() {
        let h = parsed(CURL);
        assert_eq!(h.sni.as_deref(), Some("api.example.com"));
        assert!(h.alpn.contains(&"http/1.1".to_string()), "{h:?}");
        let h = parsed(OPENSSL);
        assert_eq!(h.sni.as_deref(), Some("www.example.org"));
        assert_eq!(h.alpn, ["h2", "http/1.1"]);
        assert!(!h.ech);
        assert_eq!(parsed(OPENSSL_NOSNI).sni, None);
        let h = parsed(&rustls_hello("rustls.example.net"));
        assert_eq!(h.sni.as_deref(), Some("rustls.example.net"));
        assert_eq!(h.alpn, ["h2"]);
    }

    #[test]
    fn every_prefix_is_incomplete_never_wrong() {
        for hello in [
            CURL.to_vec(),
            OPENSSL.to_vec(),
            OPENSSL_NOSNI.to_vec(),
            rustls_hello("a.example"),
            refragment(CURL, 7),
        ] {
            for n in 0..hello.len() {
                let verdict = parse(&hello[..n]);
                assert!(
                    verdict == Hello::Incomplete,
                    "prefix {n}/{} gave {verdict:?}",
                    hello.len()
                );
            }
            assert!(matches!(parse(&hello), Hello::Parsed(_)));
            // Trailing bytes (the client's next flight) do not matter.
            let mut more = hello.clone();
            more.extend_from_slice(b"\x14\x03\x03\x00\x01\x01");
            assert!(matches!(parse(&more), Hello::Parsed(_)));
        }
    }

    #[test]
    fn hello_split_over_many_records() {
        for size in [1, 50, 100, 300] {
            let split = refragment(CURL, size);
            assert_eq!(
                parsed(&split).sni.as_deref(),
                Some("api.example.com"),
                "size {size}"
            );
        }
    }

    #[test]
    fn ech_flag() {
        for code in [0xfe0d_u16, 0xfe08, 0xfe0a, 0xffce] {
            let h = parsed(&with_extension(code));
            assert!(h.ech, "{code:#x}");
            assert_eq!(h.sni.as_deref(), Some("www.example.org"));
        }
        assert!(!parsed(&with_extension(0x1234)).ech);
    }

    /// The openssl hello with one more (one-byte) extension of type `code`.
    fn with_extension(code: u16) -> Vec<u8> {
        // Append the extension (fix up the three lengths).
        let mut payload = OPENSSL[5..].to_vec();
        let [hi, lo] = code.to_be_bytes();
        let ext = [hi, lo, 0x00, 0x01, 0x00];
        payload.extend_from_slice(&ext);
        let hs_len = payload.len() - 4;
        payload[1..4].copy_from_slice(&(hs_len as u32).to_be_bytes()[1..]);
        // extensions length sits after version(2)+random(32)+sid+suites+comp.
        let mut p = 4 + 2 + 32;
        p += 1 + usize::from(payload[p]);
        p += 2 + usize::from(u16::from_be_bytes([payload[p], payload[p + 1]]));
        p += 1 + usize::from(payload[p]);
        let ext_len = u16::from_be_bytes([payload[p], payload[p + 1]]) + ext.len() as u16;
        payload[p..p + 2].copy_from_slice(&ext_len.to_be_bytes());
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        rec.extend_from_slice(&payload);
        rec
    }

    /// What Go's crypto/tls or OpenSSL still read as a hello is read or refused, never
    /// another protocol (review round 7d T6, T7, S1).
    #[test]
    fn first_flights_a_server_reads() {
        // Any record version: the hello is read and its SNI judged.
        for version in [[0x02, 0x00], [0x00, 0x00], [0x03, 0x07], [0xfe, 0xfd]] {
            let mut h = refragment(CURL, 100);
            let mut at = 0;
            while at + 5 <= h.len() {
                h[at + 1..at + 3].copy_from_slice(&version);
                at += 5 + usize::from(u16::from_be_bytes([h[at + 3], h[at + 4]]));
            }
            assert_eq!(parsed(&h).sni.as_deref(), Some("api.example.com"));
        }
        // A warning alert (or a change_cipher_spec) before the hello.
        for first in [[21, 3, 1, 0, 2, 1, 0].as_slice(), &[20, 3, 3, 0, 1, 1]] {
            let flight = [first, CURL].concat();
            assert!(matches!(parse(&flight), Hello::Malformed(_)), "{first:?}");
        }
        // An SSLv2-format hello (SSL 2.0 or TLS 1.0 inside).
        for v in [[0, 2], [3, 1]] {
            let v2 = [0x80, 0x2e, 1, v[0], v[1], 0, 0x15, 0, 0, 0, 0x10];
            assert!(matches!(parse(&v2), Hello::Malformed(_)), "{v:?}");
        }
        // Other bytes with the same first byte stay another protocol.
        assert_eq!(parse(b"\x15\x7fxyz"), Hello::NotTls);
        assert_eq!(parse(b"\x80\x00\x07abc"), Hello::NotTls);
    }

    #[test]
    fn not_tls_and_malformed() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(b"\x16\x01"), Hello::Incomplete);
        assert!(matches!(
            parse(b"\x16\x03\x01\x00\x00"),
            Hello::Malformed(_)
        ));
        assert!(matches!(
            parse(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"),
            Hello::Malformed(_)
        ));
        assert!(matches!(
            parse(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"),
            Hello::Malformed(_)
        ));
        // Alert in the middle of a fragmented hello.
        let mut split = refragment(CURL, 100);
        split[105] = 21;
        assert!(matches!(parse(&split), Hello::Malformed(_)));
        // Huge declared length.
        assert!(matches!(
            parse(b"\x16\x03\x01\x00\x04\x01\xff\xff\xff"),
            Hello::Malformed(_)
        ));
        // A stream of tiny records that never completes is cut at 64 KiB.
        let mut endless = Vec::new();
        endless.extend_from_slice(&[22, 3, 1, 0, 4, 1, 0, 0xff, 0xff]);
        while endless.len() < MAX_HELLO + 10 {
            endless.extend_from_slice(&[22, 3, 1, 0, 1, 0]);
        }
        assert!(matches!(parse(&endless), Hello::Malformed(_)));
    }

    #[test]
    fn corrupted_hellos_never_panic() {
        let mut state = 0x1234_5678u32;
        for hello in [CURL, OPENSSL] {
            for _ in 0..3000 {
                let mut h = hello.to_vec();
                for _ in 0..4 {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    let i = state as usize % h.len();
                    h[i] = (state >> 8) as u8;
                }
                let _ = parse(&h);
            }
        }
    }
}
