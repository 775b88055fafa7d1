//! The filtering resolver (`listen.dns`): answers a sandbox only what its policy could use,
//! and remembers each answer so transparent mode can name a nameless connection. An adapter
//! over the sequence's query steps ([`crate::egress::admit::query_enter`], `query_name`,
//! `query_addresses`: identity, rate, the name decision, report mode, the address filter and
//! the record), as `socks5` is over the connection steps: this folder keeps the wire format —
//! rcodes, Extended DNS Errors, TTLs, records, the UDP loops and the repeat cache. A query is
//! identified once, by the repeat cache when it looks, else by the listener.

pub(crate) mod answer;
pub(crate) mod answer_cache;
#[allow(unsafe_code)]
pub(crate) mod give_back;
mod itself;
pub(crate) mod listener;
#[allow(unsafe_code)]
pub(crate) mod mmsg;
pub mod question;
pub(crate) mod reply;
pub(crate) mod strangers;
pub(crate) mod tcp;
pub(crate) mod udp;
pub mod wire;
