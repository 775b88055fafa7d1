//! The one driver of a request's phases: every HTTP request the proxy reads one by one —
//! forwarded plain HTTP (h1 and h2), plain HTTP served request by request inside a CONNECT,
//! SOCKS5 or transparent connection, each request of a terminated tunnel — is taken through
//! [`request`], which owns their order:
//!
//! 1. what only the path checks before the rules ([`Path::before_head`]: the authority of a
//!    terminated tunnel, a placeholder outside its credential);
//! 2. the head phase ([`HostRules::judge`]) on a host judged per request;
//! 3. the body phase where a protocol rule reads the body ([`super::body`]);
//! 4. what the path cannot serve ([`Path::unserved`]: forwarded, what needs its answer read);
//! 5. the flow phase ([`super::flow`]): the sandbox's flow rules with the labels armed now;
//! 6. the call phase ([`Path::call`]: an inference call metered on a terminated host);
//! 7. the verdict stages that ask per request (the decider, [`super::ask::phase`]);
//! 8. the DLP phase ([`super::dlp::request`]);
//! 9. the quota reservation ([`Path::reserve`]) — last, so a request refused by anything
//!    before it spends nothing, on every path; then the labels of the request's destination
//!    are armed (kept before it is sent).
//!
//! Report mode is decided once ([`super::reported`]) with the path's words for how a reported
//! request goes on ([`Path::REPORTED`]). Every refusal is recorded here (verdict, reason,
//! detail, method, path, what it called, status); the path only answers it in its own shape
//! ([`Stop`]). What comes after — credentials, the authority written, send, the response
//! phases — is the path's, on the [`Ready`] request.

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use hyper::body::Incoming;

use super::ask::{Asker, Prefix};
use super::body::{self, Allowed};
use super::dlp::Rebody;
use super::flow::{Ledger, Phase};
use super::forwarded::Found;
use super::head::{Head, HeadVerdict, HostRules};
use super::Refusal;
use crate::audit::record::HttpFacts;
use crate::audit::AuditGuard;
use crate::config::Binding;
use crate::policy::flows::{Act, Dest};
use crate::policy::http_rules::git_request;
use crate::policy::protocols::{Protocol, RefusedCall};
use crate::policy::reason::Reason;
use crate::policy::Verdict;

/// What a request needs that only some paths can give it: its answer read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// A WebSocket its rule allows (its messages are read).
    Socket,
    /// An MCP call (its answer filtered, its refusals answered as JSON-RPC errors).
    Mcp,
    /// An inference call (metered against budgets, its usage read).
    Metered,
}

/// What a request path supplies to the driver: only what differs between paths.
pub trait Path: Sync {
    /// The request body as this path sends it.
    type Body: Prefix + Rebody + 'static;
    /// What the call phase leaves for the path's response phases.
    type Call: Send;
    /// How a request refused in report mode goes on, for its record.
    const REPORTED: &'static str;
    /// How the decider is told the request goes: `http` or `https`, host and port.
    fn to(&self) -> (&'static str, &str, u16);
    /// The body as received, streamed.
    fn streamed(body: Incoming) -> Self::Body;
    /// Why the request is refused before the head phase reads it, if it is.
    fn before_head(&self, _req: &Request<Incoming>) -> Option<Refusal> {
        None
    }
    /// Why this path cannot serve what the request `needs`, if it cannot.
    fn unserved(&self, needs: Needs) -> Option<Refusal>;
    /// The call phase on a request allowed so far with `verdict` (`Err`: refused).
    /// (On a fleet, an inference call may wait there for this replica's share of a budget.)
    fn call(
        &self,
        allowed: &mut Allowed,
        verdict: Verdict,
        req: Request<Self::Body>,
        audit: &mut AuditGuard,
    ) -> impl std::future::Future<Output = Result<(Request<Self::Body>, Self::Call), Refusal>> + Send;
    /// Reserve the request against the daily quotas (checked and counted at once; on a
    /// fleet, waiting for this replica's share rather than refusing).
    fn reserve(&self) -> impl std::future::Future<Output = Result<(), Refusal>> + Send;
}

/// What the record says of the request: its method and path (no query), and what it called
/// in a protocol a rule named (a tool, an operation, a git service).
#[derive(Debug, Clone)]
pub struct Asked {
    /// The request's method.
    pub method: http::Method,
    /// Its path, without the query.
    pub path: Arc<str>,
    /// What it called.
    pub call: Option<String>,
}

impl Asked {
    /// The method and path of `req`.
    pub fn of<B>(req: &Request<B>) -> Self {
        Asked {
            method: req.method().clone(),
            path: req.uri().path().into(),
            call: None,
        }
    }

    /// The record's facts (the method and path shared, not copied; what it called moved).
    pub fn facts(&mut self, status: u16, credential: Option<String>) -> HttpFacts {
        HttpFacts {
            method: self.method.clone(),
            path: self.path.clone(),
            status,
            credential: credential.map(Into::into),
            secret_reflected: None,
            // Moved, not copied: once recorded, nothing reads it here again.
            call: self.call.take(),
        }
    }
}

/// A request the phases let through, to be sent by its path.
pub struct Ready<B, C> {
    /// The request to send (its body whole when a rule read it, wrapped by the DLP scanner).
    pub req: Request<B>,
    /// `Allow`, or `Report` when report mode let a refusal go on (then no credential).
    pub verdict: Verdict,
    /// What the body phase allowed (the MCP rule its answer is filtered by).
    pub allowed: Allowed,
    /// The WebSocket rule an allowed upgrade is relayed under.
    pub socket: Option<Arc<Protocol>>,
    /// What the call phase left.
    pub call: C,
    /// What the DLP body scanner will have found (read after the request was sent).
    pub dlp: Option<Found>,
    /// What the record says of the request.
    pub asked: Asked,
}

/// A request the phases refused, recorded: the refusal, and the ids a JSON-RPC body carried
/// (answer with JSON-RPC errors; none: the path's own refusal).
pub struct Stop {
    /// Why.
    pub refusal: Refusal,
    /// The JSON-RPC ids and whether the body was a batch.
    pub rpc: Option<(Vec<serde_json::Value>, bool)>,
    /// What the record says of the request.
    pub asked: Asked,
}

/// Where the request goes and what reads it: `rules` are the host's head rules when the host
/// is judged per request (`None`: not judged; its record still names method and path).
pub struct Judging<'a> {
    /// The sandbox's binding now.
    pub binding: &'a Binding,
    /// Who the decider phase asks.
    pub asker: &'a dyn Asker,
    /// The host's head rules, when it is judged per request.
    pub rules: Option<&'a HostRules>,
    /// `tls_intercept.judge_body_bytes`.
    pub limit: u64,
    /// The verdict the request's connection was admitted with: `Report` (report mode let a
    /// refused destination go on) keeps every request of it reported — asked about by no
    /// decider, given no credential.
    pub admitted: Verdict,
    /// Where the sandbox's flow labels are kept (its rules are the binding's).
    pub flows: Option<&'a Ledger>,
    /// The process the request is attributed to (flow rules with `scope: exec`).
    pub process: Option<&'a crate::policy::process::Process>,
}

/// The phases of one request, in the order of the module's documentation. `Ok`: the request
/// to send; `Err`: refused, recorded.
pub async fn request<P: Path>(
    path: &P,
    at: Judging<'_>,
    req: Request<Incoming>,
    audit: &mut AuditGuard,
) -> Result<Ready<P::Body, P::Call>, Stop> {
    let mut asked = Asked::of(&req);
    match phases(path, &at, req, &mut asked, audit).await {
        Ok(mut ready) => {
            audit.http(asked.facts(0, None));
            ready.asked = asked;
            Ok(ready)
        }
        Err((refusal, rpc)) => {
            let status = match rpc {
                Some(_) => 200,
                None => refusal.reason.status(),
            };
            audit.http(asked.facts(status, refusal.credential.clone()));
            Err(Stop {
                refusal,
                rpc,
                asked,
            })
        }
    }
}

/// A refusal and the JSON-RPC ids to answer it with.
type Halt = (Refusal, Option<(Vec<serde_json::Value>, bool)>);

async fn phases<P: Path>(
    path: &P,
    at: &Judging<'_>,
    req: Request<Incoming>,
    asked: &mut Asked,
    audit: &mut AuditGuard,
) -> Result<Ready<P::Body, P::Call>, Halt> {
    let binding = at.binding;
    // What the request carries is read only for a sandbox with flow rules (no copy else).
    let flow = Phase::of(binding, at.flows, at.process);
    let writes = flow.as_ref().map(|_| writes(&req));
    let (req, verdict, mut allowed, socket) = read(path, at, req, asked, audit).await?;
    let (verdict, act) = match (at.admitted, &flow, writes) {
        (Verdict::Report, _, _) => (Verdict::Report, None),
        (_, Some(flow), Some(writes)) => {
            let to = (path.to(), &*asked);
            let (v, act) = judge_flow::<P>(flow, to, writes, verdict, binding, audit).await?;
            (v, Some(act))
        }
        _ => (verdict, None),
    };
    let (mut req, call) = path
        .call(&mut allowed, verdict, req, audit)
        .await
        .map_err(|r| denied(r, audit))?;
    let how = (verdict, P::REPORTED);
    let verdict = super::ask::phase(at.asker, binding, path.to(), &mut req, how, audit)
        .await
        .map_err(|r| (r, None))?;
    let (req, mut dlp) = super::dlp::request(binding, req, audit)
        .await
        .map_err(|r| (r, None))?;
    path.reserve().await.map_err(|r| denied(r, audit))?;
    let mut req = req;
    if let Some(flow) = flow {
        arm(&flow, path.to(), asked, audit).await?;
        // A write's body is watched as it streams: a label armed meanwhile cuts it.
        let enforced = binding.enforcement != crate::policy::Enforcement::Report;
        if act == Some(Act::Write) && enforced {
            let found = dlp.get_or_insert_with(Default::default).clone();
            let gate = super::flow::Gate::new(&flow, path.to().1, path.to().2);
            req = req.map(|b| P::Body::gated(super::flow::Gated::new(b, gate, found)));
        }
    }
    Ok(Ready {
        req,
        verdict,
        allowed,
        socket,
        call,
        dlp,
        // A stand-in sharing the method and path ([`request`] moves the record's own in).
        asked: Asked {
            method: asked.method.clone(),
            path: asked.path.clone(),
            call: None,
        },
    })
}

/// What of a request can carry data out besides its method: a body, a query.
struct Carries {
    body: bool,
    query: Option<String>,
}

/// What `req` carries (read before its body is).
fn writes(req: &Request<Incoming>) -> Carries {
    use hyper::body::Body;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|n| n.trim() != "0");
    let body = declared || !req.body().is_end_stream();
    Carries {
        body,
        query: req.uri().query().map(str::to_string),
    }
}

/// The flow phase: the request judged by the sandbox's flow rules with the labels armed
/// now; a refusal goes on only in report mode.
async fn judge_flow<P: Path>(
    flow: &Phase<'_>,
    ((_, host, port), asked): ((&str, &str, u16), &Asked),
    carries: Carries,
    verdict: Verdict,
    binding: &Binding,
    audit: &mut AuditGuard,
) -> Result<(Verdict, Act), Halt> {
    let method = asked.method.as_str();
    let query = carries.query.as_deref();
    let target = (&*asked.path, query);
    let act = Act::of_request(method, carries.body, target, flow.flows.bounds);
    let dest = Dest {
        host,
        port: Some(port),
        request: Some((method, &asked.path)),
    };
    let judged = flow.judge(&dest, act).await;
    audit.labels(judged.labels);
    match judged.refused {
        None => Ok((verdict, act)),
        Some(r) => {
            let r = Refusal::new(Reason::FlowRefused, r.detail);
            super::reported(binding, r, P::REPORTED, audit)
                .map(|()| (Verdict::Report, act))
                .map_err(|r| (r, None))
        }
    }
}

/// Arm the labels of the request's destination before it is sent; a label that cannot be
/// kept refuses the request (it is never sent unrecorded).
async fn arm(
    flow: &Phase<'_>,
    (_, host, port): (&str, &str, u16),
    asked: &Asked,
    audit: &mut AuditGuard,
) -> Result<(), Halt> {
    let dest = Dest {
        host,
        port: Some(port),
        request: Some((asked.method.as_str(), &asked.path)),
    };
    let by = || format!("{} {host}{}", asked.method, asked.path);
    match flow.arm(&dest, by, audit.conn_id()).await {
        Ok(armed) => {
            audit.armed(armed);
            Ok(())
        }
        Err(e) => {
            let why = format!("the flow label this request arms could not be kept: {e}");
            Err(denied(Refusal::new(Reason::FlowRefused, why), audit))
        }
    }
}

/// A refusal no report mode lets go on, recorded.
fn denied(r: Refusal, audit: &mut AuditGuard) -> Halt {
    audit.verdict(Verdict::Deny, r.reason);
    audit.detail(r.detail.clone());
    (r, None)
}

/// What the request is once its head and body were read: the request, its verdict, what it
/// may do and the WebSocket rule of an allowed upgrade.
type Read<B> = (Request<B>, Verdict, Allowed, Option<Arc<Protocol>>);

/// The head and body phases, and what the path cannot serve.
async fn read<P: Path>(
    path: &P,
    at: &Judging<'_>,
    req: Request<Incoming>,
    asked: &mut Asked,
    audit: &mut AuditGuard,
) -> Result<Read<P::Body>, Halt> {
    let (binding, host) = (at.binding, path.to().1);
    let checked = match (path.before_head(&req), at.rules) {
        (Some(r), _) => HeadVerdict::Refused(r),
        (None, None) => HeadVerdict::Allowed(None),
        (None, Some(rules)) => rules.judge(host, Head::of(&req)),
    };
    let reported = |r: Refusal, audit: &mut AuditGuard| {
        super::reported(binding, r, P::REPORTED, audit).map_err(|r| (r, None))
    };
    let streamed = |req: Request<Incoming>| req.map(P::streamed);
    match checked {
        HeadVerdict::Allowed(call) => {
            asked.call = call;
            Ok((streamed(req), Verdict::Allow, Allowed::default(), None))
        }
        HeadVerdict::Socket(rule) => {
            asked.call = Some("websocket".into());
            match path.unserved(Needs::Socket) {
                None => Ok((
                    streamed(req),
                    Verdict::Allow,
                    Allowed::default(),
                    Some(rule),
                )),
                Some(r) => reported(r, audit)
                    .map(|()| (streamed(req), Verdict::Report, Allowed::default(), None)),
            }
        }
        HeadVerdict::Refused(r) => {
            if let Some((service, _)) =
                git_request(req.method().as_str(), req.uri().path(), req.uri().query())
            {
                asked.call = Some(format!("git {}", service.name()));
            }
            reported(r, audit).map(|()| (streamed(req), Verdict::Report, Allowed::default(), None))
        }
        HeadVerdict::Judge(judges) => judged(path, at, &judges, req, asked, audit).await,
    }
}

/// The body phase of a request a protocol rule judges: the body read whole (the bytes judged
/// are the bytes sent), judged, then what the path cannot serve of what it allowed. A body
/// that could not be read whole is refused even in report mode (it cannot be sent as judged).
async fn judged<P: Path>(
    path: &P,
    at: &Judging<'_>,
    judges: &[Arc<Protocol>],
    req: Request<Incoming>,
    asked: &mut Asked,
    audit: &mut AuditGuard,
) -> Result<Read<P::Body>, Halt> {
    let (parts, b) = req.into_parts();
    let read = match judges.first() {
        Some(p) => body::read(b, at.limit, p).await,
        None => Ok(Bytes::new()),
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(r) => return Err(denied(*r.refusal, audit)),
    };
    let refused = match body::judge(judges, &parts, &bytes) {
        Ok(mut allowed) => {
            asked.call = allowed.call.take();
            match unserved(path, &allowed) {
                None => {
                    let req = Request::from_parts(parts, P::Body::whole(bytes));
                    return Ok((req, Verdict::Allow, allowed, None));
                }
                Some(r) => RefusedCall {
                    refusal: Box::new(r),
                    call: asked.call.clone(),
                    rpc: None,
                },
            }
        }
        Err(r) => r,
    };
    asked.call = refused.call.clone();
    let r = *refused.refusal;
    match super::reported(at.binding, r, P::REPORTED, audit) {
        Ok(()) => {
            let req = Request::from_parts(parts, P::Body::whole(bytes));
            Ok((req, Verdict::Report, Allowed::default(), None))
        }
        Err(r) => Err((r, refused.rpc)),
    }
}

/// Why the path cannot serve what an allowed body needs, if it cannot.
fn unserved<P: Path>(path: &P, allowed: &Allowed) -> Option<Refusal> {
    let metered = allowed
        .inference
        .as_ref()
        .is_some_and(|(_, c)| c.body_bytes > 0);
    if metered {
        if let Some(r) = path.unserved(Needs::Metered) {
            return Some(r);
        }
    }
    allowed.mcp.as_ref().and_then(|_| path.unserved(Needs::Mcp))
}
