//! The connection to one decider: HTTP/1.1 over TCP or a Unix socket, idle connections kept
//! for the next ask, asks in flight bounded per process (`max_in_flight`) and per sandbox
//! (`max_in_flight_per_sandbox`: past either an ask fails at once, it does not queue), each
//! ask bounded in time. A decider that is slow or stopped costs the exchanges that ask it
//! their `timeout_ms`, and nothing to anyone else: no lock is held while an ask waits. A
//! failure is the asking sandbox's own ([`Failure::own`]) when it is past its share, or when
//! the pool is full or the ask times out while the sandbox had another ask in flight at any
//! moment of this one's (security review C4c: a decider that slows under a sandbox's flood
//! timed asks out while the sandbox's share was not full at that instant, and 9 and 13 of
//! 300 forbidden requests passed under `on_error: allow`). Only an ask alone in its sandbox
//! can fail as the decider's own failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

use super::error::{unreachable, DeciderError};
use crate::config::decider::{DeciderConfig, DeciderUrl};

/// The most of an answer that is read.
const MAX_ANSWER: usize = 64 * 1024;
/// Idle connections kept per decider.
const MAX_IDLE: usize = 32;

pub struct Client {
    cfg: Arc<DeciderConfig>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    in_flight: Arc<Semaphore>,
    /// Per sandbox: asks in flight, and asks started since the entry was made (entries
    /// leave at zero in flight).
    per_sandbox: Mutex<HashMap<String, (usize, u64)>>,
}

/// Why an ask got no answer, and whether the asking sandbox's own load caused it (then
/// `on_error: allow` does not apply).
#[derive(Debug)]
pub struct Failure {
    pub why: DeciderError,
    pub own: bool,
}

/// One sandbox's ask counted in flight until dropped.
struct Share<'a> {
    client: &'a Client,
    sandbox: &'a str,
    /// Whether another ask of the sandbox was in flight when this one started.
    joined: bool,
    /// The sandbox's count of asks started, with this one.
    started: u64,
}

impl Share<'_> {
    /// Whether the sandbox's own asks could have loaded the decider during this one: another
    /// was in flight when it started, or another started since (one ask alone is no load).
    fn loaded(&self) -> bool {
        let m = lock(&self.client.per_sandbox);
        let started = m.get(self.sandbox).map_or(self.started, |(_, s)| *s);
        self.joined || started != self.started
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let mut m = lock(&self.client.per_sandbox);
        if let Some((n, _)) = m.get_mut(self.sandbox) {
            *n -= 1;
            if *n == 0 {
                m.remove(self.sandbox);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Client {
    pub fn new(cfg: Arc<DeciderConfig>) -> Self {
        Client {
            in_flight: Arc::new(Semaphore::new(cfg.max_in_flight)),
            cfg,
            idle: Mutex::new(Vec::new()),
            per_sandbox: Mutex::new(HashMap::new()),
        }
    }

    /// Count an ask of `sandbox` in flight, if it is within its share.
    fn share<'a>(&'a self, sandbox: &'a str) -> Option<Share<'a>> {
        let mut m = lock(&self.per_sandbox);
        let (n, started) = m.entry(sandbox.to_string()).or_insert((0, 0));
        if *n >= self.cfg.max_in_flight_per_sandbox {
            return None;
        }
        *n += 1;
        *started += 1;
        Some(Share {
            client: self,
            sandbox,
            joined: *n > 1,
            started: *started,
        })
    }

    /// POST `json` for `sandbox`; the answer's body, or why there is none.
    pub async fn post(&self, sandbox: &str, json: Vec<u8>) -> Result<Bytes, Failure> {
        let Some(share) = self.share(sandbox) else {
            return Err(Failure {
                why: DeciderError::Busy {
                    in_flight: self.cfg.max_in_flight_per_sandbox,
                    per_sandbox: true,
                },
                own: true,
            });
        };
        // Busy and slow are load: the sandbox's own when its asks overlapped this one. A
        // refused connection or a broken answer is the decider's (`on_error` applies).
        let fail = |why: DeciderError| Failure {
            own: share.loaded(),
            why,
        };
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            return Err(fail(DeciderError::Busy {
                in_flight: self.cfg.max_in_flight,
                per_sandbox: false,
            }));
        };
        match tokio::time::timeout(self.cfg.timeout, self.exchange(json)).await {
            Ok(r) => r.map_err(|why| Failure { why, own: false }),
            Err(_) => Err(fail(DeciderError::Timeout(self.cfg.timeout.as_millis()))),
        }
    }

    async fn exchange(&self, json: Vec<u8>) -> Result<Bytes, DeciderError> {
        let mut send = match self.take_idle() {
            Some(s) => s,
            None => self.connect().await?,
        };
        let (path, host) = match &self.cfg.url {
            DeciderUrl::Http { authority, path } => (path.as_str(), authority.as_str()),
            DeciderUrl::Unix { path, .. } => (path.as_str(), "decider"),
        };
        let mut req = Request::post(path)
            .header(http::header::HOST, host)
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(key) = &self.cfg.secret {
            // Signed like the approvals webhook's requests: `timestamp.body` under the key.
            let now = crate::wire::signature::now_secs();
            let sig = crate::wire::signature::sign(&key.0, now, &json);
            req = req
                .header("x-egress-proxy-timestamp", now.to_string())
                .header("x-egress-proxy-signature", sig);
        }
        let req = req
            .body(Full::new(Bytes::from(json)))
            .map_err(|e| unreachable("building the ask", e))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| unreachable("the decider failed", e))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| unreachable("reading the decider's answer", e))?
            .to_bytes();
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(send);
            }
        }
        if !status.is_success() {
            return Err(DeciderError::Status(status.as_u16()));
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

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, DeciderError> {
        let refused = |e: std::io::Error| unreachable("cannot reach the decider", e);
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

async fn handshake<T>(io: T) -> Result<SendRequest<Full<Bytes>>, DeciderError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| unreachable("HTTP with the decider", e))?;
    tokio::spawn(conn);
    Ok(send)
}
