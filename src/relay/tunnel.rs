//! The byte relay between a client and the destination it was allowed to reach: both
//! directions, half-close aware, with an idle timeout, byte counts, and a stop future (a
//! revocation or shutdown, from [`crate::relay::watch::Watch::stopped`]). It knows nothing
//! about policy.
//!
//! Each direction is one *pump* future (read → wait for bandwidth tokens → write); [`drive`]
//! polls both pumps, the idle deadline and the stop future in one `select!`, so a pump that is
//! blocked writing to a peer that does not read — or sleeping for bandwidth — never keeps the
//! relay from noticing idleness, revocation or shutdown. The zero-copy pumps of
//! [`crate::relay::splice`] use the same driver.

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::audit::outcome::Close;
use crate::egress::limits::SandboxLimiter;
use crate::relay::liveness::Liveness;

pub use crate::audit::outcome::Relayed;

/// Run two pumps until both finish (`eof`), one fails (`error`), nothing moves for the idle
/// timeout (`idle`), or `stop` resolves (its close). Built from futures that hold their parts
/// once (no `async fn` that would keep both pumps as arguments and again as what it awaits):
/// an idle tunnel's task is little more than its two pumps.
pub fn drive<'a, A, B, S>(
    a: A,
    b: B,
    live: &'a Liveness,
    stop: S,
) -> impl Future<Output = Relayed> + 'a
where
    A: Future<Output = io::Result<()>> + 'a,
    B: Future<Output = io::Result<()>> + 'a,
    S: Future<Output = Close> + 'a,
{
    use futures_util::FutureExt;
    let both = futures_util::future::try_join(a, b);
    live.run(both, stop).map(move |r| match r {
        Ok(Ok(((), ()))) => live.relayed(Close::Eof),
        Ok(Err(_)) if live.quota_cut() => live.relayed(Close::Limit),
        Ok(Err(_)) => live.relayed(Close::Error),
        Err(close) => live.relayed(close),
    })
}

const BUF: usize = 16 * 1024;

/// Copy `r` to `w` until EOF (then half-close `w`), waiting for bandwidth tokens before each
/// write when a `shaper` is given (delayed, never dropped).
pub(crate) async fn pump<R, W>(
    r: R,
    w: W,
    up: bool,
    shaper: Option<&SandboxLimiter>,
    live: &Liveness,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    pump_observed(r, w, up, shaper, live, |_| Ok(())).await
}

/// [`pump`], showing each read to `observe` before it is written (an error ends the pump).
pub(crate) async fn pump_observed<R, W>(
    mut r: R,
    mut w: W,
    up: bool,
    shaper: Option<&SandboxLimiter>,
    live: &Liveness,
    mut observe: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // Read into the spare room as it is (no zeroing), refilled from the start each time.
    let mut buf = Vec::with_capacity(BUF);
    loop {
        buf.clear();
        let n = r.read_buf(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        observe(&buf[..n])?;
        let delay = shaper.map(|s| s.shape_now(up, n)).unwrap_or_default();
        if !delay.is_zero() {
            let until = Instant::now() + delay;
            live.active(until);
            tokio::time::sleep_until(until).await;
        }
        // Taken from the byte quotas before it is written (what crosses one never leaves),
        // counted for the record write by write.
        let allowed = live.allow(n).await;
        let mut sent = 0;
        while sent < allowed {
            let m = w.write(&buf[sent..allowed]).await?;
            if m == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            sent += m;
            live.sent(up, m);
        }
        live.cut_error()?;
    }
}

/// Relay in user space (any streams; shaped when a `shaper` is given).
pub async fn relay<C, S, F>(
    client: C,
    server: S,
    live: impl Into<Liveness>,
    stop: F,
    shaper: Option<&SandboxLimiter>,
) -> Relayed
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = Close>,
{
    let (cr, cw) = tokio::io::split(client);
    let (sr, sw) = tokio::io::split(server);
    let live = live.into();
    let up = pump(cr, sw, true, shaper, &live);
    let down = pump(sr, cw, false, shaper, &live);
    drive(up, down, &live, stop).await
}

/// Relay between two TCP sockets — zero-copy ([`crate::relay::splice`]) unless a `shaper` limits the
/// bandwidth — and close them. `late` is a cap on the receive buffer of `server` left to the
/// relay ([`crate::relay::buffers::defer_upstream`]): set when the download switches to
/// splice, or at once when the relay is shaped.
///
/// A tunnel that was revoked or stopped by shutdown is *aborted*: both sockets are reset
/// (`SO_LINGER` 0), so the kernel discards whatever is still queued in either direction and
/// nothing more reaches the client or the destination after the cut. Other endings close
/// normally (FIN). The counts of an aborted tunnel leave out what the kernel still held
/// unsent at the cut ([`crate::relay::send_queue`]): the reset discarded it.
///
/// An async block, not an `async fn`: an `async fn` keeps each argument twice in its state
/// (rust-lang/rust#62958), and an idle tunnel's task holds this state.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds each argument twice in its state (rust-lang/rust#62958)"
)]
pub fn relay_tcp<'a, F>(
    mut client: TcpStream,
    mut server: TcpStream,
    (live, late): (Liveness, Option<u32>),
    stop: F,
    shaper: Option<&'a SandboxLimiter>,
) -> impl Future<Output = Relayed> + 'a
where
    F: Future<Output = Close> + 'a,
{
    async move {
        let mut r = match shaper {
            None => crate::relay::splice::relay(&mut client, &mut server, live, late, stop).await,
            // Boxed: an unshaped tunnel's task does not carry the user-space relay's state.
            Some(_) => {
                crate::relay::buffers::cap_upstream(&server, late);
                Box::pin(relay(&mut client, &mut server, live, stop, shaper)).await
            }
        };
        if r.close.aborts() {
            r.up = r.up.saturating_sub(abort(server));
            r.down = r.down.saturating_sub(abort(client));
        }
        r
    }
}

/// Relay between any streams over TCP (a TLS client connection, an HTTP/2 stream, TLS to a
/// parent proxy) in user space, shaped when a `shaper` is given; aborted (reset) like
/// [`relay_tcp`]. The unsent count of a TLS side is in TLS record bytes, not payload bytes.
pub async fn relay_streams<C, S, F>(
    mut client: C,
    mut server: S,
    live: Liveness,
    stop: F,
    shaper: Option<&SandboxLimiter>,
) -> Relayed
where
    C: crate::egress::abortable::OverTcp,
    S: crate::egress::abortable::OverTcp,
    F: Future<Output = Close>,
{
    let mut r = relay(&mut client, &mut server, live, stop, shaper).await;
    if r.close.aborts() {
        r.up = r.up.saturating_sub(abort_over(server));
        r.down = r.down.saturating_sub(abort_over(client));
    }
    r
}

/// [`abort`] for a stream over a TCP socket.
pub(crate) fn abort_over<S: crate::egress::abortable::OverTcp>(stream: S) -> u64 {
    let unsent = match stream.tcp() {
        Some(t) => {
            let _ = t.set_zero_linger();
            crate::relay::send_queue::unsent(t)
        }
        // An HTTP/2 stream: dropping it resets it; what its connection still queues is
        // shared with its siblings and not counted.
        None => 0,
    };
    drop(stream);
    unsent
}

/// Reset `socket` and return how many bytes it still held unsent (discarded by the reset).
/// Measured immediately before the close: the kernel may still send a little in between
/// (what an acknowledgement opened in the peer's window), so the count can fall short of what
/// the peer got by that much; it never counts bytes that did not leave.
pub(crate) fn abort(socket: TcpStream) -> u64 {
    let _ = socket.set_zero_linger();
    let unsent = crate::relay::send_queue::unsent(&socket);
    drop(socket);
    unsent
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::duplex;

    fn never() -> std::future::Pending<Close> {
        std::future::pending()
    }

    #[tokio::test]
    async fn relays_both_ways_and_counts() {
        let (client, mut client_peer) = duplex(1024);
        let (server, mut server_peer) = duplex(1024);
        let task = tokio::spawn(relay(client, server, Duration::from_secs(5), never(), None));
        client_peer.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        server_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        server_peer.write_all(b"world!").await.unwrap();
        let mut buf = [0u8; 6];
        client_peer.read_exact(&mut buf).await.unwrap();
        drop(client_peer);
        drop(server_peer);
        let r = task.await.unwrap();
        assert_eq!((r.up, r.down, r.close), (5, 6, Close::Eof));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_timeout_closes() {
        let (client, _cp) = duplex(64);
        let (server, _sp) = duplex(64);
        let r = relay(client, server, Duration::from_secs(30), never(), None).await;
        assert_eq!(r.close, Close::Idle);
    }

    #[tokio::test]
    async fn stop_closes_with_its_reason() {
        let (client, _cp) = duplex(64);
        let (server, _sp) = duplex(64);
        let (tx, rx) = tokio::sync::oneshot::channel::<Close>();
        let stop = async move { rx.await.unwrap_or(Close::Shutdown) };
        let task = tokio::spawn(relay(client, server, Duration::from_secs(30), stop, None));
        tx.send(Close::Revoked).unwrap();
        assert_eq!(task.await.unwrap().close, Close::Revoked);
    }

    /// The peer that should receive never reads: the pump is stuck in `write_all`, and idle
    /// and stop must still end the relay.
    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_is_idled_out_and_can_be_stopped() {
        let (client, _client_peer_never_reads) = duplex(64);
        let (server, mut server_peer) = duplex(64);
        let feed = tokio::spawn(async move {
            let _ = server_peer.write_all(&[7u8; 4096]).await;
            server_peer
        });
        let r = relay(client, server, Duration::from_secs(30), never(), None).await;
        assert_eq!(r.close, Close::Idle);
        assert!(r.down <= 64, "{r:?}");
        drop(feed);

        let (client, _client_peer_never_reads) = duplex(64);
        let (server, mut server_peer) = duplex(64);
        let _feed = tokio::spawn(async move {
            let _ = server_peer.write_all(&[7u8; 4096]).await;
            server_peer
        });
        let stop = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Close::Revoked
        };
        let r = relay(client, server, Duration::from_secs(3600), stop, None).await;
        assert_eq!(r.close, Close::Revoked);
    }
}
