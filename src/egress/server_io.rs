//! The destination side of an allowed exchange: the TCP socket dialled to the destination (or
//! to an `http://` parent proxy, positioned inside its tunnel), or TLS to an `https://` parent
//! with the tunnel inside it. Relays that can splice need both sides plain TCP
//! ([`ServerIo::into_tcp`]); resets reach the socket underneath through [`OverTcp`].

use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::egress::abortable::OverTcp;

/// A connection toward the destination.
#[derive(Debug)]
pub enum ServerIo {
    Tcp(TcpStream),
    /// Through an `https://` parent: the tunnel's bytes travel inside TLS to the parent.
    Tls(Box<TlsStream<TcpStream>>),
}

impl ServerIo {
    /// The plain socket, for the zero-copy relay; `Err` gives a TLS connection back.
    pub fn into_tcp(self) -> Result<TcpStream, ServerIo> {
        match self {
            ServerIo::Tcp(t) => Ok(t),
            other => Err(other),
        }
    }

    /// Reset it at once when it is closed: nothing queued is sent.
    pub fn reset(&self) {
        if let Some(t) = self.tcp() {
            let _ = t.set_zero_linger();
        }
    }
}

impl OverTcp for ServerIo {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ServerIo::Tcp(t) => Some(t),
            ServerIo::Tls(t) => Some(t.get_ref().0),
        }
    }
}

crate::egress::delegate_io!(ServerIo { Tcp, Tls });
