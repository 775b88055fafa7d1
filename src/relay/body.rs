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
