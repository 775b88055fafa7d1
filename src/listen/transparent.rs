//! The transparent listener (`listen.transparent`): TCP redirected here by iptables
//! (`REDIRECT`, or TPROXY). An adapter over the admission sequence ([`crate::egress::admit`]);
//! per connection, top to bottom in [`serve`]: original destination → [`admit::enter`]
//! (sandbox by source address or `default_sandbox`, limits) → peek (never consume: the bytes
//! are replayed upstream) up to 64 KiB within `timeouts.header_ms` → the target (the SNI or
//! `Host` name, else the original destination) → [`admit::Entered::admit`] (decide, resolve
//! with the proxy's own resolver, guard, the verdict point with these first bytes, dial the
//! *resolved* address — not the one the client chose: a forged SNI cannot reach another IP)
//! → [`relay_choice::relay`], watching the policy. A refusal resets the connection; nothing
//! is forwarded. One audit guard per connection.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::accept::Accepted;
use crate::audit::{AuditGuard, Mode};
use crate::egress::admit::{self, Admitted, Ask, Door, Evidence, Seated};
use crate::listen::orig_dst::original_dst;
use crate::policy::reason::Reason;
use crate::policy::target::{Host, Target};
use crate::policy::Decision;
use crate::relay::client_io::ClientIo;
use crate::runtime::Shared;
use crate::wire::first_bytes::{FirstBytes, Inspected};
use crate::wire::peek::{classify, split_host_header, Peeked, MAX_PEEK};

use super::relay_choice;
use super::running::Running;

/// Serve one redirected connection. `permit` is its place under the global cap, `unidentified`
/// its place among its address's connections not yet identified (given back at identification).
pub async fn serve(
    shared: Arc<Shared>,
    accepted: Accepted,
    mut stream: TcpStream,
    permit: OwnedSemaphorePermit,
    unidentified: Option<crate::egress::source_caps::UnidentifiedSlot>,
) {
    let set = shared.policy.load();
    let resolver = shared.resolver();
    let mut audit = shared.audit(&accepted, Mode::Sni, &set);
    let cx = shared.cx(&set, &resolver);
    // Boxed, and freed once admitted: awaited inline, its largest state (the peek, the
    // resolution) would size the task every tunnel keeps for its whole life.
    let admitted = Box::pin(admit_connection(
        &cx,
        &shared,
        &accepted,
        &mut stream,
        unidentified,
        &mut audit,
    ));
    let (admitted, read) = match admitted.await {
        Ok(Admission::Relay(admitted, read)) => (admitted, read),
        Ok(Admission::Local(entered, read, tls)) => {
            drop(set);
            let client = accepted.client;
            // Boxed: the proxy's own endpoint is rare, and inline it would size every tunnel.
            let served = Box::pin(super::ask::serve_transparent(
                &shared, &entered, stream, read, tls, &mut audit, client,
            ));
            if let Err(e) = served.await {
                audit.detail(format!("egress-proxy.local: {e}"));
                audit.close(crate::audit::Close::Error);
            }
            drop(entered);
            drop(audit);
            drop(permit);
            return;
        }
        Err(None) => return reset_recorded(stream, audit),
        Err(Some(d)) => return reset(stream, audit, d),
    };
    // The set is not kept alive by a long tunnel: the watch re-reads the newest one.
    drop(set);
    relay_admitted(&shared, stream, admitted, read, &mut audit).await;
    drop(audit);
    drop(permit);
}

/// What admitting a connection gave.
#[allow(
    clippy::large_enum_variant,
    reason = "moved once per connection; boxing the relay would add an allocation to every one"
)]
enum Admission {
    /// An exchange to relay, with what was read of it.
    Relay(Admitted, Inspected),
    /// A connection to the proxy's own endpoint (`egress-proxy.local` in its `Host` or SNI):
    /// identified and limited, answered by [`super::ask`]; what was read, and whether it is TLS.
    Local(admit::Entered, Vec<u8>, bool),
}

/// Original destination → [`admit::enter`] (the sandbox by source address or the default,
/// its limits; identified, the place among connections no sandbox has is given back) → peek
/// under those limits → the target → [`admit::Entered::admit`]. `Err` with the refusal to
/// record, or `None` when the guard holds it already.
async fn admit_connection(
    cx: &admit::Cx<'_>,
    shared: &Shared,
    accepted: &Accepted,
    stream: &mut TcpStream,
    mut unidentified: Option<crate::egress::source_caps::UnidentifiedSlot>,
    audit: &mut AuditGuard,
) -> Result<Admission, Option<Decision>> {
    let invalid = || Some(Decision::deny(Reason::InvalidTarget, None));
    let orig = match original_dst(stream) {
        Ok((a, _)) => SocketAddr::new(a.ip().to_canonical(), a.port()),
        Err(e) => {
            audit.detail(format!("no original destination: {e}"));
            return Err(invalid());
        }
    };
    audit.original_dst(orig);
    let door = Door {
        source: accepted.client.ip(),
        evidence: Evidence::Presented { credentials: None },
        port: orig.port(),
        peer: super::peer_of(shared, accepted.client, || Some(orig)),
    };
    let mut seat = Seated(|| {
        if let Some(slot) = unidentified.take() {
            slot.spoke();
        }
    });
    let entered = admit::enter(cx, door, &mut seat, audit).map_err(|_| None)?;
    let Ok((buf, peeked)) = peek(stream, shared.settings.timeouts.header).await else {
        audit.detail("read error while peeking");
        return Err(invalid());
    };
    // The name the client asked for (SNI or Host), else the address.
    let (named, target) = target_of(&peeked, orig, audit).ok_or_else(invalid)?;
    audit.target(&target);
    if super::ask::is_local(&target) {
        return match peeked {
            Peeked::Http { .. } => Ok(Admission::Local(entered, buf, false)),
            Peeked::Tls(_) => Ok(Admission::Local(entered, buf, true)),
            _ => Err(invalid()),
        };
    }
    let first = match &peeked {
        Peeked::Incomplete => FirstBytes::Silent,
        p => FirstBytes::Client(p.clone()),
    };
    let ask = Ask {
        target,
        original: Some(orig.ip()),
        nameless: named.is_none().then(|| peeked_detail(&peeked)),
        first: Some(&first),
        request: None,
        method: None,
        reuse: false,
    };
    let admitted = entered.admit(cx, ask, audit).await.map_err(|_| None)?;
    let inspected = Inspected {
        client: buf,
        server: Vec::new(),
        first,
    };
    Ok(Admission::Relay(admitted, inspected))
}

/// Replay what was peeked (or terminate), then relay until the end, idleness, revocation or
/// shutdown.
async fn relay_admitted(
    shared: &Arc<Shared>,
    stream: TcpStream,
    admitted: Admitted,
    inspected: Inspected,
    audit: &mut AuditGuard,
) {
    // Transparent connections never ask for a kept connection.
    let Some(running) = Running::start(shared, admitted, audit) else {
        return;
    };
    let client = ClientIo::Tcp(stream);
    let relayed = relay_choice::relay(running, client, inspected, audit).await;
    audit.relayed(relayed);
}

/// The target a connection names — SNI or `Host` — on its original port, else its original
/// address; and which of the two named it. `None` when the name is not a valid host name.
fn target_of<'a>(
    peeked: &'a Peeked,
    orig: SocketAddr,
    audit: &mut AuditGuard,
) -> Option<(Option<(&'a str, &'static str)>, Target)> {
    let named: Option<(&str, &'static str)> = match peeked {
        Peeked::Tls(hello) => {
            audit.mode(Mode::Sni);
            audit.client_hello(hello.sni.as_deref(), &hello.alpn, hello.ech);
            hello.sni.as_deref().map(|n| (n, "SNI"))
        }
        Peeked::Http { host } => {
            audit.mode(Mode::Host);
            host.as_deref()
                .map(|h| (split_host_header(h).0, "Host header"))
        }
        Peeked::Other { detail } | Peeked::Unrecognised { detail } => {
            audit.mode(Mode::Tcp);
            audit.detail(*detail);
            None
        }
        Peeked::Incomplete => None,
    };
    let host = match named {
        None => Host::Ip(orig.ip()),
        Some((name, what)) => match Host::parse(name) {
            Ok(host) => host,
            Err(_) => {
                audit.detail(format!("{what} is not a valid host name"));
                return None;
            }
        },
    };
    Some((
        named,
        Target {
            host,
            port: orig.port(),
        },
    ))
}

/// Read (without answering) until [`classify`] can tell what the connection speaks, the
/// client stops, 64 KiB arrive or `header_ms` passes. Returns the bytes read and the verdict;
/// `Err` on a read error.
async fn peek(
    stream: &mut TcpStream,
    wait: std::time::Duration,
) -> std::io::Result<(Vec<u8>, Peeked)> {
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match classify(&buf) {
            Peeked::Incomplete if buf.len() < MAX_PEEK => {}
            Peeked::Incomplete => {
                let p = Peeked::Unrecognised {
                    detail: "first bytes larger than 64 KiB",
                };
                return Ok((buf, p));
            }
            p => return Ok((buf, p)),
        }
        // Into the vector's spare room: no buffer in this future's state.
        buf.reserve(4096);
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) => {
                let p = Peeked::Other {
                    detail: "client sent nothing before closing",
                };
                return Ok((buf, p));
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            // Server-speaks-first protocols (and stalled clients): decide on the destination;
            // a hello or head begun and not finished is not understood.
            Err(_) if buf.is_empty() => {
                let p = Peeked::Other {
                    detail: "no TLS or HTTP within header_ms",
                };
                return Ok((buf, p));
            }
            Err(_) => {
                let p = Peeked::Unrecognised {
                    detail: "an incomplete ClientHello or request head within header_ms",
                };
                return Ok((buf, p));
            }
        }
    }
}

/// What the peek said about a connection that named nothing.
fn peeked_detail(p: &Peeked) -> &'static str {
    match p {
        Peeked::Other { detail } => detail,
        _ => "no name in the first bytes",
    }
}

/// Refuse by reset (there is no HTTP to answer with on a redirected connection); the guard
/// records the refusal as it drops.
fn reset(stream: TcpStream, mut audit: AuditGuard, decision: Decision) {
    audit.decision(&decision);
    reset_recorded(stream, audit);
}

/// Reset a connection whose refusal the guard already holds.
fn reset_recorded(stream: TcpStream, audit: AuditGuard) {
    let _ = stream.set_zero_linger();
    drop(stream);
    drop(audit);
}
