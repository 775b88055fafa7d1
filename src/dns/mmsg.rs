//! Many datagrams per system call for the DNS listener's UDP loops: `recvmmsg(2)` reads what
//! is queued (up to [`BATCH`]) in one call, and `sendmmsg(2)` sends a batch's answers in one.
//! Under load a loop then pays one system call and one wake-up per batch, not per query
//! (docs/performance-history.md, DNS). The fourth fenced module with `unsafe`: the two calls and the
//! socket addresses they fill. Answers wait end to end in one buffer ([`Outbox`]). Addresses go through `socket2`'s `SockAddr`, which knows each
//! family's layout; nothing here keeps a pointer past the call that uses it.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use socket2::{SockAddr, SockAddrStorage};

/// Datagrams read, or answers sent, per system call at most.
pub const BATCH: usize = 32;
/// The largest datagram read (EDNS payloads above this are not offered by anyone sane); a
/// longer one is cut to this and fails to parse.
pub const MAX_DATAGRAM: usize = 4096;

/// One receive loop's buffers: [`BATCH`] datagrams of [`MAX_DATAGRAM`] and their source
/// addresses, allocated once: each batch zeroes only the address storage of the datagrams it
/// held (it used to make and zero [`BATCH`] of them per call).
pub struct Inbox {
    buf: Box<[u8]>,
    names: Box<[SockAddrStorage]>,
    /// Each read datagram's length and source (`None`: not an IP source).
    got: Vec<(usize, Option<SocketAddr>)>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            buf: vec![0u8; BATCH * MAX_DATAGRAM].into_boxed_slice(),
            names: (0..BATCH).map(|_| SockAddrStorage::zeroed()).collect(),
            got: Vec::with_capacity(BATCH),
        }
    }
}

impl Inbox {
    /// Read the datagrams queued on `fd` (up to [`BATCH`]) without waiting: how many;
    /// `WouldBlock` when there are none.
    pub fn receive(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.got.clear();
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|_| empty_iov());
        for (iov, chunk) in iovs.iter_mut().zip(self.buf.chunks_mut(MAX_DATAGRAM)) {
            iov.iov_base = chunk.as_mut_ptr().cast();
            iov.iov_len = chunk.len();
        }
        let mut headers: [libc::mmsghdr; BATCH] = std::array::from_fn(|_| zeroed_header());
        for ((h, iov), name) in headers
            .iter_mut()
            .zip(iovs.iter_mut())
            .zip(self.names.iter_mut())
        {
            let len = name.size_of();
            point(h, (name as *mut SockAddrStorage).cast(), len, iov);
        }
        // SAFETY: every header points at a live `iovec` over a distinct `MAX_DATAGRAM` slice of
        // `self.buf` and at a live, writable address storage of the size it states; all of them
        // outlive the call, which only writes through those pointers (and the headers' lengths
        // and flags). `fd` is borrowed, so open, for the call's duration.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                headers.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = usize::try_from(n).unwrap_or(0).min(BATCH);
        for (h, name) in headers.iter().zip(self.names.iter_mut()).take(n) {
            let len = (h.msg_len as usize).min(MAX_DATAGRAM);
            let namelen = h.msg_hdr.msg_namelen.min(name.size_of());
            // Taken out, and a zeroed one left in its place: fresh storage only for the
            // datagrams a batch holds.
            let name = std::mem::replace(name, SockAddrStorage::zeroed());
            // SAFETY: the kernel wrote a socket address of `namelen` bytes (at most the
            // storage's size) into `name`.
            let source = unsafe { SockAddr::new(name, namelen) }.as_socket();
            self.got.push((len, source));
        }
        Ok(n)
    }

    /// The datagrams of the last [`Inbox::receive`], with their sources.
    pub fn datagrams(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> {
        self.got
            .iter()
            .zip(self.buf.chunks(MAX_DATAGRAM))
            .map(|(&(len, src), chunk)| (&chunk[..len], src))
    }
}

/// One receive loop's answers waiting to be sent: their bytes end to end in one buffer, and
/// where each goes. Kept across batches, so an answer costs no allocation of its own and a
/// send none either. Made at its full size when the loop starts: grown in the middle of a
/// flood, it would sit on top of the flood's freed memory and keep the allocator from giving
/// it back (`tests/dns_memory.rs`).
pub struct Outbox {
    bytes: Vec<u8>,
    /// Where each answer ends in `bytes`, and its destination.
    sent_to: Vec<(usize, SockAddr)>,
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox {
            bytes: Vec::with_capacity(BATCH * CLASSIC_ANSWER),
            sent_to: Vec::with_capacity(BATCH),
        }
    }
}

/// Room per answer in a new [`Outbox`]: a classic UDP payload.
const CLASSIC_ANSWER: usize = 512;

impl Outbox {
    /// Add an answer to `to`, which `write` appends to the buffer it is given; `false` from
    /// it (or nothing written) takes back whatever it wrote. Whether an answer was added.
    pub fn push_with(&mut self, to: SocketAddr, write: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        let start = self.bytes.len();
        if !write(&mut self.bytes) || self.bytes.len() == start {
            self.bytes.truncate(start);
            return false;
        }
        self.sent_to.push((self.bytes.len(), SockAddr::from(to)));
        true
    }

    /// Add an answer already encoded.
    pub fn push(&mut self, answer: &[u8], to: SocketAddr) {
        self.push_with(to, |out| {
            out.extend_from_slice(answer);
            true
        });
    }

    /// How many answers wait.
    pub fn len(&self) -> usize {
        self.sent_to.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.sent_to.is_empty()
    }

    /// Forget every answer; the buffers are kept (a flood's are given back).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.sent_to.clear();
        if self.bytes.capacity() > 2 * BATCH * CLASSIC_ANSWER {
            self.bytes.shrink_to(BATCH * CLASSIC_ANSWER);
        }
        if self.sent_to.capacity() > 2 * BATCH {
            self.sent_to.shrink_to(BATCH);
        }
    }

    /// Send the answers from the `from`th on (at most [`BATCH`]), each to its address,
    /// without waiting: how many were sent (the rest are for a later call); `WouldBlock`
    /// when none could be.
    pub fn send(&self, fd: BorrowedFd<'_>, from: usize) -> io::Result<usize> {
        let batch = self.sent_to.get(from..).unwrap_or_default();
        let n = batch.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut start = from.checked_sub(1).map_or(0, |i| self.sent_to[i].0);
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|_| empty_iov());
        for (iov, (end, _)) in iovs.iter_mut().zip(&batch[..n]) {
            let bytes = &self.bytes[start..*end];
            iov.iov_base = bytes.as_ptr().cast_mut().cast();
            iov.iov_len = bytes.len();
            start = *end;
        }
        let mut headers: [libc::mmsghdr; BATCH] = std::array::from_fn(|_| zeroed_header());
        for ((h, iov), (_, name)) in headers.iter_mut().zip(iovs.iter_mut()).zip(batch) {
            point(h, name.as_ptr().cast_mut().cast(), name.len(), iov);
        }
        // SAFETY: the first `n` headers point at live `iovec`s over the answers' bytes (slices
        // of `self.bytes`) and at live socket addresses of the lengths they state, all
        // outliving the call; `sendmmsg` only reads through them (it writes the headers'
        // `msg_len`). `fd` is borrowed, so open.
        let sent = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                headers.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(sent).unwrap_or(0))
    }
}

/// Point a header at one datagram's address (`len` bytes at `name`) and its one buffer.
fn point(
    h: &mut libc::mmsghdr,
    name: *mut libc::c_void,
    len: libc::socklen_t,
    iov: &mut libc::iovec,
) {
    h.msg_hdr.msg_name = name;
    h.msg_hdr.msg_namelen = len;
    h.msg_hdr.msg_iov = iov;
    h.msg_hdr.msg_iovlen = 1;
}

fn empty_iov() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

fn zeroed_header() -> libc::mmsghdr {
    // SAFETY: `mmsghdr` is a C struct of integers and pointers, for which all zeros is valid
    // (null pointers, zero lengths).
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A batch goes out in one call and comes back in one, each datagram whole, in order and
    /// with its source; an empty queue is `WouldBlock`.
    #[test]
    fn sends_and_receives_a_batch_with_sources() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        let answers: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 10 + i as usize * 50]).collect();
        let mut outbox = Outbox::default();
        for answer in &answers {
            outbox.push(answer, to);
        }
        // Taken back: not sent.
        assert!(!outbox.push_with(to, |out| {
            out.extend_from_slice(b"half written");
            false
        }));
        assert_eq!(outbox.len(), 40);
        let sent = outbox.send(a.as_fd(), 0).unwrap();
        assert_eq!(sent, BATCH, "one call sends a whole batch");
        let mut inbox = Inbox::default();
        let n = inbox.receive(b.as_fd()).unwrap();
        assert_eq!(n, BATCH);
        for (i, (bytes, src)) in inbox.datagrams().enumerate() {
            assert_eq!(bytes, &answers[i][..], "datagram {i}");
            assert_eq!(src, Some(a.local_addr().unwrap()));
        }
        // The rest, from where the first call stopped.
        assert_eq!(outbox.send(a.as_fd(), BATCH).unwrap(), 40 - BATCH);
        assert_eq!(inbox.receive(b.as_fd()).unwrap(), 40 - BATCH);
        for (i, (bytes, _)) in inbox.datagrams().enumerate() {
            assert_eq!(bytes, &answers[BATCH + i][..], "datagram {}", BATCH + i);
        }
        let err = inbox.receive(b.as_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(
            inbox.datagrams().count(),
            0,
            "a failed read leaves nothing to serve"
        );
    }

    /// A datagram longer than the buffer is cut to it, not spilled into the next one's.
    #[test]
    fn an_oversized_datagram_is_cut_to_the_buffer() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        a.send_to(&[7u8; MAX_DATAGRAM + 500], b.local_addr().unwrap())
            .unwrap();
        a.send_to(b"next", b.local_addr().unwrap()).unwrap();
        let mut inbox = Inbox::default();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            inbox.receive(b.as_fd()).unwrap();
            seen.extend(inbox.datagrams().map(|(d, _)| d.to_vec()));
        }
        assert_eq!(seen[0].len(), MAX_DATAGRAM);
        assert_eq!(seen[1], b"next");
    }

    /// IPv6 sources come back as IPv6.
    #[test]
    fn ipv6_sources_are_kept() {
        let b = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let a = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let mut outbox = Outbox::default();
        outbox.push(b"q", b.local_addr().unwrap());
        outbox.send(a.as_fd(), 0).unwrap();
        let mut inbox = Inbox::default();
        inbox.receive(b.as_fd()).unwrap();
        let got: Vec<_> = inbox.datagrams().map(|(_, s)| s).collect();
        assert_eq!(got, vec![Some(a.local_addr().unwrap())]);
    }
}
