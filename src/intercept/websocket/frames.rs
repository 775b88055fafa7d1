//! The frames of one side of a socket, read as the proxy forwards them: `fastwebsockets`
//! parses each frame (no automatic answers: the relay forwards control frames itself), and
//! here a fragmented message is joined within the rule's `max_message` (one frame or a
//! whole fragment series), a text message checked UTF-8, pings and pongs bounded (125
//! bytes, [`CONTROL_PER_SECOND`]), a close frame's code and reason checked (RFC 6455
//! §5.5, §7.4). Anything else ends the socket with the close code it deserves ([`Cut`]).
//! [`read_all`] runs the same reader over bytes in memory (the fuzz target's entry).

use std::time::{Duration, Instant};

use fastwebsockets::{Frame, OpCode, Role, WebSocketError, WebSocketRead};
use tokio::io::AsyncRead;

use crate::audit::outcome::Close;

/// Control frames (ping, pong) one side may send per second.
pub const CONTROL_PER_SECOND: u32 = 32;

/// What ends a direction on the proxy's side: the close code, why, the record's close.
#[derive(Debug)]
pub struct Cut(pub u16, pub String, pub Close);

/// What one side sent, whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A complete message (`Text`: valid UTF-8; `Binary`), fragments joined.
    Message(OpCode, Vec<u8>),
    /// A ping or pong and its payload (at most 125 bytes).
    Control(OpCode, Vec<u8>),
    /// A close frame: its code (`None`: no payload) and its payload as sent.
    Close(Option<u16>, Vec<u8>),
}

/// The reading state of one side: the message being joined, the control frames this second.
#[derive(Debug)]
pub struct Frames {
    partial: Option<(OpCode, Vec<u8>)>,
    rate: (Instant, u32),
}

impl Default for Frames {
    fn default() -> Self {
        Frames {
            partial: None,
            rate: (Instant::now(), 0),
        }
    }
}

impl Frames {
    /// The next whole event from `from` (messages at most `cap` bytes), or the cut.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        from: &mut WebSocketRead<R>,
        cap: usize,
    ) -> Result<Event, Cut> {
        loop {
            let frame = from
                .read_frame(&mut |_| async { Ok::<(), std::convert::Infallible>(()) })
                .await
                .map_err(read_error)?;
            match frame.opcode {
                OpCode::Text | OpCode::Binary | OpCode::Continuation => {
                    let Some((op, data)) = joined(&mut self.partial, frame, cap)? else {
                        continue;
                    };
                    if op == OpCode::Text && std::str::from_utf8(&data).is_err() {
                        return Err(Cut(
                            1007,
                            "a text message is not UTF-8".into(),
                            Close::Error,
                        ));
                    }
                    return Ok(Event::Message(op, data));
                }
                OpCode::Ping | OpCode::Pong => {
                    if let Some(cut) = control_refusal(&frame, &mut self.rate) {
                        return Err(cut);
                    }
                    return Ok(Event::Control(frame.opcode, frame.payload.to_vec()));
                }
                OpCode::Close => {
                    let code = close_code(&frame.payload)?;
                    return Ok(Event::Close(code, frame.payload.to_vec()));
                }
            }
        }
    }
}

/// Read `bytes` as the sandbox's side of a socket (client frames, masked) with messages of at
/// most `cap` bytes: the events the proxy would forward, in order, and the cut that ended
/// them (`None`: the bytes ended first, or a close was read).
pub fn read_all(bytes: &[u8], cap: usize) -> (Vec<Event>, Option<(u16, String)>) {
    use futures_util::FutureExt;
    let (mut from, _) =
        fastwebsockets::after_handshake_split(bytes, tokio::io::sink(), Role::Server);
    from.set_auto_close(false);
    from.set_auto_pong(false);
    from.set_max_message_size(cap.saturating_add(1));
    let mut frames = Frames::default();
    let mut events = Vec::new();
    loop {
        // Reading from memory never waits.
        match frames.next(&mut from, cap).now_or_never() {
            Some(Ok(Event::Close(code, payload))) => {
                events.push(Event::Close(code, payload));
                return (events, None);
            }
            Some(Ok(e)) => events.push(e),
            Some(Err(Cut(1006, _, _))) | None => return (events, None),
            Some(Err(Cut(code, why, _))) => return (events, Some((code, why))),
        }
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
        WebSocketError::InvalidUTF8 => {
            Cut(1007, "a text message is not UTF-8".into(), Close::Error)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A client frame: FIN bit, opcode, masked payload.
    fn frame(fin: bool, op: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut f = vec![u8::from(fin) << 7 | op];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    fn text(e: &Event) -> &[u8] {
        match e {
            Event::Message(OpCode::Text, d) => d,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fragments_are_joined_and_control_frames_pass_between_them() {
        let mut b = frame(false, 1, "héllo ".as_bytes());
        b.extend(frame(true, 9, b"p"));
        b.extend(frame(true, 0, b"world"));
        b.extend(frame(true, 8, &[0x03, 0xe8, b'o', b'k']));
        let (events, cut) = read_all(&b, 100);
        assert!(cut.is_none(), "{cut:?}");
        assert_eq!(events[0], Event::Control(OpCode::Ping, b"p".to_vec()));
        assert_eq!(text(&events[1]), "héllo world".as_bytes());
        assert_eq!(
            events[2],
            Event::Close(Some(1000), vec![0x03, 0xe8, b'o', b'k'])
        );
    }

    #[test]
    fn broken_frames_end_the_socket_with_the_code_they_deserve() {
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (frame(true, 0, b"x"), 1002),
            ([frame(false, 1, b"a"), frame(true, 1, b"b")].concat(), 1002),
            (
                [frame(false, 2, &[0; 60]), frame(true, 0, &[0; 60])].concat(),
                1009,
            ),
            (frame(true, 2, &[0; 101]), 1009),
            (frame(true, 1, &[0xff, 0xfe]), 1007),
            (
                [frame(false, 1, &[0xc3]), frame(true, 0, b"(")].concat(),
                1007,
            ),
            (frame(true, 8, &[0x03, 0xed]), 1002),
            (frame(true, 8, &[0x03]), 1002),
            (frame(false, 9, b""), 1002),
            (
                [0x89u8, 0x80 | 126, 0, 126, 0, 0, 0, 0]
                    .into_iter()
                    .chain([0; 126])
                    .collect(),
                1002,
            ),
            (frame(true, 3, b""), 1002),
            ((0..40).flat_map(|_| frame(true, 10, b"")).collect(), 1008),
        ];
        for (bytes, code) in cases {
            let (_, cut) = read_all(&bytes, 100);
            assert_eq!(
                cut.as_ref().map(|c| c.0),
                Some(code),
                "{bytes:02x?}: {cut:?}"
            );
        }
    }
}
