//! How does a connection arrive, and where does it say it goes? The listeners of the data
//! plane: the explicit proxy (`CONNECT` and absolute-form HTTP, over TCP or TLS) and the
//! transparent listener (redirected TCP: the original destination, then the first bytes), the
//! client's stream, and the one refusal builder every listener answers with.

pub(crate) mod explicit;
pub(crate) mod explicit_tls;
#[allow(unsafe_code)]
pub(crate) mod orig_dst;
pub(crate) mod transparent;
mod tunnel;
