//! The upstream side of a terminated tunnel: one HTTP/1.1 or HTTP/2 connection over the
//! verified TLS stream (or, for plain HTTP inside a tunnel, over the dialled connection), and
//! the requests sent on it.

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::UpBody;
use crate::intercept::error::InterceptError;
use crate::relay::counted::Counted;

/// The upstream connection's request side.
pub enum Upstream {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Counted<UpBody>>>),
    H2(hyper::client::conn::http2::SendRequest<Counted<UpBody>>),
}

impl Upstream {
    /// HTTP/2 or HTTP/1.1 over `io`: the verified TLS stream, or the dialled TCP connection
    /// for plain HTTP inside a tunnel.
    pub async fn connect<S>(io: S, h2: bool) -> Result<Self, InterceptError>
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
            // A WebSocket handshake hands the connection over after its `101`.
            tokio::spawn(conn.with_upgrades());
            Ok(Upstream::H1(tokio::sync::Mutex::new(send)))
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
