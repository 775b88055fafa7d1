//! The kernel's socket diagnostics (netlink `NETLINK_SOCK_DIAG`, `inet_diag`): the owner uid
//! and inode of the socket at the other end of an accepted TCP connection, looked up by its
//! exact four-tuple as that socket sees it. The kernel answers within the `send`, so the
//! reply is read without waiting; a socket in another network namespace is not found here.

use std::io;
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr as NlAddr};

/// The socket the kernel found: its owner and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSocket {
    /// The owner's uid.
    pub uid: u32,
    /// The socket's inode (`socket:[inode]` in a holder's `/proc/PID/fd`).
    pub inode: u32,
}

/// A netlink socket for `inet_diag` lookups.
pub struct Diag {
    socket: Socket,
    seq: u32,
}

impl Diag {
    /// Open one (no privilege is needed to look up a socket by its tuple).
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&NlAddr::new(0, 0))?;
        Ok(Diag { socket, seq: 0 })
    }

    /// The socket whose own address is `peer` and whose remote address is `dialed` (the peer
    /// of a connection this process accepted from `peer` on `dialed`). `Ok(None)` when this
    /// network namespace has no such socket.
    pub fn lookup(
        &mut self,
        peer: SocketAddr,
        dialed: SocketAddr,
    ) -> io::Result<Option<PeerSocket>> {
        let (family, src, dst) = match (peer.ip().to_canonical(), dialed.ip().to_canonical()) {
            (a @ IpAddr::V4(_), b @ IpAddr::V4(_)) => (AF_INET, a, b),
            (a @ IpAddr::V6(_), b @ IpAddr::V6(_)) => (AF_INET6, a, b),
            _ => return Ok(None),
        };
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = self.seq;
        let request = InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: SocketId {
                source_port: peer.port(),
                destination_port: dialed.port(),
                source_address: src,
                destination_address: dst,
                interface_id: 0,
                // INET_DIAG_NOCOOKIE: match on the tuple alone.
                cookie: [0xff; 8],
            },
        };
        let mut message = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
        message.finalize();
        let mut out = vec![0; message.buffer_len()];
        message.serialize(&mut out);
        self.socket.send(&out, 0)?;
        let mut answer = Vec::with_capacity(512);
        self.socket.recv(&mut answer, libc::MSG_DONTWAIT)?;
        let reply = <NetlinkMessage<SockDiagMessage>>::deserialize(&answer)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match reply.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                Ok(Some(PeerSocket {
                    uid: r.header.uid,
                    inode: r.header.inode,
                }))
            }
            NetlinkPayload::Error(e) => match e.code.map(|c| -c.get()) {
                Some(libc::ENOENT) => Ok(None),
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => Ok(None),
            },
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unexpected inet_diag reply",
            )),
        }
    }
}
