//! `approvals.webhook`: every new request is sent, as JSON, to the operator's URL, signed
//! with HMAC-SHA256 under the shared secret; the reply may carry the decision, signed the
//! same way. A reply that is not signed right, is stale, or names another request is ignored
//! (the request stays pending for a person or a later API call).
//!
//! Signing: `X-Egress-Proxy-Timestamp: UNIX_SECONDS` and
//! `X-Egress-Proxy-Signature: sha256=HEX(HMAC_SHA256(secret, TIMESTAMP + "." + BODY))`, on
//! the request and on the reply alike. A reply's timestamp must be within [`SKEW`] of now.
//! Reply body: `{"id": "r-…", "decision": "approve" | "deny", "grant"?, "ttl_s"?, "note"?}`.

use crate::policy::cause::{self as cause, caused};
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use serde::Deserialize;

use crate::approvals::error::{webhook, ApprovalError};
use crate::config::approvals::Webhook;
pub use crate::wire::signature::{now_secs, sign, verify, SIGNATURE, SKEW, TIMESTAMP};

/// Largest reply body read.
const MAX_REPLY: usize = 16 * 1024;

/// The decision a webhook's reply may carry.
#[derive(Debug, Deserialize)]
pub struct Reply {
    /// The request the reply answers.
    pub id: String,
    /// `approve` or `deny`.
    pub decision: String,
    /// The grant's kind for an approval (`once`, `ttl`, `permanent`).
    #[serde(default)]
    pub grant: Option<String>,
    /// Seconds, for a `ttl` grant.
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// A note for the agent and the record.
    #[serde(default)]
    pub note: Option<String>,
}

/// Send `body` to the webhook; the reply's decision when it is signed right and names `id`.
pub async fn send(hook: &Webhook, id: &str, body: Vec<u8>) -> Result<Option<Reply>, ApprovalError> {
    let ts = now_secs();
    let signature = sign(&hook.secret, ts, &body);
    let fut = exchange(hook, ts, signature, body);
    let (status, headers, reply) = tokio::time::timeout(hook.timeout, fut)
        .await
        .map_err(|_| webhook(format!("no answer within {:?}", hook.timeout)))??;
    if !(200..300).contains(&status) || reply.is_empty() {
        return Ok(None);
    }
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !verify(
        &hook.secret,
        header(TIMESTAMP),
        header(SIGNATURE),
        &reply,
        now_secs(),
    ) {
        return Err(webhook(
            "the reply's signature does not verify; its decision is ignored",
        ));
    }
    let reply: Reply = serde_json::from_slice(&reply).map_err(|e| webhook(caused("reply", e)))?;
    if reply.id != id {
        return Err(webhook(format!(
            "the reply names request {}, not {id}",
            reply.id
        )));
    }
    Ok(Some(reply))
}

type Answered = (u16, http::HeaderMap, Vec<u8>);

async fn exchange(
    hook: &Webhook,
    ts: u64,
    signature: String,
    body: Vec<u8>,
) -> Result<Answered, ApprovalError> {
    let uri = &hook.url;
    let host = uri
        .host()
        .ok_or_else(|| webhook("no host"))?
        .trim_matches(['[', ']'])
        .to_string();
    let tls = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| webhook(caused(format!("connect {host}:{port}"), e)))?;
    let req = http::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            http::header::HOST,
            uri.authority().map_or("", |a| a.as_str()),
        )
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(TIMESTAMP, ts.to_string())
        .header(SIGNATURE, signature)
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| webhook(cause::of(e)))?;
    if !tls {
        return round_trip(hyper_util::rt::TokioIo::new(tcp), req).await;
    }
    let roots = crate::egress::roots::public_and(None).map_err(|e| webhook(cause::of(e)))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| webhook(cause::of(e)))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| webhook(cause::of(e)))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| webhook(caused("TLS", e)))?;
    round_trip(hyper_util::rt::TokioIo::new(stream), req).await
}

async fn round_trip<IO>(
    io: IO,
    req: http::Request<Full<bytes::Bytes>>,
) -> Result<Answered, ApprovalError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| webhook(cause::of(e)))?;
    tokio::spawn(conn);
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| webhook(cause::of(e)))?;
    let status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let bytes = Limited::new(body, MAX_REPLY)
        .collect()
        .await
        .map_err(|e| webhook(caused("reply body", e)))?
        .to_bytes();
    Ok((status, parts.headers, bytes.to_vec()))
}
