//! The client side of an explicit-proxy connection: plain TCP (`listen.proxy`) or TLS over
//! TCP (`listen.proxy_tls`) — and, for a tunnel opened on an HTTP/2 connection, that one
//! stream. Everything after the handshake treats them alike; relays that can splice, and
//! resets, reach the TCP socket underneath through [`OverTcp`] (an HTTP/2 stream has none
//! of its own: it is reset alone by dropping it, its siblings untouched).

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::egress::abortable::OverTcp;

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

crate::egress::delegate_io!(ClientIo { Tcp, Tls, H2 });
