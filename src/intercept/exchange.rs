//! One request on a terminated host: refuse TRACE, requests naming another host, requests no
//! `network.http` rule allows, and placeholders of credentials bound elsewhere; put the
//! credentials bound here on the request; forward it on the one upstream connection (HTTP/1.1
//! or HTTP/2, trailers included); write one `mode: "https"` record when the response ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::error::InterceptError;
use crate::audit::record::HttpFacts;
use crate::audit::Recorder;
use crate::config::credentials::{Credential, Inject};
use crate::config::Binding;
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
    pub async fn connect(tls: TlsStream<TcpStream>, h2: bool) -> Result<Self, InterceptError> {
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

/// One terminated tunnel's request handler.
pub struct Exchange {
    binding: Arc<Binding>,
    host: String,
    upstream: Upstream,
    recorder: Recorder,
    live: Arc<Liveness>,
}

/// Why a request is refused, for the response and the record.
struct Refusal {
    reason: Reason,
    detail: String,
    credential: Option<String>,
}

impl Exchange {
    pub fn new(
        binding: Arc<Binding>,
        host: &str,
        upstream: Upstream,
        recorder: Recorder,
        live: Arc<Liveness>,
    ) -> Self {
        Exchange {
            binding,
            host: host.to_string(),
            upstream,
            recorder,
            live,
        }
    }

    fn report(&self) -> bool {
        self.binding.enforcement == Enforcement::Report
    }

    /// What is wrong with `req`, if anything (before any credential is put on it).
    fn check(&self, req: &Request<Incoming>) -> Option<Refusal> {
        let method = req.method().as_str();
        if method == "TRACE" {
            return Some(Refusal {
                reason: Reason::HttpNotAllowed,
                detail: "TRACE is refused on terminated hosts (it would echo injected credentials)"
                    .into(),
                credential: None,
            });
        }
        // The request must be for the host the tunnel was decided and terminated for.
        let named = req
            .uri()
            .authority()
            .map(|a| a.host().to_string())
            .or_else(|| {
                req.headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(|h| h.rsplit_once(':').map(|(h, _)| h).unwrap_or(h).to_string())
            });
        if let Some(n) = named {
            if !n.eq_ignore_ascii_case(&self.host) {
                return Some(Refusal {
                    reason: Reason::HostMismatch,
                    detail: format!(
                        "the request names {n}, the tunnel was decided for {}",
                        self.host
                    ),
                    credential: None,
                });
            }
        }
        for c in self.binding.credentials.iter() {
            if !c.bound_to(&self.host) && carries(req, &c.placeholder) {
                return Some(Refusal {
                    reason: Reason::CredentialMisuse,
                    detail: format!(
                        "the placeholder of credential {} is bound to other hosts than {}",
                        c.name, self.host
                    ),
                    credential: Some(c.name.clone()),
                });
            }
        }
        let rules: Vec<_> = self
            .binding
            .network
            .http
            .iter()
            .filter(|r| r.host.matches(&self.host))
            .collect();
        if !rules.is_empty() && !rules.iter().any(|r| r.allows(method, req.uri().path())) {
            return Some(Refusal {
                reason: Reason::HttpNotAllowed,
                detail: format!(
                    "no network.http rule allows {method} {} on {}",
                    req.uri().path(),
                    self.host
                ),
                credential: None,
            });
        }
        None
    }

    pub async fn handle(&self, mut req: Request<Incoming>) -> Response<ResBody> {
        self.live.touch();
        // The request's one record, written when this guard drops (with the response body).
        let mut audit = self.recorder.guard();
        let method = req_method(&req);
        let path = req.uri().path().to_string();
        let facts = |status: u16, credential: Option<String>| HttpFacts {
            method: method.as_str().into(),
            path: path.as_str().into(),
            status,
            credential: credential.map(Into::into),
        };
        let mut verdict = Verdict::Allow;
        if let Some(r) = self.check(&req) {
            if self.report() && r.reason.reportable() {
                verdict = Verdict::Report;
                audit.verdict(verdict, r.reason);
                audit.detail(r.detail);
            } else {
                audit.verdict(Verdict::Deny, r.reason);
                audit.detail(r.detail.clone());
                audit.http(facts(403, r.credential.clone()));
                drop(audit);
                return self.refused(&method, r.reason, &r.detail);
            }
        }
        let injected = self.inject(&mut req);
        let facts_sent = facts(0, injected.clone());
        let up_bytes = Arc::new(AtomicU64::new(0));
        let req =
            req.map(|b| Counted::new(b, self.live.clone(), true).count_into(up_bytes.clone()));
        match self.upstream.send(req).await {
            Ok(resp) => {
                let mut f = facts_sent;
                f.status = resp.status().as_u16();
                audit.http(f);
                let down_bytes = Arc::new(AtomicU64::new(0));
                let (up, down) = (up_bytes.clone(), down_bytes.clone());
                resp.map(|b| {
                    Counted::new(b, self.live.clone(), false)
                        .count_into(down_bytes)
                        .on_end(move |_| {
                            audit.bytes(up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
                            drop(audit);
                        })
                        .map_err(|e| Box::new(e) as BoxError)
                        .boxed()
                })
            }
            Err(e) => {
                let msg = format!("the upstream failed: {e}");
                audit.http(facts_sent);
                audit.verdict(verdict, Reason::ConnectionRefused);
                audit.detail(msg.clone());
                audit.bytes(up_bytes.load(Ordering::Relaxed), 0);
                drop(audit);
                self.refused(&method, Reason::ConnectionRefused, &msg)
            }
        }
    }

    /// The refusal of a request in this tunnel, built like every other refusal (no path in
    /// it: a path may carry a placeholder).
    fn refused(&self, method: &str, reason: Reason, explanation: &str) -> Response<ResBody> {
        let what = format!("{method} https://{}", self.host);
        deny::in_tunnel(&deny::Refusal {
            reason,
            what: &what,
            sandbox: Some(self.binding.id.as_str()),
            explanation,
            retry_after: None,
        })
    }

    /// Put the credentials bound to this host on `req`; the names of those used.
    fn inject(&self, req: &mut Request<Incoming>) -> Option<String> {
        let mut used: Vec<&str> = Vec::new();
        for c in self
            .binding
            .credentials
            .iter()
            .filter(|c| c.bound_to(&self.host))
        {
            match &c.inject {
                Inject::Header { name, format } => {
                    let value = format.replace("{secret}", c.secret.expose());
                    if let Ok(mut v) = HeaderValue::from_str(&value) {
                        v.set_sensitive(true);
                        req.headers_mut().insert(name.clone(), v);
                        used.push(&c.name);
                    }
                }
                Inject::ReplacePlaceholder => {
                    if replace_placeholder(req, c) {
                        used.push(&c.name);
                    }
                }
            }
        }
        (!used.is_empty()).then(|| used.join(","))
    }
}

fn req_method(req: &Request<Incoming>) -> String {
    req.method().as_str().to_string()
}

/// Whether `placeholder` appears in the request's URL or any header value.
fn carries(req: &Request<Incoming>, placeholder: &str) -> bool {
    let in_uri = req
        .uri()
        .path_and_query()
        .is_some_and(|pq| pq.as_str().contains(placeholder));
    in_uri
        || req
            .headers()
            .values()
            .any(|v| contains_bytes(v.as_bytes(), placeholder.as_bytes()))
}

fn contains_bytes(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Replace `c`'s placeholder by its secret in header values and the URL; whether it was found.
fn replace_placeholder(req: &mut Request<Incoming>, c: &Credential) -> bool {
    let mut found = false;
    let secret = c.secret.expose();
    for (_, v) in req.headers_mut().iter_mut() {
        if let Ok(s) = v.to_str() {
            if s.contains(&c.placeholder) {
                if let Ok(mut nv) = HeaderValue::from_str(&s.replace(&c.placeholder, secret)) {
                    nv.set_sensitive(true);
                    *v = nv;
                    found = true;
                }
            }
        }
    }
    let uri = req.uri().to_string();
    if uri.contains(&c.placeholder) {
        if let Ok(u) = uri.replace(&c.placeholder, secret).parse() {
            *req.uri_mut() = u;
            found = true;
        }
    }
    found
}
