//! The one body wrapper that counts: every HTTP body the proxy relays (forwarded requests and
//! responses, requests and responses in terminated tunnels) passes through a [`Counted`],
//! which counts its data bytes into the exchange's [`Liveness`] (so moving bytes keep it
//! alive), passes every frame (data and trailers) through, and says once how it ended.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::egress::quota::share;
use crate::relay::liveness::Liveness;

/// How a counted body ended.
#[derive(Debug)]
pub struct Ending {
    /// Its last frame was delivered.
    pub complete: bool,
    /// The error it ended with, if it failed.
    pub error: Option<String>,
    /// The data bytes it passed.
    pub bytes: u64,
    /// SHA-256 of the data bytes it passed, when asked ([`Counted::digested`]).
    pub sha256: Option<[u8; 32]>,
}

type OnEnd = Box<dyn FnOnce(Ending) + Send + Sync>;

/// A body counted in one direction (`up`: client → destination).
pub struct Counted<B> {
    inner: B,
    live: Arc<Liveness>,
    up: bool,
    /// This body's own count, when someone wants it while it streams.
    count: Option<Arc<AtomicU64>>,
    /// The data bytes passed so far (told in [`Ending`]).
    bytes: u64,
    complete: bool,
    error: Option<String>,
    /// Called once, when the body ends or is dropped.
    on_end: Option<OnEnd>,
    /// A byte quota was spent inside this body: nothing more is passed (the exchange's cut
    /// ends it).
    spent: bool,
    /// The digest of what was passed, when asked.
    digest: Option<sha2::Sha256>,
    /// Data read but not yet granted by a byte quota whose fleet share is being leased, and
    /// when to stop waiting for it ([`Counted::poll_held`]).
    held: Option<(Bytes, tokio::time::Instant)>,
    /// The next look at the share while data is held.
    retry: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How often data held for a fleet's byte share looks at the share again.
const SHARE_RETRY: std::time::Duration = std::time::Duration::from_millis(2);

impl<B: Body> Counted<B> {
    pub fn new(inner: B, live: Arc<Liveness>, up: bool) -> Self {
        Counted {
            inner,
            live,
            up,
            count: None,
            bytes: 0,
            complete: false,
            error: None,
            on_end: None,
            spent: false,
            digest: None,
            held: None,
            retry: None,
        }
    }

    /// Also digest the bytes passed (SHA-256, told in [`Ending::sha256`]): what the client
    /// was given, computed as it streams (one pass, no copy).
    pub fn digested(mut self) -> Self {
        self.digest = Some(sha2::Digest::new());
        self
    }

    /// Also count this body's bytes into `count`.
    pub fn count_into(mut self, count: Arc<AtomicU64>) -> Self {
        self.count = Some(count);
        self
    }

    /// Call `f` once with how the body ended (when it ends, or when it is dropped).
    pub fn on_end(mut self, f: impl FnOnce(Ending) + Send + Sync + 'static) -> Self {
        self.on_end = Some(Box::new(f));
        self
    }

    fn finish(&mut self) {
        if let Some(f) = self.on_end.take() {
            let complete = self.complete || self.inner.is_end_stream();
            f(self.ending(complete));
        }
    }
}

impl<B> Counted<B> {
    /// Data held for a fleet's byte share: the part granted now, once some is (what is left
    /// stays held); `Pending` meanwhile, looking again every [`SHARE_RETRY`]; `None` when no
    /// share came by `until` (the exchange is cut), or the fleet ran out (the quota's cut).
    fn poll_held(
        &mut self,
        cx: &mut Context<'_>,
        (mut data, until): (Bytes, tokio::time::Instant),
    ) -> Poll<Option<Bytes>> {
        loop {
            let (granted, wait) = self.live.take_some(self.up, data.len());
            if granted > 0 {
                let piece = data.split_to(granted);
                if !data.is_empty() {
                    self.held = Some((data, until));
                }
                self.retry = None;
                return Poll::Ready(Some(piece));
            }
            if !wait || tokio::time::Instant::now() >= until {
                self.live.cut_now();
                self.retry = None;
                return Poll::Ready(None);
            }
            let next = tokio::time::Instant::now() + SHARE_RETRY;
            let sleep = self
                .retry
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
            if sleep.as_mut().poll(cx).is_pending() {
                self.held = Some((data, until));
                return Poll::Pending;
            }
            sleep.as_mut().reset(next);
        }
    }

    fn ending(&mut self, complete: bool) -> Ending {
        Ending {
            complete,
            error: self.error.take(),
            bytes: self.bytes,
            sha256: self.digest.take().map(|d| sha2::Digest::finalize(d).into()),
        }
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if let Some(f) = self.on_end.take() {
            let complete = self.complete;
            f(self.ending(complete));
        }
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    type Error = B::Error;
    type Data = Bytes;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if this.spent {
            // Past a byte quota: the cut (raced against the relay) ends the exchange; nothing
            // more of this body is delivered meanwhile.
            return Poll::Pending;
        }
        let mut polled = match this.held.take() {
            Some(held) => match this.poll_held(cx, held) {
                Poll::Ready(Some(piece)) => Poll::Ready(Some(Ok(Frame::data(piece)))),
                // No share came: the body ends short (its peer sees it cut).
                Poll::Ready(None) => {
                    this.error = Some(
                        "this replica could not lease a share of the fleet's bytes_per_day in time"
                            .into(),
                    );
                    this.finish();
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            },
            None => Pin::new(&mut this.inner).poll_frame(cx),
        };
        if let (Poll::Ready(Some(Ok(f))), None) = (&mut polled, &this.held) {
            if let Some(d) = f.data_mut() {
                // Only what the byte quotas still allow is passed: the frame that crosses one
                // is cut to the rest — or, on a fleet whose share is being leased, the rest is
                // held for it.
                let (granted, wait) = this.live.take_some(this.up, d.len());
                if granted < d.len() {
                    let rest = d.split_off(granted);
                    match wait {
                        true => {
                            let until = tokio::time::Instant::now() + share::LEASE_WAIT;
                            this.held = Some((rest, until));
                            if granted == 0 {
                                cx.waker().wake_by_ref();
                                return Poll::Pending;
                            }
                        }
                        false => this.spent = true,
                    }
                }
            }
        }
        match &polled {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.bytes += d.len() as u64;
                    if let Some(h) = &mut this.digest {
                        sha2::Digest::update(h, d);
                    }
                    if let Some(c) = &this.count {
                        c.fetch_add(d.len() as u64, Ordering::Relaxed);
                    }
                }
                if this.inner.is_end_stream() && this.held.is_none() {
                    this.complete = true;
                }
            }
            Poll::Ready(Some(Err(e))) => {
                this.error = Some(e.to_string());
                this.finish();
            }
            Poll::Ready(None) => {
                this.complete = true;
                this.finish();
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The bytes of a request head as HTTP/1.1 writes it: request line, header lines, the empty
/// line. A forwarded exchange counts its heads too (URLs and headers carry data: a quota of
/// bytes that counted bodies alone would let them through).
pub fn request_head_len<B>(req: &http::Request<B>) -> usize {
    let u = req.uri();
    let target = match (u.scheme_str(), u.authority()) {
        (Some(s), Some(a)) => s.len() + 3 + a.as_str().len(),
        _ => 0,
    } + u.path_and_query().map_or(1, |p| p.as_str().len());
    req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len() + headers_len(req.headers())
}

/// The bytes of a response head as HTTP/1.1 writes it (status line, header lines, empty line).
pub fn response_head_len<B>(resp: &http::Response<B>) -> usize {
    let reason = resp.status().canonical_reason().unwrap_or("");
    "HTTP/1.1 200 \r\n".len() + reason.len() + headers_len(resp.headers())
}

fn headers_len(h: &http::HeaderMap) -> usize {
    h.iter()
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum::<usize>()
        + 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use std::sync::Mutex;
    use std::time::Duration;

    #[test]
    fn heads_are_measured_as_http1_writes_them() {
        let req = http::Request::get("http://a.test/x?q=1")
            .header("host", "a.test")
            .body(())
            .unwrap();
        let written = "GET http://a.test/x?q=1 HTTP/1.1\r\nhost: a.test\r\n\r\n";
        assert_eq!(request_head_len(&req), written.len());
        let resp = http::Response::builder()
            .status(404)
            .header("content-length", "0")
            .body(())
            .unwrap();
        let written = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(response_head_len(&resp), written.len());
    }

    #[tokio::test]
    async fn counts_data_and_says_once_how_it_ended() {
        let live = Arc::new(Liveness::new(Duration::from_secs(60)));
        let count = Arc::new(AtomicU64::new(0));
        let endings = Arc::new(Mutex::new(Vec::new()));
        let seen = endings.clone();
        let body = Counted::new(Full::new(Bytes::from_static(b"hello")), live.clone(), false)
            .count_into(count.clone())
            .on_end(move |e| seen.lock().unwrap().push((e.complete, e.error)));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"hello");
        assert_eq!(count.load(Ordering::Relaxed), 5);
        assert_eq!(live.totals(), (0, 5));
        assert_eq!(*endings.lock().unwrap(), vec![(true, None)]);

        // Dropped before its end: incomplete, said once.
        let seen = endings.clone();
        let body = Counted::new(Full::new(Bytes::from_static(b"x")), live, true)
            .on_end(move |e| seen.lock().unwrap().push((e.complete, e.error)));
        drop(body);
        assert_eq!(endings.lock().unwrap().len(), 2);
        assert_eq!(endings.lock().unwrap()[1], (false, None));
    }
}
