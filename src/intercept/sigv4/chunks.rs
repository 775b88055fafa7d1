//! The chunk signatures of an `aws-chunked` body (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`),
//! computed again as the body streams: each chunk's signature chains from the previous one,
//! starting at the request's (new) seed signature, over the chunk's hash. A chunk is held
//! until it is whole (at most [`MAX_CHUNK`] bytes); the size and the signature's length do
//! not change, so neither does the body's. A body that is not such framing is an error (the
//! request is cut): nothing unread goes upstream signed.

use crate::intercept::credential_error::{sign, CredentialError};
use aws_sigv4::sign::v4;
use bytes::{Buf, Bytes, BytesMut};
use sha2::{Digest, Sha256};

/// The largest chunk held (SDKs send 64 or 128 KiB).
pub const MAX_CHUNK: usize = 8 << 20;
/// The longest chunk header line (`size;chunk-signature=<64 hex>`).
const MAX_LINE: usize = 128;
const EXTENSION: &str = ";chunk-signature=";

/// The re-signer of one body.
pub struct Chunks {
    key: Vec<u8>,
    /// `x-amz-date` of the request, and its credential scope.
    date: String,
    scope: String,
    previous: String,
    buf: BytesMut,
    done: bool,
}

impl Chunks {
    pub fn new(key: Vec<u8>, date: String, scope: String, seed: String) -> Self {
        Chunks {
            key,
            date,
            scope,
            previous: seed,
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// Feed bytes of the body; the re-signed chunks that are now whole.
    pub fn push(&mut self, data: &[u8]) -> Result<Bytes, CredentialError> {
        if self.done && !data.is_empty() {
            return Err(sign("bytes after the final chunk of an aws-chunked body"));
        }
        self.buf.extend_from_slice(data);
        let mut out = BytesMut::new();
        while !self.done {
            let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                if self.buf.len() > MAX_LINE {
                    return Err(sign("an aws-chunked chunk header is too long"));
                }
                break;
            };
            let line = std::str::from_utf8(&self.buf[..end])
                .map_err(|_| sign("an aws-chunked chunk header is not text"))?;
            let (size, sig) = line
                .split_once(EXTENSION)
                .ok_or_else(|| sign("an aws-chunked chunk has no chunk-signature"))?;
            let ok = sig.len() == 64 && sig.bytes().all(|b| b.is_ascii_hexdigit());
            let len = usize::from_str_radix(size, 16)
                .ok()
                .filter(|l| ok && *l <= MAX_CHUNK)
                .ok_or_else(|| {
                    sign("an aws-chunked chunk header cannot be read (or the chunk is too large)")
                })?;
            let whole = end + 2 + len + 2;
            if self.buf.len() < whole {
                break;
            }
            if &self.buf[whole - 2..whole] != b"\r\n" {
                return Err(sign(
                    "an aws-chunked chunk does not end where its size says",
                ));
            }
            let size = size.to_string();
            let chunk = self.buf.split_to(whole);
            let data = &chunk[end + 2..end + 2 + len];
            let signature = self.sign(data);
            out.extend_from_slice(size.as_bytes());
            out.extend_from_slice(EXTENSION.as_bytes());
            out.extend_from_slice(signature.as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
            self.previous = signature;
            self.done = len == 0;
        }
        if self.done && self.buf.has_remaining() {
            return Err(sign("bytes after the final chunk of an aws-chunked body"));
        }
        Ok(out.freeze())
    }

    /// Whether the final (empty) chunk was seen.
    pub fn finished(&self) -> bool {
        self.done
    }

    fn sign(&self, data: &[u8]) -> String {
        let empty = hex::encode(Sha256::digest(b""));
        let sts = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{empty}\n{}",
            self.date,
            self.scope,
            self.previous,
            hex::encode(Sha256::digest(data))
        );
        v4::calculate_signature(&self.key, sts.as_bytes())
    }
}
