//! How are bytes moved, and when are they cut? The relays: byte tunnels (shaped or zero-copy
//! with `splice`), plain-HTTP forwarding, the checked HTTP relay, the bodies that count and
//! shape, and the watch every exchange holds on its grant (revocation, shutdown).

pub(crate) mod abortable;
pub(crate) mod body;
pub(crate) mod counted;
pub(crate) mod forward;
pub mod http_checked;
pub(crate) mod liveness;
#[allow(unsafe_code)]
pub(crate) mod send_queue;
pub(crate) mod shaped_body;
pub(crate) mod splice;
pub(crate) mod tunnel;
pub(crate) mod watch;
