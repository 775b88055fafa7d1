//! What do the first bytes say? Protocol readers shared by listeners and relays, below both:
//! the TLS ClientHello parser (SNI, ALPN), peeking at a stream's start, checking a tunnel's
//! first bytes against what was decided, and the HTTP/1 request framing used to check every
//! request of a plain-HTTP stream. No policy, no I/O beyond reading the stream handed in.

pub mod first_bytes;
pub mod http_response;
pub mod http_stream;
pub mod peek;
pub mod signature;
pub mod sni;
pub mod socks5;
