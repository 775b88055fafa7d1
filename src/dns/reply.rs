//! What the listener sends back, once decided ([`Reply`]), and how it is written the general
//! way: hickory's response builder and encoder, for a query hickory read (TCP, a UDP query of
//! an uncommon shape, an answer with records). The common refusal is written from the wire
//! format instead ([`crate::dns::wire`]); [`encode_general`] is this way's bytes for the
//! differential check between the two.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};

use hickory_proto::op::{Edns, Header, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::BinDecodable;
use hickory_proto::xfer::Protocol;
use hickory_server::authority::{MessageRequest, MessageResponseBuilder};
use hickory_server::server::{Request, ResponseHandler, ResponseInfo};

use crate::dns::answer::Encoded;
use crate::dns::wire::{CLASSIC_PAYLOAD, EDE_OPTION, MAX_UDP_PAYLOAD};

/// What to send back, and what the record says.
pub struct Reply {
    pub rcode: ResponseCode,
    pub records: Vec<Record>,
    /// Extended DNS Error: info code and text.
    pub ede: Option<(u16, String)>,
}

impl Reply {
    /// Just a response code.
    pub fn code(rcode: ResponseCode) -> Self {
        Reply {
            rcode,
            records: Vec::new(),
            ede: None,
        }
    }

    /// A response code and an Extended DNS Error saying why.
    pub fn explained(rcode: ResponseCode, code: u16, text: String) -> Self {
        Reply {
            rcode,
            records: Vec::new(),
            ede: Some((code, text)),
        }
    }

    /// The Extended DNS Error, borrowed.
    pub fn ede(&self) -> Option<(u16, &str)> {
        self.ede.as_ref().map(|(code, text)| (*code, text.as_str()))
    }
}

/// The response header to a request's: the same id, opcode, RD and CD; recursion available,
/// not authoritative.
pub fn header(request: &Header) -> Header {
    let mut header = Header::response_from_request(request);
    header.set_recursion_available(true);
    header.set_authoritative(false);
    header
}

/// Send `reply` to `request` through `handle`: the question as asked, the records, and to a
/// client that speaks EDNS our payload and the Extended DNS Error.
pub async fn send<R: ResponseHandler>(
    request: &Request,
    reply: &Reply,
    mut handle: R,
) -> ResponseInfo {
    let mut header = header(request.header());
    header.set_response_code(reply.rcode);
    let mut builder = MessageResponseBuilder::from_message_request(request);
    if request.edns().is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        if let Some((code, text)) = reply.ede() {
            let mut data = code.to_be_bytes().to_vec();
            data.extend_from_slice(text.as_bytes());
            edns.options_mut()
                .insert(EdnsOption::Unknown(EDE_OPTION, data));
        }
        builder.edns(edns);
    }
    let response = builder.build(header, reply.records.iter(), [], [], []);
    match handle.send_response(response).await {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!(error = %e, "dns: cannot send a response");
            ResponseInfo::from(header)
        }
    }
}

/// The largest UDP answer `message`'s client takes.
pub fn udp_limit(message: &MessageRequest) -> u16 {
    message
        .edns()
        .map(|e| e.max_payload().max(CLASSIC_PAYLOAD))
        .unwrap_or(CLASSIC_PAYLOAD)
}

/// The general way's UDP answer to `bytes` (`rcode`, no records, `ede`), and the question it
/// read (type, class, the name's labels as sent); `None` when hickory cannot read it as a
/// query with one question.
#[allow(clippy::type_complexity)]
pub fn encode_general(
    bytes: &[u8],
    rcode: ResponseCode,
    ede: Option<(u16, &str)>,
) -> Option<(Vec<u8>, (u16, u16, Vec<Vec<u8>>))> {
    let message = MessageRequest::from_bytes(bytes).ok()?;
    let limit = udp_limit(&message);
    let src = SocketAddr::from((Ipv4Addr::LOCALHOST, 5353));
    let request = Request::new(message, src, Protocol::Udp);
    let question = {
        let q = request.request_info().ok()?.query.original().clone();
        let labels = q.name().iter().map(<[u8]>::to_vec).collect();
        (
            u16::from(q.query_type()),
            u16::from(q.query_class()),
            labels,
        )
    };
    let reply = Reply {
        rcode,
        records: Vec::new(),
        ede: ede.map(|(code, text)| (code, text.to_owned())),
    };
    let out = Encoded::new(limit);
    let mut sent = Box::pin(send(&request, &reply, out.clone()));
    let waker = std::task::Waker::noop();
    // Encoding into memory never waits.
    let std::task::Poll::Ready(_) = sent
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
    else {
        return None;
    };
    Some((out.take()?, question))
}

/// The record's spelling of a response code.
pub fn rcode_name(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::Refused => "REFUSED",
        _ => "OTHER",
    }
}
