//! The handler's answer, encoded into bytes for the transport that sends it (UDP and TCP
//! alike): at most the transport's limit (the client's UDP payload, or 65,535 over TCP),
//! truncated with TC set beyond it (hickory's encoder drops whole records); an answer that
//! cannot be encoded at all becomes `SERVFAIL` with the query's id.

use std::sync::{Arc, Mutex};

use hickory_proto::op::{Header, MessageType, ResponseCode};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};
use hickory_server::authority::MessageResponse;
use hickory_server::server::{ResponseHandler, ResponseInfo};

/// Where one query's answer is encoded.
#[derive(Clone)]
pub struct Encoded {
    limit: u16,
    out: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Encoded {
    /// An answer of at most `limit` bytes.
    pub fn new(limit: u16) -> Self {
        Encoded {
            limit,
            out: Arc::new(Mutex::new(None)),
        }
    }

    /// The encoded answer (`None`: the handler sent none).
    pub fn take(&self) -> Option<Vec<u8>> {
        self.out.lock().ok()?.take()
    }
}

#[async_trait::async_trait]
impl ResponseHandler for Encoded {
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
    ) -> std::io::Result<ResponseInfo> {
        let id = response.header().id();
        let mut buffer = Vec::with_capacity(512);
        let encoded = {
            let mut encoder = BinEncoder::new(&mut buffer);
            encoder.set_max_size(self.limit);
            response.destructive_emit(&mut encoder)
        };
        let info = match encoded {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "dns: cannot encode an answer");
                let mut h = Header::new();
                h.set_id(id);
                h.set_message_type(MessageType::Response);
                h.set_response_code(ResponseCode::ServFail);
                buffer = h.to_bytes().map_err(std::io::Error::other)?;
                ResponseInfo::from(h)
            }
        };
        if let Ok(mut slot) = self.out.lock() {
            *slot = Some(buffer);
        }
        Ok(info)
    }
}
