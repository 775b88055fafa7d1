//! The transparent listener (`listen.transparent`): TCP redirected here by iptables
//! (`REDIRECT`, or TPROXY). Per connection, top to bottom in [`serve`]: original destination →
//! sandbox by source address (or `default_sandbox`) → limits → peek (never consume: the bytes
//! are replayed upstream) up to 64 KiB within `timeouts.header_ms` → decide on the SNI or
//! `Host` name, or on the original destination with address rules only → resolve with the
//! proxy's own resolver → guard → dial the *resolved* address, not the one the client chose
//! (a forged SNI cannot reach another IP) → relay, watching the policy. A refusal resets the
//! connection; nothing is forwarded. One audit guard per connection.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::accept::Accepted;
use crate::audit::{AuditGuard, Close, Mode};
use crate::egress;
use crate::egress::identity::identify;
use crate::listen::orig_dst::original_dst;
use crate::policy::reason::Reason;
use crate::policy::set::{PolicySet, Sandbox};
use crate::policy::target::{Host, Target};
use crate::policy::{Decision, Enforcement, Verdict};
use crate::relay::tunnel::Relayed;
use crate::server::shared::Shared;
use crate::wire::first_bytes::{self, FirstBytes, Rules};
use crate::wire::peek::{classify, split_host_header, Peeked, MAX_PEEK};

/// Serve one redirected connection. `permit` is its place under the global cap, `unidentified`
/// its place among its address's connections not yet identified (given back at identification).
pub async fn serve(
    shared: Arc<Shared>,
    accepted: Accepted,
    mut stream: TcpStream,
    permit: OwnedSemaphorePermit,
    unidentified: Option<crate::egress::admission::UnidentifiedSlot>,
) {
    let _ = stream.set_nodelay(true);
    let set = shared.policy.load();
    let mut audit = shared.audit(&accepted, Mode::Sni, &set);

    // 1. Where the client meant to go.
    let orig = match original_dst(&stream) {
        Ok((a, _)) => SocketAddr::new(a.ip().to_canonical(), a.port()),
        Err(e) => {
            audit.detail(format!("no original destination: {e}"));
            return reset(stream, audit, Decision::deny(Reason::InvalidTarget, None));
        }
    };
    audit.original_dst(orig);

    // 2. The sandbox, by source address (or the default).
    let default = shared.settings.default_sandbox.as_deref();
    let who = match identify(&set, None, accepted.client.ip(), default) {
        Ok(w) => w,
        Err(refused) => {
            audit.identity_refused(refused.method);
            return reset(stream, audit, Decision::deny(refused.reason, None));
        }
    };
    let sb = who.sandbox.clone();
    audit.identified(&who, sb.stats(shared.metrics()).clone());
    // Identified: the place among connections no sandbox has is given back.
    if let Some(slot) = unidentified {
        slot.spoke();
        drop(slot);
    }

    // 3. Its limits.
    let slot = match shared.admit(&sb) {
        Ok(slot) => slot,
        Err((reason, _)) => {
            audit.close(Close::Limit);
            return reset(stream, audit, Decision::deny(reason, None));
        }
    };

    // 4. Peek until the first bytes say what this is.
    let (buf, peeked) = match peek(&mut stream, shared.settings.timeouts.header).await {
        Ok(x) => x,
        Err(()) => {
            audit.detail("read error while peeking");
            return reset(stream, audit, Decision::deny(Reason::InvalidTarget, None));
        }
    };

    // 5. The target: the name the client asked for (SNI or Host), else the address.
    let Some((named, target)) = target_of(&peeked, orig, &mut audit) else {
        return reset(stream, audit, Decision::deny(Reason::InvalidTarget, None));
    };
    audit.target(&target);

    let report = sb.binding.enforcement == Enforcement::Report;
    let named_target = target.clone();

    // 6. Decide, resolve once, decide on the addresses. A connection with no name is decided
    //    by a name the DNS listener gave this sandbox for its destination, if a name rule
    //    allows one; otherwise on the address.
    let by_answer = match named {
        Some(_) => None,
        None => by_dns_answer(&shared, &set, &sb, orig, &peeked, &mut audit),
    };
    let (target, decided) = match by_answer {
        Some(x) => x,
        None => {
            let resolver = shared.resolver();
            let lookup = shared.lookup(&resolver);
            // Through a parent, a name goes unresolved unless strict_sni_dst must compare
            // the client's destination with its addresses.
            let decided = match shared.parent_for(&sb, &target) {
                Some(_) if !sb.binding.strict_sni_dst => {
                    egress::decide_for_parent(&set, &sb, &target, lookup).await
                }
                _ => egress::decide(&set, &sb, &target, Some(orig.ip()), lookup).await,
            };
            (target, decided)
        }
    };
    audit.decided(&decided);
    if !decided.proceeds() {
        return reset(stream, audit, decided.decision);
    }

    // 6b. What flows — the CONNECT tunnel's checker: nothing but TLS on `require_tls_ports`,
    //     no ECH under `refuse_ech`, and anything but TLS or a readable HTTP head only where
    //     the rule that allowed it lets opaque TCP flow.
    let opaque = decided.decision.allows_opaque(&target);
    match first_bytes_check(&sb, &named_target, &peeked, opaque, &mut audit) {
        Err(refused) => return reset(stream, audit, refused),
        // Allowed by the rules, refused by its first bytes: the record says report.
        Ok(Some(d)) if decided.decision.verdict == Verdict::Allow => audit.decision(&d),
        Ok(_) => {}
    }

    // 7. Dial a checked address, the client's own choice when it is one of them.
    let (dialed, checked) = match shared
        .open_allowed(&sb, &set, &decided, &target, Some(orig.ip()), &mut audit)
        .await
    {
        Ok(x) => x,
        Err(failed) => return reset(stream, audit, Decision::deny(failed.reason, None)),
    };
    audit.dialed(dialed.addr);
    let grant = egress::grant(&who, target.clone(), checked, &set);
    // The set is not kept alive by a long tunnel: the watch re-reads the newest one.
    drop(set);

    // 8. Replay what was peeked (or terminate), then relay until the end, idleness,
    //    revocation or shutdown.
    let _active = sb.stats(shared.metrics()).active();
    let stop = shared.watch(grant).stopped();
    let mut up = dialed.stream;
    crate::relay::buffers::cap(
        &stream,
        crate::relay::abortable::OverTcp::tcp(&up),
        sb.binding.limits.socket_buffer_bytes,
    );
    let limiter = slot.limiter();
    let idle = shared.settings.timeouts.idle;
    let shaper = limiter.shapes().then_some(&**limiter);
    let bound = shared
        .settings
        .interceptor
        .as_ref()
        .filter(|ix| ix.terminates(&sb.binding, &target.host.to_string()));
    let terminate = match (&peeked, bound) {
        (Peeked::Tls(hello), Some(ix)) => Some((ix, hello.alpn.clone())),
        (_, Some(_)) => {
            // As on the explicit proxy: a bound host takes nothing but TLS (a secret never
            // travels in clear), and nothing reaches it.
            audit.detail(
                "the host's credentials or HTTP rules need TLS; this connection is not TLS",
            );
            return reset(
                stream,
                audit,
                Decision::deny(Reason::CredentialMisuse, None),
            );
        }
        _ => None,
    };
    let relayed = if let Some((ix, client_alpn)) = terminate {
        // A host credentials or HTTP rules are bound to: terminated, as on the explicit
        // proxy (the SNI decided the name).
        let tunnel = crate::intercept::Tunnel {
            current: shared.current_binding(&sb.binding.id),
            host: &target.host.to_string(),
            port: target.port,
            client: crate::relay::client_io::ClientIo::Tcp(stream),
            early: buf,
            server: up,
            client_alpn,
        };
        let live = Arc::new(crate::relay::liveness::Liveness::new(idle));
        let wait = shared.settings.timeouts.header;
        // Boxed, like every branch a plain tunnel does not take: an idle tunnel's task holds
        // only the state of the branch it is in.
        Box::pin(crate::intercept::serve(
            ix, tunnel, &mut audit, stop, live, wait,
        ))
        .await
    } else if matches!(peeked, Peeked::Http { .. }) {
        audit.open();
        // Decided by Host: every later request on the connection is checked too.
        let checked = Box::pin(crate::relay::http_checked::relay_checked(
            stream, up, buf, &target, report, idle, stop, shaper,
        ))
        .await;
        if let Some(m) = checked.mismatch {
            m.record(&mut audit, report);
        }
        checked.relayed
    } else {
        audit.open();
        match up.write_all(&buf).await {
            Ok(()) => {
                // The peeked bytes are replayed: the relay does not keep them.
                let replayed = buf.len() as u64;
                drop(buf);
                let mut r = match up.into_tcp() {
                    Ok(up) => crate::relay::tunnel::relay_tcp(stream, up, idle, stop, shaper).await,
                    // TLS to a parent proxy: relayed in user space.
                    Err(up) => {
                        Box::pin(crate::relay::tunnel::relay_streams(
                            stream, up, idle, stop, shaper,
                        ))
                        .await
                    }
                };
                r.up += replayed;
                r
            }
            Err(_) => Relayed::nothing(Close::Error),
        }
    };
    audit.relayed(relayed);
    drop(audit);
    drop(slot);
    drop(permit);
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

/// What the first bytes carry, judged by the same checker as a CONNECT tunnel's
/// ([`first_bytes::verify`]): a port of `require_tls_ports` takes nothing but TLS, a
/// ClientHello with Encrypted Client Hello is refused under `refuse_ech`, and a request's
/// `Host` port must be the connection's. `Err` with the refusal; in report mode `Ok` with the
/// decision to record if the rules allow the connection.
fn first_bytes_check(
    sb: &Sandbox,
    target: &Target,
    peeked: &Peeked,
    opaque: bool,
    audit: &mut AuditGuard,
) -> Result<Option<Decision>, Decision> {
    let first = match peeked {
        Peeked::Incomplete => FirstBytes::Silent,
        p => FirstBytes::Client(p.clone()),
    };
    let rules = Rules {
        require_tls: sb.binding.require_tls_ports.contains(&target.port),
        refuse_ech: sb.binding.refuse_ech,
        opaque,
    };
    let Err(m) = first_bytes::verify(target, &first, rules) else {
        return Ok(None);
    };
    let d = Decision::deny(m.reason, None);
    audit.detail(m.detail);
    if sb.binding.enforcement != Enforcement::Report || !m.reason.reportable() {
        return Err(d);
    }
    Ok(Some(Decision {
        verdict: Verdict::Report,
        ..d
    }))
}

/// A connection with no name, decided by a name the DNS listener gave this sandbox for its
/// destination — if a name rule allows one.
fn by_dns_answer(
    shared: &Shared,
    set: &PolicySet,
    sb: &Arc<Sandbox>,
    orig: SocketAddr,
    peeked: &Peeked,
    audit: &mut AuditGuard,
) -> Option<(Target, egress::Decided)> {
    let names = shared.dns_memory.names(&sb.binding.id, orig.ip());
    let (named_target, decided) =
        egress::decide_by_answer(set, sb, &names, orig.ip(), orig.port())?;
    audit.target(&named_target);
    audit.detail(format!(
        "{}; the name {} came from a DNS answer the proxy gave this sandbox for {}",
        peeked_detail(peeked),
        named_target.host,
        orig.ip()
    ));
    Some((named_target, decided))
}

/// Read (without answering) until [`classify`] can tell what the connection speaks, the
/// client stops, 64 KiB arrive or `header_ms` passes. Returns the bytes read and the verdict;
/// `Err` on a read error.
async fn peek(stream: &mut TcpStream, wait: std::time::Duration) -> Result<(Vec<u8>, Peeked), ()> {
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
            Ok(Err(_)) => return Err(()),
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
    let _ = stream.set_zero_linger();
    drop(stream);
    audit.decision(&decision);
}
