//! Sending a forwarded request to its origin ([`super::forward`]): on the kept connection or
//! the one dialled, and once more on a new connection to the same checked address when the
//! origin closed a kept one under it.

use bytes::Bytes;
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::forward::{with_audit, SharedExchange};
use crate::audit::metrics::Metrics;
use crate::egress::admit::{Route, Through};
use crate::egress::parent;
use crate::egress::upstream_pool::Upstream;
use crate::policy::cause::{of, Why};

/// Send the request on `up`. A kept connection may have been closed by the origin just as it
/// was taken: a request that never left, or a bodiless idempotent one that got no answer, is
/// sent again once on a new connection to the same checked address (RFC 9110 §9.2.2). An
/// error of the request itself (its body from the client could not be read: bad chunked
/// framing, a short body) is the client's, not the origin's.
pub(super) async fn send(
    dial: (std::time::Duration, &Metrics),
    exchange: &SharedExchange,
    up: &mut Upstream,
    upstream_req: Request<crate::egress::upstream_pool::ReqBody>,
) -> Result<Response<Incoming>, Sent> {
    let again = (up.reused > 0).then(|| resendable(&upstream_req)).flatten();
    match up.sender.try_send_request(upstream_req).await {
        Ok(resp) => Ok(resp),
        Err(e) if e.error().is_user() => Err(Sent::Client(of(e.into_error()))),
        Err(mut e) if up.reused > 0 => {
            let unanswered = e.error().is_incomplete_message() || e.error().is_canceled();
            let Some(req) = e
                .take_message()
                .or_else(|| again.filter(|_| unanswered).map(Resend::request))
            else {
                return Err(Sent::Origin(of(e.into_error())));
            };
            *up = redial(dial, up).await?;
            with_audit(exchange, |a| {
                a.detail("the kept upstream connection was closed by the origin; sent again on a new one")
            });
            up.sender
                .send_request(req)
                .await
                .map_err(|e| match e.is_user() {
                    true => Sent::Client(of(e)),
                    false => Sent::Origin(of(e)),
                })
        }
        Err(e) => Err(Sent::Origin(of(e.into_error()))),
    }
}

/// Why a forwarded request got no answer.
pub(super) enum Sent {
    /// The origin (or the way to it) failed.
    Origin(Why),
    /// The request could not be sent as the client gave it (its body was malformed).
    Client(Why),
}

/// What is needed to send a bodiless idempotent request again.
struct Resend {
    method: http::Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Resend {
    fn request(self) -> Request<crate::egress::upstream_pool::ReqBody> {
        let mut req = Request::new(
            http_body_util::Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        );
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.headers_mut() = self.headers;
        req
    }
}

/// A copy of `req` to send again if it is idempotent and has no body.
fn resendable<B: hyper::body::Body>(req: &Request<B>) -> Option<Resend> {
    crate::egress::upstream_pool::may_send_again(req).then(|| Resend {
        method: req.method().clone(),
        uri: req.uri().clone(),
        headers: req.headers().clone(),
    })
}

/// A new connection to the checked address `up` was connected to (the parent's, over TLS to
/// an `https://` parent), under `up`'s cut (which the exchange's watcher holds).
async fn redial(
    (timeout, metrics): (std::time::Duration, &Metrics),
    up: &Upstream,
) -> Result<Upstream, Sent> {
    let gone = "the kept connection closed, and a new one failed";
    let d = match &up.via {
        None => crate::egress::dial(&[up.addr.ip()], up.addr.port(), None, timeout, metrics)
            .await
            .map_err(|reason| Sent::Origin(format!("{gone} ({reason})").into()))?,
        Some(p) => parent::reach(p, &[up.addr.ip()], timeout, metrics)
            .await
            .map_err(|f| Sent::Origin(format!("{gone} ({})", f.detail).into()))?,
    };
    let mut new = Upstream::handshake_with(d.stream, d.addr, up.cut.clone())
        .await
        .map_err(|e| Sent::Origin(of(e)))?;
    new.via = up.via.clone();
    Ok(new)
}

/// The connection a forwarded request goes on: the kept one, or HTTP/1.1 on the one dialled
/// (to the origin, or to the parent it goes through).
pub(super) async fn upstream_of(
    route: Route,
    through: Option<&Through>,
) -> Result<Upstream, hyper::Error> {
    match route {
        Route::Kept(up) => Ok(up),
        Route::Dialed(d) => {
            let via = through.map(|t| t.parent.clone());
            Upstream::handshake(d.stream, d.addr, via).await
        }
    }
}
