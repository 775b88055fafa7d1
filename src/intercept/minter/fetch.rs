//! One HTTPS POST to a token endpoint, made by the proxy itself: the endpoint's name resolved
//! by the proxy's own resolver (so `dns.hosts` applies), TLS verified like every terminated
//! upstream (public roots plus `tls_intercept.upstream_ca_file`), HTTP/1.1, the whole
//! exchange bounded in time and the answer in size. Errors say what failed, never a secret
//! (the request carries one; nothing of it is in an error).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::egress::resolve::Resolver;
use crate::intercept::credential_error::{caused, mint, unreachable, CredentialError};

/// The most of a token endpoint's answer that is read.
const MAX_ANSWER: usize = 64 * 1024;

/// A token endpoint's answer: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// POST `body` to `url` with `headers` (values marked sensitive), within `within`.
pub async fn post(
    tls: &Arc<rustls::ClientConfig>,
    resolver: &Resolver,
    url: &Uri,
    headers: Vec<(HeaderName, String)>,
    body: Vec<u8>,
    within: Duration,
) -> Result<Answer, CredentialError> {
    match tokio::time::timeout(within, exchange(tls, resolver, url, headers, body)).await {
        Ok(r) => r,
        Err(_) => Err(mint(format!(
            "the token endpoint did not answer within {} ms",
            within.as_millis()
        ))),
    }
}

async fn exchange(
    tls: &Arc<rustls::ClientConfig>,
    resolver: &Resolver,
    url: &Uri,
    headers: Vec<(HeaderName, String)>,
    body: Vec<u8>,
) -> Result<Answer, CredentialError> {
    let host = url
        .host()
        .ok_or_else(|| mint("the token URL has no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(443);
    let addrs = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => resolver
            .resolve(bare)
            .await
            .map_err(|e| unreachable(format!("resolving {bare}: {}", e.reason().code())))?,
    };
    let mut tcp = Err(unreachable(format!("{bare} has no address")));
    for ip in addrs {
        tcp = tokio::net::TcpStream::connect((ip, port))
            .await
            .map_err(|e| unreachable(caused(format!("connecting to {ip}:{port}"), e)));
        if tcp.is_ok() {
            break;
        }
    }
    let tcp = tcp?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(bare.to_string())
        .map_err(|_| unreachable(format!("{bare} is not a TLS server name")))?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| unreachable(caused(format!("TLS with {bare}"), e)))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(caused(format!("HTTP with {bare}"), e)))?;
    tokio::spawn(conn);
    let authority = url.authority().map(|a| a.as_str()).unwrap_or(bare);
    let mut req = Request::post(url.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header(http::header::HOST, authority)
        .header(http::header::USER_AGENT, "egress-proxy")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| mint(caused("building the request", e)))?;
    for (n, v) in headers {
        let mut v =
            HeaderValue::from_str(&v).map_err(|_| mint(format!("header {n} is not valid")))?;
        v.set_sensitive(true);
        req.headers_mut().insert(n, v);
    }
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| unreachable(caused("the token endpoint failed", e)))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| unreachable(caused("reading the token endpoint's answer", e)))?
        .to_bytes();
    Ok(Answer { status, body })
}
