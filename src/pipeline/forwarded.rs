//! The pipeline on a forwarded plain-HTTP request (`GET http://host/…`) to a host judged per
//! request: the head phase, then the body phase where a protocol rule reads the body, before
//! anything is sent. What needs its answer read — an MCP call (its lists filtered, the
//! server's requests dropped), an inference call (metered), a WebSocket (its messages) — is
//! refused here with its reason: it is served inside a tunnel, where the answer is read.
//! What a plain request cannot have — a credential or the identity token — is refused before
//! it is dialled ([`crate::intercept::InClear`]) or here (the sandbox's own identity header).
//! In report mode a refusal is recorded `report` and the request is sent as it came.

use bytes::Bytes;
use http::Request;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;

use super::ask::{Asker, Prefix, ShowError};
use super::driver::{self, Judging, Needs, Path};
use super::head::HostRules;
use super::Refusal;
use crate::audit::AuditGuard;
use crate::config::Binding;
use crate::policy::process::Process;
use crate::policy::reason::Reason;
use crate::policy::Verdict;

/// A forwarded request's body, as the forwarder sends it.
pub type ForwardBody = BoxBody<Bytes, SendError>;

/// What the DLP scanner found in a forwarded body, read after it was sent.
pub type Found = std::sync::Arc<std::sync::Mutex<super::dlp::Found>>;

/// The pipeline's phases on a forwarded request of `binding` to `host`, driven by
/// [`driver::request`] (the head and body phases where the host has `network.http` rules —
/// elsewhere the record still names the method and path —, the decider, DLP, then the quota
/// reservation `reserve`), for a connection admitted with `admitted` from `process` (the
/// clearance's, which scoped rules read). `Ok` with the request to send and what the body scanner will have
/// found; `Err` with the refusal, recorded.
pub async fn phases<R>(
    (binding, asker, flows): (&Binding, &dyn Asker, &super::flow::Ledger),
    (host, port, limit): (&str, u16, u64),
    (admitted, process): (Verdict, Option<&Process>),
    req: Request<Incoming>,
    audit: &mut AuditGuard,
    reserve: impl Fn() -> R + Sync,
) -> Result<(Request<ForwardBody>, Option<Found>), Refusal>
where
    R: std::future::Future<Output = Result<(), Refusal>> + Send,
{
    let rules = HostRules::of(binding, host, process);
    let at = Judging {
        binding,
        asker,
        rules: (!rules.is_empty()).then_some(&rules),
        limit,
        admitted,
        flows: Some(flows),
        process,
    };
    let path = Forwarded {
        host,
        port,
        reserve,
    };
    match driver::request(&path, at, req, audit).await {
        Ok(ready) => Ok((ready.req, ready.dlp)),
        Err(stop) => Err(stop.refusal),
    }
}

/// The forwarded path as the driver sees it: plain HTTP to `host`:`port`, nothing metered,
/// reserved by `reserve`.
struct Forwarded<'a, F> {
    host: &'a str,
    port: u16,
    reserve: F,
}

impl<F, R> Path for Forwarded<'_, F>
where
    F: Fn() -> R + Sync,
    R: std::future::Future<Output = Result<(), Refusal>> + Send,
{
    type Body = ForwardBody;
    type Call = ();
    const REPORTED: &'static str = "report mode: forwarded";

    fn to(&self) -> (&'static str, &str, u16) {
        ("http", self.host, self.port)
    }

    fn streamed(body: Incoming) -> ForwardBody {
        body.map_err(SendError::from).boxed()
    }

    /// What reads a request's answer runs only inside a tunnel: a socket's messages, an
    /// inference call's usage (metered against budgets), an MCP call's answer (lists cut to the
    /// rule's, the server's requests dropped, refusals as JSON-RPC errors). Forwarded, its
    /// answer would reach the sandbox unread.
    fn unserved(&self, needs: Needs) -> Option<Refusal> {
        let host = self.host;
        let (reason, detail) = match needs {
            Needs::Socket => (Reason::WebSocketNotAllowed, format!("a WebSocket to {host} is relayed only inside a tunnel (wss://, or ws:// through CONNECT), where its messages are read")),
            Needs::Metered => (Reason::InferenceNotAllowed, format!("an inference call to {host} is served only inside a tunnel (https://, or http:// through CONNECT), where it is metered and its usage read")),
            Needs::Mcp => (Reason::McpNotAllowed, format!("an MCP call to {host} is served only inside a tunnel (https://, or http:// through CONNECT), where its answer is filtered")),
        };
        Some(Refusal::new(reason, detail))
    }

    async fn call(
        &self,
        _: &mut super::body::Allowed,
        _: Verdict,
        req: Request<ForwardBody>,
        _: &mut AuditGuard,
    ) -> Result<(Request<ForwardBody>, ()), Refusal> {
        Ok((req, ()))
    }

    fn reserve(&self) -> impl std::future::Future<Output = Result<(), Refusal>> + Send {
        (self.reserve)()
    }
}

impl Prefix for ForwardBody {
    async fn prefix(mut self, max: usize) -> Result<(Self, Bytes, bool), ShowError> {
        let mut got = bytes::BytesMut::new();
        loop {
            match self.frame().await {
                None => {
                    let all = got.freeze();
                    return Ok((
                        Full::new(all.clone()).map_err(|n| match n {}).boxed(),
                        all,
                        false,
                    ));
                }
                Some(Err(e)) => return Err(ShowError::Read(Box::new(e))),
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => got.extend_from_slice(&d),
                    Err(_) => return Err(ShowError::Trailers),
                },
            }
            if got.len() > max {
                // The bytes read, then the rest as it comes.
                let all = got.freeze();
                let shown = all.slice(..max);
                let first = futures_util::stream::once(std::future::ready(Ok(Frame::data(all))));
                let rest = http_body_util::BodyStream::new(self);
                let body = StreamBody::new(futures_util::StreamExt::chain(first, rest));
                return Ok((body.boxed(), shown, true));
            }
        }
    }

    fn stand_in() -> Self {
        http_body_util::Empty::new().map_err(|n| match n {}).boxed()
    }
}

impl super::dlp::Rebody for ForwardBody {
    fn scanned(s: super::dlp::Scanned<Self>) -> Self {
        s.boxed()
    }

    fn whole(b: Bytes) -> Self {
        Full::new(b).map_err(|never| match never {}).boxed()
    }

    fn gated(g: super::flow::Gated<Self>) -> Self {
        g.boxed()
    }
}

/// Why a request body sent upstream ended early (the client's stream failed, or the DLP
/// phase cut it): one concrete error type, so the forwarded request's body is any `Error`
/// hyper's client takes without a boxed-to-boxed conversion.
#[derive(Debug)]
pub struct SendError(pub Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl From<hyper::Error> for SendError {
    fn from(e: hyper::Error) -> Self {
        SendError(Box::new(e))
    }
}

impl From<super::dlp::Cut> for SendError {
    fn from(e: super::dlp::Cut) -> Self {
        SendError(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of several frames, shown in part: the bytes shown are its first ones, and the
    /// body sent afterwards is the whole of it, in order.
    #[tokio::test]
    async fn a_shown_prefix_is_sent_again_before_the_rest() {
        let frames = ["hello ", "decider, ", "and the rest"]
            .map(|s| Ok::<_, SendError>(Frame::data(Bytes::from_static(s.as_bytes()))));
        let body: ForwardBody = StreamBody::new(futures_util::stream::iter(frames)).boxed();
        let (body, shown, more) = body.prefix(8).await.unwrap();
        assert_eq!((&shown[..], more), (&b"hello de"[..], true));
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..], b"hello decider, and the rest");
        let short: ForwardBody = Full::new(Bytes::from_static(b"tiny"))
            .map_err(|n| match n {})
            .boxed();
        let (body, shown, more) = short.prefix(8).await.unwrap();
        assert_eq!((&shown[..], more), (&b"tiny"[..], false));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"tiny");
    }
}
