//! The first stage of every data-plane connection: what is known the moment it is accepted.
//! The accept loops in [`crate::server`] make one; the listeners take it from there.

use std::net::SocketAddr;
use std::time::Instant;

/// A connection just accepted.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    /// The audit record's `conn_id` (later requests on a keep-alive connection take new ids).
    pub conn_id: u64,
    /// The client's address (identity by source, and the record's `client`).
    pub client: SocketAddr,
    /// When it was accepted: `duration_ms` is measured from here.
    pub started: Instant,
}
