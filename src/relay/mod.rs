//! How are bytes moved, and when are they cut? The relays: byte tunnels (shaped or zero-copy
//! with `splice`), plain-HTTP forwarding, the checked HTTP relay, the bodies that count and
//! shape, the watch every exchange holds on its clearance (revocation, shutdown), the client's
//! stream (TCP or TLS), and `deny`, the one builder of what a client is told when refused.
//! The destination's stream, its abort switch and the kept upstream connections are
//! [`crate::egress`]'s: a dial makes them.

pub(crate) mod body;
pub(crate) mod boxed_spawn;
pub(crate) mod buffers;
mod chunk;
pub(crate) mod client_io;
pub(crate) mod counted;
pub(crate) mod deny;
pub(crate) mod forward;
mod forward_send;
pub(crate) mod hop_by_hop;
pub mod http_checked;
pub(crate) mod liveness;
#[allow(unsafe_code)]
pub(crate) mod send_queue;
pub(crate) mod shaped_body;
pub(crate) mod splice;
pub(crate) mod tunnel;
pub(crate) mod watch;
