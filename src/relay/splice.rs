//! Zero-copy relay for tunnels between two TCP sockets that need no shaping: `splice(2)`
//! moves bytes socket → pipe → socket inside the kernel, so the proxy never copies payload
//! into user space and holds no per-tunnel buffers; pipes come from a shared pool and are held
//! only while bytes are in flight, so idle tunnels cost only their task and two sockets. Same
//! contract and the same driver as [`crate::relay::tunnel::relay`]: half-close aware, idle timeout,
//! byte counts, stop future. Safe wrappers from `nix`; no `unsafe` here.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

use nix::fcntl::{splice, OFlag, SpliceFFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::audit::outcome::Close;
use crate::relay::chunk::Chunk;
use crate::relay::liveness::Liveness;
use crate::relay::tunnel::{drive, Relayed};

/// Most bytes moved through a pipe per splice: the kernel's default pipe capacity (64 KiB,
/// 16 pages). A pump whose peer stops reading holds its pipe with the bytes in it, and an
/// unprivileged proxy's pipes all count against one `fs.pipe-user-pages-soft` budget (with
/// 1 MiB pipes for every tunnel, ~64 stalled tunnels exhausted it and every other tunnel's
/// pipes shrank to one page): so only a bounded number of pipes are grown at once
/// ([`MAX_GROWN`] of [`GROWN_SIZE`]), while a stream keeps filling them. When no pipe can be
/// had at all (the hard budget, or descriptors), a pump copies through user space instead.
const PIPE_SIZE: usize = 64 * 1024;

/// Empty pipes kept for reuse. A pump holds a pipe only while bytes are in flight, so idle
/// tunnels hold none (descriptors are the scarce resource with ten thousand tunnels) and new
/// tunnels rarely pay for `pipe2`.
static POOL: Mutex<Vec<(OwnedFd, OwnedFd)>> = Mutex::new(Vec::new());
/// Most pipes kept in the pool.
const POOL_MAX: usize = 256;

fn take_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    if let Some(p) = POOL.lock().ok().and_then(|mut v| v.pop()) {
        return Ok(p);
    }
    nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// Return an *empty* pipe to the pool.
fn give_pipe(p: (OwnedFd, OwnedFd)) {
    if let Ok(mut v) = POOL.lock() {
        if v.len() < POOL_MAX {
            v.push(p);
        }
    }
}

/// A pipe taken from the pool, and how much it holds.
struct Pipe {
    /// (read end, write end); `None` once given back.
    fds: Option<(OwnedFd, OwnedFd)>,
    /// Its capacity: [`PIPE_SIZE`], or [`GROWN_SIZE`] while grown.
    cap: usize,
}

/// What a pipe grows to while a stream keeps filling it.
const GROWN_SIZE: usize = 256 * 1024;
/// Pipes grown at once, at most, across the process: 16 MiB of pipe pages, a quarter of the
/// default per-user budget, so stalled tunnels cannot take the budget from the others.
const MAX_GROWN: usize = 64;
static GROWN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Pipe {
    fn take() -> io::Result<Pipe> {
        take_pipe().map(|fds| Pipe {
            fds: Some(fds),
            cap: PIPE_SIZE,
        })
    }

    fn fd(&self, write: bool) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        match &self.fds {
            Some((r, w)) => Ok(if write { w.as_fd() } else { r.as_fd() }),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// Grow to [`GROWN_SIZE`] when the budget allows (a refusal by the kernel is fine).
    fn grow(&mut self) {
        use std::sync::atomic::Ordering;
        if self.cap != PIPE_SIZE {
            return;
        }
        if GROWN.fetch_add(1, Ordering::Relaxed) >= MAX_GROWN {
            GROWN.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let grown = self.fd(true).and_then(|w| {
            nix::fcntl::fcntl(w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(GROWN_SIZE as i32))
                .map_err(io::Error::from)
        });
        match grown {
            Ok(n) if n as usize >= GROWN_SIZE => self.cap = GROWN_SIZE,
            _ => {
                GROWN.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Back to the pool, *empty* and at the default size (a pipe that cannot shrink is
    /// closed instead).
    fn give(mut self) {
        if self.cap != PIPE_SIZE {
            let shrunk = self.fd(true).and_then(|w| {
                nix::fcntl::fcntl(w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32))
                    .map_err(io::Error::from)
            });
            if shrunk.is_err() {
                return;
            }
            GROWN.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.cap = PIPE_SIZE;
        }
        if let Some(fds) = self.fds.take() {
            give_pipe(fds);
        }
    }
}

impl Drop for Pipe {
    /// Dropped while grown (an error, a cut tunnel): its place in the budget is free again.
    fn drop(&mut self) {
        if self.cap != PIPE_SIZE {
            GROWN.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Move everything from `src` to `dst` until `src` reaches EOF, then half-close `dst`. A
/// pump keeps its pipe only while the stream keeps filling it (and then grows it, see
/// [`Pipe::grow`]); once the source has nothing to read the pipe goes back to the pool, so
/// an idle tunnel holds none.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    up: bool,
    live: &Liveness,
    ends: &Ends,
) -> io::Result<()> {
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    let mut held: Option<Pipe> = None;
    loop {
        let pipe = match held.take() {
            // Streaming: read again at once (the socket is still marked readable).
            Some(p) => p,
            None => {
                src.readable().await?;
                match Pipe::take() {
                    Ok(p) => p,
                    Err(_) => {
                        // No pipe to be had: move this chunk through user space.
                        // Boxed: the fallback's state is not carried by every pump.
                        if Box::pin(copy_chunk(src, dst, up, live, ends)).await? {
                            return Ok(());
                        }
                        continue;
                    }
                }
            }
        };
        let moved = src.try_io(Interest::READABLE, || {
            let w = pipe.fd(true)?;
            splice(src.as_fd(), None, w, None, pipe.cap, flags).map_err(io::Error::from)
        });
        let n = match moved {
            Ok(0) => {
                pipe.give();
                ends.pass_on(dst);
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pipe.give();
                continue;
            }
            Err(e) => return Err(e),
        };
        // Taken from the byte quotas before it is written: what crosses one never leaves.
        let mut left = live.allow(n).await;
        while left > 0 {
            dst.writable().await?;
            let written = dst.try_io(Interest::WRITABLE, || {
                let r = pipe.fd(false)?;
                splice(r, None, dst.as_fd(), None, left, flags).map_err(io::Error::from)
            });
            match written {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(m) => {
                    left -= m;
                    live.sent(up, m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        live.cut_error()?;
        // Fully drained. A pipe the source filled is kept (grown) for the next chunk; else it
        // is empty and can serve another tunnel.
        if n == pipe.cap {
            let mut pipe = pipe;
            pipe.grow();
            held = Some(pipe);
        } else {
            pipe.give();
        }
    }
}

/// Move one chunk from `src` to `dst` through a buffer; `true` at EOF (then `dst` is
/// half-closed).
async fn copy_chunk(
    src: &TcpStream,
    dst: &TcpStream,
    up: bool,
    live: &Liveness,
    ends: &Ends,
) -> io::Result<bool> {
    // On the heap, and only here: a buffer in this future's state would be reserved in every
    // pump of every tunnel, idle or not. Read into its spare room: zeroing it first would
    // cost a 16 KiB `memset` a chunk.
    let mut buf = Chunk::take();
    let n = match src.try_read_buf(&mut *buf) {
        Ok(0) => {
            ends.pass_on(dst);
            return Ok(true);
        }
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
        Err(e) => return Err(e),
    };
    let n = live.allow(n).await;
    let mut sent = 0;
    while sent < n {
        dst.writable().await?;
        match dst.try_write(&buf[sent..n]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(m) => {
                sent += m;
                live.sent(up, m);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    live.cut_error()?;
    Ok(false)
}

/// Bytes a direction moves through user space before it switches to splice. A short tunnel —
/// an API call, a TLS handshake and a small answer — then costs one `read` and one `write` per
/// chunk and no pipe. Tokio's reads also note a short read as "drained", so no read is wasted
/// on `EAGAIN`: a burst smaller than the buffer costs one system call fewer than through a pipe,
/// which must be tried again to learn it is empty. Bulk streams pass this within a few reads.
const SPLICE_AFTER: u64 = 64 * 1024;

/// One direction: through user space for its first [`SPLICE_AFTER`] bytes, then zero-copy.
/// `late` is a cap on `src`'s receive buffer not set yet
/// ([`crate::relay::buffers::defer_upstream`]): it is set at the switch, so a direction that
/// never gets there (a short tunnel) never pays for it.
async fn start_then_splice(
    mut src: ReadHalf<'_>,
    mut dst: WriteHalf<'_>,
    (up, late): (bool, Option<u32>),
    live: &Liveness,
    ends: &Ends,
) -> io::Result<()> {
    let mut moved = 0u64;
    while moved < SPLICE_AFTER {
        // Wait with nothing but the readiness: an idle tunnel's task holds no buffer and no
        // read or write state (the copy is boxed, and gone once the chunk is moved).
        src.as_ref().readable().await?;
        match Box::pin(copy_once(&mut src, &mut dst, up, live)).await? {
            0 => {
                ends.pass_on(dst.as_ref());
                return Ok(());
            }
            n => moved += n as u64,
        }
    }
    crate::relay::buffers::cap_upstream(src.as_ref(), late);
    pump(src.as_ref(), dst.as_ref(), up, live, ends).await
}

/// Read one chunk from `src` and write it all to `dst`: its size (0 at EOF).
async fn copy_once(
    src: &mut ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    up: bool,
    live: &Liveness,
) -> io::Result<usize> {
    // Uninitialised room, read into as it is (a zeroed buffer cost a 16 KiB `memset` a chunk,
    // an end of stream's included: four a short tunnel), and one of the thread's spares.
    let mut buf = Chunk::take();
    let n = src.read_buf(&mut *buf).await?;
    let allowed = live.allow(n).await;
    let mut sent = 0;
    while sent < allowed {
        let m = dst.write(&buf[sent..allowed]).await?;
        if m == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += m;
        live.sent(up, m);
    }
    live.cut_error()?;
    Ok(n)
}

/// Relay between two sockets: in user space while a direction is young, then with splice.
/// `client` → `server` is "up". `late` caps `server`'s receive buffer when its direction
/// switches to splice ([`start_then_splice`]). The caller keeps the sockets and closes them
/// when it returns: the direction that ends second is not half-closed here ([`Ends`]), the
/// close says it.
///
/// An async block, not an `async fn`: an `async fn` keeps each argument twice in its state
/// (rust-lang/rust#62958), and an idle tunnel's task holds this state.
pub fn relay<'a, F>(
    client: &'a mut TcpStream,
    server: &'a mut TcpStream,
    live: impl Into<Liveness>,
    late: Option<u32>,
    stop: F,
) -> impl Future<Output = Relayed> + 'a
where
    F: Future<Output = Close> + 'a,
{
    let live = live.into();
    async move {
        let ends = Ends::default();
        let (client_r, client_w) = client.split();
        let (server_r, server_w) = server.split();
        let up = start_then_splice(client_r, server_w, (true, None), &live, &ends);
        let down = start_then_splice(server_r, client_w, (false, late), &live, &ends);
        drive(up, down, &live, stop).await
    }
}

/// How many of a relay's two directions have reached EOF. The first to end passes it on as a
/// half-close of its destination (`shutdown(SHUT_WR)`): the other side may still be sending.
/// The second needs no `shutdown`: both directions are then done and the relay ends, and its
/// caller closes both sockets (the close sends the same FIN; nothing is left unread to turn it
/// into a reset, the source having been read to its EOF). One system call fewer per tunnel.
#[derive(Default)]
struct Ends(std::sync::atomic::AtomicBool);

impl Ends {
    /// A direction reached EOF: half-close `dst` unless the other direction ended first.
    fn pass_on(&self, dst: &TcpStream) {
        if !self.0.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let _ = nix::sys::socket::shutdown(dst.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// The tests that move data grow pipes (a process-wide count): one at a time.
    static MOVING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn relays_both_ways_counts_and_half_closes() {
        let _one = MOVING.lock().await;
        let (mut client_peer, mut client) = pair().await;
        let (mut server, mut server_peer) = pair().await;
        let task = tokio::spawn(async move {
            relay(
                &mut client,
                &mut server,
                Duration::from_secs(5),
                None,
                std::future::pending(),
            )
            .await
        });
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let send = big.clone();
        let writer = tokio::spawn(async move {
            client_peer.write_all(&send).await.unwrap();
            client_peer.shutdown().await.unwrap();
            let mut back = Vec::new();
            client_peer.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        server_peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, big, "up direction intact, and EOF propagated");
        server_peer.write_all(b"reply").await.unwrap();
        server_peer.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"reply");
        let r = task.await.unwrap();
        assert_eq!((r.up, r.down, r.close), (3_000_000, 5, Close::Eof));
    }

    /// Pipes grown while a stream filled them give their place in the budget back, whether
    /// the relay ends or is cut in the middle of a stream (its futures dropped).
    #[tokio::test]
    async fn grown_pipes_give_back_their_budget_when_the_relay_ends_or_is_cut() {
        use std::sync::atomic::Ordering;
        let _one = MOVING.lock().await;
        let (mut client_peer, mut client) = pair().await;
        let (mut server, mut server_peer) = pair().await;
        let (tx, rx) = tokio::sync::oneshot::channel::<Close>();
        let stop = async move { rx.await.unwrap_or(Close::Shutdown) };
        let task = tokio::spawn(async move {
            relay(&mut client, &mut server, Duration::from_secs(5), None, stop).await
        });
        let writer = tokio::spawn(async move {
            let chunk = vec![7u8; 1 << 20];
            while client_peer.write_all(&chunk).await.is_ok() {}
        });
        // Read slowly enough that the pump keeps a full pipe, then cut mid-stream.
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        let mut grown_seen = 0;
        while got < 20_000_000 {
            got += server_peer.read(&mut buf).await.unwrap();
            grown_seen = grown_seen.max(GROWN.load(Ordering::Relaxed));
        }
        assert!(grown_seen >= 1, "a streaming pump grows its pipe");
        tx.send(Close::Revoked).unwrap();
        assert_eq!(task.await.unwrap().close, Close::Revoked);
        writer.abort();
        assert_eq!(GROWN.load(Ordering::Relaxed), 0);
    }

    /// An idle tunnel's task holds this future for the tunnel's life: its two pumps, the idle
    /// sleep and the stop, each once. Before the driver was a future of its own (nested `async
    /// fn`s each kept what they passed on) it was 4,384 bytes, and the whole task ~7 KiB
    /// (docs/performance-history.md, idle memory); 1,144 bytes now. When the pumps awaited the
    /// wait for a fleet's byte share inline it was 1,448: that wait is boxed, so only a relay
    /// that waits holds it. A bound on a size, not a timing: deterministic.
    #[tokio::test]
    async fn an_idle_relay_holds_its_pumps_once() {
        let (_cp, mut client) = pair().await;
        let (mut server, _sp) = pair().await;
        let stop = Box::pin(std::future::pending::<Close>());
        let live = Liveness::new(Duration::from_secs(5));
        let relaying = relay(&mut client, &mut server, live, None, stop);
        let size = std::mem::size_of_val(&relaying);
        assert!(size <= 1200, "the splice relay's future is {size} bytes");
    }

    #[tokio::test]
    async fn idle_and_stop() {
        let (_cp, mut client) = pair().await;
        let (mut server, _sp) = pair().await;
        let r = relay(
            &mut client,
            &mut server,
            Duration::from_millis(200),
            None,
            std::future::pending(),
        )
        .await;
        assert_eq!(r.close, Close::Idle);
        let (_cp, mut client) = pair().await;
        let (mut server, _sp) = pair().await;
        let (tx, rx) = tokio::sync::oneshot::channel::<Close>();
        let stop = async move { rx.await.unwrap_or(Close::Shutdown) };
        let task = tokio::spawn(async move {
            relay(
                &mut client,
                &mut server,
                Duration::from_secs(30),
                None,
                stop,
            )
            .await
        });
        tx.send(Close::Revoked).unwrap();
        assert_eq!(task.await.unwrap().close, Close::Revoked);
    }
}
