//! Where a terminated tunnel (or a tunnel whose plain-HTTP requests are served one by one)
//! leads: the decided host and port, the scheme its requests are judged under, the process
//! it is attributed to, and how a refusal there names it.

use std::sync::Arc;

use crate::relay::deny;

/// Where a terminated tunnel leads.
pub struct Destination {
    pub host: String,
    pub port: u16,
    /// `https`, or `http` for plain HTTP inside a tunnel (judged the same, sent in clear).
    pub scheme: &'static str,
    /// The process the tunnel is attributed to (scoped `network.http` rules decide by it).
    pub process: Option<Arc<crate::policy::process::Process>>,
    /// Where a refusal tells the sandbox to ask for access (`https://` only where the proxy
    /// has an interception CA).
    pub ask: deny::AskUrl,
}

impl Destination {
    /// `https://host[:port]` as a refusal names it: the port kept unless it is the scheme's
    /// own (clients review F11), IPv6 in brackets.
    pub fn shown(&self) -> String {
        let host = match self.host.contains(':') {
            true => format!("[{}]", self.host),
            false => self.host.clone(),
        };
        let default = if self.scheme == "http" { 80 } else { 443 };
        match self.port == default {
            true => format!("{}://{host}", self.scheme),
            false => format!("{}://{host}:{}", self.scheme, self.port),
        }
    }
}
