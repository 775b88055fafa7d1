//! The admin listener (`listen.admin`): `GET /healthz`, `GET /readyz` (policy loaded and
//! listeners bound) and `GET /metrics` (Prometheus text). Read-only; nothing here can change
//! policy.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::shared::Shared;

/// Serve one admin connection.
pub async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(route(&shared, &req)) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(10))
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn route(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let plain = "text/plain; charset=utf-8";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, plain, "ok\n".into()),
        (&Method::GET, "/readyz") => {
            if shared.ready.load(Ordering::Acquire) {
                text(
                    StatusCode::OK,
                    plain,
                    format!("ready: policy {}\n", shared.policy.load().version()),
                )
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, plain, "not ready\n".into())
            }
        }
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            shared.metrics.render(),
        ),
        _ => text(StatusCode::NOT_FOUND, plain, "not found\n".into()),
    }
}
