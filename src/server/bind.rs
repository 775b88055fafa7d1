//! The listeners the configuration asks for, bound before anything else starts so that a
//! taken port or a bad certificate stops the start with a clear error.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, UdpSocket};

use crate::config::Config;
use crate::listen::explicit_tls::TlsServer;

/// A listener for TPROXY'd connections: `IP_TRANSPARENT` set before `bind`, so connections
/// addressed to any destination are accepted and keep their original destination as the
/// local address.
fn bind_tproxy(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    crate::listen::orig_dst::set_transparent(&socket, addr.is_ipv6())?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The DNS listener's sockets: one UDP socket per worker thread on the same address
/// (`SO_REUSEPORT`: the kernel spreads clients over them by address and port, so each receive
/// loop waits on a socket of its own and a datagram wakes one loop, not all), and TCP on the
/// same address. The address is first bound by a plain socket, so a port that anyone holds —
/// another egress-proxy's `SO_REUSEPORT` group included — is refused as taken instead of
/// silently shared (an old instance with an old policy would answer some of the queries).
/// With port 0 the ports are the one the kernel chose (retried a few times if another
/// process holds its TCP twin).
async fn bind_dns(addr: SocketAddr) -> std::io::Result<(Vec<UdpSocket>, TcpListener)> {
    let loops = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16);
    let mut last = None;
    for _ in 0..8 {
        let probe = std::net::UdpSocket::bind(addr)?;
        let bound = probe.local_addr()?;
        let tcp = match TcpListener::bind(bound).await {
            Ok(tcp) => tcp,
            Err(e) if addr.port() == 0 => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        drop(probe);
        let mut udp = Vec::with_capacity(loops);
        for _ in 0..loops {
            udp.push(reuseport_udp(bound)?);
        }
        return Ok((udp, tcp));
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port free for both UDP and TCP")))
}

/// A non-blocking UDP socket with `SO_REUSEPORT`, bound to `addr`. (Only sockets of the same
/// user can join the group: another user's process cannot take a share of the queries.)
fn reuseport_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage};
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket::socket(
        family,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::ReusePort, &true)?;
    socket::bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    )?;
    UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// Every listener of the configuration, bound (and the TLS listeners' certificates loaded).
pub(super) struct Listeners {
    pub proxy: Option<TcpListener>,
    pub proxy_tls: Option<(TcpListener, Arc<TlsServer>)>,
    pub transparent: Option<TcpListener>,
    pub admin: Option<TcpListener>,
    pub admin_tls: Option<Arc<TlsServer>>,
    pub dns: Option<(Vec<UdpSocket>, TcpListener)>,
    pub socks5: Option<TcpListener>,
}

/// The bound addresses, by listener.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Addrs {
    pub proxy: Option<SocketAddr>,
    pub proxy_tls: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub transparent: Option<SocketAddr>,
    pub dns: Option<SocketAddr>,
    pub socks5: Option<SocketAddr>,
}

impl Addrs {
    /// Every bound address (the proxy refuses to dial its own listeners).
    pub fn all(&self) -> Vec<SocketAddr> {
        [
            self.proxy,
            self.admin,
            self.transparent,
            self.dns,
            self.proxy_tls,
            self.socks5,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The socket options every data-plane connection wants, set once on its listener: Linux
/// copies them to each accepted socket, so no connection pays a `setsockopt` for them.
/// `TCP_NODELAY` (a proxy forwards what it has at once), and `SO_SNDBUF` at
/// `defaults.limits.socket_buffer_bytes` (what a client that stops reading may pin: a
/// sandbox with another value sets its own, [`crate::relay::buffers::cap`]).
fn data_plane_options(l: &TcpListener, sndbuf: Option<u32>) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(l, sockopt::TcpNoDelay, &true)?;
    if let Some(n) = sndbuf {
        setsockopt(l, sockopt::SndBuf, &(n as usize))?;
    }
    crate::relay::buffers::inherited(sndbuf);
    Ok(())
}

/// Bind `addr` for the listener named `what`, if configured.
async fn bind(what: &str, addr: Option<SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    match addr {
        Some(a) => Ok(Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("binding {what} {a}"))?,
        )),
        None => Ok(None),
    }
}

impl Listeners {
    pub async fn bind(config: &Config) -> anyhow::Result<Self> {
        let l = &config.listen;
        let transparent = match l.transparent {
            Some(a) if l.transparent_tproxy => Some(bind_tproxy(a).with_context(|| {
                format!("binding listen.transparent {a} for TPROXY (needs CAP_NET_ADMIN)")
            })?),
            a => bind("listen.transparent", a).await?,
        };
        let proxy_tls = match &l.proxy_tls {
            Some(t) => {
                let server = Arc::new(TlsServer::load(t, true)?);
                bind("listen.proxy_tls", Some(t.addr))
                    .await?
                    .map(|listener| (listener, server))
            }
            None => None,
        };
        let dns = match l.dns {
            Some(a) => Some(
                bind_dns(a)
                    .await
                    .with_context(|| format!("binding listen.dns {a} (UDP and TCP)"))?,
            ),
            None => None,
        };
        let admin_tls = match &l.admin_tls {
            Some(t) => Some(Arc::new(TlsServer::load(t, false)?)),
            None => None,
        };
        let listeners = Listeners {
            proxy: bind("listen.proxy", l.proxy).await?,
            proxy_tls,
            transparent,
            admin: bind("listen.admin", l.admin).await?,
            admin_tls,
            dns,
            socks5: bind("listen.socks5", l.socks5).await?,
        };
        let sndbuf = config.defaults.limits.socket_buffer_bytes;
        for l in [
            listeners.proxy.as_ref(),
            listeners.proxy_tls.as_ref().map(|(l, _)| l),
            listeners.transparent.as_ref(),
            listeners.socks5.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            data_plane_options(l, sndbuf).context("setting the data-plane socket options")?;
        }
        Ok(listeners)
    }

    pub fn addrs(&self) -> Addrs {
        let at = |l: &TcpListener| l.local_addr().ok();
        Addrs {
            proxy: self.proxy.as_ref().and_then(at),
            proxy_tls: self.proxy_tls.as_ref().and_then(|(l, _)| at(l)),
            admin: self.admin.as_ref().and_then(at),
            transparent: self.transparent.as_ref().and_then(at),
            dns: self
                .dns
                .as_ref()
                .and_then(|(u, _)| u.first())
                .and_then(|u| u.local_addr().ok()),
            socks5: self.socks5.as_ref().and_then(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the listener sets is what every accepted socket has: the per-connection
    /// `setsockopt` calls this replaces would otherwise be needed.
    #[tokio::test]
    async fn accepted_sockets_inherit_the_listeners_options() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        data_plane_options(&l, Some(65536)).unwrap();
        let addr = l.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = l.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
        let sndbuf =
            nix::sys::socket::getsockopt(&accepted, nix::sys::socket::sockopt::SndBuf).unwrap();
        // The kernel doubles what it is given.
        assert_eq!(sndbuf, 2 * 65536);
        assert!(!client.nodelay().unwrap());
    }
}
