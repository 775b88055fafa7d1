//! Absolute-form request forwarding (`GET http://host/...` on the explicit proxy), after the
//! request was allowed and a checked address dialled: rewrite the request for the origin
//! (origin-form target, hop-by-hop headers and the proxy's credentials removed; through a
//! parent proxy, absolute form with the parent's own `Proxy-Authorization`), send it,
//! and stream both bodies — counted, shaped under the sandbox's bandwidth limits, and
//! watched: when the policy no longer allows the exchange, the upstream connection is
//! reset (nothing more reaches the origin) and so is the client connection (nothing more
//! reaches the client), and the record says `close: "revoked"`. An exchange that ended
//! cleanly leaves its upstream connection to [`crate::egress::upstream_pool`] for the next
//! request of the same sandbox to the same authority and address.

use std::sync::{Arc, Mutex};

use http::{header, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;

use super::forward_send::{send, upstream_of, Sent};
use crate::audit::metrics::ActiveGuard;
use crate::audit::metrics::Metrics;
use crate::audit::{AuditGuard, Close};
use crate::egress::abortable::Cut;
use crate::egress::admit::{Admitted, Through};
use crate::egress::handles::Handles;
use crate::egress::limits::{ConnectionSlot, SandboxLimiter};
use crate::egress::parent;
use crate::egress::upstream_pool::Upstream;
use crate::egress::upstream_pool::UpstreamPool;
use crate::pipeline::{self, forwarded::ForwardBody};
use crate::policy::reason::Reason;
use crate::policy::target::Target;
use crate::policy::Decision;
use crate::relay::body::{Body, BoxError};
use crate::relay::counted::{self, Counted};
use crate::relay::deny;
use crate::relay::hop_by_hop::{host_header, strip_hop_by_hop};
use crate::relay::liveness::Liveness;
use crate::relay::shaped_body::ShapedBody;
use crate::relay::watch::Watch;

/// What lives exactly as long as the exchange: its record, its place in the active gauge
/// and under the sandbox's connection limit. Shared by the response body, the watcher task
/// and the request handler; the last one to let go writes the record.
pub(super) struct Exchange {
    audit: AuditGuard,
    _active: ActiveGuard,
    _slot: ConnectionSlot,
}

pub(super) type SharedExchange = Arc<Mutex<Exchange>>;

pub(super) fn with_audit(ex: &SharedExchange, f: impl FnOnce(&mut AuditGuard)) {
    if let Ok(mut e) = ex.lock() {
        f(&mut e.audit);
    }
}

/// What a forwarded exchange reads besides its request: the handles, not the whole runtime.
pub struct Forwarding {
    /// The exchange's clearance, watched against every later policy and the process phase.
    pub watch: Watch,
    /// Where a connection that ended cleanly is kept for the next request.
    pub upstreams: Arc<UpstreamPool>,
    pub metrics: Arc<Metrics>,
    /// `timeouts.idle_ms`.
    pub idle: std::time::Duration,
    /// `timeouts.connect_ms` (a kept connection closed under the request is dialled again).
    pub connect: std::time::Duration,
    /// `tls_intercept.judge_body_bytes`: the most of a body a protocol rule reads.
    pub judge_body_bytes: u64,
    /// Who the pipeline's decider phase asks ([`pipeline::ask`]).
    pub asker: Arc<dyn pipeline::ask::Asker>,
    /// Where the sandbox's flow labels are kept ([`pipeline::flow`]).
    pub flows: Arc<pipeline::flow::Ledger>,
}

/// Forward one allowed request and return the origin's response (or a 502).
pub async fn forward(
    fx: Forwarding,
    cut: Arc<Cut>,
    req: Request<Incoming>,
    mut audit: AuditGuard,
    admitted: Admitted,
) -> Response<Body> {
    let Admitted {
        sandbox,
        clearance,
        route,
        slot,
        through,
        ..
    } = admitted;
    let limiter = slot.limiter().clone();
    let shaped = limiter.shapes();
    let process = clearance.process.as_deref();
    let live = Arc::new(Liveness::new(fx.idle).metered(&limiter, &clearance.target.host, process));
    audit.count(live.counters());
    let host = host_header(&clearance.target);
    let failed = Failed::of(req.method(), &host, &sandbox.binding, &clearance);

    // The request pipeline, with the quota reservation: nothing is sent before them.
    let at = (
        &*live,
        (&*sandbox.binding, &*fx.asker, &*fx.flows),
        &clearance.target,
        fx.judge_body_bytes,
    );
    // What admission decided (a stage's refusal in report mode is on its record only).
    let from = (audit.verdict_so_far(), clearance.process.as_deref());
    let (req, dlp) = match judged(at, from, req, &mut audit).await {
        Ok(r) => r,
        Err(r) => return refused(audit, &r, &failed),
    };
    let exchange: SharedExchange = Arc::new(Mutex::new(Exchange {
        audit,
        _active: sandbox.stats(&fx.metrics).active(),
        _slot: slot,
    }));
    let shaper = shaped.then(|| limiter.clone());
    let upstream_req = for_origin(req, &host, live.clone(), shaper, through.as_ref());
    // The head is counted as what it is on the wire (its body is counted as it streams).
    live.moved(true, counted::request_head_len(&upstream_req));

    let mut up = match upstream_of(route, through.as_ref()).await {
        Ok(up) => up,
        Err(e) => return bad_gateway(&exchange, &e.to_string(), &failed),
    };
    if up.reused > 0 {
        with_audit(&exchange, |a| {
            a.detail("sent on a kept upstream connection")
        });
    }
    let upstream_cut = up.cut.clone();

    // The watcher: cuts both sides on revocation, shutdown or idleness; it ends when the
    // exchange does (`done_tx` dropped).
    let done_tx = watch_exchange(fx.watch, &exchange, &cut, &upstream_cut, &live);

    let sent = send((fx.connect, &fx.metrics), &exchange, &mut up, upstream_req).await;
    if let Some(cut) = dlp.and_then(|found| dlp_cut(&exchange, &found, &failed)) {
        upstream_cut.close();
        return cut;
    }
    // Through a parent, its own refusal is told from the origin's answer.
    let refused = sent.as_ref().ok().zip(through.as_ref());
    if let Some(detail) = refused.and_then(|(r, t)| parent::refusal(&t.parent, r)) {
        upstream_cut.close();
        return refused_by_parent(&exchange, &detail, &failed);
    }
    let after = (fx.upstreams, clearance, up);
    match sent {
        Ok(resp) => {
            with_audit(&exchange, |a| a.status(resp.status()));
            let shaper = shaped.then_some(limiter);
            answer(resp, live, shaper, finish(after, exchange, done_tx))
        }
        Err(e) => {
            upstream_cut.close();
            match e {
                Sent::Origin(e) => bad_gateway(&exchange, &e.to_string(), &failed),
                Sent::Client(e) => bad_request(&exchange, &e.to_string(), &failed),
            }
        }
    }
}

/// The origin's answer as the client gets it: hop-by-hop headers gone, its head and body
/// counted (the body shaped under `shaper`), and `finish` run when the body ends.
fn answer(
    resp: Response<Incoming>,
    live: Arc<Liveness>,
    shaper: Option<Arc<SandboxLimiter>>,
    finish: impl FnOnce(crate::relay::counted::Ending) + Send + Sync + 'static,
) -> Response<Body> {
    live.moved(false, counted::response_head_len(&resp));
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // Counted, and the record (held by the exchange) finished when the body ends.
    let body = Counted::new(body, live, false)
        .digested()
        .on_end(finish)
        .map_err(|e| Box::new(e) as BoxError);
    let body = match shaper {
        Some(limiter) => ShapedBody::new(body, limiter, false).boxed(),
        None => body.boxed(),
    };
    Response::from_parts(parts, body)
}

/// The DLP scanner cut the body (`dlp_blocked`): the record says so and which rules matched,
/// the client gets the refusal (the origin got an incomplete body, never the whole).
fn dlp_cut(
    exchange: &SharedExchange,
    found: &pipeline::forwarded::Found,
    failed: &Failed,
) -> Option<Response<Body>> {
    let mut cut = None;
    with_audit(exchange, |a| {
        cut = pipeline::dlp::recorded(found, a);
        if let Some((reason, why)) = &cut {
            a.decision(&Decision::deny(*reason, None));
            a.detail(why.clone());
            a.close_if_unset(Close::Error);
        }
    });
    let (reason, why) = cut?;
    Some(deny::response(&deny::Wording {
        reason,
        what: &failed.what,
        sandbox: Some(&failed.sandbox),
        explanation: &why,
        retry_after: None,
        // A request forwarded as plain HTTP came through HTTP_PROXY: the http:// form reaches
        // the proxy the same way.
        ask: deny::AskUrl::Http,
    }))
}

/// The pipeline's phases ([`pipeline::forwarded::phases`]), the request reserved against the
/// daily quotas (checked and counted at once) once its rules allowed it. `Err`: refused,
/// recorded.
async fn judged(
    (live, who, target, limit): (&Liveness, Who<'_>, &Target, u64),
    from: (
        crate::policy::Verdict,
        Option<&crate::policy::process::Process>,
    ),
    req: Request<Incoming>,
    audit: &mut AuditGuard,
) -> Result<(Request<ForwardBody>, Option<pipeline::forwarded::Found>), pipeline::Refusal> {
    let host = target.host.to_string();
    let at = (host.as_str(), target.port, limit);
    pipeline::forwarded::phases(who, at, from, req, audit, || live.reserve_waiting()).await
}

/// The sandbox's binding, who its decider phase asks and where its flow labels are kept.
type Who<'a> = (
    &'a crate::config::Binding,
    &'a dyn pipeline::ask::Asker,
    &'a pipeline::flow::Ledger,
);

/// A request the pipeline refused: its record finished, the §6 refusal.
fn refused(mut audit: AuditGuard, r: &pipeline::Refusal, failed: &Failed) -> Response<Body> {
    audit.close_if_unset(Close::Error);
    if let Some(p) = failed.provider {
        let resp = deny::provider_shaped(p, r.reason, &r.detail, Some(&failed.sandbox));
        audit.status(resp.status());
        return resp;
    }
    let resp = deny::response(&deny::Wording {
        reason: r.reason,
        what: &failed.what,
        sandbox: Some(&failed.sandbox),
        explanation: &r.detail,
        retry_after: (r.reason == Reason::QuotaExceeded)
            .then(|| crate::egress::quota::until_tomorrow().as_secs()),
        ask: deny::AskUrl::Http,
    });
    audit.status(resp.status());
    resp
}

/// What happens when a forwarded response's body ends: the upstream connection is kept for
/// the next request of the same sandbox and authority when it ended cleanly, closed
/// otherwise; the record says how it ended; the watcher is told the exchange is over.
fn finish(
    after: (
        Arc<UpstreamPool>,
        crate::egress::clearance::Clearance,
        Upstream,
    ),
    exchange: SharedExchange,
    done_tx: oneshot::Sender<()>,
) -> impl FnOnce(crate::relay::counted::Ending) + Send + Sync + 'static {
    // In a mutex: the connection is not `Sync`, the callback must be.
    let after = Mutex::new(Some(after));
    move |ending| {
        if let Some((upstreams, clearance, up)) = after.lock().ok().and_then(|mut a| a.take()) {
            if ending.complete {
                upstreams.put(&clearance, up);
            } else {
                up.cut.close();
            }
        }
        with_audit(&exchange, |a| {
            a.body_sha256(ending.sha256);
            // A cut the proxy made (a grant's end, a quota, a stop) already says why.
            if !ending.complete && !a.has_detail() {
                a.detail(match ending.error {
                    Some(e) => format!("upstream: {e}"),
                    None => "the client went away before the response ended".into(),
                });
            }
            a.close_if_unset(if ending.complete {
                Close::Eof
            } else {
                Close::Error
            });
        });
        drop(done_tx);
    }
}

/// Watch an exchange until it ends (the returned sender dropped): on revocation or shutdown
/// record why and reset both connections (nothing queued reaches the origin or the client);
/// when nothing moved in either direction for `idle_ms` — an origin that never answers, a
/// client that stopped sending its body — close both. The record and the client's cut come
/// *before* the upstream connection is dropped: the handler must never see the upstream
/// error first and answer the client with a 502.
fn watch_exchange(
    watch: Watch,
    exchange: &SharedExchange,
    cut: &Arc<Cut>,
    upstream_cut: &Arc<Cut>,
    live: &Arc<Liveness>,
) -> oneshot::Sender<()> {
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let stop = {
        let (exchange, cut, upstream_cut) = (exchange.clone(), cut.clone(), upstream_cut.clone());
        async move {
            let granted_by = watch.granted_by();
            let close = watch.stopped().await;
            with_audit(&exchange, |a| {
                a.close(close);
                if let Some(d) = Watch::cut_detail(close, granted_by.as_deref()) {
                    a.detail(d);
                }
            });
            cut.abort();
            upstream_cut.abort();
        }
    };
    let idle = {
        let live = live.clone();
        let (exchange, cut, upstream_cut) = (exchange.clone(), cut.clone(), upstream_cut.clone());
        async move {
            live.idle().await;
            with_audit(&exchange, |a| {
                a.close_if_unset(Close::Idle);
                a.detail("nothing moved in either direction for timeouts.idle_ms");
            });
            cut.close();
            upstream_cut.close();
        }
    };
    let spent = {
        let live = live.clone();
        let (exchange, cut, upstream_cut) = (exchange.clone(), cut.clone(), upstream_cut.clone());
        async move {
            live.quota_spent().await;
            with_audit(&exchange, |a| {
                a.relayed_until(Close::Limit);
                if let Some(cut) = live.cut_by() {
                    a.detail(cut);
                }
            });
            // The client keeps what it was counted for: its connection ends with a FIN after
            // the bytes already passed (a reset would discard them from its socket buffer).
            cut.close();
            upstream_cut.abort();
        }
    };
    let watcher_exchange = exchange.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = done_rx => {}
            _ = stop => {}
            _ = idle => {}
            _ = spent => {}
        }
        drop(watcher_exchange);
    });
    done_tx
}

/// The client's request could not be sent as it was (a malformed body): 400, recorded as
/// `malformed_request` — the client's fault, not the origin's.
fn bad_request(exchange: &SharedExchange, e: &str, failed: &Failed) -> Response<Body> {
    with_audit(exchange, |a| {
        a.decision(&Decision::deny(Reason::MalformedRequest, None));
        a.detail(format!("client: {e}"));
        a.close_if_unset(Close::Error);
    });
    deny::response(&deny::Wording {
        reason: Reason::MalformedRequest,
        what: &failed.what,
        sandbox: Some(&failed.sandbox),
        explanation: &format!("the request could not be read as sent ({e})"),
        retry_after: None,
        ask: deny::AskUrl::Http,
    })
}

/// The parent refused a forwarded request ([`parent::refusal`]): 502 `upstream_proxy_refused`
/// with its status line, as for a refused CONNECT (its body is not passed on).
fn refused_by_parent(exchange: &SharedExchange, detail: &str, failed: &Failed) -> Response<Body> {
    with_audit(exchange, |a| {
        a.decision(&Decision::deny(Reason::UpstreamProxyRefused, None));
        a.detail(detail.to_string());
        a.close_if_unset(Close::Error);
    });
    deny::response(&deny::Wording {
        reason: Reason::UpstreamProxyRefused,
        what: &failed.what,
        sandbox: Some(&failed.sandbox),
        explanation: detail,
        retry_after: None,
        ask: deny::AskUrl::Http,
    })
}

/// `req` as the origin gets it: hop-by-hop headers and the proxy's credentials gone, origin
/// form, `Host` the decided authority, and its body counted (and shaped under `shaper`).
/// Through a parent: absolute form naming what is asked of the parent, and the parent's own
/// `Proxy-Authorization`.
fn for_origin(
    req: Request<ForwardBody>,
    host: &str,
    live: Arc<Liveness>,
    shaper: Option<Arc<SandboxLimiter>>,
    through: Option<&Through>,
) -> Request<crate::egress::upstream_pool::ReqBody> {
    let (mut parts, body) = req.into_parts();
    let body = Counted::new(body, live, true).boxed();
    let body = match shaper {
        Some(limiter) => ShapedBody::new(body, limiter, true).boxed(),
        None => body,
    };
    strip_hop_by_hop(&mut parts.headers);
    // RFC 9112 §3.2.2: the request-target's authority is what was decided and dialled, and
    // the Host sent upstream is that authority — never the client's own `Host` (a
    // virtual-hosted origin would otherwise serve a host that was not decided).
    parts.headers.remove(header::HOST);
    if let Ok(v) = host.parse() {
        parts.headers.insert(header::HOST, v);
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = match through {
        None => path.parse::<Uri>(),
        Some(t) => format!("http://{}{path}", t.asked).parse::<Uri>(),
    }
    .unwrap_or_else(|_| Uri::from_static("/"));
    if let Some(auth) = through.and_then(|t| t.parent.authorization.as_ref()) {
        if let Ok(mut v) = http::HeaderValue::from_str(auth.value()) {
            v.set_sensitive(true);
            parts.headers.insert(header::PROXY_AUTHORIZATION, v);
        }
    }
    parts.version = http::Version::HTTP_11;
    Request::from_parts(parts, body)
}

/// The request was allowed but the origin did not answer it properly: 502, recorded as
/// `connection_refused` with the error (unless the exchange was revoked meanwhile).
fn bad_gateway(
    exchange: &SharedExchange,
    e: &dyn std::fmt::Display,
    failed: &Failed,
) -> Response<Body> {
    with_audit(exchange, |a| {
        a.decision(&Decision::deny(Reason::ConnectionRefused, None));
        a.detail(format!("upstream: {e}"));
        a.close_if_unset(Close::Error);
    });
    deny::response(&deny::Wording {
        reason: Reason::ConnectionRefused,
        what: &failed.what,
        sandbox: Some(&failed.sandbox),
        explanation: &format!("the destination did not answer the request properly ({e})"),
        retry_after: None,
        ask: deny::AskUrl::Http,
    })
}

/// What a 502 says about the request.
struct Failed {
    what: String,
    sandbox: String,
    /// The host's LLM provider, whose error shape its refusals take.
    provider: Option<crate::policy::protocols::inference::Provider>,
}

impl Failed {
    /// How a refusal or a 502 names the request: method and decided authority (`host`), never
    /// the path or query.
    fn of(
        method: &http::Method,
        host: &str,
        binding: &crate::config::Binding,
        clearance: &crate::egress::clearance::Clearance,
    ) -> Failed {
        let provider = pipeline::head::provider_of(binding, &clearance.target.host.to_string());
        Failed {
            what: format!("{method} http://{host}"),
            sandbox: binding.id.to_string(),
            provider,
        }
    }
}
