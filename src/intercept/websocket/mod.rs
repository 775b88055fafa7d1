//! WebSocket on a terminated host, after the pipeline allowed the upgrade (a `protocol:
//! websocket` rule, [`crate::policy::protocols::websocket`]): the handshake as it goes
//! upstream ([`upstream_headers`]: `Upgrade`/`Connection` written by the proxy, compression
//! extensions stripped so every frame is readable), the origin's answer checked
//! ([`switched`]: only a `101` with `Upgrade: websocket` and no extension makes a socket),
//! then both streams read as frames by `fastwebsockets` — never as opaque bytes — and each
//! message judged, rewritten and forwarded by [`pump`]. [`Socket::run`] ends the socket with
//! a close frame on both sides when a message is refused (1008), a frame breaks the protocol
//! (1002), a message is too large (1009), the policy no longer allows the socket (1008) or
//! the proxy stops (1012).

mod control;
pub mod frames;
mod pump;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::{Frame, Role, WebSocket, WebSocketWrite};
use http::header::{self, HeaderMap, HeaderValue};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::WriteHalf;
use tokio::sync::{watch, Mutex};

use super::scrub::Scrubber;
use crate::audit::outcome::Close;
use crate::audit::record::HttpFacts;
use crate::audit::{AuditGuard, Recorder};
use crate::config::decider::DlpConfig;
use crate::policy::protocols::websocket::WsRule;
use crate::policy::protocols::RefusedCall;
use crate::policy::Verdict;
use crate::relay::liveness::Liveness;

/// How long a socket being closed waits for the other side's close frame.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How often an open socket checks that the policy in force still allows it.
const RECHECK: Duration = Duration::from_millis(500);

/// The write half of one side's frame stream.
type Writer = Mutex<WebSocketWrite<WriteHalf<TokioIo<Upgraded>>>>;

/// The read half of one side's frame stream.
type Reader = fastwebsockets::WebSocketRead<tokio::io::ReadHalf<TokioIo<Upgraded>>>;

/// (placeholder, secret): replaced in the sandbox's text messages.
pub type Swaps = Vec<(Vec<u8>, Vec<u8>)>;

/// (credential, placeholder) of credentials bound to other hosts.
pub type Foreign = Vec<(String, Vec<u8>)>;

/// Rewrite the handshake's headers as they go upstream: on HTTP/1.1 the proxy's own
/// `Connection: Upgrade` and `Upgrade: websocket` (hop-by-hop, never the client's; HTTP/2's
/// extended CONNECT has none), and no `Sec-WebSocket-Extensions` (a compressed frame could
/// not be judged).
pub fn upstream_headers(headers: &mut HeaderMap, h2: bool) {
    crate::relay::hop_by_hop::strip_hop_by_hop(headers);
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    if !h2 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
}

/// Why the origin's `101` (HTTP/2: `200`) did not make a socket the proxy can read, if it
/// did not: it needs `Upgrade: websocket` (HTTP/1.1), and no extension (none was offered).
pub fn not_switched(headers: &HeaderMap, h2: bool) -> Option<&'static str> {
    if !h2 && !crate::pipeline::head::wants_websocket(headers) {
        return Some("the origin answered 101 without Upgrade: websocket");
    }
    if headers.contains_key(header::SEC_WEBSOCKET_EXTENSIONS) {
        return Some("the origin chose a WebSocket extension the proxy did not offer (compressed frames cannot be judged)");
    }
    None
}

/// The `101` (HTTP/2: `200`) the client is answered with: the origin's accept key and
/// subprotocol, and on HTTP/1.1 the proxy's own `Upgrade` and `Connection`.
pub fn client_headers(origin: &HeaderMap, h2: bool) -> HeaderMap {
    let mut h = HeaderMap::new();
    if !h2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
    for k in [header::SEC_WEBSOCKET_ACCEPT, header::SEC_WEBSOCKET_PROTOCOL] {
        if let Some(v) = origin.get(&k) {
            h.insert(k, v.clone());
        }
    }
    h
}

/// Whether the policy in force still allows the socket ([`Now`]).
pub type Still = Box<dyn Fn() -> Now + Send + Sync>;

/// What the policy in force says of an open socket.
pub enum Now {
    /// Allowed, by this rule (a reload may have changed it).
    Allowed(Arc<WsRule>),
    /// No longer allowed, and why.
    Refused(String),
}

/// What a socket's messages are read with: its rule, the credentials and scanners of its
/// host, where it is recorded and what can end it.
pub struct Socket {
    /// The rule that allowed the upgrade (replaced when a reload changes it).
    pub rule: Arc<WsRule>,
    /// A credential is bound to the host (binary messages refused unless allowed).
    pub credentialed: bool,
    /// Placeholders replaced in the sandbox's text messages.
    pub replace: Swaps,
    /// Placeholders of credentials not bound here: refused in the sandbox's messages.
    pub foreign: Foreign,
    /// The secrets scrubbed from the origin's messages.
    pub scrubber: Option<Arc<Scrubber>>,
    /// The DLP rules each message from the sandbox is scanned with.
    pub dlp: Option<Arc<DlpConfig>>,
    /// The sandbox is in report mode: a refused message is forwarded and recorded `report`.
    pub report: bool,
    /// The sandbox's flow rules toward the host: each of its messages is a write.
    pub flow: Option<crate::pipeline::flow::Gate>,
    /// The tunnel's liveness (bytes, idle, the daily byte quota).
    pub live: Arc<Liveness>,
    /// Where refused messages are recorded.
    pub recorder: Recorder,
    /// The handshake's method and path, for the records.
    pub asked: (http::Method, Arc<str>),
    /// Re-judges the socket under the policy in force.
    pub still: Still,
    /// Set when the tunnel is stopped (revocation, shutdown).
    pub ending: watch::Receiver<Option<Close>>,
    /// Messages forwarded each way (sandbox → origin, origin → sandbox); zero at first.
    pub counts: [AtomicU64; 2],
    /// The pings not yet answered each way ([`control`]); empty at first.
    pub pings: std::sync::Mutex<control::Pings>,
    /// Credentials whose secret the origin's messages carried (scrubbed); empty at first.
    pub reflected: std::sync::Mutex<Vec<String>>,
}

/// How a socket ended.
#[derive(Debug)]
pub struct Ended {
    /// The record's close.
    pub close: Close,
    /// The close code sent or forwarded to the sandbox.
    pub code: u16,
    /// Why, when the proxy ended it.
    pub why: Option<String>,
}

impl Socket {
    /// Relay messages between `client` and `origin` until either closes, a message is
    /// refused, the policy no longer allows the socket or the tunnel stops; the socket's
    /// record (`audit`) says how it ended.
    pub async fn run(self, client: Upgraded, origin: Upgraded, mut audit: AuditGuard) -> Close {
        let cap = self.rule.max_message;
        let base = self.live.totals();
        let (mut from_client, to_client) = frames(client, Role::Server, cap);
        let (mut from_origin, to_origin) = frames(origin, Role::Client, cap);
        let (to_client, to_origin) = (Mutex::new(to_client), Mutex::new(to_origin));
        let rule = std::sync::RwLock::new(self.rule.clone());
        let ended = {
            let up = pump::pump(
                &self,
                &rule,
                &mut from_client,
                (&to_origin, &to_client),
                true,
            );
            let down = pump::pump(
                &self,
                &rule,
                &mut from_origin,
                (&to_client, &to_origin),
                false,
            );
            tokio::pin!(up, down);
            let mut ending = self.ending.clone();
            let watch = watch_policy(&self.still, &mut ending, &rule);
            tokio::pin!(watch);
            let first = tokio::select! {
                e = &mut up => (e, true),
                e = &mut down => (e, false),
                e = &mut watch => {
                    close_both(&to_client, &to_origin, &e).await;
                    (e, true)
                }
            };
            match first {
                (pump::Step::Closed(e), up_first) => {
                    // One side closed: let the other's close answer through.
                    let rest = async {
                        match up_first {
                            true => down.await,
                            false => up.await,
                        }
                    };
                    let _ = tokio::time::timeout(CLOSE_GRACE, rest).await;
                    e
                }
                (pump::Step::Stop(e), _) => e,
            }
        };
        let [up, down] = &self.counts;
        let (up, down) = (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
        let mut detail = format!(
            "websocket: {up} messages from the sandbox, {down} from the origin; close {}",
            ended.code
        );
        if let Some(why) = &ended.why {
            detail.push_str(&format!(": {why}"));
        }
        audit.detail(detail);
        audit.close(ended.close);
        let reflected =
            std::mem::take(&mut *self.reflected.lock().unwrap_or_else(|p| p.into_inner()));
        for name in &reflected {
            audit.secret_reflected(name);
        }
        let (u, d) = self.live.totals();
        audit.bytes(u.saturating_sub(base.0), d.saturating_sub(base.1));
        ended.close
    }

    /// Record a message the rule refused (or, in report mode, let through): one record per
    /// message, with the socket's method and path and what it called.
    fn record_refused(&self, sent: bool, n: u64, r: &RefusedCall) {
        let mut audit = self.recorder.guard();
        let verdict = match self.report {
            true => Verdict::Report,
            false => Verdict::Deny,
        };
        audit.verdict(verdict, r.refusal.reason);
        let from = if sent { "the sandbox" } else { "the origin" };
        audit.detail(format!(
            "websocket message {n} from {from}: {}",
            r.refusal.detail
        ));
        audit.http(HttpFacts {
            method: self.asked.0.clone(),
            path: self.asked.1.clone(),
            status: 101,
            credential: None,
            secret_reflected: None,
            call: Some(format!(
                "websocket {}",
                r.call.as_deref().unwrap_or("message")
            )),
        });
    }
}

/// Both halves of one side's frame stream, read with the proxy's caps: control frames and
/// closes are the relay's to forward (no automatic answers), frames larger than `cap`
/// refused by the reader.
fn frames(
    io: Upgraded,
    role: Role,
    cap: usize,
) -> (Reader, WebSocketWrite<WriteHalf<TokioIo<Upgraded>>>) {
    let mut ws = WebSocket::after_handshake(TokioIo::new(io), role);
    ws.set_auto_close(false);
    ws.set_auto_pong(false);
    ws.set_max_message_size(cap.saturating_add(1));
    ws.split(tokio::io::split)
}

/// Ends the socket when the policy in force no longer allows it (checked every
/// [`RECHECK`], the rule replaced when a reload changed it) or the tunnel is stopped.
async fn watch_policy(
    still: &Still,
    ending: &mut watch::Receiver<Option<Close>>,
    rule: &std::sync::RwLock<Arc<WsRule>>,
) -> pump::Step {
    let mut tick = tokio::time::interval(RECHECK);
    loop {
        tokio::select! {
            _ = tick.tick() => match still() {
                Now::Allowed(now) => {
                    if let Ok(mut r) = rule.write() {
                        *r = now;
                    }
                }
                Now::Refused(why) => return pump::Step::Stop(Ended { close: Close::Revoked, code: 1008, why: Some(why) }),
            },
            changed = ending.changed() => {
                let close = match changed {
                    Ok(()) => (*ending.borrow()).unwrap_or(Close::Shutdown),
                    Err(_) => Close::Shutdown,
                };
                let (code, why) = match close {
                    Close::Shutdown => (1012, "the proxy is restarting"),
                    Close::Limit => (1008, "a daily quota of the sandbox is spent"),
                    _ => (1008, "the policy in force no longer allows this connection"),
                };
                return pump::Step::Stop(Ended { close, code, why: Some(why.into()) });
            }
        }
    }
}

/// Send a close frame with the ending's code and reason to the sandbox, and 1001 to the
/// origin (the proxy is going away); best effort.
async fn close_both(to_client: &Writer, to_origin: &Writer, e: &pump::Step) {
    let (code, why) = match e {
        pump::Step::Closed(e) | pump::Step::Stop(e) => (e.code, e.why.clone().unwrap_or_default()),
    };
    close_one(to_client, code, &why).await;
    close_one(to_origin, 1001, "").await;
}

/// One close frame, its reason cut to what a control frame carries; best effort.
async fn close_one(w: &Writer, code: u16, why: &str) {
    let mut reason = format!("egress-proxy: {why}");
    if reason.len() > 123 {
        let mut end = 120;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    let mut w = w.lock().await;
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        let _ = w.write_frame(Frame::close(code, reason.as_bytes())).await;
        let _ = w.flush().await;
    })
    .await;
}
