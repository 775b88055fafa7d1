//! A terminated request's response on its way to the client: an MCP rule's filter first
//! ([`crate::intercept::mcp_filter`]), then the secret scrubber, the byte count and the
//! record, written when the body ends. A body neither can read (an encoding other than
//! `identity`) is refused, never passed unread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::{BoxError, Exchange, ResBody, Sent};
use crate::audit::AuditGuard;
use crate::intercept::mcp_filter::{self, McpFiltered, Notes};
use crate::intercept::scrub::{Findings, Scrubbed, Scrubber};
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
    scrubber: Option<Arc<Scrubber>>,
    findings: Arc<Mutex<Findings>>,
    down_bytes: Arc<AtomicU64>,
}

impl Out {
    fn finish<B>(self, b: B, on_end: impl FnOnce(Ending) + Send + Sync + 'static) -> ResBody
    where
        B: hyper::body::Body<Data = Bytes> + Unpin + Send + Sync + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        match self.scrubber {
            Some(s) => Counted::new(
                Scrubbed::new(b, s, self.limit, self.findings),
                self.live,
                false,
            )
            .count_into(self.down_bytes)
            .on_end(on_end)
            .map_err(Into::into)
            .boxed(),
            None => Counted::new(b, self.live, false)
                .count_into(self.down_bytes)
                .on_end(on_end)
                .map_err(Into::into)
                .boxed(),
        }
    }
}

/// What reads a response before the client does: the secret scrubber, and the MCP rule
/// that filters it with the lists the request asked for.
pub(super) type Readers = (Option<Arc<Scrubber>>, Option<(Arc<McpRule>, Lists)>);

impl Exchange {
    /// The upstream's response: an MCP rule's filter first ([`mcp_filter`]), then its
    /// headers scrubbed at once and its body as it streams (`secret_reflected`); refused when
    /// it cannot be read. The record is written when the body ends.
    pub(super) fn response(
        &self,
        mut resp: Response<Incoming>,
        mut audit: AuditGuard,
        readers: Readers,
        sent: Sent,
    ) -> Response<ResBody> {
        let (scrubber, mcp) = readers;
        let Sent {
            asked,
            injected,
            up_bytes,
        } = sent;
        audit.http(asked.facts(resp.status().as_u16(), injected.clone()));
        let findings = Arc::new(Mutex::new(Findings::default()));
        if let Some(s) = &scrubber {
            for name in s.headers(resp.headers_mut()) {
                audit.secret_reflected(name);
            }
        }
        let why = match scrubber.is_some() || mcp.is_some() {
            true => unscannable(&resp),
            false => None,
        };
        if let Some(why) = why {
            // Never passed unread: a compressed secret or MCP message would not be found.
            audit.verdict(Verdict::Deny, Reason::UnscannableResponse);
            audit.http(asked.facts(502, injected));
            audit.detail(why.clone());
            audit.bytes(up_bytes.load(Ordering::Relaxed), 0);
            drop(audit);
            return self.refused(&asked.method, Reason::UnscannableResponse, &why);
        }
        let notes = Arc::new(Mutex::new(Notes::default()));
        let empty = hyper::body::Body::is_end_stream(resp.body());
        let filter = mcp.filter(|_| !empty).and_then(|(rule, lists)| {
            let framing = mcp_filter::framing(resp.headers())?;
            resp.headers_mut().remove(http::header::CONTENT_LENGTH);
            Some((rule, lists, framing))
        });
        let down_bytes = Arc::new(AtomicU64::new(0));
        let (up, down) = (up_bytes, down_bytes.clone());
        let (seen, noted) = (findings.clone(), notes.clone());
        let on_end = move |_| {
            if let Ok(f) = seen.lock() {
                for n in &f.names {
                    audit.secret_reflected(n);
                }
                if let Some(past) = f.unscanned_past {
                    audit.detail(format!(
                        "the response body past {past} bytes was not scanned for secrets (tls_intercept.scrub_body_bytes)"
                    ));
                }
            }
            if let Ok(n) = noted.lock() {
                if n.hidden > 0 {
                    audit.detail(format!(
                        "the MCP response hid {} list entries the rule does not allow",
                        n.hidden
                    ));
                }
                if !n.dropped.is_empty() {
                    audit.detail(format!(
                        "the MCP server's requests were dropped: {}",
                        n.dropped.join(", ")
                    ));
                }
            }
            audit.bytes(up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
            drop(audit);
        };
        let out = Out {
            live: self.live.clone(),
            limit: self.limits.scrub,
            scrubber,
            findings,
            down_bytes,
        };
        let judge_limit = usize::try_from(self.limits.judge).unwrap_or(usize::MAX);
        resp.map(|b| match filter {
            Some((rule, lists, framing)) => out.finish(
                McpFiltered::new(b, rule, lists, framing, judge_limit, notes),
                on_end,
            ),
            None => out.finish(b, on_end),
        })
    }
}
