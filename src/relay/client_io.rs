//! The client side of an explicit-proxy connection: plain TCP (`listen.proxy`) or TLS over
//! TCP (`listen.proxy_tls`) — and, for a tunnel opened on an HTTP/2 connection, that one
//! stream. Everything after the handshake treats them alike; relays that can splice, and
//! resets, reach the TCP socket underneath through [`OverTcp`] (an HTTP/2 stream has none
//! of its own: it is reset alone by dropping it, its siblings untouched).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::relay::abortable::OverTcp;

/// A client connection.
pub enum ClientIo {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// A CONNECT stream of an HTTP/2 connection (RFC 9113 §8.5).
    H2(Box<TokioIo<hyper::upgrade::Upgraded>>),
}

impl ClientIo {
    /// Reset the client side at once: the TCP socket (nothing queued is sent), or for an
    /// HTTP/2 stream nothing here — it is reset when dropped.
    pub fn reset(&self) {
        if let Some(t) = self.tcp() {
            let _ = t.set_zero_linger();
        }
    }
}

impl OverTcp for ClientIo {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ClientIo::Tcp(t) => Some(t),
            ClientIo::Tls(t) => Some(t.get_ref().0),
            ClientIo::H2(_) => None,
        }
    }
}

impl OverTcp for TlsStream<TcpStream> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.get_ref().0)
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Tcp(t) => Pin::new(t).poll_read(cx, buf),
            ClientIo::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
            ClientIo::H2(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Tcp(t) => Pin::new(t).poll_write(cx, buf),
            ClientIo::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
            ClientIo::H2(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Tcp(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            ClientIo::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
            ClientIo::H2(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientIo::Tcp(t) => t.is_write_vectored(),
            ClientIo::Tls(t) => t.is_write_vectored(),
            ClientIo::H2(t) => t.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Tcp(t) => Pin::new(t).poll_flush(cx),
            ClientIo::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
            ClientIo::H2(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            ClientIo::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
            ClientIo::H2(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}
