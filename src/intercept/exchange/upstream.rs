//! The upstream side of a terminated tunnel: one HTTP/1.1 or HTTP/2 connection over the
//! verified TLS stream (or, for plain HTTP inside a tunnel, over the dialled connection), and
//! the requests sent on it. The connection is driven by its own task until the origin closes
//! it, every sender is gone, or its [`Cut`] fires — so it can outlive its tunnel, kept idle
//! for the next one ([`crate::intercept::kept`]).
//!
//! A tunnel that took a kept connection keeps its own dialled socket as a [`Spare`] until its
//! first request is answered, [`SPARE_LIFE`] at most (a connection the proxy opened and does
//! not use is not left silent at the origin for the tunnel's life): when the origin closed the kept connection as the request was
//! sent — before the request was written, or, for an idempotent request without a body,
//! before an answer's head came back — the request goes again, once, over TLS opened on the spare to the
//! same checked address (verified for the same name, the same protocol required). The tunnel
//! then never gives its connection back to the pool: the kept one's cut no longer covers it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use super::UpBody;
use crate::egress::abortable::{Abortable, Cut};
use crate::egress::server_io::ServerIo;
use crate::intercept::error::InterceptError;
use crate::relay::boxed_spawn::BoxedSpawn;
use crate::relay::counted::Counted;

/// What a request to the upstream carries.
type Req = Request<Counted<UpBody>>;

/// The longest a tunnel keeps its spare socket: the race it covers — the origin closing a
/// kept connection as the first request goes out on it — comes right after the client's
/// handshake.
pub const SPARE_LIFE: Duration = Duration::from_secs(2);

/// The upstream connection's request side, and the tunnel's spare socket while it has one.
pub struct Upstream {
    first: Sender,
    /// The connection opened on the spare, once the kept one failed (at most once).
    replacement: OnceLock<Sender>,
    /// Set on a kept connection (shared with the timer that drops it after [`SPARE_LIFE`]).
    spare: Option<Arc<SpareSlot>>,
}

/// Where a tunnel's spare waits.
struct SpareSlot {
    spare: Mutex<Option<Spare>>,
    /// Whether `spare` holds one: read on every request, without the lock.
    held: AtomicBool,
}

impl SpareSlot {
    /// The spare, taken (`None` when none is held).
    fn take(&self) -> Option<Spare> {
        if !self.held.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.spare.lock().ok().and_then(|mut s| s.take())
    }
}

/// One connection's request side.
enum Sender {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Counted<UpBody>>>),
    H2(hyper::client::conn::http2::SendRequest<Counted<UpBody>>),
}

/// A tunnel's own dialled socket to the checked address, kept while its first request is on a
/// kept connection, and how to open TLS on it as the kept connection was.
pub struct Spare {
    /// The dialled, checked connection.
    pub server: ServerIo,
    /// The upstream TLS configuration the kept connection was opened with.
    pub connector: tokio_rustls::TlsConnector,
    /// The name it was verified for.
    pub name: ServerName<'static>,
    /// The protocol the origin chose then (the client was offered only it).
    pub alpn: Option<Vec<u8>>,
    /// `timeouts.header_ms`: the bound on the two handshakes.
    pub handshake: Duration,
}

impl Upstream {
    /// HTTP/2 or HTTP/1.1 over `io`: the verified TLS stream, or the dialled TCP connection
    /// for plain HTTP inside a tunnel; driven until the origin closes it or `cut` fires.
    pub async fn connect<S>(io: S, h2: bool, cut: &Arc<Cut>) -> Result<Self, InterceptError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        Ok(Upstream {
            first: Sender::open(io, h2, cut).await?,
            replacement: OnceLock::new(),
            spare: None,
        })
    }

    /// Keep `spare` for the first request (a tunnel on a kept connection), for
    /// [`SPARE_LIFE`] at most; it closes with the tunnel before that.
    pub fn with_spare(mut self, spare: Spare) -> Self {
        let slot = Arc::new(SpareSlot {
            spare: Mutex::new(Some(spare)),
            held: AtomicBool::new(true),
        });
        let timer = Arc::downgrade(&slot);
        tokio::spawn(async move {
            tokio::time::sleep(SPARE_LIFE).await;
            drop(timer.upgrade().and_then(|s| s.take()));
        });
        self.spare = Some(slot);
        self
    }

    /// A second handle on this HTTP/2 connection, for another tunnel of the same key: its
    /// requests go as streams of their own beside this one's. `None` on HTTP/1.1 (one request
    /// at a time) and once the spare replaced the connection.
    pub fn share(&self) -> Option<Upstream> {
        match (&self.first, self.replacement.get()) {
            (Sender::H2(s), None) => Some(Upstream {
                first: Sender::H2(s.clone()),
                replacement: OnceLock::new(),
                spare: None,
            }),
            _ => None,
        }
    }

    /// The connection requests go on: the replacement, once there is one.
    fn sender(&self) -> &Sender {
        self.replacement.get().unwrap_or(&self.first)
    }

    /// Whether requests go over HTTP/2.
    pub fn is_h2(&self) -> bool {
        matches!(self.sender(), Sender::H2(_))
    }

    /// Whether a spare is held (the request can be sent again).
    pub(super) fn has_spare(&self) -> bool {
        (self.spare.as_ref()).is_some_and(|s| s.held.load(Ordering::Acquire))
    }

    /// Whether the spare replaced the kept connection (it is not to be kept again).
    pub fn replaced(&self) -> bool {
        self.replacement.get().is_some()
    }

    /// Free for a request now (an HTTP/1.1 connection between requests, an HTTP/2 one under
    /// its stream limit) and not closed by the origin.
    pub fn ready(&mut self) -> bool {
        let sender = match self.replacement.get_mut() {
            Some(r) => r,
            None => &mut self.first,
        };
        match sender {
            Sender::H1(s) => {
                let s = s.get_mut();
                s.is_ready() && !s.is_closed()
            }
            Sender::H2(s) => s.is_ready() && !s.is_closed(),
        }
    }

    /// Closed by the origin (a connection in use is not).
    pub fn closed(&self) -> bool {
        match self.sender() {
            Sender::H1(s) => s.try_lock().is_ok_and(|s| s.is_closed()),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// Send `req`; with a spare held, once more on a new connection if the kept one was
    /// closed under it (`again`: the copy of an idempotent request without a body). The
    /// answer, and whether it came on the new connection.
    pub(super) async fn send(
        &self,
        req: Req,
        again: Option<Req>,
    ) -> Result<(Response<Incoming>, bool), hyper::Error> {
        let (e, back) = match self.sender().send(req).await {
            Ok(resp) => {
                self.drop_spare();
                return Ok((resp, false));
            }
            Err(failed) => failed,
        };
        // Not written at all, or idempotent with no head of an answer back (RFC 9110
        // §9.2.2: such a request may be sent again after a connection failed under it).
        let retry = back.or(again);
        let spare = self.take_spare();
        let (Some(req), Some(spare)) = (retry, spare) else {
            return Err(e);
        };
        // Boxed: a TLS handshake's future is most of 10 KB, and this rare branch would
        // otherwise make every request's future (moved and spawned per request) that big.
        let Some(new) = Box::pin(spare.open()).await else {
            return Err(e);
        };
        // The spare is taken once, under its lock: only one replacement is ever set.
        if self.replacement.set(new).is_err() {
            return Err(e);
        }
        let sent = self.sender().send(req).await;
        sent.map(|r| (r, true)).map_err(|(e, _)| e)
    }

    /// The spare, taken (`None` when none is held).
    fn take_spare(&self) -> Option<Spare> {
        self.spare.as_ref().and_then(|s| s.take())
    }

    fn drop_spare(&self) {
        // A read first: most requests have no spare to drop.
        if self.has_spare() {
            drop(self.take_spare());
        }
    }
}

impl Sender {
    async fn open<S>(io: S, h2: bool, cut: &Arc<Cut>) -> Result<Self, InterceptError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(BoxedSpawn, io)
                .await
                .map_err(|source| InterceptError::Upstream {
                    version: "HTTP/2",
                    source,
                })?;
            drive(conn, cut);
            Ok(Sender::H2(send))
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
            Ok(Sender::H1(tokio::sync::Mutex::new(send)))
        }
    }

    /// Send `req`; on failure, the error and the request when it was not sent.
    async fn send(&self, req: Req) -> Result<Response<Incoming>, (hyper::Error, Option<Req>)> {
        match self {
            Sender::H1(s) => {
                let mut s = s.lock().await;
                if let Err(e) = s.ready().await {
                    return Err((e, Some(req)));
                }
                s.try_send_request(req).await.map_err(|mut e| {
                    let back = e.take_message();
                    (e.into_error(), back)
                })
            }
            Sender::H2(s) => {
                let mut s = s.clone();
                if let Err(e) = s.ready().await {
                    return Err((e, Some(req)));
                }
                s.try_send_request(req).await.map_err(|mut e| {
                    let back = e.take_message();
                    (e.into_error(), back)
                })
            }
        }
    }
}

impl Spare {
    /// TLS to the same name on the spare socket, requiring the protocol the client was
    /// offered, then HTTP on it. `None` when any of it fails.
    async fn open(self) -> Option<Sender> {
        let cut = Cut::new();
        let server = Abortable::new(self.server, cut.clone());
        let connect = self.connector.connect(self.name, server);
        let tls = tokio::time::timeout(self.handshake, connect)
            .await
            .ok()?
            .ok()?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        if alpn != self.alpn {
            return None;
        }
        let h2 = alpn.as_deref() == Some(b"h2");
        let open = Sender::open(tls, h2, &cut);
        tokio::time::timeout(self.handshake, open).await.ok()?.ok()
    }
}

/// A copy of `req` with an empty body, to send again, if it is idempotent and has none.
pub(super) fn resendable<B: hyper::body::Body>(
    req: &Request<B>,
    body: impl FnOnce() -> Counted<UpBody>,
) -> Option<Req> {
    if !crate::egress::upstream_pool::may_send_again(req) {
        return None;
    }
    let mut again = Request::new(body());
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    Some(again)
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
