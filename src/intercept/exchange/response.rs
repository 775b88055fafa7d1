//! A terminated request's response on its way to the client: an MCP rule's filter first
//! ([`crate::intercept::mcp_filter`]), then the secret scrubber, the byte count and the
//! record, written when the body ends. A body neither can read (an encoding other than
//! `identity`) is refused, never passed unread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::inference::{Metered, Tapped};
use super::{BoxError, ResBody, Sent, Terminated};
use crate::audit::AuditGuard;
use crate::intercept::mcp_filter::{self, Framing, McpFiltered, Notes};
use crate::intercept::scrub::{Findings, Scrubbed, Scrubber};
use crate::intercept::InterceptError;
use crate::policy::protocols::mcp::{Lists, McpRule};
use crate::policy::reason::Reason;
use crate::policy::Verdict;
use crate::relay::counted::{Counted, Ending};
use crate::relay::liveness::Liveness;

/// Why a response of a host with a secret bound cannot be scanned: a `Content-Encoding`
/// other than `identity` on a body that is not known to be empty.
fn unscannable<B: hyper::body::Body>(resp: &Response<B>) -> Option<String> {
    let enc = resp.headers().get(http::header::CONTENT_ENCODING)?;
    let identity = enc.to_str().is_ok_and(|e| {
        e.split(',')
            .all(|t| t.trim().eq_ignore_ascii_case("identity"))
    });
    if identity || resp.body().is_end_stream() {
        return None;
    }
    Some(format!(
        "the upstream answered with Content-Encoding: {} although identity was asked; an encoded body cannot be scanned for the secrets brokered to it, so it is not passed",
        String::from_utf8_lossy(enc.as_bytes())
    ))
}

/// Where a response body goes after any MCP filter: the secret scrubber, the count, the
/// record (when it ends).
struct Out {
    live: Arc<Liveness>,
    limit: u64,
    /// The scrubber, and what it found (shared with the record's writer).
    scrubber: Option<(Arc<Scrubber>, Arc<Mutex<Findings>>)>,
}

impl Out {
    fn finish<B>(self, b: B, on_end: impl FnOnce(Ending) + Send + Sync + 'static) -> ResBody
    where
        B: hyper::body::Body<Data = Bytes> + Unpin + Send + Sync + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        match self.scrubber {
            Some((s, findings)) => {
                Counted::new(Scrubbed::new(b, s, self.limit, findings), self.live, false)
                    .digested()
                    .on_end(on_end)
                    .map_err(Into::into)
                    .boxed()
            }
            None => Counted::new(b, self.live, false)
                .digested()
                .on_end(on_end)
                .map_err(Into::into)
                .boxed(),
        }
    }

    /// The body as it was read: one read whole goes on with its exact length.
    fn body(
        self,
        read: Read,
        headers: &mut http::HeaderMap,
        on_end: impl FnOnce(Ending) + Send + Sync + 'static,
    ) -> ResBody {
        match read {
            Read::Whole(bytes) => {
                if !says_length(headers, bytes.len()) {
                    headers.insert(http::header::CONTENT_LENGTH, bytes.len().into());
                }
                self.finish(Full::new(bytes), on_end)
            }
            Read::Stream(f) => self.finish(f, on_end),
            Read::Plain(b) => self.finish(b, on_end),
            Read::Tapped(b) => self.finish(b, on_end),
        }
    }
}

/// Whether `headers` carry one `Content-Length`, of exactly `len` (digits only): kept as
/// it came rather than written again (a header value built from a number is an allocation).
fn says_length(headers: &http::HeaderMap, len: usize) -> bool {
    let mut all = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let (Some(one), None) = (all.next(), all.next()) else {
        return false;
    };
    let digits = one.as_bytes();
    let value = digits.iter().try_fold(0usize, |n, d| {
        d.is_ascii_digit().then_some(())?;
        n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
    });
    !digits.is_empty() && value == Some(len)
}

/// What reads a response before the client does: the secret scrubber, the MCP rule that
/// filters it with the lists the request asked for (and whether only to report), and the
/// sandbox and credential whose token answer it is (sealed).
pub(super) type Readers = (Option<Arc<Scrubber>>, Mcp, Option<(String, String)>);

/// The MCP rule that filters a response, the lists asked for, and whether only to report.
pub(super) type Mcp = Option<(Arc<McpRule>, Lists, bool)>;

/// What ends a response's record: the secrets found, what the MCP filter did, an inference
/// call's usage (its reservation settled), the bytes.
fn ender(
    mut audit: AuditGuard,
    findings: Option<Arc<Mutex<Findings>>>,
    notes: Option<Arc<Mutex<Notes>>>,
    up: Arc<AtomicU64>,
    metered: Option<(Metered, u16)>,
) -> impl FnOnce(Ending) + Send + Sync + 'static {
    move |ending| {
        if let Some((m, status)) = metered {
            m.finish(status, ending.complete, &mut audit);
        }
        if let Some(Ok(f)) = findings.as_ref().map(|f| f.lock()) {
            for n in &f.names {
                audit.secret_reflected(n);
            }
            if let Some(past) = f.unscanned_past {
                audit.detail(format!(
                    "the response body past {past} bytes was not scanned for secrets (tls_intercept.scrub_body_bytes)"
                ));
            }
        }
        if let Some(Ok(n)) = notes.as_ref().map(|n| n.lock()) {
            let (hid, were) = match n.report {
                true => ("would have hidden", "would have been dropped (report mode)"),
                false => ("hid", "were dropped"),
            };
            if n.hidden > 0 {
                audit.detail(format!(
                    "the MCP response {hid} {} list entries the rule does not allow",
                    n.hidden
                ));
            }
            if !n.dropped.is_empty() {
                audit.detail(format!(
                    "the MCP server's requests {were}: {}",
                    n.dropped.join(", ")
                ));
            }
        }
        audit.bytes(up.load(Ordering::Relaxed), ending.bytes);
        audit.body_sha256(ending.sha256);
        drop(audit);
    }
}

/// A response body on its way: untouched, filtered as it streams, or read whole and
/// filtered.
enum Read {
    Plain(Incoming),
    Tapped(Tapped<Incoming>),
    Stream(McpFiltered<Incoming>),
    Whole(Bytes),
}

/// A response an MCP rule filters: as it streams (an event stream), or read whole and
/// filtered, so that it goes on with its exact length (JSON).
async fn filtered(
    b: Incoming,
    (rule, lists, framing, report): (Arc<McpRule>, Lists, Framing, bool),
    notes: Arc<Mutex<Notes>>,
    limit: usize,
) -> Result<Read, InterceptError> {
    match framing {
        Framing::EventStream => Ok(Read::Stream(
            McpFiltered::new(b, rule, lists, limit, notes).dry(report),
        )),
        Framing::Json => McpFiltered::new((), rule, lists, limit, notes)
            .dry(report)
            .read_whole(b)
            .await
            .map(Read::Whole),
    }
}

impl Terminated<'_> {
    /// A token endpoint's answer to the sandbox, read whole (bounded) with its tokens sealed
    /// for `(sandbox, credential)` ([`crate::intercept::sealed`]); `Err`: not passed at all.
    async fn sealed(
        &self,
        b: Incoming,
        (sandbox, credential): (String, String),
        limit: usize,
    ) -> Result<Read, InterceptError> {
        let c = crate::pipeline::whole::read(b, limit).await.map_err(|e| {
            InterceptError::body_caused("the token endpoint's answer could not be read", e)
        })?;
        let minter = &self.ex.mint.minter;
        Ok(Read::Whole(minter.seal_answer(
            &sandbox,
            &credential,
            &c,
        )?))
    }

    /// The upstream's response: an MCP rule's filter first ([`mcp_filter`]: a JSON body read
    /// whole and answered with its exact length, an event stream as it streams), then its
    /// headers scrubbed at once and its body as it streams (`secret_reflected`); refused when
    /// it cannot be read. The record is written when the body ends.
    pub(super) async fn response(
        &self,
        mut resp: Response<Incoming>,
        mut audit: AuditGuard,
        readers: Readers,
        mut sent: Sent,
    ) -> Response<ResBody> {
        let (scrubber, mcp, seal) = readers;
        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            return self.switched(audit, &sent);
        }
        audit.answered(resp.status().as_u16(), sent.injected.as_deref());
        if let Some(s) = &scrubber {
            for name in s.headers(resp.headers_mut()) {
                audit.secret_reflected(name);
            }
        }
        // Every answer of the token endpoint is sealed, whatever its status: an error answer
        // may carry tokens too.
        let why = match scrubber.is_some() || mcp.is_some() || seal.is_some() {
            true => unscannable(&resp),
            false => None,
        };
        if let Some(why) = why {
            // Never passed unread: a compressed secret or MCP message would not be found.
            return self.unread(audit, &sent, &why);
        }
        // Only a filtered response has notes (no allocation for the others).
        let notes = mcp.as_ref().map(|_| Arc::new(Mutex::new(Notes::default())));
        let empty = hyper::body::Body::is_end_stream(resp.body());
        let filter = mcp.filter(|_| !empty).and_then(|(rule, lists, report)| {
            let framing = mcp_filter::framing(resp.headers())?;
            if framing == Framing::EventStream {
                // Filtered as it streams, its length is not known; a JSON answer is read
                // whole and goes on with its exact length (`Out::body`).
                resp.headers_mut().remove(http::header::CONTENT_LENGTH);
            }
            Some((rule, lists, framing, report))
        });
        let judge_limit = usize::try_from(self.ex.limits.judge).unwrap_or(usize::MAX);
        let (mut parts, b) = resp.into_parts();
        let sealed = seal.as_ref().map(|(_, c)| c.clone());
        let read = match (filter, seal, &sent.metered) {
            (None, None, Some(m)) => Ok(Read::Tapped(m.tap(&parts.headers, b))),
            (None, None, None) => Ok(Read::Plain(b)),
            (None, Some(s), _) => self.sealed(b, s, judge_limit).await,
            (Some(f), _, _) => filtered(b, f, notes.clone().unwrap_or_default(), judge_limit).await,
        };
        let read = match read {
            Ok(r) => r,
            Err(why) => return self.unread(audit, &sent, &why.to_string()),
        };
        if let Some(c) = sealed {
            audit.detail(format!(
                "the tokens in the answer were sealed for credential {c}"
            ));
        }
        // Only a scrubbed response has findings (no allocation for the others).
        let scrubber = scrubber.map(|s| (s, Arc::new(Mutex::new(Findings::default()))));
        let findings = scrubber.as_ref().map(|(_, f)| f.clone());
        let metered = sent.metered.take().map(|m| (m, parts.status.as_u16()));
        let on_end = ender(audit, findings, notes.clone(), sent.up_bytes, metered);
        let out = Out {
            live: self.ex.live.clone(),
            limit: self.ex.limits.scrub,
            scrubber,
        };
        let body = out.body(read, &mut parts.headers, on_end);
        Response::from_parts(parts, body)
    }

    /// The origin's `101` to a request that did not ask to switch: refused, never passed on
    /// (only a socket a rule allowed switches, [`super::socket`]).
    fn switched(&self, mut audit: AuditGuard, sent: &Sent) -> Response<ResBody> {
        let why = "the origin switched protocols on a request that did not ask to";
        audit.verdict(Verdict::Deny, Reason::WebSocketNotAllowed);
        audit.answered(502, sent.injected.as_deref());
        audit.detail(why);
        drop(audit);
        self.ex
            .refused(&sent.asked.method, Reason::WebSocketNotAllowed, why)
    }

    /// A response that cannot be read (an encoding, an MCP message that does not parse):
    /// recorded and refused, never passed.
    fn unread(&self, mut audit: AuditGuard, sent: &Sent, why: &str) -> Response<ResBody> {
        audit.verdict(Verdict::Deny, Reason::UnscannableResponse);
        audit.answered(502, sent.injected.as_deref());
        audit.detail(why.to_string());
        audit.bytes(sent.up_bytes.load(Ordering::Relaxed), 0);
        drop(audit);
        self.ex
            .refused(&sent.asked.method, Reason::UnscannableResponse, why)
    }
}

#[cfg(test)]
mod tests {
    use super::says_length;

    #[test]
    fn a_length_is_kept_only_when_it_is_one_header_of_exactly_the_body() {
        let headers = |values: &[&'static str]| {
            let mut h = http::HeaderMap::new();
            for v in values {
                h.append(
                    http::header::CONTENT_LENGTH,
                    http::HeaderValue::from_static(v),
                );
            }
            h
        };
        assert!(says_length(&headers(&["17"]), 17));
        assert!(says_length(&headers(&["0"]), 0));
        for (values, len) in [
            (&["17"][..], 16),
            (&["17", "17"], 17),
            (&["+17"], 17),
            (&[" 17"], 17),
            (&[""], 0),
            (&[], 0),
            (&["99999999999999999999999"], 17),
        ] {
            assert!(!says_length(&headers(values), len), "{values:?} {len}");
        }
    }
}
