//! One direction of a socket: frames read, a fragmented message joined (bounded by the
//! rule's `max_message`), each whole message judged by the rule, scanned (DLP, the
//! sandbox's), its placeholders replaced (the sandbox's) or its secrets scrubbed (the
//! origin's), and written to the other side as one frame; control frames checked and
//! forwarded at a bounded rate; a close forwarded (the sandbox's reason judged, scanned and
//! rewritten like a message) and the direction ended.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use fastwebsockets::{Frame, OpCode, Payload};

use super::frames::{Cut, Event, Frames};
use super::{close_one, Ended, Reader, Socket, Writer};
use crate::audit::outcome::Close;
use crate::pipeline::dlp::Scanner;
use crate::policy::protocols::websocket::{Message, WsRule};
use crate::policy::protocols::RefusedCall;
use crate::policy::reason::Reason;

/// How a direction ended.
#[derive(Debug)]
pub enum Step {
    /// A close frame went through: the other direction may answer it.
    Closed(Ended),
    /// The proxy ended the socket (both sides told), or a side went away.
    Stop(Ended),
}

/// Read `from` until it closes, forwarding to `to` (`back` is `from`'s own writer, told why
/// when the proxy ends the socket); `sent`: `from` is the sandbox.
pub async fn pump(
    s: &Socket,
    rule: &RwLock<Arc<WsRule>>,
    from: &mut Reader,
    (to, back): (&Writer, &Writer),
    sent: bool,
) -> Step {
    let mut frames = Frames::default();
    loop {
        let cap = rule
            .read()
            .map(|r| r.max_message)
            .unwrap_or_else(|p| p.into_inner().max_message);
        let event = match frames.next(from, cap).await {
            Ok(e) => e,
            Err(cut) => return stop((to, back), sent, cut).await,
        };
        match event {
            Event::Message(op, data) => {
                let rule_now = rule
                    .read()
                    .map(|r| r.clone())
                    .unwrap_or_else(|p| p.into_inner().clone());
                if let Err(cut) = s.forward(&rule_now, sent, (op, data), to).await {
                    return stop((to, back), sent, cut).await;
                }
            }
            Event::Control(op, payload) => {
                s.live.moved(sent, payload.len());
                let Some(payload) = s.control(sent, op, payload) else {
                    continue;
                };
                let f = Frame::new(true, op, None, Payload::Owned(payload));
                if let Err(cut) = write(to, f).await {
                    return stop((to, back), sent, cut).await;
                }
            }
            Event::Close(code, mut payload) => {
                if let (false, Some(scrubber)) = (sent, &s.scrubber) {
                    s.reflected(scrubber.scrub_message(&mut payload));
                }
                if sent && payload.len() > 2 {
                    let rule_now = rule
                        .read()
                        .map(|r| r.clone())
                        .unwrap_or_else(|p| p.into_inner().clone());
                    match s.close_reason(&rule_now, payload) {
                        Ok(p) => payload = p,
                        Err(cut) => return stop((to, back), sent, cut).await,
                    }
                }
                let _ = write(to, Frame::close_raw(Payload::Owned(payload))).await;
                return Step::Closed(Ended {
                    close: Close::Eof,
                    code: code.unwrap_or(1005),
                    why: None,
                });
            }
        }
    }
}

/// A whole message: its opcode and payload.
type Whole = (OpCode, Vec<u8>);

/// A refused message: why, and the message as it came where report mode may forward it.
type NotSent = (RefusedCall, Option<Whole>);

impl Socket {
    /// One whole message: judged, rewritten and written to `to`, counted; `Err` with what
    /// ends the socket (a refusal, a failed write, a spent quota).
    async fn forward(
        &self,
        rule: &WsRule,
        sent: bool,
        data: (OpCode, Vec<u8>),
        to: &Writer,
    ) -> Result<(), Cut> {
        let dir = usize::from(!sent);
        let n = self.counts[dir].load(Ordering::Relaxed) + 1;
        let (op, out) = match self.message(rule, sent, data) {
            Ok(out) => out,
            Err((r, original)) => {
                self.record_refused(sent, n, &r);
                match (self.report, original) {
                    (true, Some(o)) => o,
                    _ => {
                        let why = format!("message {n} refused: {}", r.refusal.detail);
                        return Err(Cut(1008, why, Close::Refused));
                    }
                }
            }
        };
        let len = out.len();
        write(to, Frame::new(true, op, None, Payload::Owned(out))).await?;
        self.counts[dir].fetch_add(1, Ordering::Relaxed);
        if self.live.delivered(sent, len).is_err() {
            let why = self
                .live
                .spent()
                .unwrap_or_else(|| "a daily quota is spent".into());
            return Err(Cut(1008, why, Close::Limit));
        }
        Ok(())
    }

    /// A close frame from the sandbox (code and reason, RFC 6455 §5.5.1): its reason is a text
    /// message like any other — judged by the rule, scanned, its placeholders replaced, and
    /// recorded when refused (review 7b W17b, W18). A reason the replacement makes longer than
    /// a close frame holds (123 bytes) is dropped; the code goes on.
    fn close_reason(&self, rule: &WsRule, mut payload: Vec<u8>) -> Result<Vec<u8>, Cut> {
        let reason = payload.split_off(2);
        let n = self.counts[0].load(Ordering::Relaxed) + 1;
        match self.message(rule, true, (OpCode::Text, reason)) {
            Ok((_, r)) if r.len() <= 123 => payload.extend_from_slice(&r),
            Ok(_) => {}
            Err((r, original)) => {
                self.record_refused(true, n, &r);
                match (self.report, original) {
                    (true, Some((_, o))) => payload.extend_from_slice(&o),
                    _ => {
                        let why = format!(
                            "the close reason (message {n}) refused: {}",
                            r.refusal.detail
                        );
                        return Err(Cut(1008, why, Close::Refused));
                    }
                }
            }
        }
        Ok(payload)
    }

    /// Judge, scan and rewrite one whole message: `Ok` with what to forward; `Err` with the
    /// refusal and, where report mode may forward it, the message as it came.
    fn message(&self, rule: &WsRule, sent: bool, (op, data): Whole) -> Result<Whole, NotSent> {
        let refuse = |reason, detail: String| RefusedCall {
            refusal: Box::new(crate::policy::refusal::Refusal::new(reason, detail)),
            call: None,
            rpc: None,
        };
        let mut data = data;
        // The origin's message is judged as the sandbox would read it: its secrets scrubbed
        // (so that report mode, which forwards a refused message, never forwards a secret).
        if let (false, Some(scrubber)) = (sent, &self.scrubber) {
            self.reflected(scrubber.scrub_message(&mut data));
        }
        // A text message was checked UTF-8 by the reader ([`super::frames`]); scrubbing
        // replaces ASCII with ASCII.
        let judged = match (op, std::str::from_utf8(&data)) {
            (OpCode::Text, Ok(t)) => rule.judge(sent, self.credentialed, Message::Text(t)),
            _ => rule.judge(sent, self.credentialed, Message::Binary(&data)),
        };
        if let Err(r) = judged {
            return Err((r, Some((op, data))));
        }
        if !sent {
            return Ok((op, data));
        }
        // A message is a write: after a label, refused where the flow rules say.
        if let Some(r) = self.flow.as_ref().and_then(|g| g.write_refused()) {
            return Err((refuse(Reason::FlowRefused, r.detail), Some((op, data))));
        }
        if let Some((name, _)) = self
            .foreign
            .iter()
            .find(|(_, p)| crate::intercept::placeholder::contains(&data, p))
        {
            let why = format!("the message carries the placeholder of credential {name}, which is not bound to this host");
            return Err((refuse(Reason::CredentialMisuse, why), None));
        }
        if let Some(cfg) = &self.dlp {
            let mut scanner = Scanner::new(cfg.clone(), self.report);
            if let Err(e) = scanner.scan(&bytes::Bytes::copy_from_slice(&data)) {
                return Err((refuse(Reason::DlpBlocked, e.to_string()), None));
            }
        }
        for (placeholder, secret) in &self.replace {
            if crate::intercept::placeholder::contains(&data, placeholder) {
                data = crate::intercept::placeholder::replace_bytes(&data, placeholder, secret);
            }
        }
        Ok((op, data))
    }
}

/// Write one frame and flush it.
async fn write(w: &Writer, f: Frame<'_>) -> Result<(), Cut> {
    let mut w = w.lock().await;
    let r = async {
        w.write_frame(f).await?;
        w.flush().await
    };
    r.await.map_err(|e| {
        Cut(
            1006,
            format!("writing to the other side failed: {e}"),
            Close::Error,
        )
    })
}

/// End the socket from this direction: `back` (the side that read) is told the code and why
/// (a 1006 is never sent: that side is gone), the other side 1001.
async fn stop((to, back): (&Writer, &Writer), sent: bool, cut: Cut) -> Step {
    let Cut(code, why, close) = cut;
    if code != 1006 {
        // The sandbox reads why; the origin is told the proxy is going away.
        let (to_sandbox, to_origin) = match sent {
            true => (back, to),
            false => (to, back),
        };
        close_one(to_sandbox, code, &why).await;
        close_one(to_origin, 1001, "").await;
    } else {
        close_one(to, 1001, "").await;
    }
    Step::Stop(Ended {
        close,
        code,
        why: Some(why),
    })
}
