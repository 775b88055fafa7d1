//! The body phase of the request pipeline: the body of a request whose rules name a protocol
//! is read whole, within `tls_intercept.judge_body_bytes` (a larger body, or one that fails to
//! arrive, is refused), then judged by each candidate rule's protocol in turn
//! ([`Protocol::judge`]); the first that allows it decides. The body is read as its declared
//! media type ([`Protocol::judge`] refuses a type the protocol does not read), and only one
//! `Content-Type` is read. The bytes judged are the bytes sent upstream.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName};

use crate::policy::protocols::inference::{Call, InferenceRule};
use crate::policy::protocols::mcp::{Lists, McpRule};
use crate::policy::protocols::{Asked, Protocol, RefusedCall};
use crate::policy::reason::Reason;

use super::whole::Unread;

/// What the judged request may do: what it called, and the MCP rule its response is filtered
/// by (with the lists asked for).
#[derive(Default)]
pub struct Allowed {
    /// What the request called (for the record).
    pub call: Option<String>,
    /// The MCP rule its response is filtered by, and the lists asked for.
    pub mcp: Option<(Arc<McpRule>, Lists)>,
    /// An inference rule's call: the rule and what the call asks for.
    pub inference: Option<(Arc<InferenceRule>, Box<Call>)>,
}

/// Read `body` (at most `limit` bytes); the refusal names the first candidate's protocol.
pub async fn read<B>(body: B, limit: u64, first: &Protocol) -> Result<Bytes, RefusedCall>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    super::whole::read(body, limit).await.map_err(|e| {
        let (reason, detail) = match e {
            Unread::TooLarge(_) => (
                first.reason(),
                format!("the body is larger than {limit} bytes, more than a {} rule judges (tls_intercept.judge_body_bytes)", first.name()),
            ),
            Unread::Failed(e) => (Reason::MalformedRequest, format!("the body could not be read: {e}")),
        };
        RefusedCall {
            refusal: Box::new(crate::policy::refusal::Refusal::new(reason, detail)),
            call: None,
            rpc: None,
        }
    })
}

/// The routing headers of MCP's 2026 transport, named once (not parsed from text per request).
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// The headers the protocols read, in their order in [`read_headers`]'s answer.
const READ: [HeaderName; 3] = [http::header::CONTENT_TYPE, MCP_METHOD, MCP_NAME];

/// The value of each header in [`READ`], found in one walk over the request's few headers
/// (a lookup each would hash each name). A header sent twice reads as a value no body agrees
/// with (the origin may read either); one that is not visible ASCII (a base64-wrapped name
/// included) cannot agree with the body either: it reads as a value no body carries.
fn read_headers(headers: &HeaderMap) -> [Option<&str>; 3] {
    const NONE_AGREES: &str = "\u{0}";
    let mut read = [None; 3];
    for (name, value) in headers {
        if let Some(i) = READ.iter().position(|n| n == name) {
            read[i] = match read[i] {
                None => Some(value.to_str().unwrap_or(NONE_AGREES)),
                Some(_) => Some(NONE_AGREES),
            };
        }
    }
    read
}

/// Judge `body` by each candidate in turn: the first that allows it decides; else the first
/// candidate's refusal.
pub fn judge(
    candidates: &[Arc<Protocol>],
    parts: &Parts,
    body: &[u8],
) -> Result<Allowed, RefusedCall> {
    let [content_type, mcp_method, mcp_name] = read_headers(&parts.headers);
    let asked = Asked {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        content_type,
        mcp_method,
        mcp_name,
    };
    let mut first = None;
    for p in candidates {
        match p.judge(asked, body) {
            Ok(j) => {
                let mcp = match &**p {
                    Protocol::Mcp(rule) => Some((rule.clone(), j.lists)),
                    _ => None,
                };
                let inference = match (&**p, j.inference) {
                    (Protocol::Inference(rule), Some(c)) => Some((rule.clone(), c)),
                    _ => None,
                };
                return Ok(Allowed {
                    call: j.call,
                    mcp,
                    inference,
                });
            }
            Err(r) => {
                first.get_or_insert(r);
            }
        }
    }
    Err(first.unwrap_or_else(|| RefusedCall {
        refusal: Box::new(crate::policy::refusal::Refusal::new(
            Reason::HttpNotAllowed,
            "no rule judged the request",
        )),
        call: None,
        rpc: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// What a lookup of each header reads: its one value, or a value no body agrees with.
    fn looked_up(headers: &HeaderMap) -> [Option<&str>; 3] {
        READ.map(|name| {
            let mut all = headers.get_all(name).iter();
            let first = all.next()?;
            match all.next() {
                Some(_) => Some("\u{0}"),
                None => Some(first.to_str().unwrap_or("\u{0}")),
            }
        })
    }

    #[test]
    fn one_walk_reads_each_header_as_a_lookup_would() {
        let values: [&[u8]; 4] = [b"application/json", b"tools/call", b"caf\xc3\xa9", b""];
        let names = [
            "content-type",
            "mcp-method",
            "mcp-name",
            "accept",
            "Mcp-Name",
        ];
        // Every order of up to three headers drawn from the names and values (repeats included).
        for n in 0..=3u32 {
            for code in 0..(names.len() * values.len()).pow(n) {
                let mut headers = HeaderMap::new();
                let mut c = code;
                for _ in 0..n {
                    let (name, value) = (names[c % names.len()], values[(c / names.len()) % 4]);
                    c /= names.len() * values.len();
                    let value = HeaderValue::from_bytes(value).expect("a header value");
                    headers.append(
                        HeaderName::from_bytes(name.as_bytes()).expect("a name"),
                        value,
                    );
                }
                assert_eq!(read_headers(&headers), looked_up(&headers), "{headers:?}");
            }
        }
    }
}
