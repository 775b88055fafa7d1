//! One request on a terminated host, read against the sandbox's binding *now* (a reload that
//! narrows rules or rotates a secret applies from the next request):
//!
//! 1. refused unless it is one the rules can judge: its method (any case; TRACE, TRACK and
//!    unusual methods only when a rule names them), exactly the decided authority
//!    ([`super::authority`]), a canonical path ([`crate::policy::http_rules::canonical_path`]);
//!    no override header or `_method` parameter that would make the upstream read another
//!    method, path or host ([`crate::policy::http_rules::override_refusal`]);
//!    a placeholder bound elsewhere, or outside the headers its credential names, is
//!    `credential_misuse`; then the `network.http` rules — a rule naming a protocol reads
//!    the body whole (`tls_intercept.judge_body_bytes`) and judges it
//!    ([`crate::policy::protocols`]); the bytes judged are the bytes sent;
//! 2. the decider is asked ([`decider`]), the DLP phase reads the target and headers (and
//!    wraps the body), then the request is reserved against the daily quotas — the same
//!    order as on the forwarded path: a request refused before anything of it is sent
//!    spends nothing;
//! 3. the credentials bound here are put on it (never when the check refused it, even in report
//!    mode: a reported request goes upstream without any credential);
//! 4. it goes upstream with one authority written by the proxy and `Accept-Encoding: identity`
//!    when a secret could come back ([`super::scrub`] reads what it can scan);
//! 5. an MCP rule filters the response ([`super::mcp_filter`]); its headers and body are
//!    scrubbed of the secrets bound here (`secret_reflected`); one `mode: "https"` record
//!    (with `call`: the tool, operation or service) when the response ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;

use super::authority;
use super::credential::{carries_outside, MintCx};
use crate::audit::record::HttpFacts;
use crate::audit::{AuditGuard, Recorder};
use crate::config::Binding;
use crate::pipeline::body::{self as judge, Allowed};
use crate::pipeline::head::{Checked, Head};
use crate::pipeline::Refusal;
use crate::policy::http_rules::git_request;
use crate::policy::protocols::{Protocol, Refused};
use crate::policy::reason::Reason;
use crate::policy::{Enforcement, Verdict};
use crate::relay::counted::Counted;
use crate::relay::deny;
use crate::relay::liveness::Liveness;

mod decider;
mod destination;
mod inference;
mod inject;
mod prepared;
mod response;
mod socket;
mod up_body;
mod upstream;

pub use destination::Destination;
use prepared::Prepared;
pub use up_body::UpBody;
pub use upstream::Upstream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ResBody = BoxBody<Bytes, BoxError>;

/// How much of a body the exchange reads: responses scanned for secrets (`scrub`), request
/// bodies judged by protocol rules and MCP messages filtered (`judge`).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub scrub: u64,
    pub judge: u64,
}

/// The sandbox's binding as it is now, with the version of the policy set it is in (`None`:
/// the sandbox is gone).
pub type CurrentBinding = Arc<dyn Fn() -> Option<(Arc<Binding>, Arc<str>)> + Send + Sync>;

/// One terminated tunnel's request handler.
pub struct Exchange {
    current: CurrentBinding,
    dest: Destination,
    /// The one authority requests go upstream with.
    written: authority::Written,
    upstream: Upstream,
    recorder: Recorder,
    live: Arc<Liveness>,
    /// What minting kinds need.
    mint: MintCx,
    limits: BodyLimits,
    /// The scrubber of the binding last seen (rebuilt when the binding changes).
    prepared: Mutex<Option<Arc<Prepared>>>,
    /// The socket the last upgrade opened, relayed once the connection hands over.
    parked: Mutex<Option<socket::Parked>>,
    /// Told when the tunnel is stopped, so that open sockets close with a reason.
    ending: Arc<tokio::sync::watch::Sender<Option<crate::audit::outcome::Close>>>,
}

/// What reads the response of `req`: the MCP rule that filters it (report mode changes
/// nothing — lists and server requests pass as the server sent them — and the record says
/// what enforcing would have hidden or dropped), and the sealing of a minting credential's
/// token endpoint answering the sandbox's own call, whatever the verdict. Where anything reads
/// the response, it is asked for uncompressed.
fn readers(
    p: &Prepared,
    allowed: Allowed,
    verdict: Verdict,
    req: &mut Request<UpBody>,
    metered: bool,
) -> (response::Mcp, Option<(String, String)>) {
    let report = p.binding.enforcement == Enforcement::Report;
    let mcp = allowed
        .mcp
        .filter(|_| verdict == Verdict::Allow)
        .map(|(rule, lists)| (rule, lists, report));
    let seal = p.seal_of(req.uri().path());
    if !p.bound.is_empty() || mcp.is_some() || seal.is_some() || metered {
        req.headers_mut().insert(
            http::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    (mcp, seal)
}

/// What the record says of the request asked: its method and path, and what it called in a
/// protocol a rule named (a tool, an operation, a git service).
struct Asked {
    method: http::Method,
    path: Arc<str>,
    call: Option<String>,
}

impl Asked {
    fn of<B>(req: &Request<B>) -> Self {
        Asked {
            method: req.method().clone(),
            path: req.uri().path().into(),
            call: None,
        }
    }

    /// The record's facts (the method and path shared with the request's, not copied).
    fn facts(&self, status: u16, credential: Option<String>) -> HttpFacts {
        HttpFacts {
            method: self.method.clone(),
            path: self.path.clone(),
            status,
            credential: credential.map(Into::into),
            secret_reflected: None,
            call: self.call.as_deref().map(Into::into),
        }
    }
}

/// How a request refused in report mode goes on, for its record.
const WITHOUT_CREDENTIALS: &str = "forwarded without credentials";

/// What [`Exchange::decide`] decided before the body is read.
struct Decided {
    prepared: Arc<Prepared>,
    verdict: Verdict,
    judges: Vec<Arc<Protocol>>,
    /// An upgrade to a WebSocket its rule allows.
    socket: Option<Arc<Protocol>>,
}

/// What the body phase passes on: the request, its verdict, what it may do, an inference
/// call's accounting.
type Judged = (
    Request<UpBody>,
    Verdict,
    Allowed,
    Option<inference::Metered>,
);

/// Why the body phase refused: answered and recorded already, or an inference call refused
/// at admission (answered in its provider's shape).
enum Unjudged {
    Answered(Response<ResBody>),
    Call(
        crate::policy::protocols::inference::Provider,
        crate::pipeline::Refusal,
    ),
}

/// What went upstream: the request, the credentials put on it, the bytes sent so far, and an
/// inference call's accounting.
struct Sent {
    asked: Asked,
    injected: Option<String>,
    up_bytes: Arc<AtomicU64>,
    metered: Option<inference::Metered>,
}

impl Sent {
    fn of(asked: Asked, injected: Option<String>) -> Self {
        Sent {
            asked,
            injected,
            up_bytes: Arc::new(AtomicU64::new(0)),
            metered: None,
        }
    }
}

impl Exchange {
    /// Told when the tunnel is stopped: open sockets close with a reason first.
    pub fn ending(&self) -> Arc<tokio::sync::watch::Sender<Option<crate::audit::outcome::Close>>> {
        self.ending.clone()
    }

    pub fn new(
        current: CurrentBinding,
        dest: Destination,
        upstream: Upstream,
        recorder: Recorder,
        live: Arc<Liveness>,
        mint: MintCx,
        limits: BodyLimits,
    ) -> Option<Self> {
        Some(Exchange {
            parked: Mutex::new(None),
            ending: Arc::new(tokio::sync::watch::channel(None).0),
            current,
            written: authority::Written::new(&dest.host, dest.port)?,
            dest,
            upstream,
            recorder,
            live,
            mint,
            limits,
            prepared: Mutex::new(None),
        })
    }

    /// What is wrong with `req` under `p`, if anything (before any credential is put on it):
    /// what only a terminated tunnel checks, then the pipeline's head phase
    /// ([`crate::pipeline::head`]).
    fn check(&self, p: &Prepared, req: &Request<Incoming>) -> Checked {
        match self.refusal(p, req) {
            Some(r) => Checked::Refused(r),
            // A host not judged per request has no head rules to read, as on the forwarded
            // path (an `Upgrade` is not passed: a socket's messages would go unread).
            None if !p.judged => Checked::Allowed(None),
            None => p.rules.judge(&self.dest.host, Head::of(req)),
        }
    }

    /// Why `req` is refused before the pipeline's head phase reads it, if it is: another
    /// authority than the tunnel's, a placeholder where its credential is not.
    fn refusal(&self, p: &Prepared, req: &Request<Incoming>) -> Option<Refusal> {
        let b = &*p.binding;
        let host = self.dest.host.as_str();
        if let Some(why) = authority::mismatch(req, host, self.dest.port) {
            return Some(Refusal::new(Reason::HostMismatch, why));
        }
        let misuse = |credential: &str, detail: String| {
            Some(Refusal {
                reason: Reason::CredentialMisuse,
                detail,
                credential: Some(credential.to_string()),
                shown: None,
            })
        };
        for c in b.credentials.iter().filter(|c| !c.bound_to(host)) {
            if carries_outside(req.uri(), req.headers(), &c.placeholder, &[]) {
                let why = format!(
                    "the placeholder of credential {} is bound to other hosts than {host}",
                    c.name
                );
                return misuse(&c.name, why);
            }
        }
        for k in &p.bound {
            if let Some(why) = k.kind.misuse(req.uri(), req.headers(), &k.placeholder) {
                let why = k.kind.misuse_sentence(&k.name, why);
                return misuse(&k.name, why);
            }
        }
        None
    }

    /// What `b` means for this host (cached per binding and policy version: identity tokens
    /// name the version).
    fn prepared(&self, b: Arc<Binding>, version: Arc<str>) -> Arc<Prepared> {
        if let Ok(cache) = self.prepared.lock() {
            let same = |p: &&Arc<Prepared>| Arc::ptr_eq(&p.binding, &b) && p.version == version;
            if let Some(p) = cache.as_ref().filter(same) {
                return p.clone();
            }
        }
        let p = Arc::new(Prepared::new(
            b,
            (&self.dest.host, self.dest.process.as_deref()),
            &self.mint,
            version.clone(),
        ));
        if let Ok(mut cache) = self.prepared.lock() {
            *cache = Some(p.clone());
        }
        p
    }

    /// One request, in the fixed order of the module's documentation: decide (reading the
    /// body when a protocol rule judges it, then the decider and the DLP phase), reserve it
    /// against the quotas, put the credentials on it, write the authority, send, filter and scrub the
    /// response.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<ResBody> {
        self.live.touch();
        let mut asked = Asked::of(&req);
        if let Some(why) = self.recorder.unavailable() {
            // Not served: its record could not be kept (unrecorded, counted).
            return self.refused(&asked.method, Reason::AuditUnavailable, why.explain());
        }
        // The request's one record, written when this guard drops (with the response body).
        let mut audit = self.recorder.guard();
        let d = match self.read_request(&req, &mut asked, &mut audit) {
            Ok(x) => x,
            Err(r) => {
                drop(audit);
                return self.refused(&asked.method, r.reason, &r.detail);
            }
        };
        let (mut req, verdict, allowed, metered) =
            match self.body_phase(req, &d, &mut asked, &mut audit).await {
                Ok(x) => x,
                Err(why) => return self.refused_body(audit, &asked, why),
            };
        let verdict = match self
            .ask_decider(&d.prepared, &mut req, verdict, &mut audit)
            .await
        {
            Ok(v) => v,
            Err(r) => return self.refused_recorded(audit, &asked, r),
        };
        let h2 = matches!(self.upstream, Upstream::H2(_));
        self.written.write(&mut req, h2);
        socket::no_switch(&d.socket, &mut req);
        let (mcp, seal) = readers(&d.prepared, allowed, verdict, &mut req, metered.is_some());
        // The DLP phase judges what the sandbox sent, before any credential is put on.
        let (mut req, dlp) =
            match crate::pipeline::dlp::request(&d.prepared.binding, req, &mut audit).await {
                Ok(x) => x,
                Err(r) => return self.refused_recorded(audit, &asked, r),
            };
        // Each request the rules, the decider and the DLP phase let through is reserved
        // against the daily quotas (one refused before anything of it is sent spends
        // nothing): checked and counted at once, so parallel streams cannot all pass.
        if let Err(r) = self.live.reserve() {
            return self.refused_recorded(audit, &asked, r);
        }
        // A request the check would refuse is never given a credential; one is put on as
        // the request will be sent (a signature covers the authority written above).
        let injected = match verdict {
            Verdict::Allow => match self.inject(&d.prepared, &mut req).await {
                Ok(used) => used,
                Err(r) => return self.refused_recorded(audit, &asked, r),
            },
            _ => None,
        };
        if let (Some(rule), Verdict::Allow) = (d.socket.clone(), verdict) {
            let sent = Sent::of(asked, injected);
            return self.socket(req, (rule, &d.prepared), audit, sent).await;
        }
        let scrubber = d.prepared.scrubber_for(&self.mint, req.headers());
        let up_bytes = Arc::new(AtomicU64::new(0));
        let req =
            req.map(|b| Counted::new(b, self.live.clone(), true).count_into(up_bytes.clone()));
        let sent = self.upstream.send(req).await;
        if let Some(why) = dlp.and_then(|found| crate::pipeline::dlp::recorded(&found, &mut audit))
        {
            return self.refused_recorded(audit, &asked, Refusal::new(Reason::DlpBlocked, why));
        }
        match sent {
            Ok(resp) => {
                let sent = Sent {
                    asked,
                    injected,
                    up_bytes,
                    metered,
                };
                self.response(resp, audit, (scrubber, mcp, seal), sent)
                    .await
            }
            Err(e) => {
                let msg = format!("the upstream failed: {e}");
                audit.http(asked.facts(0, injected));
                audit.verdict(verdict, Reason::ConnectionRefused);
                audit.detail(msg.clone());
                audit.bytes(up_bytes.load(Ordering::Relaxed), 0);
                drop(audit);
                self.refused(&asked.method, Reason::ConnectionRefused, &msg)
            }
        }
    }

    /// The body phase where a protocol rule judges the body ([`Exchange::judged`]), then an
    /// inference call's admission ([`Exchange::metered`]): the request to send, its verdict,
    /// what it may do and its accounting; or why it is refused.
    async fn body_phase(
        &self,
        req: Request<Incoming>,
        d: &Decided,
        asked: &mut Asked,
        audit: &mut AuditGuard,
    ) -> Result<Judged, Unjudged> {
        let (req, verdict, mut allowed) = match d.judges.is_empty() {
            true => (req.map(UpBody::Streamed), d.verdict, Allowed::default()),
            false => self
                .judged(req, d, asked, audit)
                .await
                .map_err(Unjudged::Answered)?,
        };
        let metered = self
            .metered(&d.prepared, &mut allowed, verdict)
            .map_err(|(provider, r)| Unjudged::Call(provider, r))?;
        let req = match &metered {
            Some(m) if m.bound.is_some() => (m.bound_request(req, audit))
                .map_err(|(provider, r)| Unjudged::Call(provider, r))?,
            _ => req,
        };
        Ok((req, verdict, allowed, metered))
    }

    /// The answer to a request the body phase refused (recorded here unless it was already).
    fn refused_body(&self, audit: AuditGuard, asked: &Asked, why: Unjudged) -> Response<ResBody> {
        match why {
            Unjudged::Answered(resp) => {
                drop(audit);
                resp
            }
            Unjudged::Call(provider, r) => self.refused_call_recorded(audit, asked, provider, r),
        }
    }

    /// Read the request against the binding in force now: `Err` with the refusal (recorded);
    /// else what the binding means here, the verdict (report mode: a request the rules
    /// refuse goes upstream without credentials, recorded `report`) and the protocols that
    /// still judge the body.
    fn read_request(
        &self,
        req: &Request<Incoming>,
        asked: &mut Asked,
        audit: &mut AuditGuard,
    ) -> Result<Decided, Refusal> {
        let Some((binding, version)) = (self.current)() else {
            let why = "the sandbox is no longer registered";
            audit.verdict(Verdict::Deny, Reason::UnknownSandbox);
            audit.detail(why);
            audit.http(asked.facts(403, None));
            return Err(Refusal::new(Reason::UnknownSandbox, why));
        };
        audit.record.policy_version = version.clone();
        let prepared = self.prepared(binding, version);
        let decided = |verdict, judges| Decided {
            prepared: prepared.clone(),
            verdict,
            judges,
            socket: None,
        };
        let r = match self.check(&prepared, req) {
            Checked::Allowed(call) => {
                asked.call = call;
                return Ok(decided(Verdict::Allow, Vec::new()));
            }
            Checked::Judge(judges) => return Ok(decided(Verdict::Allow, judges)),
            Checked::Socket(rule) => {
                asked.call = Some("websocket".into());
                return Ok(Decided {
                    socket: Some(rule),
                    ..decided(Verdict::Allow, Vec::new())
                });
            }
            Checked::Refused(r) => r,
        };
        if let Some((service, _)) =
            git_request(req.method().as_str(), req.uri().path(), req.uri().query())
        {
            asked.call = Some(format!("git {}", service.name()));
        }
        match crate::pipeline::reported(&prepared.binding, r, WITHOUT_CREDENTIALS, audit) {
            Ok(()) => Ok(decided(Verdict::Report, Vec::new())),
            Err(r) => {
                audit.http(asked.facts(403, r.credential.clone()));
                Err(r)
            }
        }
    }

    /// Read and judge the body of a request a protocol rule judges ([`judge`]): the request
    /// with the bytes judged, its verdict and what it may do; or the refusal, recorded
    /// (JSON-RPC calls are answered with JSON-RPC errors). In report mode a refused body is
    /// forwarded without credentials and recorded `report`.
    async fn judged(
        &self,
        req: Request<Incoming>,
        d: &Decided,
        asked: &mut Asked,
        audit: &mut AuditGuard,
    ) -> Result<(Request<UpBody>, Verdict, Allowed), Response<ResBody>> {
        let (parts, body) = req.into_parts();
        let (bytes, refused) = match judge::read(body, self.limits.judge, &d.judges[0]).await {
            Err(r) => (None, r),
            Ok(bytes) => match judge::judge(&d.judges, &parts, &bytes) {
                Ok(mut allowed) => {
                    asked.call = allowed.call.take();
                    let req = Request::from_parts(parts, UpBody::whole(bytes));
                    return Ok((req, d.verdict, allowed));
                }
                Err(r) => (Some(bytes), r),
            },
        };
        asked.call = refused.call.clone();
        // A body that could not be read whole cannot be sent as judged, even in report mode.
        let r = Refusal::new(refused.reason, refused.detail.clone());
        let went_on = match bytes {
            Some(bytes) => {
                let how = WITHOUT_CREDENTIALS;
                crate::pipeline::reported(&d.prepared.binding, r, how, audit)
                    .ok()
                    .map(|()| bytes)
            }
            None => {
                audit.verdict(Verdict::Deny, r.reason);
                audit.detail(r.detail);
                None
            }
        };
        if let Some(bytes) = went_on {
            let req = Request::from_parts(parts, UpBody::whole(bytes));
            return Ok((req, Verdict::Report, Allowed::default()));
        }
        let status = match refused.rpc {
            Some(_) => 200,
            None => refused.reason.status(),
        };
        audit.http(asked.facts(status, None));
        if let Some(provider) = d.judges.iter().find_map(|p| match &**p {
            Protocol::Inference(r) => Some(r.provider),
            _ => None,
        }) {
            let r = Refusal::new(refused.reason, refused.detail);
            return Err(self.refused_inference(provider, &r));
        }
        Err(self.refused_call(&asked.method, &refused))
    }

    /// The refusal of a judged request: JSON-RPC errors for the ids its calls carried, else
    /// the house refusal.
    fn refused_call(&self, method: &http::Method, r: &Refused) -> Response<ResBody> {
        match &r.rpc {
            Some((ids, batch)) if !ids.is_empty() => {
                let what = format!("{method} {}", self.dest.shown());
                let id = (self.current)().map(|(b, _)| b.id.to_string());
                deny::jsonrpc(
                    &deny::Refusal {
                        reason: r.reason,
                        what: &what,
                        sandbox: id.as_deref(),
                        explanation: &r.detail,
                        retry_after: None,
                        ask: self.dest.ask,
                    },
                    ids,
                    *batch,
                )
            }
            _ => self.refused(method, r.reason, &r.detail),
        }
    }

    /// The refusal of a request in this tunnel, built like every other refusal (no path in
    /// it: a path may carry a placeholder) — or in the provider's error shape on a host an LLM
    /// provider's rule judges.
    fn refused(
        &self,
        method: &http::Method,
        reason: Reason,
        explanation: &str,
    ) -> Response<ResBody> {
        if let Some(provider) = self.provider_here() {
            return self.refused_inference(provider, &Refusal::new(reason, explanation));
        }
        let what = format!("{method} {}", self.dest.shown());
        let id = (self.current)().map(|(b, _)| b.id.to_string());
        deny::in_tunnel(&deny::Refusal {
            reason,
            what: &what,
            sandbox: id.as_deref(),
            explanation,
            retry_after: None,
            ask: self.dest.ask,
        })
    }
}
