//! The original destination of a redirected connection — the one fenced module with
//! `unsafe`. iptables `REDIRECT` rewrites the destination and keeps the original in
//! conntrack, readable with `getsockopt(SO_ORIGINAL_DST)` (IPv4) or
//! `getsockopt(IP6T_SO_ORIGINAL_DST)` (IPv6). With TPROXY the socket's local address *is* the
//! original destination, so when conntrack has no entry the local address is returned; TPROXY
//! listeners need `IP_TRANSPARENT` / `IPV6_TRANSPARENT` set before `bind`
//! ([`set_transparent`]).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

use tokio::net::TcpStream;

/// `SO_ORIGINAL_DST` and `IP6T_SO_ORIGINAL_DST` share the number 80 (linux/netfilter_ipv4.h,
/// linux/netfilter_ipv6/ip6_tables.h).
const SO_ORIGINAL_DST: libc::c_int = 80;

/// How the original destination was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From conntrack (REDIRECT / DNAT).
    Conntrack,
    /// The socket's local address (TPROXY, or no redirection at all).
    LocalAddr,
}

/// The destination the client originally connected to.
pub fn original_dst(stream: &TcpStream) -> io::Result<(SocketAddr, Source)> {
    let local = stream.local_addr()?;
    let fd = stream.as_raw_fd();
    let found = match local {
        SocketAddr::V4(_) => ipv4(fd),
        SocketAddr::V6(l) if l.ip().to_ipv4_mapped().is_some() => ipv4(fd),
        SocketAddr::V6(_) => ipv6(fd),
    };
    match found {
        Ok(addr) => Ok((addr, Source::Conntrack)),
        Err(_) => Ok((local, Source::LocalAddr)),
    }
}

fn ipv4(fd: libc::c_int) -> io::Result<SocketAddr> {
    let mut addr: libc::sockaddr_in = zeroed_in();
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket owned by the caller's TcpStream for the duration of the
    // call; `addr` is a properly sized, writable sockaddr_in and `len` holds its size, which
    // the kernel updates. No pointer outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(
        ip,
        u16::from_be(addr.sin_port),
    )))
}

fn ipv6(fd: libc::c_int) -> io::Result<SocketAddr> {
    let mut addr: libc::sockaddr_in6 = zeroed_in6();
    let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: as in `ipv4`, with a sockaddr_in6 buffer of the size passed in `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_IPV6,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in6).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let ip = Ipv6Addr::from(addr.sin6_addr.s6_addr);
    Ok(SocketAddr::V6(SocketAddrV6::new(
        ip,
        u16::from_be(addr.sin6_port),
        0,
        0,
    )))
}

/// Let a listening socket accept connections addressed to non-local addresses (TPROXY).
/// Needs CAP_NET_ADMIN. Call before `bind`.
pub fn set_transparent(socket: &impl AsRawFd, ipv6: bool) -> io::Result<()> {
    let (level, name) = if ipv6 {
        (libc::SOL_IPV6, libc::IPV6_TRANSPARENT)
    } else {
        (libc::SOL_IP, libc::IP_TRANSPARENT)
    };
    let one: libc::c_int = 1;
    // SAFETY: the descriptor is a valid socket for the duration of the call, and the option
    // value points at a live c_int whose size is passed alongside it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn zeroed_in() -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: 0,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: 0 },
        sin_zero: [0; 8],
    }
}

fn zeroed_in6() -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: 0,
        sin6_port: 0,
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
        sin6_scope_id: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unredirected_connection_reports_its_local_address() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let _c = TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let (dst, _) = original_dst(&s).unwrap();
        assert_eq!(dst, addr);
    }
}
