//! The HTTP body type the explicit proxy answers with (deny responses, forwarded responses),
//! and small constructors. Errors are boxed so that a revoked or failed exchange can end a
//! body with its own error.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Any error a body may end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of the explicit proxy.
pub type Body = BoxBody<Bytes, BoxError>;

/// No body.
pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Why a request body sent upstream ended early (the client's stream failed, or the DLP
/// phase cut it): one concrete error type, so the forwarded request's body is any `Error`
/// hyper's client takes without a boxed-to-boxed conversion.
#[derive(Debug)]
pub struct SendError(pub BoxError);

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl From<hyper::Error> for SendError {
    fn from(e: hyper::Error) -> Self {
        SendError(Box::new(e))
    }
}

impl From<crate::pipeline::dlp::Cut> for SendError {
    fn from(e: crate::pipeline::dlp::Cut) -> Self {
        SendError(Box::new(e))
    }
}
