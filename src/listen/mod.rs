//! How does a connection arrive, and where does it say it goes? The listeners of the data
//! plane, each an adapter that parses its protocol, makes one call into the admission
//! sequence ([`crate::egress::admit`]) and hands what it admitted to the one relay chooser
//! ([`relay_choice`]): the explicit proxy (`CONNECT` and absolute-form HTTP, over TCP or TLS,
//! HTTP/1.1 or HTTP/2), the transparent listener (redirected TCP: the original destination,
//! then the first bytes) and the SOCKS5 listener (a CONNECT, with a login or by source).

pub(crate) mod ask;
mod connect;
pub(crate) mod explicit;
mod explicit_head;
mod explicit_refuse;
pub(crate) mod explicit_tls;
mod opaque_flow;
#[allow(unsafe_code)]
pub(crate) mod orig_dst;
mod refused_inside;
pub(crate) mod relay_choice;
mod running;
pub(crate) mod socks5;
#[cfg(test)]
mod task_size;
pub(crate) mod transparent;

/// The client's socket as it sees itself — its address, and the address it connected to
/// (`dialed`: the listener's address, or a redirected connection's original destination) —
/// with the first look at who holds it, when `listen.attribution.observe` is on (otherwise
/// no `getsockname` is spent on it). Called as the connection is accepted, before any of
/// its bytes is read: every later look must agree with this one.
pub(crate) fn peer_of(
    shared: &crate::runtime::Shared,
    client: std::net::SocketAddr,
    dialed: impl FnOnce() -> Option<std::net::SocketAddr>,
) -> Option<crate::egress::attribution::Peer> {
    let observer = shared.settings.observer.as_ref()?;
    let dialed = dialed()?;
    let exhaustive = shared.policy.load().any_scoped();
    Some(crate::egress::attribution::Peer {
        client,
        dialed,
        first: observer.first_look(client, dialed, exhaustive),
    })
}
