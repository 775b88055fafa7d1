//! Cutting an HTTP connection that hyper owns. A [`Cut`] is one client connection's switch:
//! [`Cut::close`] ends it in order (FIN — an idle exchange), [`Cut::abort`] ends it with a
//! reset (a revoked or shutdown-expired exchange: the kernel discards what is queued, so
//! nothing more reaches the client or the origin). The sockets are wrapped in [`Abortable`],
//! which sets `SO_LINGER` 0 when it is dropped after an abort; hyper's connection futures own
//! them, and dropping those futures closes the sockets.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// One client connection's switch (shared with the upstream connections of its exchanges).
#[derive(Debug)]
pub struct Cut {
    fired: watch::Sender<bool>,
    abort: AtomicBool,
}

impl Cut {
    pub fn new() -> Arc<Cut> {
        Arc::new(Cut {
            fired: watch::channel(false).0,
            abort: AtomicBool::new(false),
        })
    }

    /// End the connection with a FIN.
    pub fn close(&self) {
        let _ = self.fired.send(true);
    }

    /// End the connection, and every socket wrapped with this switch, with a reset.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Release);
        let _ = self.fired.send(true);
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Changes when the connection is to end.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.fired.subscribe()
    }
}

/// A stream with (usually) a TCP socket of its own underneath — plain, or TLS over TCP: what
/// can be reset. An HTTP/2 stream shares its connection's socket with its siblings, so it has
/// none (`None`): it is reset by dropping it (RST_STREAM), never by resetting the socket.
pub trait OverTcp: AsyncRead + AsyncWrite + Unpin {
    fn tcp(&self) -> Option<&TcpStream>;
}

impl OverTcp for TcpStream {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

/// A TCP socket (or a stream over one) that is reset instead of closed when dropped after its
/// [`Cut`] aborted.
pub struct Abortable<S: OverTcp = TcpStream> {
    /// `None` only after [`Abortable::into_inner`].
    stream: Option<S>,
    cut: Arc<Cut>,
}

impl<S: OverTcp> Abortable<S> {
    pub fn new(stream: S, cut: Arc<Cut>) -> Self {
        Abortable {
            stream: Some(stream),
            cut,
        }
    }

    /// The socket itself (a CONNECT tunnel takes it over and closes it its own way).
    pub fn into_inner(mut self) -> Option<S> {
        self.stream.take()
    }

    fn stream(&mut self) -> io::Result<Pin<&mut S>> {
        match self.stream.as_mut() {
            Some(s) => Ok(Pin::new(s)),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

impl<S: OverTcp> Drop for Abortable<S> {
    fn drop(&mut self) {
        if let Some(s) = &self.stream {
            if self.cut.aborted() {
                if let Some(t) = s.tcp() {
                    let _ = t.set_zero_linger();
                }
            }
        }
    }
}

impl<S: OverTcp> AsyncRead for Abortable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl<S: OverTcp> AsyncWrite for Abortable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(s) => s.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}
