//! The upstream side of a terminated tunnel: one HTTP/1.1 or HTTP/2 connection over the
//! verified TLS stream (or, for plain HTTP inside a tunnel, over the dialled connection), and
//! the requests sent on it. The connection is driven by its own task until the origin closes
//! it, every sender is gone, or its [`Cut`] fires — so it can outlive its tunnel, kept idle
//! for the next one ([`crate::intercept::kept`]).

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

use std::sync::Arc;

use super::UpBody;
use crate::egress::abortable::Cut;
use crate::intercept::error::InterceptError;
use crate::relay::counted::Counted;

/// The upstream connection's request side.
pub enum Upstream {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Counted<UpBody>>>),
    H2(hyper::client::conn::http2::SendRequest<Counted<UpBody>>),
}

impl Upstream {
    /// HTTP/2 or HTTP/1.1 over `io`: the verified TLS stream, or the dialled TCP connection
    /// for plain HTTP inside a tunnel; driven until the origin closes it or `cut` fires.
    pub async fn connect<S>(io: S, h2: bool, cut: &Arc<Cut>) -> Result<Self, InterceptError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|source| InterceptError::Upstream {
                    version: "HTTP/2",
                    source,
                })?;
            drive(conn, cut);
            Ok(Upstream::H2(send))
        } else {
            let (send, conn) =
                hyper::client::conn::http1::handshake(io)
                    .await
                    .map_err(|source| InterceptError::Upstream {
                        version: "HTTP/1.1",
                        source,
                    })?;
            // A WebSocket handshake hands the connection over after its `101`.
            drive(conn.with_upgrades(), cut);
            Ok(Upstream::H1(tokio::sync::Mutex::new(send)))
        }
    }

    /// Free for a request now (an HTTP/1.1 connection between requests, an HTTP/2 one under
    /// its stream limit) and not closed by the origin.
    pub fn ready(&mut self) -> bool {
        match self {
            Upstream::H1(s) => {
                let s = s.get_mut();
                s.is_ready() && !s.is_closed()
            }
            Upstream::H2(s) => s.is_ready() && !s.is_closed(),
        }
    }

    /// Closed by the origin (a connection in use is not).
    pub fn closed(&self) -> bool {
        match self {
            Upstream::H1(s) => s.try_lock().is_ok_and(|s| s.is_closed()),
            Upstream::H2(s) => s.is_closed(),
        }
    }

    pub(super) async fn send(
        &self,
        req: Request<Counted<UpBody>>,
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

/// Run a connection's task until it ends or `cut` fires (dropping it closes the socket; with a
/// reset after an abort). A cut dropped without firing changes nothing.
fn drive<F>(conn: F, cut: &Arc<Cut>)
where
    F: std::future::Future + Send + 'static,
{
    let mut fired = cut.subscribe();
    tokio::spawn(async move {
        // A cut dropped unfired (nobody can keep the connection) leaves it to end by itself.
        tokio::select! {
            _ = conn => {}
            Ok(()) = fired.changed() => {}
        }
    });
}
