//! What a forwarded request loses and gains on its way upstream: the hop-by-hop headers
//! (RFC 9110 §7.6.1, those its `Connection` names too) and the proxy's own credentials are
//! removed, and its `Host` is the decided target's.

use http::header::{self, HeaderMap, HeaderName};

use crate::policy::target::Target;

/// Hop-by-hop headers, plus the proxy's own credentials: never forwarded.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_connection(headers);
    for h in [
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(h);
    }
}

/// What is about the client's own connection: `Connection`, the headers it names,
/// `Keep-Alive` and `Proxy-Connection`. A terminated request loses these (its upstream
/// connection is the proxy's, and may be kept for the next tunnel), and keeps `TE` and
/// `Trailer` (gRPC's `te: trailers`).
pub(crate) fn strip_connection(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    headers.remove(header::CONNECTION);
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// The `Host` header for a target (the port only when it is not 80).
pub(crate) fn host_header(t: &Target) -> String {
    if t.port == 80 {
        t.host.to_string()
    } else {
        t.to_string()
    }
}
