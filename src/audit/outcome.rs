//! How a connection is classified and how it ended: the record's `mode` and `close`, the
//! metric labels, and what relays report. A leaf: the audit trail, the metrics and the relays
//! all use it, and it uses nothing.

use serde::Serialize;

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Close {
    /// Both sides finished normally (or the request was answered).
    Eof,
    /// Nothing moved for `timeouts.idle_ms` (or no request arrived within `header_ms`).
    Idle,
    /// An I/O error on either side.
    Error,
    /// The policy in force no longer allows the exchange.
    Revoked,
    /// The proxy is shutting down.
    Shutdown,
    /// Refused by a limit (or cut by a daily quota).
    Limit,
    /// Closed by the proxy for what was refused inside it (a WebSocket message, 1008).
    Refused,
}

impl Close {
    /// The record's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Close::Eof => "eof",
            Close::Idle => "idle",
            Close::Error => "error",
            Close::Revoked => "revoked",
            Close::Shutdown => "shutdown",
            Close::Limit => "limit",
            Close::Refused => "refused",
        }
    }

    /// Whether a relay that ended this way is cut (both sockets reset, nothing queued
    /// delivered): revocation, shutdown, a spent quota.
    pub fn aborts(self) -> bool {
        matches!(self, Close::Revoked | Close::Shutdown | Close::Limit)
    }
}

/// What the proxy read the destination from (the record's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Explicit proxy, `CONNECT host:port` (also: a connection that sent no usable request).
    Connect,
    /// Explicit proxy, absolute-form `GET http://host/...`.
    Http,
    /// Transparent, TLS ClientHello SNI.
    Sni,
    /// Transparent, HTTP `Host` header.
    Host,
    /// Transparent, neither TLS nor HTTP: decided on the original destination (or on the
    /// name a DNS answer gave the sandbox for it).
    Tcp,
    /// A query to the DNS listener.
    Dns,
    /// One request inside a tunnel the proxy terminated (credentials, HTTP rules).
    Https,
    /// The SOCKS5 listener, a CONNECT request.
    Socks5,
    /// An access request's life (`approval` says which step): asked, approved, denied,
    /// expired. Not a connection: counted nowhere else.
    Approval,
}

impl Mode {
    /// The record's and the metric label's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Connect => "connect",
            Mode::Http => "http",
            Mode::Sni => "sni",
            Mode::Host => "host",
            Mode::Tcp => "tcp",
            Mode::Dns => "dns",
            Mode::Https => "https",
            Mode::Socks5 => "socks5",
            Mode::Approval => "approval",
        }
    }
}

/// What a finished relay reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// Client → destination.
    pub up: u64,
    /// Destination → client.
    pub down: u64,
    pub close: Close,
    /// Why the proxy cut it, when it did (`close: limit`: which quota, and its value).
    pub cut: Option<String>,
}

impl Relayed {
    /// Nothing was relayed.
    pub fn nothing(close: Close) -> Self {
        Relayed {
            up: 0,
            down: 0,
            close,
            cut: None,
        }
    }
}
