//! The connection to one decider: HTTP/1.1 over TCP or a Unix socket, idle connections kept
//! for the next ask, asks in flight bounded (`max_in_flight`: past it an ask fails at once,
//! it does not queue), each ask bounded in time. A decider that is slow or stopped costs the
//! exchanges that ask it their `timeout_ms`, and nothing to anyone else: no lock is held
//! while an ask waits.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

use crate::config::decider::{DeciderConfig, DeciderUrl};

/// The most of an answer that is read.
const MAX_ANSWER: usize = 64 * 1024;
/// Idle connections kept per decider.
const MAX_IDLE: usize = 32;

pub struct Client {
    cfg: Arc<DeciderConfig>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    in_flight: Arc<Semaphore>,
}

impl Client {
    pub fn new(cfg: Arc<DeciderConfig>) -> Self {
        Client {
            in_flight: Arc::new(Semaphore::new(cfg.max_in_flight)),
            cfg,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// POST `json`; the answer's body, or why there is none.
    pub async fn post(&self, json: Vec<u8>) -> Result<Bytes, String> {
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            return Err(format!(
                "{} asks already in flight (decider.max_in_flight)",
                self.cfg.max_in_flight
            ));
        };
        match tokio::time::timeout(self.cfg.timeout, self.exchange(json)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the decider did not answer within {} ms",
                self.cfg.timeout.as_millis()
            )),
        }
    }

    async fn exchange(&self, json: Vec<u8>) -> Result<Bytes, String> {
        let mut send = match self.take_idle() {
            Some(s) => s,
            None => self.connect().await?,
        };
        let (path, host) = match &self.cfg.url {
            DeciderUrl::Http { authority, path } => (path.as_str(), authority.as_str()),
            DeciderUrl::Unix { path, .. } => (path.as_str(), "decider"),
        };
        let req = Request::post(path)
            .header(http::header::HOST, host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(json)))
            .map_err(|e| format!("building the ask: {e}"))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("the decider failed: {e}"))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("reading the decider's answer: {e}"))?
            .to_bytes();
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(send);
            }
        }
        if !status.is_success() {
            return Err(format!("the decider answered HTTP {}", status.as_u16()));
        }
        Ok(body)
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let refused = |e: std::io::Error| format!("cannot reach the decider: {e}");
        match &self.cfg.url {
            DeciderUrl::Http { authority, .. } => {
                let tcp = tokio::net::TcpStream::connect(authority.as_str())
                    .await
                    .map_err(refused)?;
                let _ = tcp.set_nodelay(true);
                handshake(TokioIo::new(tcp)).await
            }
            DeciderUrl::Unix { socket, .. } => {
                let s = tokio::net::UnixStream::connect(socket)
                    .await
                    .map_err(refused)?;
                handshake(TokioIo::new(s)).await
            }
        }
    }
}

async fn handshake<T>(io: T) -> Result<SendRequest<Full<Bytes>>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP with the decider: {e}"))?;
    tokio::spawn(conn);
    Ok(send)
}
