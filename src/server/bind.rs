//! The listeners the configuration asks for, bound before anything else starts so that a
//! taken port or a bad certificate stops the start with a clear error.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, UdpSocket};

use crate::config::Config;
use crate::listen::explicit_tls::TlsServer;

use super::threads::{self, Group};

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
/// The data-plane listeners are [`Group`]s (empty when not configured), taken to the runtime
/// that accepts on them.
pub(super) struct Listeners {
    pub proxy: Group,
    pub proxy_tls: Option<(Group, Arc<TlsServer>)>,
    pub transparent: Group,
    pub admin: Option<TcpListener>,
    pub admin_tls: Option<Arc<TlsServer>>,
    pub dns: Option<(Vec<UdpSocket>, TcpListener)>,
    pub socks5: Group,
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
fn data_plane_options(l: &std::net::TcpListener, sndbuf: Option<u32>) -> std::io::Result<()> {
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

/// Bind the data-plane listener named `what`, if configured: one socket, or with `threads`
/// one per data-plane thread.
fn bind_data(
    what: &str,
    addr: Option<SocketAddr>,
    threads: usize,
    tproxy: bool,
) -> anyhow::Result<Group> {
    let Some(a) = addr else {
        return Ok(Vec::new());
    };
    threads::bind_group(a, threads, tproxy).with_context(|| match tproxy {
        true => format!("binding {what} {a} for TPROXY (needs CAP_NET_ADMIN)"),
        false => format!("binding {what} {a}"),
    })
}

impl Listeners {
    pub async fn bind(config: &Config) -> anyhow::Result<Self> {
        let l = &config.listen;
        let threads = l.threads;
        let transparent = bind_data(
            "listen.transparent",
            l.transparent,
            threads,
            l.transparent_tproxy,
        )?;
        let proxy_tls = match &l.proxy_tls {
            Some(t) => {
                let server = Arc::new(TlsServer::load(t, true)?);
                let group = bind_data("listen.proxy_tls", Some(t.addr), threads, false)?;
                Some((group, server))
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
            proxy: bind_data("listen.proxy", l.proxy, threads, false)?,
            proxy_tls,
            transparent,
            admin: bind("listen.admin", l.admin).await?,
            admin_tls,
            dns,
            socks5: bind_data("listen.socks5", l.socks5, threads, false)?,
        };
        let sndbuf = config.defaults.limits.socket_buffer_bytes;
        let tls = listeners.proxy_tls.as_ref().map(|(g, _)| g.as_slice());
        for l in [
            listeners.proxy.as_slice(),
            tls.unwrap_or_default(),
            listeners.transparent.as_slice(),
            listeners.socks5.as_slice(),
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
        let first = |g: &Group| g.first().and_then(|l| l.local_addr().ok());
        Addrs {
            proxy: first(&self.proxy),
            proxy_tls: self.proxy_tls.as_ref().and_then(|(g, _)| first(g)),
            admin: self.admin.as_ref().and_then(at),
            transparent: first(&self.transparent),
            dns: self
                .dns
                .as_ref()
                .and_then(|(u, _)| u.first())
                .and_then(|u| u.local_addr().ok()),
            socks5: first(&self.socks5),
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
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        data_plane_options(&l, Some(65536)).unwrap();
        let l = TcpListener::from_std(l).unwrap();
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
