//! Through the parent proxy (`upstream_proxy`): after this proxy's own decision allowed a
//! target, a tunnel to it is asked of the parent with `CONNECT host:port` — for CONNECT
//! tunnels, terminated (brokered) hosts and transparent connections alike, so the parent's
//! answer is always its own and never confused with an origin's. Forwarded plain HTTP goes
//! to the parent as requests ([`reach`] the parent, then [`crate::relay::forward`] writes the
//! absolute form), because corporate parents refuse `CONNECT` to port 80. The
//! parent's address is what this proxy dials itself, so the guard judges it (a parent on a
//! private or loopback address must be listed in `defaults.guard_allow_ranges`); the target
//! name goes to the parent unresolved. The parent's reply head is read without reading a
//! byte past it, so what the origin sends first (an SSH or SMTP banner) stays in the socket
//! for the relay. A refusal (407, 403, 502, …) becomes `upstream_proxy_refused` with the
//! parent's status line; its `Proxy-Authorization` is never logged.

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::audit::metrics::Metrics;
use crate::config::upstream::UpstreamProxy;
use crate::egress::resolve::Resolver;
use crate::egress::server_io::ServerIo;
use crate::egress::Dialed;
use crate::policy::guard::{Guard, GuardVerdict};
use crate::policy::reason::Reason;
use crate::policy::target::Target;

mod head;
mod route;

pub use route::bypassed;

use head::{read_head, read_head_buffered};

/// Why the parent gave no tunnel: the reason the client is refused with, and what the
/// record's detail says.
#[derive(Debug)]
pub struct ParentFailed {
    pub reason: Reason,
    pub detail: String,
}

/// The parent's addresses, resolved by this proxy's resolver, that the guard permits.
pub async fn addresses(
    parent: &UpstreamProxy,
    guard: &Guard,
    resolver: &Resolver,
) -> Result<Vec<IpAddr>, ParentFailed> {
    let addrs = match parent.host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => resolver
            .resolve(&parent.host)
            .await
            .map_err(|e| ParentFailed {
                reason: e.reason(),
                detail: format!("upstream proxy {}: {e}", parent.shown()),
            })?,
    };
    permitted(parent, &addrs, guard)
}

/// A connection to the parent itself at one of `addrs` (already permitted): TCP, then TLS
/// for an `https://` parent, verified before anything is sent to it.
pub async fn reach(
    parent: &UpstreamProxy,
    addrs: &[IpAddr],
    timeout: Duration,
    metrics: &Metrics,
) -> Result<Dialed, ParentFailed> {
    let shown = parent.shown();
    let failed = |reason, detail: String| ParentFailed { reason, detail };
    let (tcp, addr) = crate::egress::dial_socket(addrs, parent.port, None, timeout, metrics)
        .await
        .map_err(|reason| failed(reason, format!("upstream proxy {shown}: cannot connect")))?;
    let Some(tls) = &parent.tls else {
        return Ok(Dialed {
            stream: ServerIo::Tcp(tcp),
            addr,
        });
    };
    let connector = route::connector(tls).map_err(|e| {
        failed(
            Reason::UpstreamProxyRefused,
            format!("upstream proxy {shown}: no TLS configuration ({e})"),
        )
    })?;
    let handshake = connector.connect(tls.name.clone(), tcp);
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(s)) => Ok(Dialed {
            stream: ServerIo::Tls(Box::new(s)),
            addr,
        }),
        Ok(Err(e)) => Err(failed(
            Reason::UpstreamProxyRefused,
            format!("upstream proxy {shown}: TLS with it failed: {e}"),
        )),
        Err(_) => Err(failed(
            Reason::ConnectionTimeout,
            format!("upstream proxy {shown}: no TLS handshake"),
        )),
    }
}

/// A tunnel to `target` through `parent`: the socket to the parent, positioned after its
/// `200` (so it carries the target's bytes), and the parent's address.
pub async fn connect(
    parent: &UpstreamProxy,
    target: &Target,
    guard: &Guard,
    resolver: &Resolver,
    timeout: Duration,
    metrics: &Metrics,
) -> Result<Dialed, ParentFailed> {
    let shown = parent.shown();
    let failed = |reason, detail: String| ParentFailed { reason, detail };
    let addrs = addresses(parent, guard, resolver).await?;
    let Dialed { mut stream, addr } = reach(parent, &addrs, timeout, metrics).await?;
    let request = connect_request(parent, target);
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        match &mut stream {
            ServerIo::Tcp(tcp) => read_head(tcp).await,
            ServerIo::Tls(tls) => read_head_buffered(tls).await,
        }
    };
    let head = match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(head)) => head,
        Ok(Err(e)) => {
            return Err(failed(
                Reason::UpstreamProxyRefused,
                format!("upstream proxy {shown}: no tunnel ({e})"),
            ))
        }
        Err(_) => {
            return Err(failed(
                Reason::ConnectionTimeout,
                format!("upstream proxy {shown}: no answer to CONNECT"),
            ))
        }
    };
    let status_line = head.lines().next().unwrap_or("").trim();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(200..=299) if status_line.starts_with("HTTP/1.") => Ok(Dialed { stream, addr }),
        _ => Err(failed(
            Reason::UpstreamProxyRefused,
            format!("upstream proxy {shown} answered {}", printable(status_line)),
        )),
    }
}

/// The parent's addresses the guard permits: a parent on a private or loopback address must
/// be listed in `defaults.guard_allow_ranges`, like any destination.
fn permitted(
    parent: &UpstreamProxy,
    addrs: &[IpAddr],
    guard: &Guard,
) -> Result<Vec<IpAddr>, ParentFailed> {
    let shown = parent.shown();
    let mut refused = None;
    let permitted: Vec<IpAddr> = addrs
        .iter()
        .copied()
        .filter(|ip| match guard.check(*ip, parent.port, |_| None) {
            GuardVerdict::Permit => true,
            v => {
                refused = Some((*ip, v));
                false
            }
        })
        .collect();
    if !permitted.is_empty() {
        return Ok(permitted);
    }
    let detail = match refused {
        Some((ip, GuardVerdict::Prohibited(range))) => format!(
            "upstream proxy {shown}: its address {ip} is in {range}; a parent on a private or loopback address must be listed in defaults.guard_allow_ranges"
        ),
        Some((ip, _)) => format!("upstream proxy {shown}: {ip} is this proxy itself"),
        None => format!("upstream proxy {shown}: no address"),
    };
    Err(ParentFailed {
        reason: Reason::DestinationIpProhibited,
        detail,
    })
}

/// The `CONNECT` asking `parent` for a tunnel to `target`, with its credentials if it has
/// any.
fn connect_request(parent: &UpstreamProxy, target: &Target) -> String {
    let authority = target.to_string();
    let mut request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(auth) = &parent.authorization {
        request.push_str("Proxy-Authorization: ");
        request.push_str(auth.value());
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request
}

/// How an allowed exchange reaches its target.
pub struct Opened {
    pub dialed: Dialed,
    /// The address the exchange's grant is watched with: the checked address dialled (or
    /// asked of the parent), or the parent's own when the parent resolves the name.
    pub checked: IpAddr,
    /// What the record's detail says about the route (through a parent).
    pub via: Option<String>,
}

/// Open what `decided` allowed: a checked address directly, or — with a parent that does
/// not bypass the target — a tunnel through the parent to the checked address when the name
/// was resolved here (address rules needed it: the parent then cannot resolve it anew), or
/// to the name itself when it was not.
#[allow(clippy::too_many_arguments)]
pub async fn open(
    parent: Option<&UpstreamProxy>,
    decided: &crate::egress::Decided,
    target: &Target,
    prefer: Option<IpAddr>,
    guard: &Guard,
    resolver: &Resolver,
    timeout: Duration,
    metrics: &Metrics,
) -> Result<Opened, ParentFailed> {
    let Some(parent) = parent else {
        let dialed = crate::egress::dial(&decided.dial, target.port, prefer, timeout, metrics)
            .await
            .map_err(|reason| ParentFailed {
                reason,
                detail: String::new(),
            })?;
        return Ok(Opened {
            checked: dialed.addr.ip(),
            dialed,
            via: None,
        });
    };
    let asked = asked(decided, target);
    let dialed = connect(parent, &asked, guard, resolver, timeout, metrics).await?;
    let checked = match asked.host {
        crate::policy::target::Host::Ip(ip) => ip,
        crate::policy::target::Host::Name(_) => dialed.addr.ip(),
    };
    Ok(Opened {
        via: Some(format!(
            "through upstream proxy {} (CONNECT {asked})",
            parent.shown()
        )),
        checked,
        dialed,
    })
}

/// What is asked of the parent for `target`: the checked address when the name was resolved
/// here (address rules needed it: the parent then cannot resolve it anew) or the target is
/// an address, else the name itself.
pub fn asked(decided: &crate::egress::Decided, target: &Target) -> Target {
    match decided.dial.first() {
        Some(ip)
            if !decided.resolved.is_empty()
                || matches!(target.host, crate::policy::target::Host::Ip(_)) =>
        {
            Target {
                host: crate::policy::target::Host::Ip(*ip),
                port: target.port,
            }
        }
        _ => target.clone(),
    }
}

/// Whether the answer to a request sent through `parent` in absolute form is the parent's own
/// refusal rather than the origin's answer — a 407 (it wants credentials), or an error it
/// marked as its own: an RFC 9209 `Proxy-Status` naming an error, or Squid's `X-Squid-Error`
/// — and if so, the detail that says it (as a refused `CONNECT`'s does).
pub fn refusal<B>(parent: &UpstreamProxy, resp: &http::Response<B>) -> Option<String> {
    let h = resp.headers();
    let marked = resp.status() == http::StatusCode::PROXY_AUTHENTICATION_REQUIRED
        || h.contains_key("x-squid-error")
        || h.get_all("proxy-status")
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains("error=")));
    marked.then(|| {
        let status = resp.status();
        let line = format!(
            "HTTP/1.1 {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        format!(
            "upstream proxy {} answered {}",
            parent.shown(),
            printable(&line)
        )
    })
}

/// A status line as it may be shown: printable ASCII, at most 120 bytes.
fn printable(line: &str) -> String {
    line.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(120)
        .collect()
}
