//! A request body as it goes upstream: streamed as the client sends it, the bytes read whole
//! (judged by a protocol rule, or hashed to be signed), or streamed with its `aws-chunked`
//! chunk signatures computed again ([`crate::intercept::sigv4::Chunks`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::intercept::sigv4::Chunks;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum UpBody {
    Streamed(Incoming),
    /// The whole body (taken when sent).
    Whole(Option<Bytes>),
    Resigned(Incoming, Box<Chunks>),
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
            UpBody::Resigned(b, chunks) => loop {
                match std::task::ready!(Pin::new(&mut *b).poll_frame(cx)) {
                    None if chunks.finished() => return Poll::Ready(None),
                    None => {
                        return Poll::Ready(Some(Err(
                            "the aws-chunked body ended before its final chunk".into(),
                        )))
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
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
            UpBody::Streamed(b) | UpBody::Resigned(b, _) => b.is_end_stream(),
            UpBody::Whole(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Streamed(b) | UpBody::Resigned(b, _) => b.size_hint(),
            UpBody::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
