//! The client side of an HTTP/1.x connection, framed request by request (RFC 9112 §6): which
//! bytes are a request head, which are its body (`Content-Length` or chunked), so that every
//! request head on a keep-alive connection can be checked before any of it is relayed.
//! Ambiguous framing — `Content-Length` together with `Transfer-Encoding`, differing
//! lengths, a transfer coding other than chunked — is an error: it is how requests are
//! smuggled past an inspecting proxy. After a request that asks to switch protocols
//! (`Upgrade`) or a `CONNECT`, the framer waits ([`Step::AwaitSwitch`]) until the relay knows
//! the origin's answer ([`crate::wire::http_response`]): only a `101` (or a `2xx` to the
//! `CONNECT`) makes the rest of the stream opaque ([`RequestStream::switched`]); any other
//! answer and the next request is framed and checked like every other.

use crate::wire::peek::MAX_PEEK;

/// One request head: its method and path (for its record), its `Host` and, for an
/// absolute-form target, its authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The request's method.
    pub method: String,
    /// The target's path without the query (the authority of a `CONNECT`).
    pub path: String,
    /// The `Host` header, if any.
    pub host: Option<String>,
    /// The request line's authority (absolute form), if any.
    pub authority: Option<String>,
    /// What its answer's framing depends on.
    pub kind: RequestKind,
}

/// What a response's framing (and a protocol switch) depends on in its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestKind {
    /// `HEAD`: its answer has no body.
    pub head: bool,
    /// Whether it is a `CONNECT`.
    pub connect: bool,
    /// It carries `Upgrade`.
    pub upgrade: bool,
}

/// What the next bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The first `n` bytes are body (or opaque) bytes: relay them.
    Pass(usize),
    /// All the bytes went into a request head (or chunk line) that is not complete yet.
    Buffered,
    /// A chunk-size or trailer line is complete: relay [`RequestStream::take_held`]; the first
    /// `consumed` bytes of the input went into it.
    Line {
        /// Input bytes that went into it.
        consumed: usize,
    },
    /// A request head is complete: check it, then relay [`RequestStream::take_held`]; the
    /// first `consumed` bytes of the input went into it.
    Head {
        /// The head read.
        head: Head,
        /// Input bytes that went into it.
        consumed: usize,
    },
    /// A request that asked to switch protocols (or a `CONNECT`) went out whole: nothing
    /// more is framed until [`RequestStream::switched`] says whether the origin switched.
    AwaitSwitch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Head,
    Body(u64),
    /// Reading a chunk-size line.
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data: bytes still to skip.
    ChunkEnd(u8),
    /// Trailer lines after the last chunk, up to an empty line.
    Trailers,
    /// The request before asked to switch protocols; the origin's answer is not known yet.
    AwaitSwitch,
    Opaque,
}

/// The framer of one connection's client → server bytes.
#[derive(Debug)]
pub struct RequestStream {
    state: State,
    /// The request head (or chunk-size / trailer line) being read.
    buf: Vec<u8>,
    /// The request being framed asked to switch: after its body, wait for the answer.
    switch_after: bool,
}

impl Default for RequestStream {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestStream {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        RequestStream {
            state: State::Head,
            buf: Vec::new(),
            switch_after: false,
        }
    }

    /// A framer of a message body alone (a response's, [`crate::wire::http_response`]):
    /// `length` bytes, or chunked when `None`; [`RequestStream::body_done`] says when it ended.
    pub fn body(length: Option<u64>) -> Self {
        let state = match length {
            Some(0) => State::Head,
            Some(n) => State::Body(n),
            None => State::ChunkSize,
        };
        RequestStream {
            state,
            buf: Vec::new(),
            switch_after: false,
        }
    }

    /// The body (of [`RequestStream::body`]) has ended.
    pub fn body_done(&self) -> bool {
        self.state == State::Head
    }

    /// The origin answered the request that asked to switch: with a switch (`101`, or a
    /// `2xx` to a `CONNECT`) the rest of the stream is opaque; otherwise framing goes on.
    pub fn switched(&mut self, switched: bool) {
        if self.state == State::AwaitSwitch {
            self.state = if switched { State::Opaque } else { State::Head };
        }
    }

    /// The message ended (its body, or a bodiless head): next is a head, or the wait for
    /// the answer to a switch.
    fn ended(&mut self) -> State {
        if std::mem::take(&mut self.switch_after) {
            State::AwaitSwitch
        } else {
            State::Head
        }
    }

    /// The bytes of the head or line last completed.
    pub fn take_held(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Look at the start of `data`.
    pub fn step(&mut self, data: &[u8]) -> Result<Step, &'static str> {
        match self.state {
            State::Opaque => Ok(Step::Pass(data.len())),
            State::AwaitSwitch => Ok(Step::AwaitSwitch),
            State::Body(left) => {
                let n = (data.len() as u64).min(left) as usize;
                self.state = if left == n as u64 {
                    self.ended()
                } else {
                    State::Body(left - n as u64)
                };
                Ok(Step::Pass(n))
            }
            State::ChunkData(left) => {
                let n = (data.len() as u64).min(left) as usize;
                self.state = if left == n as u64 {
                    State::ChunkEnd(2)
                } else {
                    State::ChunkData(left - n as u64)
                };
                Ok(Step::Pass(n))
            }
            State::ChunkEnd(left) => {
                let n = data.len().min(left as usize);
                let expected = &b"\r\n"[2 - left as usize..2 - left as usize + n];
                if &data[..n] != expected {
                    return Err("chunk data not followed by CRLF");
                }
                self.state = match left as usize - n {
                    0 => State::ChunkSize,
                    r => State::ChunkEnd(r as u8),
                };
                Ok(Step::Pass(n))
            }
            State::ChunkSize | State::Trailers => self.line(data),
            State::Head => self.head(data),
        }
    }

    /// A chunk-size or trailer line; passed through once complete.
    fn line(&mut self, data: &[u8]) -> Result<Step, &'static str> {
        let end = data.iter().position(|b| *b == b'\n');
        let take = end.map_or(data.len(), |i| i + 1);
        if self.buf.len() + take > 4096 {
            return Err("chunk-size or trailer line longer than 4 KiB");
        }
        self.buf.extend_from_slice(&data[..take]);
        if end.is_none() {
            return Ok(Step::Buffered);
        }
        let line = std::mem::take(&mut self.buf);
        let text = line
            .strip_suffix(b"\r\n")
            .ok_or("chunk-size or trailer line without CRLF")?;
        self.state = match self.state {
            State::ChunkSize => {
                let size = text.split(|b| *b == b';').next().unwrap_or_default();
                // Hex digits only: `from_str_radix` would take a sign (`+a`), which hyper and
                // most origins refuse — a framing difference smuggling lives on.
                let size = std::str::from_utf8(size)
                    .ok()
                    .map(|s| s.trim_end_matches([' ', '\t']))
                    .filter(|s| !s.is_empty() && s.len() <= 16)
                    .filter(|s| s.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|s| u64::from_str_radix(s, 16).ok())
                    .ok_or("bad chunk size")?;
                if size == 0 {
                    State::Trailers
                } else {
                    State::ChunkData(size)
                }
            }
            _ if text.is_empty() => self.ended(),
            _ => State::Trailers,
        };
        self.buf = line;
        Ok(Step::Line { consumed: take })
    }

    fn head(&mut self, data: &[u8]) -> Result<Step, &'static str> {
        let before = self.buf.len();
        self.buf.extend_from_slice(data);
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut req = httparse::Request::new(&mut headers);
        let len = match req.parse(&self.buf) {
            Ok(httparse::Status::Partial) if self.buf.len() < MAX_PEEK => {
                return Ok(Step::Buffered)
            }
            Ok(httparse::Status::Partial) => return Err("request head larger than 64 KiB"),
            Ok(httparse::Status::Complete(len)) => len,
            Err(_) => return Err("malformed request head"),
        };
        let Framing {
            host,
            length,
            chunked,
            upgrade,
        } = framing(req.headers)?;
        let method = req.method.unwrap_or("");
        let path = req.path.unwrap_or("");
        let authority = if method == "CONNECT" {
            Some(path.to_string())
        } else {
            path.split_once("://")
                .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or("").to_string())
        };
        let kind = RequestKind {
            head: method == "HEAD",
            connect: method == "CONNECT",
            upgrade,
        };
        let head = Head {
            method: method.to_string(),
            path: path_of(path, authority.as_deref(), kind.connect),
            host,
            authority,
            kind,
        };
        self.switch_after = upgrade || kind.connect;
        self.state = if chunked {
            State::ChunkSize
        } else {
            match length {
                Some(n) if n > 0 => State::Body(n),
                _ => self.ended(),
            }
        };
        self.buf.truncate(len);
        Ok(Step::Head {
            head,
            consumed: len - before,
        })
    }
}

/// The path a record names for a request `target`: without scheme, authority and query.
fn path_of(target: &str, authority: Option<&str>, connect: bool) -> String {
    if connect {
        return target.to_string();
    }
    let rest = match (authority, target.split_once("://")) {
        (Some(a), Some((_, after))) => after.strip_prefix(a).unwrap_or(after),
        _ => target,
    };
    let path = rest.split(['?', '#']).next().unwrap_or("");
    match path.is_empty() {
        true => "/".into(),
        false => path.into(),
    }
}

/// What a request head's headers say about it and its body.
struct Framing {
    host: Option<String>,
    length: Option<u64>,
    chunked: bool,
    upgrade: bool,
}

/// Read the headers with the framing rules hyper applies on the explicit proxy: one `Host`,
/// digits-only `Content-Length` (equal when repeated), `chunked` last when there is a
/// transfer coding, never both framings, no upgrade to h2c.
fn framing(headers: &[httparse::Header<'_>]) -> Result<Framing, &'static str> {
    let mut host = None;
    let mut hosts = 0;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut coded = false;
    let mut upgrade = false;
    for h in headers {
        let value = std::str::from_utf8(h.value).map_err(|_| "non-UTF-8 header value")?;
        if h.name.eq_ignore_ascii_case("host") {
            hosts += 1;
            host = Some(value.trim().to_string());
        } else if h.name.eq_ignore_ascii_case("content-length") {
            // Digits only (no sign, no list), as hyper requires on the explicit proxy.
            let v = value.trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err("bad Content-Length");
            }
            let n: u64 = v.parse().map_err(|_| "bad Content-Length")?;
            if length.is_some_and(|l| l != n) {
                return Err("differing Content-Length headers");
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            coded = true;
            let last = value.rsplit(',').next().unwrap_or("").trim();
            chunked = last.eq_ignore_ascii_case("chunked");
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            // h2c would carry streams whose `:authority` nothing checks.
            if value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("h2c"))
            {
                return Err("an upgrade to h2c (HTTP/2 streams the proxy cannot check)");
            }
            upgrade = true;
        }
    }
    if hosts > 1 {
        return Err("several Host headers");
    }
    if coded && length.is_some() {
        return Err("both Content-Length and Transfer-Encoding");
    }
    if coded && !chunked {
        return Err("a transfer coding other than chunked last");
    }
    Ok(Framing {
        host,
        length,
        chunked,
        upgrade,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `input` in pieces of `piece` bytes; return the heads seen and the bytes that would
    /// be relayed, in order.
    fn run(input: &[u8], piece: usize) -> Result<(Vec<Head>, Vec<u8>), &'static str> {
        let mut rs = RequestStream::new();
        let mut heads = Vec::new();
        let mut relayed = Vec::new();
        for chunk in input.chunks(piece) {
            let mut data = chunk;
            while !data.is_empty() {
                match rs.step(data)? {
                    Step::Pass(n) => {
                        relayed.extend_from_slice(&data[..n]);
                        data = &data[n..];
                    }
                    Step::Buffered => data = &[],
                    Step::Line { consumed } => {
                        relayed.extend(rs.take_held());
                        data = &data[consumed..];
                    }
                    Step::Head { head, consumed } => {
                        heads.push(head);
                        relayed.extend(rs.take_held());
                        data = &data[consumed..];
                    }
                    Step::AwaitSwitch => return Err("waiting for the origin's answer"),
                }
            }
        }
        Ok((heads, relayed))
    }

    fn hosts(heads: &[Head]) -> Vec<Option<&str>> {
        heads.iter().map(|h| h.host.as_deref()).collect()
    }

    #[test]
    fn frames_keep_alive_requests_with_every_body_kind_at_every_split() {
        let input: &[u8] = b"GET /a HTTP/1.1\r\nHost: one\r\n\r\n\
POST /b HTTP/1.1\r\nHost: two\r\nContent-Length: 11\r\n\r\nHost: three\
POST /c HTTP/1.1\r\nHost: four\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nHost:\r\n0\r\nT: v\r\n\r\n\
GET http://five:8080/x HTTP/1.1\r\nHost: six\r\n\r\n";
        for piece in [1, 2, 3, 7, 64, input.len()] {
            let (heads, relayed) = run(input, piece).unwrap();
            assert_eq!(
                hosts(&heads),
                vec![Some("one"), Some("two"), Some("four"), Some("six")],
                "piece {piece}"
            );
            assert_eq!(heads[3].authority.as_deref(), Some("five:8080"));
            assert_eq!(relayed, input, "piece {piece}");
        }
    }

    #[test]
    fn smuggling_shapes_are_errors() {
        for bad in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz",
            b"\x00garbage\r\n\r\n",
        ] {
            assert!(run(bad, 1).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// After an `Upgrade` (or `CONNECT`) request the framer waits for the origin's answer:
    /// a switch makes the rest opaque, anything else frames (and checks) the next request.
    #[test]
    fn after_an_upgrade_the_answer_decides() {
        let head = b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n";
        let rest = b"\x81\x05GET / HTTP/1.1\r\nHost: b\r\n\r\n";
        for switched in [true, false] {
            let mut rs = RequestStream::new();
            assert!(matches!(rs.step(head).unwrap(), Step::Head { .. }));
            rs.take_held();
            assert_eq!(rs.step(rest).unwrap(), Step::AwaitSwitch);
            rs.switched(switched);
            let next = rs.step(rest);
            if switched {
                assert_eq!(next.unwrap(), Step::Pass(rest.len()));
            } else {
                assert!(
                    next.is_err(),
                    "the bytes after a refused upgrade are framed"
                );
            }
        }
        let mut rs = RequestStream::new();
        let connect = b"CONNECT b:443 HTTP/1.1\r\nHost: b:443\r\n\r\n";
        assert!(matches!(rs.step(connect).unwrap(), Step::Head { .. }));
        rs.take_held();
        assert_eq!(rs.step(b"GET").unwrap(), Step::AwaitSwitch);
        rs.switched(false);
        assert_eq!(rs.step(b"GET").unwrap(), Step::Buffered);
    }

    #[test]
    fn an_upgrade_to_h2c_is_refused() {
        let req = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: websocket, H2C\r\n\r\n";
        assert!(run(req, 1000).is_err());
    }

    #[test]
    fn signed_or_listed_lengths_are_refused() {
        for bad in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n",
        ] {
            assert!(run(bad, 1000).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(run(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
            1000
        )
        .is_ok());
    }
}
