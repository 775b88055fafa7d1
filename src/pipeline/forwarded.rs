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
use super::head::{Checked, Head, HostRules};
use super::{body, Refusal};
use crate::audit::record::HttpFacts;
use crate::audit::AuditGuard;
use crate::config::Binding;
use crate::policy::protocols::Refused;
use crate::policy::reason::Reason;
use crate::policy::Verdict;

/// A forwarded request's body, as the forwarder sends it.
pub type ForwardBody = BoxBody<Bytes, SendError>;

/// What the DLP scanner found in a forwarded body, read after it was sent.
pub type Found = std::sync::Arc<std::sync::Mutex<super::dlp::Found>>;

/// The pipeline's phases on a forwarded request of `binding` to `host`, in order: the head and
/// body phases where the host has `network.http` rules ([`judge`]; elsewhere the record still
/// names the method and path), then the DLP phase where the sandbox has `dlp:` ([`scan`]),
/// then the quota reservation (`reserve`): a request refused before anything of it is sent
/// spends nothing. `Ok` with the request to send and what the body scanner will have found;
/// `Err` with the refusal, recorded.
pub async fn phases(
    (binding, asker): (&Binding, &dyn Asker),
    (host, port, limit): (&str, u16, u64),
    req: Request<Incoming>,
    audit: &mut AuditGuard,
    reserve: impl FnOnce() -> Result<(), Refusal>,
) -> Result<(Request<ForwardBody>, Option<Found>), Refusal> {
    let rules = HostRules::of(binding, host, audit.attributed().as_deref());
    let mut req = match rules.is_empty() {
        true => {
            let (parts, b) = req.into_parts();
            audit.http(facts(&parts, None));
            Request::from_parts(parts, b.map_err(SendError::from).boxed())
        }
        false => judge(binding, &rules, host, limit, req, audit).await?,
    };
    // The decider, after the rules and with the body when it asks (the terminated path's
    // question: method, target, headers).
    let verdict = (audit.verdict_so_far(), REPORTED);
    super::ask::phase(
        asker,
        binding,
        ("http", host, port),
        &mut req,
        verdict,
        audit,
    )
    .await?;
    let scanned = super::dlp::request(binding, req, audit).await?;
    if let Err(r) = reserve() {
        audit.decision(&crate::policy::Decision::deny(r.reason, None));
        audit.detail(r.detail.clone());
        return Err(r);
    }
    Ok(scanned)
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
}

/// Judge a forwarded request of `binding` to `host` (whose rules are `rules`, not empty):
/// `Ok` with the request to send (its body whole when a protocol rule read it), recorded with
/// what it called; `Err` with the refusal, recorded (verdict, reason, detail, method and path).
pub async fn judge(
    binding: &Binding,
    rules: &HostRules,
    host: &str,
    limit: u64,
    req: Request<Incoming>,
    audit: &mut AuditGuard,
) -> Result<Request<ForwardBody>, Refusal> {
    let checked = rules.judge(host, Head::of(&req));
    let (parts, b) = req.into_parts();
    let refused = match checked {
        Checked::Allowed(call) => {
            audit.http(facts(&parts, call));
            return Ok(Request::from_parts(
                parts,
                b.map_err(SendError::from).boxed(),
            ));
        }
        Checked::Refused(r) => r,
        // A socket's messages are read on terminated hosts only; a forwarded request's
        // `Upgrade` never reaches the origin.
        Checked::Socket(_) => Refusal::new(
            Reason::WebSocketNotAllowed,
            format!("a WebSocket to {host} is relayed only inside a tunnel (wss://, or ws:// through CONNECT), where its messages are read"),
        ),
        Checked::Judge(judges) => {
            let read = match judges.first() {
                Some(p) => body::read(b, limit, p).await,
                None => Ok(Bytes::new()),
            };
            let (bytes, refused) = match read {
                Ok(bytes) => match body::judge(&judges, &parts, &bytes) {
                    Ok(allowed) => match read_in_tunnel_only(&allowed) {
                        Some((reason, what, why)) => (bytes, Refused {
                            reason,
                            detail: format!("{what} to {host} is served only inside a tunnel (https://, or http:// through CONNECT), {why}"),
                            call: allowed.call,
                            rpc: None,
                        }),
                        None => {
                            audit.http(facts(&parts, allowed.call));
                            return Ok(whole(parts, bytes));
                        }
                    },
                    Err(r) => (bytes, r),
                },
                Err(r) => {
                    // A body that could not be read whole cannot be sent as judged, even in
                    // report mode.
                    audit.http(facts(&parts, None));
                    audit.verdict(Verdict::Deny, r.reason);
                    audit.detail(r.detail.clone());
                    return Err(Refusal::new(r.reason, r.detail));
                }
            };
            audit.http(facts(&parts, refused.call.clone()));
            let r = Refusal::new(refused.reason, refused.detail);
            return reported(binding, r, audit).map(|()| whole(parts, bytes));
        }
    };
    audit.http(facts(&parts, None));
    reported(binding, refused, audit)
        .map(|()| Request::from_parts(parts, b.map_err(SendError::from).boxed()))
}

/// Why an allowed call cannot be forwarded in clear, if it cannot: what reads its answer runs
/// only inside a tunnel — an inference call is metered against budgets and its usage read, an
/// MCP call's answer filtered (lists cut to the rule's, the server's requests dropped) and its
/// refusals answered as JSON-RPC errors. Forwarded, its answer would reach the sandbox unread.
fn read_in_tunnel_only(
    allowed: &crate::pipeline::body::Allowed,
) -> Option<(Reason, &'static str, &'static str)> {
    if allowed
        .inference
        .as_ref()
        .is_some_and(|(_, c)| c.body_bytes > 0)
    {
        return Some((
            Reason::InferenceNotAllowed,
            "an inference call",
            "where it is metered and its usage read",
        ));
    }
    allowed.mcp.as_ref().map(|_| {
        (
            Reason::McpNotAllowed,
            "an MCP call",
            "where its answer is filtered",
        )
    })
}

/// A refusal, recorded ([`super::reported`]): `Ok` when report mode lets the request go on.
fn reported(binding: &Binding, r: Refusal, audit: &mut AuditGuard) -> Result<(), Refusal> {
    super::reported(binding, r, REPORTED, audit)
}

/// How a request refused in report mode went on, for its record.
const REPORTED: &str = "report mode: forwarded";

/// What the record says of the request: its method and path (no query), and what it called.
fn facts(parts: &http::request::Parts, call: Option<String>) -> HttpFacts {
    HttpFacts {
        method: parts.method.clone(),
        path: parts.uri.path().into(),
        status: 0,
        credential: None,
        secret_reflected: None,
        call: call.map(Into::into),
    }
}

/// The request with the body that was judged, sent whole.
fn whole(parts: http::request::Parts, bytes: Bytes) -> Request<ForwardBody> {
    let body = Full::new(bytes).map_err(|never| match never {}).boxed();
    Request::from_parts(parts, body)
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
