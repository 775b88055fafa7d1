//! One direction of a socket: frames read, a fragmented message joined (bounded by the
//! rule's `max_message`), each whole message judged by the rule, scanned (DLP, the
//! sandbox's), its placeholders replaced (the sandbox's) or its secrets scrubbed (the
//! origin's), and written to the other side as one frame; control frames checked and
//! forwarded at a bounded rate; a close forwarded and the direction ended.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fastwebsockets::{Frame, OpCode, Payload, WebSocketError};

use super::{close_one, Ended, Reader, Socket, Writer};
use crate::audit::outcome::Close;
use crate::pipeline::dlp::Scanner;
use crate::policy::protocols::websocket::{Message, WsRule};
use crate::policy::protocols::Refused;
use crate::policy::reason::Reason;

/// Control frames (ping, pong) one side may send per second.
pub const CONTROL_PER_SECOND: u32 = 32;

/// How a direction ended.
#[derive(Debug)]
pub enum Step {
    /// A close frame went through: the other direction may answer it.
    Closed(Ended),
    /// The proxy ended the socket (both sides told), or a side went away.
    Stop(Ended),
}

/// What ends a direction on the proxy's side: the close code, why, the record's close.
struct Cut(u16, String, Close);

/// Read `from` until it closes, forwarding to `to` (`back` is `from`'s own writer, told why
/// when the proxy ends the socket); `sent`: `from` is the sandbox.
pub async fn pump(
    s: &Socket,
    rule: &RwLock<Arc<WsRule>>,
    from: &mut Reader,
    (to, back): (&Writer, &Writer),
    sent: bool,
) -> Step {
    let mut partial: Option<(OpCode, Vec<u8>)> = None;
    let mut rate = (Instant::now(), 0u32);
    loop {
        let frame = match from
            .read_frame(&mut |_| async { Ok::<(), std::convert::Infallible>(()) })
            .await
        {
            Ok(f) => f,
            Err(e) => return stop((to, back), sent, read_error(e)).await,
        };
        let rule_now = rule
            .read()
            .map(|r| r.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        match frame.opcode {
            OpCode::Text | OpCode::Binary | OpCode::Continuation => {
                let data = match joined(&mut partial, frame, rule_now.max_message) {
                    Ok(Some(d)) => d,
                    Ok(None) => continue,
                    Err(cut) => return stop((to, back), sent, cut).await,
                };
                if let Err(cut) = s.forward(&rule_now, sent, data, to).await {
                    return stop((to, back), sent, cut).await;
                }
            }
            OpCode::Ping | OpCode::Pong => {
                if let Some(cut) = control_refusal(&frame, &mut rate) {
                    return stop((to, back), sent, cut).await;
                }
                s.live.moved(sent, frame.payload.len());
                let Some(payload) = s.control(sent, frame.opcode, frame.payload.to_vec()) else {
                    continue;
                };
                let f = Frame::new(true, frame.opcode, None, Payload::Owned(payload));
                if let Err(cut) = write(to, f).await {
                    return stop((to, back), sent, cut).await;
                }
            }
            OpCode::Close => {
                let code = match close_code(&frame.payload) {
                    Ok(c) => c,
                    Err(cut) => return stop((to, back), sent, cut).await,
                };
                let mut payload = frame.payload.to_vec();
                if let (false, Some(scrubber)) = (sent, &s.scrubber) {
                    s.reflected(scrubber.scrub_message(&mut payload));
                }
                let f = Frame::close_raw(Payload::Owned(payload));
                let _ = write(to, f).await;
                return Step::Closed(Ended {
                    close: Close::Eof,
                    code: code.unwrap_or(1005),
                    why: None,
                });
            }
        }
    }
}

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
                        let why = format!("message {n} refused: {}", r.detail);
                        return Err(Cut(1008, why, Close::Eof));
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

    /// Judge, scan and rewrite one whole message: `Ok` with what to forward; `Err` with the
    /// refusal and, where report mode may forward it, the message as it came.
    #[allow(clippy::type_complexity)]
    fn message(
        &self,
        rule: &WsRule,
        sent: bool,
        (op, data): (OpCode, Vec<u8>),
    ) -> Result<(OpCode, Vec<u8>), (Refused, Option<(OpCode, Vec<u8>)>)> {
        let refuse = |reason, detail: String| Refused {
            reason,
            detail,
            call: None,
            rpc: None,
        };
        let mut data = data;
        // The origin's message is judged as the sandbox would read it: its secrets scrubbed
        // (so that report mode, which forwards a refused message, never forwards a secret).
        if let (false, Some(scrubber)) = (sent, &self.scrubber) {
            self.reflected(scrubber.scrub_message(&mut data));
        }
        let judged = match op {
            OpCode::Text => match std::str::from_utf8(&data) {
                Ok(t) => rule.judge(sent, self.credentialed, Message::Text(t)),
                Err(_) => {
                    let r = refuse(
                        Reason::WebSocketNotAllowed,
                        "a text message is not UTF-8".into(),
                    );
                    return Err((r, None));
                }
            },
            _ => rule.judge(sent, self.credentialed, Message::Binary(&data)),
        };
        if let Err(r) = judged {
            return Err((r, Some((op, data))));
        }
        if !sent {
            return Ok((op, data));
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

/// Join `frame` to the message being read: `Ok(Some)` when it completes one, `Err` when the
/// frames break the protocol or the message outgrows `cap`.
fn joined(
    partial: &mut Option<(OpCode, Vec<u8>)>,
    frame: Frame<'_>,
    cap: usize,
) -> Result<Option<(OpCode, Vec<u8>)>, Cut> {
    let protocol = |why: &str| Cut(1002, why.into(), Close::Error);
    match (frame.opcode, partial.as_mut()) {
        (OpCode::Continuation, None) => {
            return Err(protocol("a continuation frame without a message"))
        }
        (OpCode::Continuation, Some((_, buf))) => {
            if buf.len() + frame.payload.len() > cap {
                return Err(too_big(cap));
            }
            buf.extend_from_slice(&frame.payload);
        }
        (_, Some(_)) => return Err(protocol("a new message inside a fragmented one")),
        (op, None) => {
            if frame.payload.len() > cap {
                return Err(too_big(cap));
            }
            *partial = Some((op, frame.payload.to_vec()));
        }
    }
    match frame.fin {
        true => Ok(partial.take()),
        false => Ok(None),
    }
}

fn too_big(cap: usize) -> Cut {
    Cut(
        1009,
        format!("a message is larger than the rule's max_message_bytes ({cap})"),
        Close::Eof,
    )
}

/// Why a ping or pong is refused: over 125 bytes, or more than [`CONTROL_PER_SECOND`].
fn control_refusal(frame: &Frame<'_>, rate: &mut (Instant, u32)) -> Option<Cut> {
    if frame.payload.len() > 125 {
        return Some(Cut(
            1002,
            "a control frame over 125 bytes".into(),
            Close::Error,
        ));
    }
    if rate.0.elapsed() >= Duration::from_secs(1) {
        *rate = (Instant::now(), 0);
    }
    rate.1 += 1;
    (rate.1 > CONTROL_PER_SECOND).then(|| {
        Cut(
            1008,
            format!("more than {CONTROL_PER_SECOND} control frames in a second"),
            Close::Eof,
        )
    })
}

/// A close frame's code (`None`: no payload), checked as RFC 6455 §7.4 allows it on the wire.
fn close_code(payload: &[u8]) -> Result<Option<u16>, Cut> {
    let bad = |why: String| Cut(1002, why, Close::Error);
    match payload.len() {
        0 => return Ok(None),
        1 => return Err(bad("a close frame with a one-byte payload".into())),
        n if n > 125 => return Err(bad("a close frame over 125 bytes".into())),
        _ => {}
    }
    let code = u16::from_be_bytes([payload[0], payload[1]]);
    let allowed = matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999);
    if !allowed {
        return Err(bad(format!("close code {code} may not be sent")));
    }
    if std::str::from_utf8(&payload[2..]).is_err() {
        return Err(bad("a close reason that is not UTF-8".into()));
    }
    Ok(Some(code))
}

/// What a read error means: the peer went away (no close), a frame too large, or a frame
/// that breaks the protocol.
fn read_error(e: WebSocketError) -> Cut {
    match e {
        WebSocketError::UnexpectedEOF | WebSocketError::ConnectionClosed => Cut(
            1006,
            "the peer closed without a close frame".into(),
            Close::Eof,
        ),
        WebSocketError::IoError(e) => {
            Cut(1006, format!("the peer's stream failed: {e}"), Close::Error)
        }
        WebSocketError::FrameTooLarge => Cut(
            1009,
            "a frame is larger than the rule's max_message_bytes".into(),
            Close::Eof,
        ),
        other => Cut(
            1002,
            format!("a frame breaks RFC 6455: {other}"),
            Close::Error,
        ),
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
