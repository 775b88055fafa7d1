//! The one request pipeline: every HTTP request to a host that is judged per request —
//! forwarded plain HTTP, and each request (each HTTP/2 stream) of a terminated tunnel — goes
//! through the same named phases, judged as the origin will read it:
//!
//! 1. **head** ([`head::HostRules::judge`]): the request made canonical — a method compared
//!    without case (TRACE and unusual methods only where a rule names them), no override
//!    header or `_method` parameter, a canonical path (no dot segment, no encoded `.` `/` `\`,
//!    the same canonicalizer as grants, sealing and presets), no body on a method that carries
//!    none, no identity header of the proxy's own — then the host's `network.http` rules as one
//!    matcher: where a rule reads a protocol on the request's path (MCP, JSON-RPC, GraphQL,
//!    git, LFS), only such rules decide, so a plainer rule on the same host cannot skip it;
//! 2. **body** ([`body::read`], [`body::judge`]): a rule naming a protocol reads the body,
//!    bounded, *as its declared media type* — a media type the protocol does not read is
//!    refused, never guessed — and the bytes judged are the bytes sent;
//! 3. the verdict stages that ask per request (the decider), DLP and the quota reservation.
//!
//! [`driver::request`] owns that order for every path that serves requests one by one
//! (forwarded plain HTTP, and the exchange of a terminated tunnel or of plain HTTP read in a
//! tunnel); each path supplies only what differs ([`driver::Path`]). Credentials, send and the
//! response phases follow on the path's side: on a terminated host all of them
//! ([`crate::intercept`]); forwarded, a credential never travels in clear
//! ([`crate::intercept::InClear`] refuses such a request before it is dialled).
//!
//! [`judged_per_request`] is the one predicate that says which hosts these are.

pub mod ask;
pub mod aws_chunked;
pub mod body;
pub mod coding;
pub mod decoded;
pub mod dlp;
pub mod driver;
pub mod flow;
pub mod flow_gate;
pub mod forwarded;
pub mod head;
pub(crate) mod unescape;
pub mod whole;

use crate::audit::AuditGuard;
use crate::config::Binding;
use crate::policy::{Enforcement, Verdict};

/// Whether the requests of `binding` to `host` are judged one by one: a credential or the
/// identity token is bound to it, it is the token endpoint of a minting credential, or a
/// `network.http` rule names it. The one predicate: termination
/// ([`crate::intercept::Interceptor::terminates`]) and the forwarded path both ask it.
pub fn judged_per_request(binding: &Binding, host: &str) -> bool {
    binding
        .credentials
        .iter()
        .any(|c| c.bound_to(host) || c.token_host(host))
        || binding.network.http.iter().any(|r| r.host.matches(host))
        || (binding.network.layers.iter()).any(|l| l.http.iter().any(|r| r.host.matches(host)))
        || binding
            .identity_token
            .as_ref()
            .is_some_and(|t| t.bound_to(host))
}

/// Whether every plain-HTTP request of `binding` is served one by one by the pipeline, whatever
/// its host and however it arrives (forwarded, or inside a CONNECT, SOCKS5 or transparent
/// connection): a phase applies to requests to any host (`dlp`, and the decider, which is
/// asked about every request the same way on every path: [`ask`]). Elsewhere plain HTTP in a
/// tunnel to a host not [`judged_per_request`] is framed and checked against the decided host
/// ([`crate::relay::http_checked`]).
pub fn reads_every_request(binding: &Binding) -> bool {
    binding.dlp.is_some() || binding.decider.is_some() || binding.network.flows.is_some()
}

pub use crate::policy::refusal::Refusal;

/// A refusal, recorded — the one place report mode is decided for a request's phases: `Ok`
/// when the sandbox is in report mode and the reason is reportable (the request goes on,
/// recorded `report` with `how` it went on); else `Err`, recorded `deny`.
pub fn reported(
    binding: &Binding,
    r: Refusal,
    how: &str,
    audit: &mut AuditGuard,
) -> Result<(), Refusal> {
    if binding.enforcement == Enforcement::Report && r.reason.reportable() {
        audit.verdict(Verdict::Report, r.reason);
        audit.detail(format!("{} ({how})", r.detail));
        return Ok(());
    }
    audit.verdict(Verdict::Deny, r.reason);
    audit.detail(r.detail.clone());
    Err(r)
}
