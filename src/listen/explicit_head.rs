//! The explicit listener's first look at a connection's first request head: hyper would
//! answer a head it cannot parse with a bare 400, so the proxy answers it itself, with
//! `Proxy-Status`, a body, and the right mode in the record. What the look read is handed to
//! hyper to read again ([`crate::intercept::prefixed::Prefixed`]): the head costs one `read`,
//! not a peek and then a read of the same bytes.

use tokio::net::TcpStream;

use super::explicit::MAX_HEAD;
use crate::audit::accept::Accepted;
use crate::audit::{Close, Mode};
use crate::policy::reason::Reason;
use crate::policy::Decision;
use crate::relay::deny::{self, Wording};
use crate::runtime::Shared;

/// A first request head that arrived whole but cannot be served: what it was and why.
pub(super) struct Malformed {
    mode: Mode,
    why: String,
}

/// What the first look reads: a CONNECT or a request head fits; a larger one is read on, up
/// to [`MAX_HEAD`], as far as it has arrived.
const FIRST_LOOK: usize = 4096;

/// Wait (without a buffer: a silent client holds none) until the connection has something to
/// say, then read it: the bytes (empty when the client closed). One system call for what the
/// first-byte wait, the head check and hyper's first read each did before (hyper reads these
/// bytes again from memory).
pub(super) async fn first_look(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    stream.readable().await?;
    // Read into the spare room as it is: zeroing it first cost a 4 KiB `memset` a connection.
    let mut buf = Vec::with_capacity(FIRST_LOOK);
    // Through `AsyncRead`, not `try_read`: a short read marks the socket drained, so hyper's
    // next read waits for more instead of trying (and failing) once.
    stream.read_buf(&mut buf).await?;
    Ok(buf)
}

/// Look at the first request head, if it is all there: hyper would answer a head it cannot
/// parse with a bare 400, so the proxy answers it itself, with Proxy-Status, a body and the
/// right mode in the record. A head still incomplete is left to hyper. `first` is what
/// [`first_look`] read; a first look that filled its buffer reads on (without waiting) with
/// room for a whole head. `first` comes back with whatever was read on, for hyper.
pub(super) fn malformed_head(stream: &TcpStream, first: &mut Vec<u8>) -> Option<Malformed> {
    if first.len() == FIRST_LOOK {
        let have = first.len();
        first.resize(MAX_HEAD, 0);
        let n = stream.try_read(&mut first[have..]).unwrap_or(0);
        first.truncate(have + n);
    }
    let head = &first[..];
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    let mode = |method: Option<&str>| match method {
        Some(m) if m.eq_ignore_ascii_case("CONNECT") => Mode::Connect,
        _ => Mode::Http,
    };
    match req.parse(head) {
        Ok(httparse::Status::Partial) => None,
        Err(e) => {
            let first = head.split(|b| *b == b' ').next().unwrap_or_default();
            Some(Malformed {
                mode: mode(std::str::from_utf8(first).ok()),
                why: format!("the request is not valid HTTP/1.1 ({e})"),
            })
        }
        Ok(httparse::Status::Complete(_)) => {
            let method = req.method;
            let path = req.path.unwrap_or_default();
            if mode(method) == Mode::Connect || path.parse::<http::Uri>().is_ok() {
                return None;
            }
            Some(Malformed {
                mode: mode(method),
                why: "the request target is not a valid URI (IPv6 literals need brackets: http://[::1]:8080/)".into(),
            })
        }
    }
}

/// Answer a malformed first request with a §6 400 and record it.
pub(super) async fn refuse_malformed(
    shared: &Shared,
    accepted: Accepted,
    mut stream: TcpStream,
    bad: Malformed,
) {
    use tokio::io::AsyncWriteExt;
    let mut audit = shared.audit(&accepted, bad.mode, &shared.policy.load());
    audit.decision(&Decision::deny(Reason::InvalidTarget, None));
    audit.detail(bad.why.clone());
    audit.close(Close::Error);
    // Take in what was sent, so that closing does not reset the answer away.
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.try_read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    let resp = deny::wire(&Wording {
        reason: Reason::InvalidTarget,
        what: "this request",
        sandbox: None,
        explanation: &bad.why,
        retry_after: None,
        ask: shared.ask(),
    });
    let wait = shared.settings.timeouts.header;
    let _ = tokio::time::timeout(wait, async {
        stream.write_all(&resp).await?;
        stream.shutdown().await
    })
    .await;
}
