//! One request on a terminated host, read against the sandbox's binding *now* (a reload that
//! narrows rules or rotates a secret applies from the next request):
//!
//! 1. the pipeline's driver ([`crate::pipeline::driver::request`], this path's hooks in
//!    [`path`]) takes it through its phases in their one order: refused unless it is exactly
//!    the decided authority ([`super::authority`]) with no placeholder bound elsewhere or
//!    outside the headers its credential names (`credential_misuse`); the head rules (method,
//!    overrides, canonical path, the `network.http` rules); the body phase where a rule names
//!    a protocol (the bytes judged are the bytes sent); an inference call admitted and
//!    metered; the decider; DLP on target, headers and body; the daily quotas — a request
//!    refused before anything of it is sent spends nothing;
//! 2. the authority the proxy writes, and `Accept-Encoding: identity` when a secret could come
//!    back ([`super::scrub`] reads what it can scan);
//! 3. the credentials bound here are put on it (never when the check refused it, even in report
//!    mode: a reported request goes upstream without any credential);
//! 4. it goes upstream;
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
use crate::audit::{AuditGuard, Recorder};
use crate::config::Binding;
use crate::pipeline::body::Allowed;
pub(crate) use crate::pipeline::driver::Asked;
use crate::pipeline::driver::{self, Judging, Ready, Stop};
use crate::pipeline::Refusal;
use crate::policy::protocols::inference::Provider;
use crate::policy::reason::Reason;
use crate::policy::{Enforcement, Verdict};
use crate::relay::counted::Counted;
use crate::relay::deny;
use crate::relay::liveness::Liveness;

mod destination;
mod inference;
mod inject;
mod path;
mod prepared;
mod response;
pub mod socket;
mod up_body;
mod upstream;

pub use destination::Destination;
use path::Terminated;
use prepared::Prepared;
pub use up_body::UpBody;
pub use upstream::{Spare, Upstream};

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
    /// The tunnel's WebSockets: the one parked for the connection's hand-over, and how open
    /// ones are told the tunnel stops.
    sockets: socket::Sockets,
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
    /// Its upstream connection, once the tunnel is done with it.
    pub fn into_upstream(self) -> Upstream {
        self.upstream
    }

    /// The tunnel's WebSockets ([`socket::Sockets`]).
    pub fn sockets(&self) -> &socket::Sockets {
        &self.sockets
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
            sockets: socket::Sockets::default(),
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

    /// One request: its phases driven by [`driver::request`] (head and body rules, an
    /// inference call's admission, the decider, DLP, the quota reservation), then the
    /// authority written, the credentials put on it, sent, its response filtered and scrubbed.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<ResBody> {
        self.live.touch();
        let method = req.method().clone();
        if let Some(why) = self.recorder.unavailable() {
            // Not served: its record could not be kept (unrecorded, counted).
            return self.refused(&method, Reason::AuditUnavailable, why.explain());
        }
        // The request's one record, written when this guard drops (with the response body).
        let mut audit = self.recorder.guard();
        let Some((binding, version)) = (self.current)() else {
            let why = "the sandbox is no longer registered";
            audit.verdict(Verdict::Deny, Reason::UnknownSandbox);
            audit.detail(why);
            audit.http(Asked::of(&req).facts(403, None));
            drop(audit);
            return self.refused(&method, Reason::UnknownSandbox, why);
        };
        audit.record.policy_version = version.clone();
        let p = self.prepared(binding, version);
        let at = Judging {
            binding: &p.binding,
            asker: &*self.mint.deciders,
            rules: p.judged.then_some(&p.rules),
            limit: self.limits.judge,
            // Each request's own record starts allowed: its phases say otherwise.
            admitted: Verdict::Allow,
            flows: Some(&self.mint.flows),
            process: self.dest.process.as_deref(),
        };
        let path = Terminated { ex: self, p: &p };
        // Bound before it is served: a `match` on the call would keep its whole result in
        // this future across the serve (608 bytes more in every request's task).
        let ready = match driver::request(&path, at, req, &mut audit).await {
            Ok(ready) => ready,
            Err(stop) => {
                drop(audit);
                return self.refused_call(&method, &stop);
            }
        };
        self.serve(&p, ready, audit).await
    }

    /// Send `req` upstream, its body counted (into `up_bytes` too). A kept connection the
    /// origin closes under the first request: sent again on a new one, and the record says so.
    async fn send(
        &self,
        req: Request<UpBody>,
        up_bytes: &Arc<AtomicU64>,
        audit: &mut AuditGuard,
    ) -> Result<Response<Incoming>, hyper::Error> {
        let again = self.upstream.has_spare().then(|| {
            let empty = || Counted::new(UpBody::whole(Bytes::new()), self.live.clone(), true);
            upstream::resendable(&req, empty)
        });
        let req =
            req.map(|b| Counted::new(b, self.live.clone(), true).count_into(up_bytes.clone()));
        let (resp, replaced) = self.upstream.send(req, again.flatten()).await?;
        if replaced {
            audit.detail(
                "the kept upstream connection was closed by the origin; sent again on a new one",
            );
        }
        Ok(resp)
    }

    /// What follows the driver on a request it let through: the authority written, what
    /// reads the response, the credentials put on, sent (or relayed as a socket).
    async fn serve(
        &self,
        p: &Arc<Prepared>,
        ready: Ready<UpBody, Option<inference::Metered>>,
        mut audit: AuditGuard,
    ) -> Response<ResBody> {
        let Ready {
            mut req,
            verdict,
            allowed,
            socket,
            call: metered,
            dlp,
            asked,
        } = ready;
        let h2 = self.upstream.is_h2();
        self.written.write(&mut req, h2);
        socket::no_switch(&socket, &mut req);
        if socket.is_none() {
            crate::relay::hop_by_hop::strip_connection(req.headers_mut());
        }
        let (mcp, seal) = readers(p, allowed, verdict, &mut req, metered.is_some());
        // A request the check would refuse is never given a credential; one is put on as
        // the request will be sent (a signature covers the authority written above).
        let injected = match verdict {
            Verdict::Allow => match p.inject(&mut req, self.limits.judge).await {
                Ok(used) => used,
                Err(r) => return self.refused_recorded(audit, &asked, r),
            },
            _ => None,
        };
        if let (Some(rule), Verdict::Allow) = (socket, verdict) {
            let sent = Sent::of(asked, injected);
            let path = Terminated { ex: self, p };
            // Boxed, as the socket's future is 13 KB: unboxed, every request's would be.
            return Box::pin(path.socket(req, (rule, p), audit, sent)).await;
        }
        let scrubber = p.scrubber_for(&self.mint, req.headers());
        let up_bytes = Arc::new(AtomicU64::new(0));
        let sent = self.send(req, &up_bytes, &mut audit).await;
        if let Some((reason, why)) =
            dlp.and_then(|found| crate::pipeline::dlp::recorded(&found, &mut audit))
        {
            return self.refused_recorded(audit, &asked, Refusal::new(reason, why));
        }
        match sent {
            Ok(resp) => {
                let sent = Sent {
                    asked,
                    injected,
                    up_bytes,
                    metered,
                };
                let path = Terminated { ex: self, p };
                path.response(resp, audit, (scrubber, mcp, seal), sent)
                    .await
            }
            Err(e) => {
                let msg = format!("the upstream failed: {e}");
                audit.answered(0, injected.as_deref());
                audit.verdict(verdict, Reason::ConnectionRefused);
                audit.detail(msg.clone());
                audit.bytes(up_bytes.load(Ordering::Relaxed), 0);
                drop(audit);
                self.refused(&asked.method, Reason::ConnectionRefused, &msg)
            }
        }
    }

    /// The answer to a request the driver refused (recorded): JSON-RPC errors for the ids its
    /// calls carried, else the house refusal (or the provider's shape).
    fn refused_call(&self, method: &http::Method, stop: &Stop) -> Response<ResBody> {
        let r = &stop.refusal;
        match &stop.rpc {
            Some((ids, batch)) if !ids.is_empty() => {
                let what = format!("{method} {}", self.dest.shown());
                let id = (self.current)().map(|(b, _)| b.id.to_string());
                deny::jsonrpc(
                    &deny::Wording {
                        reason: r.reason,
                        what: &what,
                        sandbox: id.as_deref(),
                        explanation: r.shown(),
                        retry_after: None,
                        ask: self.dest.ask,
                    },
                    ids,
                    *batch,
                )
            }
            _ => self.refused(method, r.reason, r.shown()),
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
        deny::in_tunnel(&deny::Wording {
            reason,
            what: &what,
            sandbox: id.as_deref(),
            explanation,
            retry_after: None,
            ask: self.dest.ask,
        })
    }

    /// A refusal after the request was decided (a credential that could not be had, the
    /// decider, the body scanner), recorded with its reason and built like every other.
    pub(super) fn refused_recorded(
        &self,
        mut audit: AuditGuard,
        asked: &Asked,
        r: Refusal,
    ) -> Response<ResBody> {
        audit.verdict(Verdict::Deny, r.reason);
        audit.detail(r.detail.clone());
        audit.answered(r.reason.status(), r.credential.as_deref());
        drop(audit);
        self.refused(&asked.method, r.reason, r.shown())
    }

    /// The LLM provider whose rules judge this host, when one does: every refusal here is
    /// then answered in that provider's error shape (an SDK shows its message), not only a
    /// refused call's — a path no rule allows (`models.list()`), a refused upgrade, an origin
    /// that cannot be reached.
    pub(super) fn provider_here(&self) -> Option<Provider> {
        let (binding, _) = (self.current)()?;
        crate::pipeline::head::provider_of(&binding, &self.dest.host)
    }

    /// A refused call, answered in its provider's error shape: `reason`'s status, the
    /// explanation as the error's message, `Retry-After` and `x-should-retry: false` on a
    /// budget (the official SDKs would otherwise retry a 429).
    pub(super) fn refused_inference(&self, provider: Provider, r: &Refusal) -> Response<ResBody> {
        let id = (self.current)().map(|(b, _)| b.id.to_string());
        deny::provider_shaped(provider, r.reason, r.shown(), id.as_deref())
    }

    /// Whether a `protocol: websocket` rule of the binding now names this host: then an
    /// HTTP/2 connection offers extended CONNECT (`SETTINGS_ENABLE_CONNECT_PROTOCOL`).
    pub fn offers_websocket(&self) -> bool {
        (self.current)().is_some_and(|(b, _)| {
            b.network
                .http
                .iter()
                .any(|r| r.is_websocket() && r.host.matches(&self.dest.host))
        })
    }
}
