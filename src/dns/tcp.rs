//! DNS over TCP (RFC 7766) on `listen.dns`. Served here rather than by hickory's own TCP
//! listener so that a connection goes through the same admission as every other listener
//! (`server::accept_gated`) and is closed by the same [`Liveness`] as every relay: each
//! message is a 2-byte length and the query; answers go back in order on the same
//! connection; it closes on EOF, a malformed frame, `idle` with no complete query, or
//! shutdown. UDP stays with hickory's `ServerFuture`.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinEncoder};
use hickory_proto::xfer::Protocol;
use hickory_server::authority::{MessageRequest, MessageResponse};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::audit::outcome::Close;
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
        let answer = Answer::default();
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

/// Where the handler's response is encoded (one per query).
#[derive(Clone, Default)]
struct Answer(Arc<Mutex<Option<Vec<u8>>>>);

impl Answer {
    fn take(&self) -> Option<Vec<u8>> {
        self.0.lock().ok()?.take()
    }
}

#[async_trait::async_trait]
impl ResponseHandler for Answer {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> io::Result<ResponseInfo> {
        let mut buffer = Vec::with_capacity(512);
        let info = {
            let mut encoder = BinEncoder::new(&mut buffer);
            encoder.set_max_size(u16::MAX);
            response
                .destructive_emit(&mut encoder)
                .map_err(io::Error::other)?
        };
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(buffer);
        }
        Ok(info)
    }
}
