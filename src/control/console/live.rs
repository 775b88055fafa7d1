//! The console's view of the decisions as they happen: the last [`KEPT`] records (the *Live*
//! page shows them without JavaScript), records per minute over the last hour (the *Audit*
//! page's chart), and each record as one Server-Sent Event for the page's script (the
//! stream itself, its filters and bounded buffer, are `GET /v1/observe`'s:
//! [`crate::control::observe`]), ending when the session does: at its end, or at once when
//! it is signed out.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::sync::broadcast;

use crate::control::observe::Filter;

/// Records kept for the page.
pub const KEPT: usize = 200;
/// Minutes counted.
pub const MINUTES: usize = 60;

/// What the console remembers of the stream.
#[derive(Default)]
pub struct Live {
    recent: Mutex<VecDeque<Bytes>>,
    /// (minute since the epoch, records written in it), oldest first.
    per_minute: Mutex<VecDeque<(u64, u64)>>,
}

impl Live {
    /// Follow `records` until the audit log closes.
    pub fn follow(self: &Arc<Self>, mut records: broadcast::Receiver<Bytes>) {
        let live = self.clone();
        tokio::spawn(async move {
            loop {
                match records.recv().await {
                    Ok(line) => live.note(line, now_minute()),
                    // Fell behind: what was lost is not shown, and is not counted here.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    fn note(&self, line: Bytes, minute: u64) {
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == KEPT {
                recent.pop_front();
            }
            recent.push_back(line);
        }
        let mut per = self.per_minute.lock().unwrap_or_else(|e| e.into_inner());
        match per.back_mut() {
            Some((m, n)) if *m == minute => *n += 1,
            _ => per.push_back((minute, 1)),
        }
        while per
            .front()
            .is_some_and(|(m, _)| *m + MINUTES as u64 <= minute)
        {
            per.pop_front();
        }
    }

    /// The kept records that pass `filter`, newest first.
    pub fn recent(&self, filter: &Filter) -> Vec<serde_json::Value> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent
            .iter()
            .rev()
            .filter(|l| filter.matches(l))
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect()
    }

    /// Records per minute over the last [`MINUTES`] minutes up to `now` (oldest first; a
    /// minute with none is 0).
    pub fn per_minute(&self, now: u64) -> Vec<(u64, u64)> {
        let per = self.per_minute.lock().unwrap_or_else(|e| e.into_inner());
        let first = now + 1 - MINUTES as u64;
        (first..=now)
            .map(|m| {
                let n = per.iter().find(|(k, _)| *k == m).map_or(0, |(_, n)| *n);
                (m, n)
            })
            .collect()
    }
}

/// The current minute since the epoch.
pub fn now_minute() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// A stream that ends when its session does: the body `B` until `deadline`, or until the
/// session is closed (sign-out), whichever comes first.
pub struct Until<B> {
    body: B,
    deadline: std::time::Instant,
    /// Wakes the stream at `deadline` when nothing else does.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Resolves when the session is closed.
    ended: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
}

impl<B> Until<B> {
    /// `body` until `deadline` or until `ended` resolves.
    pub fn new(
        body: B,
        deadline: std::time::Instant,
        ended: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Self {
        Until {
            body,
            deadline,
            timer: Box::pin(tokio::time::sleep_until(deadline.into())),
            ended: Box::pin(ended),
        }
    }
}

impl<B: Body + Unpin> Body for Until<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let over = self.timer.as_mut().poll(cx).is_ready();
        let closed = self.ended.as_mut().poll(cx).is_ready();
        if over || closed || std::time::Instant::now() >= self.deadline {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }
}

/// One record as an event: a record is one JSON line, so one `data:` field carries it.
pub fn event(line: &[u8]) -> Bytes {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut out = Vec::with_capacity(line.len() + 8);
    out.extend_from_slice(b"data: ");
    // A record never holds a raw line end (JSON escapes it); a notice is ours. Either way an
    // event never ends early.
    out.extend(
        line.iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_records_and_the_minutes_are_kept_and_bounded() {
        let live = Live::default();
        for i in 0..(KEPT + 5) {
            let line = format!(
                r#"{{"event":"end","sandbox":"s{}","decision":"deny"}}"#,
                i % 2
            );
            live.note(Bytes::from(line), 1000 + (i as u64) / 100);
        }
        let all = live.recent(&Filter::default());
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0]["sandbox"], "s0", "newest first: record {}", KEPT + 4);
        let only = Filter::parse(Some("sandbox=s1")).unwrap();
        assert_eq!(live.recent(&only).len(), KEPT / 2);
        let per = live.per_minute(1002);
        assert_eq!(per.len(), MINUTES);
        assert_eq!(per[MINUTES - 3..], [(1000, 100), (1001, 100), (1002, 5)]);
        live.note(Bytes::from_static(b"{}"), 1002 + MINUTES as u64);
        assert_eq!(
            live.per_minute.lock().unwrap().len(),
            1,
            "the hour moved on"
        );
    }

    #[tokio::test]
    async fn a_stream_ends_with_its_session() {
        use http_body_util::{BodyExt, Full};
        let now = std::time::Instant::now();
        let never = std::future::pending::<()>;
        let mut ended = Until::new(Full::new(Bytes::from_static(b"x")), now, never());
        assert!(ended.frame().await.is_none(), "the session is over");
        let later = now + std::time::Duration::from_secs(60);
        let mut open = Until::new(Full::new(Bytes::from_static(b"x")), later, never());
        let data = open.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&data[..], b"x");
        let mut signed_out = Until::new(Full::new(Bytes::from_static(b"x")), later, async {});
        assert!(signed_out.frame().await.is_none(), "signed out");
    }

    #[test]
    fn an_event_is_one_data_field() {
        assert_eq!(&event(b"{\"a\":1}\n")[..], b"data: {\"a\":1}\n\n");
        assert_eq!(&event(b"x\ny\r")[..], b"data: x y \n\n");
    }
}
