//! A body read whole, within a byte limit, for what judges or scans it whole: the body phase
//! and DLP under a `Content-Encoding` (requests), the sealed token answer and the MCP rule's
//! JSON answer (responses). A body that arrives in one frame — a judged call and its answer
//! nearly always do — is kept as that frame, not copied; one that arrives in several is
//! gathered into one buffer. Trailers are not part of what is read.

use std::pin::pin;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a body was not read whole.
#[derive(Debug, thiserror::Error)]
pub enum Unread {
    /// It carried more than the limit's bytes.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// Reading it failed (the client went away, its framing broke).
    #[error("the body could not be read")]
    Failed(#[source] BoxError),
}

/// `body` read to its end: at most `limit` bytes, else [`Unread::TooLarge`] as soon as a frame
/// goes past it (the rest is not waited for).
pub async fn read<B>(body: B, limit: usize) -> Result<Bytes, Unread>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let mut held = Held::Nothing;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| Unread::Failed(e.into()))?.into_data() else {
            continue;
        };
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(Unread::TooLarge(limit));
        }
        held = match held {
            Held::Nothing => Held::One(data),
            Held::One(one) => {
                let mut all = BytesMut::with_capacity(len);
                all.extend_from_slice(&one);
                all.extend_from_slice(&data);
                Held::Many(all)
            }
            Held::Many(mut all) => {
                all.extend_from_slice(&data);
                Held::Many(all)
            }
        };
        if body.is_end_stream() {
            // Its declared length is read: no poll only to be told it ended.
            break;
        }
    }
    Ok(match held {
        Held::Nothing => Bytes::new(),
        Held::One(one) => one,
        Held::Many(all) => all.freeze(),
    })
}

/// What has been read so far: nothing, the one frame as it came, or several gathered.
enum Held {
    Nothing,
    One(Bytes),
    Many(BytesMut),
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{Full, StreamBody};

    use super::*;

    fn frames(parts: &[&'static [u8]]) -> impl http_body::Body<Data = Bytes, Error = Infallible> {
        let frames: Vec<Result<http_body::Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(http_body::Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn one_frame_is_kept_and_many_are_joined_in_order() {
        let one: &'static [u8] = b"{\"jsonrpc\":\"2.0\"}";
        let got = read(Full::new(Bytes::from_static(one)), 100).await.unwrap();
        assert_eq!(got, one);
        assert_eq!(got.as_ptr(), one.as_ptr(), "one frame is not copied");
        let got = read(frames(&[b"ab", b"", b"cd", b"e"]), 5).await.unwrap();
        assert_eq!(got, &b"abcde"[..]);
        assert_eq!(read(frames(&[]), 0).await.unwrap(), &b""[..]);
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_refused_in_any_frame() {
        for parts in [
            &[&b"abcdef"[..]][..],
            &[b"abc", b"def"],
            &[b"a", b"b", b"c", b"def"],
        ] {
            let got = read(frames(parts), 5).await;
            assert!(
                matches!(got, Err(Unread::TooLarge(5))),
                "{parts:?}: {got:?}"
            );
        }
        assert!(
            read(frames(&[b"abc", b"de"]), 5).await.is_ok(),
            "exactly the limit"
        );
    }

    #[tokio::test]
    async fn a_failed_read_is_failed_not_short() {
        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"abc"))),
            Err("the client went away".into()),
        ];
        let got = read(StreamBody::new(futures_util::stream::iter(frames)), 100).await;
        assert!(matches!(got, Err(Unread::Failed(_))), "{got:?}");
    }
}
