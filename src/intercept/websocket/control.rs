//! Pings and pongs between the sandbox and the origin, forwarded so that neither can carry
//! data past the message rules: a ping from the sandbox goes on with an empty payload and
//! the origin's pong is answered to the sandbox with the payload it sent (its keepalive
//! still matches); a pong from the sandbox goes on only if it answers a ping the origin
//! sent (an unsolicited pong is dropped: a heartbeat needs no payload); the origin's
//! control payloads are scrubbed of secrets. Idle and keepalive stay the two ends' own.

use std::collections::VecDeque;

use fastwebsockets::OpCode;

use super::Socket;

/// Pings remembered each way (oldest forgotten first).
const PENDING: usize = 16;

/// The pings not yet answered, each way.
#[derive(Debug, Default)]
pub struct Pings {
    /// Payloads of the sandbox's pings, in order (sent on with empty payloads).
    from_sandbox: VecDeque<Vec<u8>>,
    /// Payloads of the origin's pings (as the sandbox saw them), in order.
    from_origin: VecDeque<Vec<u8>>,
}

fn remember(q: &mut VecDeque<Vec<u8>>, payload: Vec<u8>) {
    if q.len() == PENDING {
        q.pop_front();
    }
    q.push_back(payload);
}

impl Pings {
    /// What a control frame (`op`, `payload`) from the sandbox (`sent`) becomes on the other
    /// side: `None` when it is dropped.
    pub fn pass(&mut self, sent: bool, op: OpCode, payload: Vec<u8>) -> Option<Vec<u8>> {
        match (sent, op) {
            (true, OpCode::Ping) => {
                remember(&mut self.from_sandbox, payload);
                Some(Vec::new())
            }
            (true, _) => {
                if payload.is_empty() {
                    return Some(payload);
                }
                let i = self.from_origin.iter().position(|p| *p == payload)?;
                self.from_origin.remove(i)
            }
            (false, OpCode::Ping) => {
                remember(&mut self.from_origin, payload.clone());
                Some(payload)
            }
            (false, _) => match payload.is_empty() {
                true => Some(self.from_sandbox.pop_front().unwrap_or_default()),
                false => Some(payload),
            },
        }
    }
}

impl Socket {
    /// A ping or pong read from one side, as the other side gets it (`None`: dropped).
    pub(super) fn control(&self, sent: bool, op: OpCode, mut payload: Vec<u8>) -> Option<Vec<u8>> {
        if let (false, Some(scrubber)) = (sent, &self.scrubber) {
            self.reflected(scrubber.scrub_message(&mut payload));
        }
        let mut pings = self.pings.lock().unwrap_or_else(|p| p.into_inner());
        pings.pass(sent, op, payload)
    }

    /// Note the credentials whose secret a message from the origin carried (scrubbed).
    pub(super) fn reflected(&self, names: Vec<&str>) {
        if names.is_empty() {
            return;
        }
        let mut r = self.reflected.lock().unwrap_or_else(|p| p.into_inner());
        for n in names {
            if !r.iter().any(|x| x == n) {
                r.push(n.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_payload_never_reaches_the_origin_and_comes_back_to_the_sandbox() {
        let mut p = Pings::default();
        assert_eq!(
            p.pass(true, OpCode::Ping, b"secret".to_vec()),
            Some(Vec::new())
        );
        // The origin's pong (empty) is answered with the sandbox's own payload.
        assert_eq!(
            p.pass(false, OpCode::Pong, Vec::new()),
            Some(b"secret".to_vec())
        );
    }

    #[test]
    fn a_pong_from_the_sandbox_passes_only_as_the_answer_to_the_origins_ping() {
        let mut p = Pings::default();
        assert_eq!(p.pass(true, OpCode::Pong, b"exfil".to_vec()), None);
        assert_eq!(
            p.pass(false, OpCode::Ping, b"k1".to_vec()),
            Some(b"k1".to_vec())
        );
        assert_eq!(
            p.pass(true, OpCode::Pong, b"k1".to_vec()),
            Some(b"k1".to_vec())
        );
        // Answered once.
        assert_eq!(p.pass(true, OpCode::Pong, b"k1".to_vec()), None);
        assert_eq!(p.pass(true, OpCode::Pong, Vec::new()), Some(Vec::new()));
    }

    #[test]
    fn the_pending_pings_are_bounded() {
        let mut p = Pings::default();
        for i in 0..100u8 {
            p.pass(false, OpCode::Ping, vec![i]);
        }
        assert_eq!(p.from_origin.len(), PENDING);
        assert_eq!(p.pass(true, OpCode::Pong, vec![0]), None);
        assert_eq!(p.pass(true, OpCode::Pong, vec![99]), Some(vec![99]));
    }
}
