//! How many bytes the kernel still holds unsent for a TCP socket — the second fenced module
//! with `unsafe` (one `ioctl`). A revoked tunnel is reset, and a reset discards the send
//! queue: the relay subtracts what was still unsent from what it had handed to the kernel, so
//! the audit record counts the bytes that actually left the proxy.

use std::os::fd::AsRawFd;

/// `SIOCOUTQNSD` (linux/sockios.h): bytes in the send queue not yet sent. (`SIOCOUTQ` would
/// also count bytes sent but not yet acknowledged — the peer may well have them, its
/// acknowledgement delayed.)
const SIOCOUTQNSD: libc::Ioctl = 0x894B;

/// Bytes in `socket`'s send queue that have not been sent; 0 when the kernel cannot say (a
/// socket that is already closed or reset has nothing left to send either).
pub fn unsent<S: AsRawFd>(socket: &S) -> u64 {
    let mut queued: libc::c_int = 0;
    // SAFETY: the fd is open for the duration of the call (borrowed from `socket`); the ioctl
    // writes one `int` through the pointer, which points at a live, writable `c_int` that
    // outlives the call.
    let rc = unsafe {
        libc::ioctl(
            socket.as_raw_fd(),
            SIOCOUTQNSD,
            &mut queued as *mut libc::c_int,
        )
    };
    if rc != 0 {
        return 0;
    }
    u64::try_from(queued).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn counts_what_a_peer_that_does_not_read_left_queued() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer_never_reads, _) = l.accept().unwrap();
        assert_eq!(unsent(&c), 0);
        c.set_nonblocking(true).unwrap();
        let chunk = [7u8; 65536];
        let mut written = 0u64;
        while let Ok(n) = c.write(&chunk) {
            written += n as u64;
        }
        // The peer's receive buffer took some; the rest waits in ours.
        let q = unsent(&c);
        assert!(q > 0 && q < written, "queued {q} of {written}");
    }
}
