//! The filtering resolver (`listen.dns`): answers a sandbox only what its policy could use,
//! and remembers each answer so transparent mode can name a nameless connection.

pub(crate) mod answer;
pub(crate) mod answer_cache;
#[allow(unsafe_code)]
pub(crate) mod give_back;
pub(crate) mod listener;
#[allow(unsafe_code)]
pub(crate) mod mmsg;
pub mod question;
pub(crate) mod strangers;
pub(crate) mod tcp;
pub(crate) mod udp;
