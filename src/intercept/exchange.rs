//! One request on a terminated host, read against the sandbox's binding *now* (a reload that
//! narrows rules or rotates a secret applies from the next request):
//!
//! 1. refused unless it is one the rules can judge: its method (any case; TRACE, TRACK and
//!    unusual methods only when a rule names them), exactly the decided authority
//!    ([`super::authority`]), a canonical path ([`crate::policy::http_rules::canonical_path`]);
//!    no override header or `_method` parameter that would make the upstream read another
//!    method, path or host ([`crate::policy::http_rules::override_refusal`]);
//!    a placeholder bound elsewhere, or outside the headers its credential names, is
//!    `credential_misuse`; then the `network.http` rules;
//! 2. the credentials bound here are put on it (never when the check refused it, even in report
//!    mode: a reported request goes upstream without any credential);
//! 3. it goes upstream with one authority written by the proxy and `Accept-Encoding: identity`
//!    when a secret could come back ([`super::scrub`] reads what it can scan);
//! 4. the response's headers and body are scrubbed of the secrets bound here
//!    (`secret_reflected`); one `mode: "https"` record when the response ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::relay::server_io::ServerIo;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_rustls::client::TlsStream;

use super::authority;
use super::credential::{self, carries_outside, Bound};
use super::error::InterceptError;
use super::scrub::{Findings, Scrubbed, Scrubber};
use crate::audit::record::HttpFacts;
use crate::audit::{AuditGuard, Recorder};
use crate::config::Binding;
use crate::policy::http_rules::{canonical_path, method_refusal, override_refusal, HttpRule};
use crate::policy::reason::Reason;
use crate::policy::{Enforcement, Verdict};
use crate::relay::counted::Counted;
use crate::relay::deny;
use crate::relay::liveness::Liveness;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ResBody = BoxBody<Bytes, BoxError>;

/// The upstream connection's request side.
pub enum Upstream {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Counted<Incoming>>>),
    H2(hyper::client::conn::http2::SendRequest<Counted<Incoming>>),
}

impl Upstream {
    pub async fn connect(tls: TlsStream<ServerIo>, h2: bool) -> Result<Self, InterceptError> {
        let io = TokioIo::new(tls);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|source| InterceptError::Upstream {
                    version: "HTTP/2",
                    source,
                })?;
            tokio::spawn(conn);
            Ok(Upstream::H2(send))
        } else {
            let (send, conn) =
                hyper::client::conn::http1::handshake(io)
                    .await
                    .map_err(|source| InterceptError::Upstream {
                        version: "HTTP/1.1",
                        source,
                    })?;
            tokio::spawn(conn);
            Ok(Upstream::H1(tokio::sync::Mutex::new(send)))
        }
    }

    async fn send(
        &self,
        req: Request<Counted<Incoming>>,
    ) -> Result<Response<Incoming>, hyper::Error> {
        match self {
            Upstream::H1(s) => {
                let mut s = s.lock().await;
                s.ready().await?;
                s.send_request(req).await
            }
            Upstream::H2(s) => {
                let mut s = s.clone();
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }
}

/// The sandbox's binding as it is now, with the version of the policy set it is in (`None`:
/// the sandbox is gone).
pub type CurrentBinding = Box<dyn Fn() -> Option<(Arc<Binding>, Arc<str>)> + Send + Sync>;

/// What a binding means for this tunnel's host, worked out once per binding (a reload makes
/// a new binding, and the next request a new `Prepared`).
struct Prepared {
    binding: Arc<Binding>,
    /// The `network.http` rules for this host.
    rules: Vec<HttpRule>,
    /// The credentials bound here, each as its kind handles it.
    bound: Vec<Bound>,
    /// The scrubber of the secrets bound here (none: no secret).
    scrubber: Option<Arc<Scrubber>>,
}

impl Prepared {
    fn new(binding: Arc<Binding>, host: &str) -> Self {
        let rules = binding
            .network
            .http
            .iter()
            .filter(|r| r.host.matches(host))
            .cloned()
            .collect();
        let bound: Vec<Bound> = binding
            .credentials
            .iter()
            .filter(|c| c.bound_to(host))
            .map(credential::bound)
            .collect();
        let scrubber = Scrubber::new(bound.iter()).map(Arc::new);
        Prepared {
            binding,
            rules,
            bound,
            scrubber,
        }
    }
}

/// Where a terminated tunnel leads.
pub struct Destination {
    pub host: String,
    pub port: u16,
}

/// One terminated tunnel's request handler.
pub struct Exchange {
    current: CurrentBinding,
    dest: Destination,
    /// The one authority requests go upstream with.
    written: authority::Written,
    upstream: Upstream,
    recorder: Recorder,
    live: Arc<Liveness>,
    /// Bytes of a response body scanned for secrets, at most.
    scrub_limit: u64,
    /// The scrubber of the binding last seen (rebuilt when the binding changes).
    prepared: Mutex<Option<Arc<Prepared>>>,
}

/// Why a request is refused, for the response and the record.
struct Refusal {
    reason: Reason,
    detail: String,
    credential: Option<String>,
}

impl Refusal {
    fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Refusal {
            reason,
            detail: detail.into(),
            credential: None,
        }
    }
}

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

/// What the record says of the request asked: its method and path.
struct Asked {
    method: String,
    path: String,
}

impl Asked {
    fn facts(&self, status: u16, credential: Option<String>) -> HttpFacts {
        HttpFacts {
            method: self.method.as_str().into(),
            path: self.path.as_str().into(),
            status,
            credential: credential.map(Into::into),
            secret_reflected: None,
        }
    }
}

/// What went upstream: the request, the credentials put on it, the bytes sent so far.
struct Sent {
    asked: Asked,
    injected: Option<String>,
    up_bytes: Arc<AtomicU64>,
}

impl Exchange {
    pub fn new(
        current: CurrentBinding,
        dest: Destination,
        upstream: Upstream,
        recorder: Recorder,
        live: Arc<Liveness>,
        scrub_limit: u64,
    ) -> Option<Self> {
        Some(Exchange {
            current,
            written: authority::Written::new(&dest.host, dest.port)?,
            dest,
            upstream,
            recorder,
            live,
            scrub_limit,
            prepared: Mutex::new(None),
        })
    }

    /// What is wrong with `req` under `p`, if anything (before any credential is put on it).
    fn check(&self, p: &Prepared, req: &Request<Incoming>) -> Option<Refusal> {
        let b = &*p.binding;
        let host = self.dest.host.as_str();
        let method = req.method().as_str();
        let rules = &p.rules;
        if let Some(why) = method_refusal(method, rules.iter()) {
            return Some(Refusal::new(Reason::HttpNotAllowed, why));
        }
        if let Some(why) = override_refusal(req.headers(), req.uri().query()) {
            return Some(Refusal::new(Reason::HttpNotAllowed, why));
        }
        if let Some(why) = authority::mismatch(req, host, self.dest.port) {
            return Some(Refusal::new(Reason::HostMismatch, why));
        }
        let path = req.uri().path();
        if let Err(why) = canonical_path(path) {
            return Some(Refusal::new(
                Reason::HttpNotAllowed,
                format!("{why}: refused on terminated hosts (the upstream could read it as another path)"),
            ));
        }
        let misuse = |credential: &str, detail: String| {
            Some(Refusal {
                reason: Reason::CredentialMisuse,
                detail,
                credential: Some(credential.to_string()),
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
                let why = format!("the placeholder of credential {} is {why}", k.name);
                return misuse(&k.name, why);
            }
        }
        let query = req.uri().query();
        if !rules.is_empty() && !rules.iter().any(|r| r.allows_request(method, path, query)) {
            return Some(Refusal::new(
                Reason::HttpNotAllowed,
                format!("no network.http rule allows {method} {path} on {host}"),
            ));
        }
        None
    }

    /// What `b` means for this host (cached per binding).
    fn prepared(&self, b: Arc<Binding>) -> Arc<Prepared> {
        if let Ok(cache) = self.prepared.lock() {
            if let Some(p) = cache.as_ref().filter(|p| Arc::ptr_eq(&p.binding, &b)) {
                return p.clone();
            }
        }
        let p = Arc::new(Prepared::new(b, &self.dest.host));
        if let Ok(mut cache) = self.prepared.lock() {
            *cache = Some(p.clone());
        }
        p
    }

    /// One request, in the fixed order of the module's documentation: decide, put the
    /// credentials on it, write the authority, send, scrub the response.
    pub async fn handle(&self, mut req: Request<Incoming>) -> Response<ResBody> {
        self.live.touch();
        let asked = Asked {
            method: req.method().as_str().to_string(),
            path: req.uri().path().to_string(),
        };
        if let Some(why) = self.recorder.unavailable() {
            // Not served: its record could not be kept (unrecorded, counted).
            return self.refused(&asked.method, Reason::AuditUnavailable, why.explain());
        }
        // The request's one record, written when this guard drops (with the response body).
        let mut audit = self.recorder.guard();
        let (prepared, verdict) = match self.decide(&req, &asked, &mut audit) {
            Ok(x) => x,
            Err(r) => {
                drop(audit);
                return self.refused(&asked.method, r.reason, &r.detail);
            }
        };
        // A request the check would refuse is never given a credential.
        let injected = match verdict {
            Verdict::Allow => self.inject(&prepared, &mut req),
            _ => None,
        };
        let h2 = matches!(self.upstream, Upstream::H2(_));
        self.written.write(&mut req, h2);
        let scrubber = prepared.scrubber.clone();
        if scrubber.is_some() {
            req.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        let up_bytes = Arc::new(AtomicU64::new(0));
        let req =
            req.map(|b| Counted::new(b, self.live.clone(), true).count_into(up_bytes.clone()));
        match self.upstream.send(req).await {
            Ok(resp) => {
                let sent = Sent {
                    asked,
                    injected,
                    up_bytes,
                };
                self.response(resp, audit, scrubber, sent)
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

    /// Read the request against the binding in force now: `Err` with the refusal (recorded);
    /// else what the binding means here and the verdict (report mode: a request
    /// the rules refuse goes upstream without credentials, recorded `report`).
    fn decide(
        &self,
        req: &Request<Incoming>,
        asked: &Asked,
        audit: &mut AuditGuard,
    ) -> Result<(Arc<Prepared>, Verdict), Refusal> {
        let Some((binding, version)) = (self.current)() else {
            let why = "the sandbox is no longer registered";
            audit.verdict(Verdict::Deny, Reason::UnknownSandbox);
            audit.detail(why);
            audit.http(asked.facts(403, None));
            return Err(Refusal::new(Reason::UnknownSandbox, why));
        };
        audit.record.policy_version = version;
        let prepared = self.prepared(binding);
        let Some(r) = self.check(&prepared, req) else {
            return Ok((prepared, Verdict::Allow));
        };
        if prepared.binding.enforcement == Enforcement::Report && r.reason.reportable() {
            audit.verdict(Verdict::Report, r.reason);
            audit.detail(format!("{} (forwarded without credentials)", r.detail));
            return Ok((prepared, Verdict::Report));
        }
        audit.verdict(Verdict::Deny, r.reason);
        audit.detail(r.detail.clone());
        audit.http(asked.facts(403, r.credential.clone()));
        Err(r)
    }

    /// The upstream's response, its headers scrubbed at once and its body as it streams
    /// (`secret_reflected`); refused when it cannot be scanned. The record is written when
    /// the body ends.
    fn response(
        &self,
        mut resp: Response<Incoming>,
        mut audit: AuditGuard,
        scrubber: Option<Arc<Scrubber>>,
        sent: Sent,
    ) -> Response<ResBody> {
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
            if let Some(why) = unscannable(&resp) {
                // Never passed unscanned: a compressed secret would not be found.
                audit.verdict(Verdict::Deny, Reason::UnscannableResponse);
                audit.http(asked.facts(502, injected));
                audit.detail(why.clone());
                audit.bytes(up_bytes.load(Ordering::Relaxed), 0);
                drop(audit);
                return self.refused(&asked.method, Reason::UnscannableResponse, &why);
            }
        }
        let down_bytes = Arc::new(AtomicU64::new(0));
        let (up, down) = (up_bytes, down_bytes.clone());
        let seen = findings.clone();
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
            audit.bytes(up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
            drop(audit);
        };
        let (live, limit) = (self.live.clone(), self.scrub_limit);
        resp.map(|b| match scrubber {
            Some(s) => Counted::new(Scrubbed::new(b, s, limit, findings), live, false)
                .count_into(down_bytes)
                .on_end(on_end)
                .map_err(|e| Box::new(e) as BoxError)
                .boxed(),
            None => Counted::new(b, live, false)
                .count_into(down_bytes)
                .on_end(on_end)
                .map_err(|e| Box::new(e) as BoxError)
                .boxed(),
        })
    }

    /// The refusal of a request in this tunnel, built like every other refusal (no path in
    /// it: a path may carry a placeholder).
    fn refused(&self, method: &str, reason: Reason, explanation: &str) -> Response<ResBody> {
        let what = format!("{method} https://{}", self.dest.host);
        let id = (self.current)().map(|(b, _)| b.id.to_string());
        deny::in_tunnel(&deny::Refusal {
            reason,
            what: &what,
            sandbox: id.as_deref(),
            explanation,
            retry_after: None,
        })
    }

    /// Put the credentials bound to this host on `req`, each by its kind; the names of those
    /// used.
    fn inject(&self, p: &Prepared, req: &mut Request<Incoming>) -> Option<String> {
        let used: Vec<&str> = p
            .bound
            .iter()
            .filter(|k| k.kind.apply(req.headers_mut(), &k.placeholder))
            .map(|k| k.name.as_str())
            .collect();
        (!used.is_empty()).then(|| used.join(","))
    }
}
