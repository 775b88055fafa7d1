//! The relay of a transparent connection decided by its HTTP `Host`: every request head the
//! client sends on it — not only the first — is framed ([`crate::wire::http_stream`]) and checked
//! before any of it reaches the origin. A request whose `Host` (or absolute-form authority)
//! names another host or port than the one the connection was decided and dialled for ends
//! the connection with a reset (`host_mismatch`; in report mode it is recorded and relayed).
//! A request that cannot be framed unambiguously ends it too (`protocol_not_allowed`).
//! Each request after the first is reserved as a request of its own (daily quotas, a `once`
//! grant): one past them is not sent, and the connection ends after the origin has answered
//! the requests sent before it (`quota_exceeded`, `no_rule_matched`) — the earlier requests
//! keep their answers and cost one unit each, what was delivered (security review C3d:
//! six pipelined requests against a quota of 3 were charged 3, the origin got 1 and the
//! client no answer). What the client still sends after the refused request is read and
//! dropped until it closes (a lingering close, bounded): a socket closed with bytes unread
//! is reset, and the reset can take the answers with it.
//! The other direction is relayed as it comes and framed alongside
//! ([`crate::wire::http_response`]) so that a request asking to switch protocols (`Upgrade`,
//! `CONNECT`) ends the checks only when the origin really switched (`101`, `2xx`): until it
//! has answered, nothing more of the client's is relayed, and after any other answer the next
//! request is checked like the others.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::audit::outcome::Close;
use crate::audit::record::HttpFacts;
use crate::audit::{AuditGuard, Recorder};
use crate::egress::limits::SandboxLimiter;
use crate::policy::reason::Reason;
use crate::policy::refusal::Refusal;
use crate::policy::target::{Host, Target};
use crate::policy::Verdict;
use crate::relay::liveness::Liveness;
use crate::relay::tunnel::{drive, pump_observed, Relayed};
use crate::wire::http_response::{Answer, ResponseStream};
use crate::wire::http_stream::{Head, RequestKind, RequestStream, Step};
use crate::wire::peek::split_host_header;

/// How a checked relay ended: the relay's result, and the first request that was refused (or,
/// in report mode, would have been).
#[derive(Debug)]
pub struct CheckedRelay {
    /// How the relay ended.
    pub relayed: Relayed,
    /// A request that named another host, if one did.
    pub mismatch: Option<Refusal>,
}

/// Whether `head` names `expected` (host, and port when it gives one; the connection's port
/// otherwise).
pub fn check(head: &Head, expected: &Target) -> Result<(), Refusal> {
    let named = head.authority.as_deref().or(head.host.as_deref());
    let Some(value) = named else {
        return Err(Refusal::new(
            Reason::HostMismatch,
            "a request without Host on a connection decided by Host",
        ));
    };
    let (h, p) = split_host_header(value);
    let same_host = Host::parse(h).is_ok_and(|h| h == expected.host);
    let same_port = p.is_none_or(|p| p.parse::<u16>() == Ok(expected.port));
    if same_host && same_port {
        return Ok(());
    }
    let shown: String = value
        .chars()
        .take(255)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    Err(Refusal::new(
        Reason::HostMismatch,
        format!("a later request named {shown}; the connection was decided for {expected}"),
    ))
}

/// Relay `client` ⇄ `server`, replaying `first` (the peeked bytes, which hold the first
/// request head) and checking every request head against `expected`. With `report`, a
/// mismatch is recorded and the request relayed anyway.
#[allow(clippy::too_many_arguments)]
pub async fn relay_checked<C, S, F>(
    mut client: C,
    mut server: S,
    first: Vec<u8>,
    expected: &Target,
    report: bool,
    (live, recorder): (Liveness, Recorder),
    stop: F,
    shaper: Option<&SandboxLimiter>,
) -> CheckedRelay
where
    C: crate::egress::abortable::OverTcp,
    S: crate::egress::abortable::OverTcp,
    F: std::future::Future<Output = Close>,
{
    let found: Mutex<Option<Refusal>> = Mutex::new(None);
    let responses = Mutex::new(ResponseStream::new());
    let (answer_tx, answer_rx) = tokio::sync::watch::channel(Answer::Pending);
    let answered = tokio::sync::Notify::new();
    let records = Records::default();
    let relayed = {
        let (mut cr, cw) = tokio::io::split(&mut client);
        let (sr, mut sw) = tokio::io::split(&mut server);
        let up = async {
            let mut framer = RequestStream::new();
            let mut pending = first;
            let mut buf = vec![0u8; 16 * 1024];
            let mut answer_rx = answer_rx;
            let mut heads = Heads {
                seen: 0,
                live: &live,
                recorder: &recorder,
                records: &records,
            };
            loop {
                let f = frame(
                    &mut framer,
                    &pending,
                    (expected, report),
                    &found,
                    &mut heads,
                );
                expect_answers(&responses, &f.sent, &answer_tx);
                send(&mut sw, &f.out, shaper, &live).await?;
                if f.refused {
                    if spent(&found) {
                        // The requests sent are answered, in order, then the connection
                        // closes: the origin gets the end of the requests.
                        let _ = sw.shutdown().await;
                        linger(&mut cr, &answered).await;
                        return Ok(());
                    }
                    return Err(std::io::Error::other("request refused"));
                }
                if let Some(rest) = f.held {
                    // Nothing more goes out until the origin has answered the switch.
                    let answer = *answer_rx
                        .wait_for(|a| *a != Answer::Pending)
                        .await
                        .map_err(|_| std::io::Error::other("the origin never answered"))?;
                    framer.switched(answer == Answer::Switched);
                    pending = rest;
                    continue;
                }
                let n = cr.read(&mut buf).await?;
                if n == 0 {
                    let _ = sw.shutdown().await;
                    return Ok(());
                }
                pending = buf[..n].to_vec();
            }
        };
        let observe = |bytes: &[u8]| observed(&responses, (&answer_tx, &records), bytes);
        let down = async {
            let r = pump_observed(sr, cw, false, shaper, &live, observe).await;
            answered.notify_one();
            r
        };
        drive(up, down, &live, stop).await
    };
    if let Ok(mut r) = responses.lock() {
        r.finish();
        records.answered(&mut r, Some(relayed.close));
    }
    records.unanswered(relayed.close);
    let mismatch = found.into_inner().ok().flatten();
    ended(relayed, mismatch, report, (client, server))
}

/// The origin's `bytes`, framed: when they complete the answer to a request that asked to
/// switch protocols, the waiting client side is told.
fn observed(
    responses: &Mutex<ResponseStream>,
    (answer_tx, records): (&tokio::sync::watch::Sender<Answer>, &Records),
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut r = responses
        .lock()
        .map_err(|_| std::io::Error::other("poisoned"))?;
    r.feed(bytes).map_err(std::io::Error::other)?;
    records.answered(&mut r, None);
    if r.answer() != Answer::Pending {
        answer_tx.send_if_modified(|a| {
            let changed = *a != r.answer();
            *a = r.answer();
            changed
        });
    }
    Ok(())
}

/// How a checked relay ended: a refused request (unless only reported), a revocation or a
/// shutdown resets both sides — nothing queued reaches either, and the counts leave out what
/// the kernel still held unsent.
fn ended<C, S>(
    mut relayed: Relayed,
    mismatch: Option<Refusal>,
    report: bool,
    (client, server): (C, S),
) -> CheckedRelay
where
    C: crate::egress::abortable::OverTcp,
    S: crate::egress::abortable::OverTcp,
{
    // A refused request that is not only reported (a quota never is), as the record says;
    // one refused for a spent quota or grant ended after the answers before it, unreset.
    let enforced = mismatch
        .as_ref()
        .is_some_and(|m| !(spends(m) || report && m.reason.reportable()));
    if enforced || matches!(relayed.close, Close::Revoked | Close::Shutdown) {
        relayed.up = relayed
            .up
            .saturating_sub(crate::relay::tunnel::abort_over(server));
        relayed.down = relayed
            .down
            .saturating_sub(crate::relay::tunnel::abort_over(client));
    }
    if enforced {
        relayed.close = Close::Eof;
    }
    CheckedRelay { relayed, mismatch }
}

/// How long, after the origin's last answer was relayed, a connection ended for a spent quota
/// keeps reading what the client still sends ([`linger`]).
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// At most this much of what the client sends after the refusal is read and dropped.
const LINGER_BYTES: usize = 1 << 20;

/// A lingering close: read and drop what the client still sends — requests pipelined behind
/// the refused one, arriving after it — until it closes, [`LINGER_BYTES`], or [`LINGER`]
/// after `answered` (the origin's answers relayed and the client's side half-closed). A
/// socket closed with bytes unread is reset, and a reset can discard the answers still on
/// their way to the client.
async fn linger<R: tokio::io::AsyncRead + Unpin>(r: &mut R, answered: &tokio::sync::Notify) {
    let drain = async {
        let (mut buf, mut dropped) = (vec![0u8; 4096], 0);
        while dropped < LINGER_BYTES {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => dropped += n,
            }
        }
    };
    let after = async {
        answered.notified().await;
        tokio::time::sleep(LINGER).await;
    };
    tokio::select! {
        () = drain => {}
        () = after => {}
    }
}

/// Whether `m` refused a request for what the sandbox spent (a daily quota, a `once` grant)
/// rather than for what the request is: the requests before it stand.
fn spends(m: &Refusal) -> bool {
    matches!(m.reason, Reason::QuotaExceeded | Reason::NoRuleMatched)
}

/// Whether the refusal kept in `found` is one that [`spends`].
fn spent(found: &Mutex<Option<Refusal>>) -> bool {
    found.lock().is_ok_and(|f| f.as_ref().is_some_and(spends))
}

/// What one pass of the framer over the client's bytes gave.
/// Tell the response side which requests went out (it frames their answers in order); a
/// switch or a `CONNECT` among them makes the answer to it pending again.
fn expect_answers(
    responses: &Mutex<ResponseStream>,
    sent: &[RequestKind],
    answer: &tokio::sync::watch::Sender<Answer>,
) {
    if let Ok(mut r) = responses.lock() {
        for k in sent {
            r.sent(*k);
        }
        if sent.iter().any(|k| k.upgrade || k.connect) {
            answer.send_replace(Answer::Pending);
        }
    }
}

struct Framed {
    /// The bytes that may go to the origin.
    out: Vec<u8>,
    /// A refused request (or unframeable bytes) ends the connection here.
    refused: bool,
    /// The request heads that went into `out`, in order.
    sent: Vec<RequestKind>,
    /// A request asked to switch protocols: the bytes after it, held until the origin
    /// answers.
    held: Option<Vec<u8>>,
}

/// The records of the requests sent and not answered yet, oldest first, each with the bytes
/// of its request: every request framed on the connection gets its own (`mode: http`, method,
/// path, status and bytes), written when its answer has been relayed whole — the connection
/// keeps its own record too.
#[derive(Default)]
struct Records(Mutex<VecDeque<(AuditGuard, u64)>>);

impl Records {
    /// A request was sent: `g` is its record.
    fn push(&self, g: AuditGuard) {
        if let Ok(mut q) = self.0.lock() {
            q.push_back((g, 0));
        }
    }

    /// `n` more bytes of the request sent last.
    fn up(&self, n: usize) {
        if let Some((_, up)) = self.0.lock().ok().as_mut().and_then(|q| q.back_mut()) {
            *up += n as u64;
        }
    }

    /// The answers `r` read whole end their requests' records (written as they drop); at the
    /// connection's end (`close`), so does the answer it cut.
    fn answered(&self, r: &mut ResponseStream, close: Option<Close>) {
        while let Some((status, down)) = r.take_answered() {
            let Some((mut g, up)) = self.0.lock().ok().and_then(|mut q| q.pop_front()) else {
                return;
            };
            if let Ok(code) = http::StatusCode::from_u16(status) {
                g.status(code);
            }
            g.bytes(up, down);
            if let Some(c) = close {
                g.close_if_unset(c);
            }
        }
    }
}

impl Records {
    /// The connection ended with `close`: requests still unanswered end their records so.
    fn unanswered(&self, close: Close) {
        let left = self.0.lock().map(|mut q| std::mem::take(&mut *q));
        for (mut g, up) in left.unwrap_or_default() {
            g.close_if_unset(close);
            g.bytes(up, 0);
        }
    }
}

/// The record of one request framed on the connection, its answer not known yet.
fn request_record(recorder: &Recorder, head: &Head) -> AuditGuard {
    let mut g = recorder.guard();
    g.http(HttpFacts {
        method: http::Method::from_bytes(head.method.as_bytes()).unwrap_or_default(),
        path: head.path.as_str().into(),
        status: 0,
        credential: None,
        secret_reflected: None,
        call: None,
    });
    g
}

/// The request heads framed so far, each after the first reserved as a request of its own.
struct Heads<'a> {
    seen: u64,
    live: &'a Liveness,
    recorder: &'a Recorder,
    records: &'a Records,
}

impl Heads<'_> {
    /// A head passed the host check: the first was reserved when the connection was admitted;
    /// each later one is reserved now against the daily quotas and the `once` grant that
    /// allowed the connection (security review C3d: six requests on one kept connection
    /// counted as one).
    fn reserve(&mut self) -> Result<(), Refusal> {
        self.seen += 1;
        if self.seen == 1 {
            return Ok(());
        }
        self.live.reserve().map_err(|r| {
            Refusal::new(
                r.reason,
                format!("request {} on the connection: {}", self.seen, r.detail),
            )
        })
    }

    /// The request of `head` goes to the origin (`refusal`: one report mode lets go): its
    /// record waits for the answer ([`Records`]).
    fn sent(&self, head: &Head, refusal: Option<&Refusal>) {
        let mut g = request_record(self.recorder, head);
        if let Some(m) = refusal {
            g.verdict(Verdict::Report, m.reason);
            g.detail(format!("{} (report mode: relayed)", m.detail));
        }
        self.records.push(g);
    }

    /// The request of `head` is refused: its record says why, written now.
    fn refused(&self, head: &Head, m: &Refusal) {
        let mut g = request_record(self.recorder, head);
        g.verdict(Verdict::Deny, m.reason);
        g.detail(m.detail.clone());
    }
}

/// Frame `data`. The first mismatch is kept in `found`.
fn frame(
    framer: &mut RequestStream,
    mut data: &[u8],
    (expected, report): (&Target, bool),
    found: &Mutex<Option<Refusal>>,
    heads: &mut Heads<'_>,
) -> Framed {
    let mut f = Framed {
        out: Vec::with_capacity(data.len()),
        refused: false,
        sent: Vec::new(),
        held: None,
    };
    let keep = |m: Refusal| {
        if let Ok(mut f) = found.lock() {
            f.get_or_insert(m);
        }
    };
    while !data.is_empty() {
        match framer.step(data) {
            Ok(Step::Pass(n)) => {
                heads.records.up(n);
                f.out.extend_from_slice(&data[..n]);
                data = &data[n..];
            }
            Ok(Step::Buffered) => data = &[],
            Ok(Step::Line { consumed }) => {
                let held = framer.take_held();
                heads.records.up(held.len());
                f.out.extend(held);
                data = &data[consumed..];
            }
            Ok(Step::Head { head, consumed }) => {
                // Reported only where a policy refusal would be (never a quota).
                let enforced = |m: &Refusal| !(report && m.reason.reportable());
                let refusal = match check(&head, expected).err() {
                    Some(m) if enforced(&m) => Some(m),
                    m => heads.reserve().err().or(m),
                };
                if let Some(m) = &refusal {
                    if enforced(m) {
                        heads.refused(&head, m);
                        keep(m.clone());
                        f.refused = true;
                        return f;
                    }
                }
                heads.sent(&head, refusal.as_ref());
                if let Some(m) = refusal {
                    keep(m);
                }
                f.sent.push(head.kind);
                let held = framer.take_held();
                heads.records.up(held.len());
                f.out.extend(held);
                data = &data[consumed..];
            }
            Ok(Step::AwaitSwitch) => {
                f.held = Some(data.to_vec());
                return f;
            }
            Err(why) => {
                keep(Refusal::new(
                    Reason::ProtocolNotAllowed,
                    format!("HTTP that cannot be framed unambiguously: {why}"),
                ));
                f.refused = true;
                return f;
            }
        }
    }
    // The switch request may end exactly at the end of `data`: wait before reading on.
    if framer.step(&[]) == Ok(Step::AwaitSwitch) {
        f.held = Some(Vec::new());
    }
    f
}

/// Write `out` to the origin, shaped, taken from the byte quotas first (what crosses one is
/// not written), counted write by write.
async fn send<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    out: &[u8],
    shaper: Option<&SandboxLimiter>,
    live: &Liveness,
) -> std::io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let delay = shaper
        .map(|s| s.shape_now(true, out.len()))
        .unwrap_or_default();
    if !delay.is_zero() {
        let until = Instant::now() + delay;
        live.active(until);
        tokio::time::sleep_until(until).await;
    }
    let out = &out[..live.allow(out.len()).await];
    let mut sent = 0;
    while sent < out.len() {
        let m = w.write(&out[sent..]).await?;
        if m == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        sent += m;
        live.sent(true, m);
    }
    live.cut_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(host: Option<&str>, authority: Option<&str>) -> Head {
        Head {
            method: "GET".into(),
            path: "/".into(),
            host: host.map(Into::into),
            authority: authority.map(Into::into),
            kind: RequestKind::default(),
        }
    }

    #[test]
    fn a_request_must_name_the_decided_host_and_port() {
        let t = Target::parse("api.test:8080", None).unwrap();
        assert!(check(&head(Some("api.test:8080"), None), &t).is_ok());
        assert!(check(&head(Some("API.test"), None), &t).is_ok());
        for bad in [
            head(Some("denied.test"), None),
            head(Some("api.test:9090"), None),
            head(None, None),
            // The absolute-form authority wins over Host.
            head(Some("api.test"), Some("denied.test")),
        ] {
            let m = check(&bad, &t).unwrap_err();
            assert_eq!(m.reason, Reason::HostMismatch, "{bad:?}");
        }
    }
}
