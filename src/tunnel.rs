//! The byte relay between a client and the destination it was allowed to reach: both
//! directions, half-close aware, with an idle timeout, byte counts, and a stop signal
//! (graceful shutdown or revocation). It knows nothing about policy.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::audit::Close;
use crate::limits::SandboxLimiter;

/// Why a relay was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stop {
    #[default]
    Running,
    Shutdown,
    Revoked,
}

/// What a finished relay reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// Client → destination.
    pub up: u64,
    /// Destination → client.
    pub down: u64,
    pub close: Close,
}

const BUF: usize = 16 * 1024;

/// Relay until both sides have closed, the tunnel idles for `idle`, an error occurs, or `stop`
/// changes away from `Running`. With a `shaper`, each chunk waits for its sandbox's bandwidth
/// tokens before it is written (delayed, never dropped).
pub async fn relay<C, S>(
    client: C,
    server: S,
    idle: Duration,
    mut stop: watch::Receiver<Stop>,
    shaper: Option<&SandboxLimiter>,
) -> Relayed
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    let mut cbuf = vec![0u8; BUF];
    let mut sbuf = vec![0u8; BUF];
    let (mut up, mut down) = (0u64, 0u64);
    let (mut client_eof, mut server_eof) = (false, false);
    let mut deadline = Instant::now() + idle;
    let finish = |up, down, close| Relayed { up, down, close };
    loop {
        if client_eof && server_eof {
            return finish(up, down, Close::Eof);
        }
        tokio::select! {
            r = cr.read(&mut cbuf), if !client_eof => match r {
                Ok(0) => {
                    client_eof = true;
                    let _ = sw.shutdown().await;
                }
                Ok(n) => {
                    if let Some(end) = shape(shaper, true, n, &mut stop).await {
                        return finish(up, down, end);
                    }
                    if sw.write_all(&cbuf[..n]).await.is_err() {
                        return finish(up, down, Close::Error);
                    }
                    up += n as u64;
                    deadline = Instant::now() + idle;
                }
                Err(_) => return finish(up, down, Close::Error),
            },
            r = sr.read(&mut sbuf), if !server_eof => match r {
                Ok(0) => {
                    server_eof = true;
                    let _ = cw.shutdown().await;
                }
                Ok(n) => {
                    if let Some(end) = shape(shaper, false, n, &mut stop).await {
                        return finish(up, down, end);
                    }
                    if cw.write_all(&sbuf[..n]).await.is_err() {
                        return finish(up, down, Close::Error);
                    }
                    down += n as u64;
                    deadline = Instant::now() + idle;
                }
                Err(_) => return finish(up, down, Close::Error),
            },
            _ = sleep_until(deadline) => return finish(up, down, Close::Idle),
            changed = stop.changed() => {
                let why = *stop.borrow();
                match (changed, why) {
                    (Ok(()), Stop::Shutdown) => return finish(up, down, Close::Shutdown),
                    (Ok(()), Stop::Revoked) => return finish(up, down, Close::Revoked),
                    (Ok(()), Stop::Running) => {}
                    // The sender is gone: the process is going away.
                    (Err(_), _) => return finish(up, down, Close::Shutdown),
                }
            }
        }
    }
}

/// Wait for bandwidth tokens; `Some(close)` if told to stop meanwhile.
async fn shape(
    shaper: Option<&SandboxLimiter>,
    up: bool,
    n: usize,
    stop: &mut watch::Receiver<Stop>,
) -> Option<Close> {
    let delay = shaper.map(|s| s.shape_now(up, n)).unwrap_or(Duration::ZERO);
    if delay.is_zero() {
        return None;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => None,
        changed = stop.changed() => match (changed, *stop.borrow()) {
            (Ok(()), Stop::Revoked) => Some(Close::Revoked),
            (Ok(()), Stop::Running) => None,
            _ => Some(Close::Shutdown),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn relays_both_ways_and_counts() {
        let (client, mut client_peer) = duplex(1024);
        let (server, mut server_peer) = duplex(1024);
        let (_tx, rx) = watch::channel(Stop::Running);
        let task = tokio::spawn(relay(client, server, Duration::from_secs(5), rx, None));
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
        let (_tx, rx) = watch::channel(Stop::Running);
        let r = relay(client, server, Duration::from_secs(30), rx, None).await;
        assert_eq!(r.close, Close::Idle);
    }

    #[tokio::test]
    async fn stop_signal_closes_with_its_reason() {
        let (client, _cp) = duplex(64);
        let (server, _sp) = duplex(64);
        let (tx, rx) = watch::channel(Stop::Running);
        let task = tokio::spawn(relay(client, server, Duration::from_secs(30), rx, None));
        tx.send(Stop::Revoked).unwrap();
        assert_eq!(task.await.unwrap().close, Close::Revoked);
    }
}
