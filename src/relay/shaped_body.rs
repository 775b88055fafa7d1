//! Bandwidth shaping for plain-HTTP forwarding: a body wrapper that, for each data frame,
//! takes the sandbox's bandwidth tokens and holds the frame back until they are due. Frames
//! are delayed, never dropped or altered. (Tunnels are shaped in [`crate::relay::tunnel`].)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::egress::limits::SandboxLimiter;

/// A body whose data frames wait for bandwidth tokens.
pub struct ShapedBody<B> {
    inner: B,
    limiter: Arc<SandboxLimiter>,
    /// Client → destination (`bandwidth_up_bps`) or the other way.
    up: bool,
    /// A frame waiting for its tokens, and the timer it waits on.
    held: Option<(Frame<Bytes>, Pin<Box<Sleep>>)>,
}

impl<B> ShapedBody<B> {
    pub fn new(inner: B, limiter: Arc<SandboxLimiter>, up: bool) -> Self {
        ShapedBody {
            inner,
            limiter,
            up,
            held: None,
        }
    }
}

impl<B> Body for ShapedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some((_, sleep)) = this.held.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            return Poll::Ready(this.held.take().map(|(frame, _)| Ok(frame)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let delay = frame
                    .data_ref()
                    .map(|d| this.limiter.shape_now(this.up, d.len()))
                    .unwrap_or_default();
                if delay.is_zero() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                let mut sleep = Box::pin(tokio::time::sleep(delay));
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                this.held = Some((frame, sleep));
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
