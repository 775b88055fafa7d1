//! The server side of a checked HTTP/1.x connection, framed response by response (RFC 9112
//! §6.3) only as far as needed to tell the origin's answer to a request that asked to switch
//! protocols (`Upgrade`, or a `CONNECT`): a `101` (a `2xx` to the `CONNECT`) means the stream
//! switched; any other final answer means it did not, and the client's next bytes are requests
//! to check. The bytes are never changed: the relay passes them on as they come and feeds them
//! here too.

use std::collections::VecDeque;

use crate::wire::http_stream::{RequestKind, RequestStream, Step};
use crate::wire::peek::MAX_PEEK;

/// What the responses fed so far said about the request that asked to switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Not answered yet.
    Pending,
    /// `101` to an `Upgrade`, `2xx` to a `CONNECT`: the rest of both directions is opaque.
    Switched,
    /// Another final answer: the connection stays HTTP.
    NotSwitched,
}

#[derive(Debug)]
enum State {
    Head,
    Body(RequestStream),
    /// A body delimited by the connection's end, or the stream switched: nothing more to read.
    Rest,
}

/// The framer of one connection's server → client bytes.
#[derive(Debug)]
pub struct ResponseStream {
    state: State,
    buf: Vec<u8>,
    /// The requests sent and not yet answered, oldest first.
    pending: VecDeque<RequestKind>,
    /// The answer to the last request that asked to switch.
    answer: Answer,
    /// The final answer being read: its status and bytes so far.
    current: Option<(u16, u64)>,
    /// Answers read whole (status, bytes), oldest first, until taken.
    done: VecDeque<(u16, u64)>,
}

impl Default for ResponseStream {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseStream {
    /// A reader at the start of a response.
    pub fn new() -> Self {
        ResponseStream {
            state: State::Head,
            buf: Vec::new(),
            pending: VecDeque::new(),
            answer: Answer::Pending,
            current: None,
            done: VecDeque::new(),
        }
    }

    /// The oldest answer read whole and not taken yet: its status and its bytes (head and
    /// body), in the order of the requests.
    pub fn take_answered(&mut self) -> Option<(u16, u64)> {
        self.done.pop_front()
    }

    /// The connection ended: an answer delimited by its end (or a switched stream) is whole.
    pub fn finish(&mut self) {
        self.complete();
    }

    /// The answer being read is whole.
    fn complete(&mut self) {
        if let Some(c) = self.current.take() {
            self.done.push_back(c);
        }
    }

    /// `n` more bytes of the answer being read.
    fn count(&mut self, n: usize) {
        if let Some(c) = self.current.as_mut() {
            c.1 += n as u64;
        }
    }

    /// A request went to the origin.
    pub fn sent(&mut self, kind: RequestKind) {
        if kind.upgrade || kind.connect {
            self.answer = Answer::Pending;
        }
        self.pending.push_back(kind);
    }

    /// What the origin answered the request that asked to switch.
    pub fn answer(&self) -> Answer {
        self.answer
    }

    /// Read `data` (all of it); `Err` when the responses cannot be framed (the relay ends).
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), &'static str> {
        while !data.is_empty() {
            match &mut self.state {
                State::Rest => {
                    self.count(data.len());
                    return Ok(());
                }
                State::Body(body) => match body.step(data)? {
                    step @ (Step::Pass(n) | Step::Line { consumed: n }) => {
                        if let Step::Line { .. } = step {
                            body.take_held();
                        }
                        data = &data[n..];
                        let done = body.body_done();
                        self.count(n);
                        if done {
                            self.state = State::Head;
                            self.complete();
                        }
                    }
                    Step::Buffered => {
                        self.count(data.len());
                        data = &[];
                    }
                    Step::Head { .. } | Step::AwaitSwitch => return Err("response body framing"),
                },
                State::Head => {
                    let before = self.buf.len();
                    self.buf.extend_from_slice(data);
                    match self.head()? {
                        None => data = &[],
                        Some(len) => {
                            data = &data[len - before..];
                            self.buf.clear();
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Parse a response head from `buf`: its length when complete.
    fn head(&mut self) -> Result<Option<usize>, &'static str> {
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(&self.buf) {
            Ok(httparse::Status::Partial) if self.buf.len() < MAX_PEEK => return Ok(None),
            Ok(httparse::Status::Partial) => return Err("response head larger than 64 KiB"),
            Ok(httparse::Status::Complete(len)) => len,
            Err(_) => return Err("malformed response head"),
        };
        let code = resp.code.unwrap_or(0);
        if (100..200).contains(&code) && code != 101 {
            // Interim (100 Continue, 103 Early Hints): the final answer follows.
            return Ok(Some(len));
        }
        let req = self.pending.pop_front().unwrap_or_default();
        self.current = Some((code, len as u64));
        let switching = req.upgrade || req.connect;
        let switched = (code == 101 && req.upgrade) || (req.connect && (200..300).contains(&code));
        if code == 101 && !req.upgrade {
            return Err("101 to a request that did not ask to switch");
        }
        if switching {
            self.answer = if switched {
                Answer::Switched
            } else {
                Answer::NotSwitched
            };
        }
        if switched {
            self.state = State::Rest;
            return Ok(Some(len));
        }
        let mut length = None;
        let mut chunked = false;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(h.value).map_err(|_| "bad Content-Length")?;
                length = Some(v.trim().parse::<u64>().map_err(|_| "bad Content-Length")?);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
                chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
                if !chunked {
                    // Delimited by the connection's end.
                    length = None;
                }
            }
        }
        let bodiless = req.head || code == 204 || code == 304;
        self.state = if bodiless {
            State::Head
        } else if chunked {
            State::Body(RequestStream::body(None))
        } else {
            match length {
                Some(n) => State::Body(RequestStream::body(Some(n))),
                None => State::Rest,
            }
        };
        if let State::Body(b) = &self.state {
            if b.body_done() {
                self.state = State::Head;
            }
        }
        if matches!(self.state, State::Head) {
            self.complete();
        }
        Ok(Some(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(upgrade: bool, connect: bool, head: bool) -> RequestKind {
        RequestKind {
            head,
            connect,
            upgrade,
        }
    }

    /// Earlier answers (with every body kind) are skipped; the answer to the upgrade decides,
    /// whatever the split.
    #[test]
    fn the_answer_to_the_switch_is_found_behind_earlier_responses() {
        let earlier = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/\
HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n101\r\n0\r\n\r\n\
HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n";
        for (last, want) in [
            (&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching\r\nUpgrade: websocket\r\n\r\n"[..], Answer::Switched),
            (b"HTTP/1.1 400 No\r\nContent-Length: 0\r\n\r\n", Answer::NotSwitched),
        ] {
            let mut all = earlier.to_vec();
            all.extend_from_slice(last);
            for piece in [1, 3, 17, all.len()] {
                let mut rs = ResponseStream::new();
                rs.sent(kind(false, false, false));
                rs.sent(kind(false, false, false));
                rs.sent(kind(false, false, true)); // HEAD: Content-Length 9, no body
                rs.sent(kind(true, false, false));
                let last_starts = all.len() - last.len();
                let mut at = 0;
                for c in all.chunks(piece) {
                    rs.feed(c).unwrap();
                    at += c.len();
                    if at <= last_starts {
                        assert_eq!(rs.answer(), Answer::Pending, "answered early");
                    }
                }
                assert_eq!(rs.answer(), want, "piece {piece}");
            }
        }
    }

    #[test]
    fn a_connect_switches_on_2xx_only_and_a_stray_101_is_an_error() {
        let mut rs = ResponseStream::new();
        rs.sent(kind(false, true, false));
        rs.feed(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .unwrap();
        assert_eq!(rs.answer(), Answer::Switched);
        let mut rs = ResponseStream::new();
        rs.sent(kind(false, true, false));
        rs.feed(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno")
            .unwrap();
        assert_eq!(rs.answer(), Answer::NotSwitched);
        let mut rs = ResponseStream::new();
        rs.sent(kind(false, false, false));
        assert!(rs.feed(b"HTTP/1.1 101 Switching\r\n\r\n").is_err());
    }

    /// Each answer is reported whole, in order, with its status and its bytes, whatever the
    /// split; one delimited by the connection's end when the connection ends.
    #[test]
    fn answers_are_counted_one_by_one() {
        let a = &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"[..];
        let b = &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 No\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"[..];
        let c = &b"HTTP/1.1 200 OK\r\n\r\nuntil the end"[..];
        let all = [a, b, c].concat();
        for split in [1, 7, all.len()] {
            let mut r = ResponseStream::new();
            for _ in 0..3 {
                r.sent(kind(false, false, false));
            }
            for piece in all.chunks(split) {
                r.feed(piece).unwrap();
            }
            assert_eq!(r.take_answered(), Some((200, a.len() as u64)));
            let interim = "HTTP/1.1 100 Continue\r\n\r\n".len();
            assert_eq!(r.take_answered(), Some((404, (b.len() - interim) as u64)));
            assert_eq!(r.take_answered(), None);
            r.finish();
            assert_eq!(r.take_answered(), Some((200, c.len() as u64)));
        }
    }
}
