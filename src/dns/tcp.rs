//! DNS over TCP (RFC 7766) on `listen.dns`. Served here rather than by hickory's own TCP
//! listener so that a connection goes through the same admission as every other listener
//! (`server::accept_gated`) and is closed by the same [`Liveness`] as every relay: each
//! message is a 2-byte length and the query; answers go back in order on the same
//! connection; it closes on EOF, a malformed frame, `idle` with no complete query, or
//! shutdown. UDP is [`crate::dns::udp`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::serialize::binary::BinDecodable;
use hickory_proto::xfer::Protocol;
use hickory_server::authority::MessageRequest;
use hickory_server::server::{Request, RequestHandler};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::audit::outcome::Close;
use crate::dns::answer::Encoded;
use crate::dns::listener::DnsListener;
use crate::relay::liveness::Liveness;
use crate::relay::watch::Phase;

/// Serve the queries of one admitted TCP connection from `client`.
pub async fn serve(
    handler: Arc<DnsListener>,
    mut stream: TcpStream,
    client: SocketAddr,
    idle: Duration,
    mut phase: watch::Receiver<Phase>,
) {
    let live = Liveness::new(idle);
    let stopping = async move {
        loop {
            if *phase.borrow_and_update() != Phase::Serving {
                return Close::Shutdown;
            }
            if phase.changed().await.is_err() {
                return Close::Shutdown;
            }
        }
    };
    tokio::pin!(stopping);
    loop {
        let query = match live.run(read_frame(&mut stream), &mut stopping).await {
            Ok(Ok(Some(q))) => q,
            // EOF, a read error or a frame too short to be a message, idle, shutdown.
            _ => return,
        };
        live.moved(true, query.len() + 2);
        let Ok(message) = MessageRequest::from_bytes(&query) else {
            // Not a DNS message: nothing in it can be answered; close (RFC 7766 §6.2.6).
            return;
        };
        let request = Request::new(message, client, Protocol::Tcp);
        let answer = Encoded::new(u16::MAX);
        handler.handle_request(&request, answer.clone()).await;
        let Some(bytes) = answer.take() else { return };
        let Ok(len) = u16::try_from(bytes.len()) else {
            return;
        };
        let mut frame = Vec::with_capacity(bytes.len() + 2);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&bytes);
        match live.run(stream.write_all(&frame), &mut stopping).await {
            Ok(Ok(())) => live.moved(false, frame.len()),
            _ => return,
        }
    }
}

/// One length-prefixed message; `None` at a clean EOF before a frame.
async fn read_frame(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(u16::from_be_bytes(len));
    if len < 12 {
        // Shorter than a DNS header.
        return Ok(None);
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(Some(buf))
}
