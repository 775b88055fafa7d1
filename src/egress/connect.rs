//! One TCP connect to a checked address, its outcome read from what epoll reports.
//!
//! `tokio::net::TcpStream::connect` waits for the socket to become writable and then asks the
//! kernel for the socket's error (`getsockopt(SO_ERROR)`): one system call on every dial, for
//! an answer epoll has already given. A connect that failed wakes its socket with `EPOLLERR`
//! (and `EPOLLHUP`, the socket being closed), which tokio reports as the write side closed; a
//! connect that succeeded wakes it writable only. So the error is asked for only when the
//! connect failed, to say why. Issue 67 counts the call (docs/performance-history.md).

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Connect to `addr`: a non-blocking socket, `connect(2)`, then wait until epoll says how it
/// went. The caller bounds the wait (a timeout drops the socket, which closes it).
pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let kind = Type::from(libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let socket = Socket::new(Domain::for_address(addr), kind, Some(Protocol::TCP))?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    let ready = stream.ready(Interest::WRITABLE).await?;
    if ready.is_write_closed() || ready.is_error() {
        let why = stream.take_error()?;
        return Err(why.unwrap_or_else(|| io::ErrorKind::ConnectionRefused.into()));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connects_to_a_listener_and_carries_bytes() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(connect(addr), l.accept());
        let mut dialed = dialed.unwrap();
        let (mut peer, _) = accepted.unwrap();
        dialed.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        assert_eq!(dialed.peer_addr().unwrap(), addr);
    }

    /// A port nobody listens on: refused, with the kernel's reason, not a socket that looks
    /// connected.
    #[tokio::test]
    async fn a_refused_connect_is_an_error() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let err = connect(addr).await.expect_err("nothing listens there");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    }

    /// Over IPv6 too (the socket's family follows the address).
    #[tokio::test]
    async fn connects_over_ipv6() {
        let l = tokio::net::TcpListener::bind("[::1]:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(connect(addr), l.accept());
        assert_eq!(dialed.unwrap().peer_addr().unwrap(), addr);
        accepted.unwrap();
    }
}
