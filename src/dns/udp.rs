//! DNS over UDP on `listen.dns`: one receive loop per socket (a socket per worker thread,
//! `SO_REUSEPORT`), each answering in place. hickory's `ServerFuture` spawned a task per
//! datagram and sent every answer through a channel to a single sending task; here a query
//! whose answer is ready at once (a cached allowed name, a refused name, a malformed query)
//! is answered by the loop that read it, with no task, channel or wake-up in between, and
//! only a query that must wait (the upstream resolver) is moved to a task of its own. The
//! rules of RFC 1035 and of hickory's own loop are kept: responses (QR set) are never
//! answered (no reflection), nor are sources with port 0; a message whose header reads but
//! whose body does not gets `FORMERR`; anything shorter than a header gets nothing; an answer
//! larger than the client's payload (512 bytes, or its EDNS size) is truncated with TC set.
//! Each loop keeps the allowed answers it gave at once ([`crate::dns::answer_cache`]) and
//! serves a repeat of the same query from them. A query of the common shape (one question of
//! plain labels, at most an OPT record) is read without hickory's decoder, decided in place
//! ([`DnsListener::decide_now`]: no copy of the datagram, no future), and its answer without
//! records (a refusal) written without its encoder ([`crate::dns::wire`]). Only a query that
//! waits for the resolver takes its part ([`Later`]) and a copy of its bytes to a task.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Header, MessageType, ResponseCode};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable};
use hickory_proto::xfer::Protocol;
use hickory_server::authority::MessageRequest;
use hickory_server::server::Request;
use std::os::fd::AsFd;

use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::dns::answer::Encoded;
use crate::dns::answer_cache::AnswerCache;
use crate::dns::listener::{Answered, Asker, DnsListener, Later, Now};
use crate::dns::mmsg::{Inbox, Outbox};
use crate::dns::question::Received;
use crate::dns::reply::{self, Reply};
use crate::dns::wire;
use crate::relay::watch::Phase;

/// Serve each socket (one per worker thread, `SO_REUSEPORT`) with a loop of its own until
/// shutdown.
pub async fn serve(
    handler: Arc<DnsListener>,
    sockets: Vec<UdpSocket>,
    phase: watch::Receiver<Phase>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for socket in sockets {
        tasks.spawn(receive(handler.clone(), Arc::new(socket), phase.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

/// One receive loop: each wake-up reads what is queued (up to a batch, one `recvmmsg`),
/// answers what can be answered at once, and sends those answers together (one `sendmmsg`).
async fn receive(
    handler: Arc<DnsListener>,
    socket: Arc<UdpSocket>,
    mut phase: watch::Receiver<Phase>,
) {
    let mut inbox = Inbox::default();
    let mut answers = Outbox::default();
    let mut cache = AnswerCache::default();
    // The text of each query's name, written over query after query (a name is 253 bytes
    // at most: made at full size here, never grown mid-flood).
    let mut name = String::with_capacity(256);
    let mut expire = tokio::time::interval(std::time::Duration::from_secs(5));
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ready = tokio::select! {
            r = socket.readable() => r,
            _ = phase.wait_for(|p| *p != Phase::Serving) => return,
            _ = expire.tick() => {
                crate::dns::give_back::freed(cache.expire());
                continue;
            }
        };
        if let Err(e) = ready {
            tracing::debug!(error = %e, "dns: udp readiness");
            continue;
        }
        match socket.try_io(Interest::READABLE, || inbox.receive(socket.as_fd())) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            // ICMP errors of earlier sends (ECONNREFUSED) and the like: keep serving.
            Err(e) => {
                tracing::debug!(error = %e, "dns: udp receive");
                continue;
            }
        }
        for (bytes, src) in inbox.datagrams() {
            let Some(src) = src.filter(|s| s.port() != 0 && !s.ip().is_unspecified()) else {
                continue;
            };
            let at = Arrived { bytes, src };
            answer(&handler, &socket, &mut cache, at, &mut answers, &mut name);
        }
        send_all(&socket, &mut answers).await;
        // A flood never starves the loop's other work, nor the worker's other tasks.
        tokio::task::consume_budget().await;
    }
}

/// One datagram as it arrived: its bytes and who sent it.
struct Arrived<'a> {
    bytes: &'a [u8],
    src: SocketAddr,
}

/// Answer one datagram: into `answers` when the answer is ready at once (a repeat served from
/// `cache`, a refusal, a malformed query: written where it waits to be sent, no allocation of
/// its own), else from a task of its own (the resolver). `name` is the loop's scratch text
/// for the question's name.
fn answer(
    handler: &Arc<DnsListener>,
    socket: &Arc<UdpSocket>,
    cache: &mut AnswerCache,
    Arrived { bytes, src }: Arrived<'_>,
    answers: &mut Outbox,
    name: &mut String,
) {
    let mut asker = None;
    let repeated = answers.push_with(src, |out| match cache.serve(handler, bytes, src, out) {
        Ok(()) => true,
        Err(a) => {
            asker = a;
            false
        }
    });
    if repeated {
        return;
    }
    let rest = match wire::Query::read(bytes) {
        // The common shape, decided in place: a refusal costs no copy, future or task.
        Some(query) => match handler.decide_now(&Received::of_wire(&query, src, name), true, asker)
        {
            Now::Silent => return,
            Now::Done(reply, answered) => {
                let at_once = reply.records.is_empty()
                    && answers
                        .push_with(src, |out| query.answer_into(out, reply.rcode, reply.ede()));
                if at_once {
                    return;
                }
                Rest::Decided(reply, answered)
            }
            Now::Later(later) => Rest::Later(later),
        },
        None => Rest::Read(asker),
    };
    let Some(work) = datagram(handler, bytes, src, rest) else {
        return;
    };
    let mut work = Box::pin(work);
    let polled = work
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    match polled {
        std::task::Poll::Ready(Some((answer, answered))) => {
            if let Some(a) = answered {
                cache.keep(bytes, &answer, a);
            }
            answers.push(&answer, src);
        }
        std::task::Poll::Ready(None) => {}
        std::task::Poll::Pending => {
            // Polled again at once by the runtime, which registers its own waker.
            let socket = socket.clone();
            tokio::spawn(async move {
                if let Some((bytes, _)) = work.await {
                    send(&socket, &bytes, src).await;
                }
            });
        }
    }
}

/// Send every answer of a batch, as many per system call as the socket takes; an answer the
/// kernel refuses (an unroutable source) is dropped, not retried.
async fn send_all(socket: &UdpSocket, answers: &mut Outbox) {
    if answers.is_empty() {
        return;
    }
    let mut from = 0;
    while from < answers.len() {
        match socket.try_io(Interest::WRITABLE, || answers.send(socket.as_fd(), from)) {
            Ok(0) => break,
            Ok(n) => from += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if socket.writable().await.is_err() {
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "dns: udp send");
                from += 1;
            }
        }
    }
    answers.clear();
}

async fn send(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    if let Err(e) = socket.send_to(bytes, to).await {
        tracing::debug!(error = %e, "dns: udp send");
    }
}

/// An encoded answer, and whether it may be served again.
type Answer = (Vec<u8>, Option<Answered>);

/// What is left of a datagram not answered in place.
enum Rest {
    /// Not of the common shape: read and decided the general way, by who asks (when known).
    Read(Option<Asker>),
    /// Decided, but its answer is not the wire format's to write (it has records, or does
    /// not fit the client's payload).
    Decided(Reply, Option<Answered>),
    /// Waiting for the resolver.
    Later(Later),
}

/// The future of a datagram's encoded answer (what is left of it: [`Rest`]), or `None` to
/// drop it. The answer of a query of the common shape is written from the wire format when
/// it has no records ([`wire`]); any other by hickory.
fn datagram(
    handler: &Arc<DnsListener>,
    bytes: &[u8],
    src: SocketAddr,
    rest: Rest,
) -> Option<impl Future<Output = Option<Answer>> + Send + 'static> {
    let mut decoder = BinDecoder::new(bytes);
    let header = Header::read(&mut decoder).ok()?;
    if header.message_type() == MessageType::Response {
        // Never answer a response: no reflection loops.
        return None;
    }
    let bytes: Box<[u8]> = bytes.into();
    let handler = handler.clone();
    Some(async move {
        let (reply, answered) = match rest {
            Rest::Read(asker) => {
                return match MessageRequest::from_bytes(&bytes) {
                    Ok(message) => general(&handler, message, src, None, asker).await,
                    Err(_) => form_error(&header).map(|b| (b, None)),
                }
            }
            Rest::Decided(reply, answered) => (reply, answered),
            Rest::Later(later) => later.finish(&handler).await,
        };
        if reply.records.is_empty() {
            let query = wire::Query::read(&bytes);
            if let Some(answer) = query.and_then(|q| q.answer(reply.rcode, reply.ede())) {
                return Some((answer, answered));
            }
        }
        let message = MessageRequest::from_bytes(&bytes).ok()?;
        general(&handler, message, src, Some((reply, answered)), None).await
    })
}

/// The general way: hickory's message, decided here unless `decided` already was, encoded by
/// hickory within the client's payload (truncated with TC beyond it).
async fn general(
    handler: &DnsListener,
    message: MessageRequest,
    src: SocketAddr,
    decided: Option<(Reply, Option<Answered>)>,
    asker: Option<Asker>,
) -> Option<Answer> {
    let limit = reply::udp_limit(&message);
    let request = Request::new(message, src, Protocol::Udp);
    let answer = Encoded::new(limit);
    let answered = match decided {
        Some((reply, answered)) => {
            reply::send(&request, &reply, answer.clone()).await;
            answered
        }
        None => {
            let mut answered = None;
            handler
                .respond(&request, answer.clone(), Some(&mut answered), asker)
                .await;
            answered
        }
    };
    // Kept only whole: a truncated answer is not repeated.
    let bytes = answer.take()?;
    let whole = bytes.get(2).is_some_and(|flags| flags & 0x02 == 0);
    Some((bytes, answered.filter(|_| whole)))
}

/// `FORMERR` for a query whose header is readable but whose body is not.
fn form_error(header: &Header) -> Option<Vec<u8>> {
    let mut reply = Header::response_from_request(header);
    reply.set_response_code(ResponseCode::FormErr);
    reply.set_query_count(0);
    reply.to_bytes().ok()
}
