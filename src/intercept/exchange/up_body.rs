//! A request body as it goes upstream: streamed as the client sends it, the bytes read whole
//! (judged by a protocol rule, or hashed to be signed), or streamed with its `aws-chunked`
//! chunk signatures computed again ([`crate::intercept::sigv4::Chunks`]), the bytes a decider
//! was shown followed by the rest, and any of these scanned by the DLP phase
//! ([`crate::pipeline::dlp`]) as it streams.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::intercept::sigv4::Chunks;
use crate::intercept::InterceptError;
use crate::pipeline::dlp::Scanned;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum UpBody {
    Streamed(Incoming),
    /// The whole body (taken when sent).
    Whole(Option<Bytes>),
    /// Any of the others (streamed, scanned by DLP, prefixed) with its chunks signed again.
    Resigned(Box<UpBody>, Box<Chunks>),
    /// The bytes read to show a decider (taken first), then the rest as it streams.
    Prefixed(Option<Bytes>, Incoming),
    Scanned(Box<Scanned<UpBody>>),
    /// Watched by the sandbox's flow rules as it streams.
    Gated(Box<crate::pipeline::flow::Gated<UpBody>>),
}

impl UpBody {
    pub fn whole(b: Bytes) -> Self {
        UpBody::Whole(Some(b))
    }

    /// The whole body, when it was read.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            UpBody::Whole(b) => b.as_ref(),
            _ => None,
        }
    }

    /// Read up to `max` bytes to show a decider: the body to send on (the same bytes then the
    /// rest), the bytes shown, and whether the body is longer.
    pub async fn prefix(self, max: usize) -> Result<(UpBody, Bytes, bool), InterceptError> {
        use http_body_util::BodyExt;
        let mut b = match self {
            UpBody::Streamed(b) => b,
            UpBody::Whole(Some(w)) => {
                let shown = w.slice(..w.len().min(max));
                return Ok((UpBody::whole(w.clone()), shown, w.len() > max));
            }
            other => return Ok((other, Bytes::new(), true)),
        };
        let mut got = bytes::BytesMut::new();
        loop {
            match b.frame().await {
                None => {
                    let all = got.freeze();
                    return Ok((UpBody::whole(all.clone()), all, false));
                }
                Some(Err(e)) => {
                    return Err(InterceptError::body_caused(
                        "reading the body for the decider",
                        e,
                    ))
                }
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => got.extend_from_slice(&d),
                    Err(_) => {
                        return Err(InterceptError::body(
                            "a body with trailers cannot be shown to the decider",
                        ))
                    }
                },
            }
            if got.len() > max {
                let all = got.freeze();
                let shown = all.slice(..max);
                return Ok((UpBody::Prefixed(Some(all), b), shown, true));
            }
        }
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpBody::Streamed(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpBody::Whole(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            UpBody::Prefixed(first, b) => match first.take() {
                Some(f) => Poll::Ready(Some(Ok(Frame::data(f)))),
                None => Pin::new(b).poll_frame(cx).map_err(Into::into),
            },
            UpBody::Scanned(b) => Pin::new(&mut **b).poll_frame(cx),
            UpBody::Gated(b) => Pin::new(&mut **b).poll_frame(cx),
            UpBody::Resigned(b, chunks) => loop {
                match std::task::ready!(Pin::new(&mut **b).poll_frame(cx)) {
                    None if chunks.finished() => return Poll::Ready(None),
                    None => {
                        return Poll::Ready(Some(Err(
                            "the aws-chunked body ended before its final chunk".into(),
                        )))
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Some(Ok(f)) => match f.into_data() {
                        Ok(d) => match chunks.push(&d) {
                            Ok(out) if out.is_empty() => continue,
                            Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                            Err(e) => return Poll::Ready(Some(Err(e.into()))),
                        },
                        Err(_) => {
                            return Poll::Ready(Some(Err(
                                "trailers on a signed aws-chunked body are not signed again".into(),
                            )))
                        }
                    },
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Streamed(b) => b.is_end_stream(),
            UpBody::Resigned(b, _) => b.is_end_stream(),
            UpBody::Whole(b) => b.is_none(),
            UpBody::Prefixed(first, b) => first.is_none() && b.is_end_stream(),
            UpBody::Scanned(b) => b.is_end_stream(),
            UpBody::Gated(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Streamed(b) => b.size_hint(),
            UpBody::Resigned(b, _) => b.size_hint(),
            UpBody::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            UpBody::Prefixed(first, b) => {
                let extra = first.as_ref().map_or(0, |f| f.len() as u64);
                let h = b.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower() + extra);
                if let Some(u) = h.upper() {
                    out.set_upper(u + extra);
                }
                out
            }
            UpBody::Scanned(b) => b.size_hint(),
            UpBody::Gated(b) => b.size_hint(),
        }
    }
}

/// The pipeline reads a terminated request's body as it reads any other: the DLP scanner wraps
/// it, the decider is shown a prefix of it.
impl crate::pipeline::dlp::Rebody for UpBody {
    fn scanned(s: crate::pipeline::dlp::Scanned<Self>) -> Self {
        UpBody::Scanned(Box::new(s))
    }

    fn whole(b: bytes::Bytes) -> Self {
        UpBody::whole(b)
    }

    fn gated(g: crate::pipeline::flow::Gated<Self>) -> Self {
        UpBody::Gated(Box::new(g))
    }
}

impl crate::pipeline::ask::Prefix for UpBody {
    async fn prefix(
        self,
        max: usize,
    ) -> Result<(Self, bytes::Bytes, bool), crate::pipeline::ask::ShowError> {
        UpBody::prefix(self, max)
            .await
            .map_err(|e| crate::pipeline::ask::ShowError::Read(Box::new(e)))
    }

    fn stand_in() -> Self {
        UpBody::Whole(None)
    }
}
