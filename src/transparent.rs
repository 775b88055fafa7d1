//! The transparent listener (`listen.transparent`): TCP redirected here by iptables
//! (`REDIRECT`, or TPROXY). Per connection: original destination → sandbox by source address
//! (or `default_sandbox`) → peek (never consume: the bytes are replayed upstream) up to 64 KiB
//! within `timeouts.header_ms` → decide on the SNI or `Host` name, or on the original
//! destination with address rules only → resolve the name with the proxy's own resolver →
//! guard → dial the *resolved* address, not the one the client chose (a forged SNI cannot reach
//! another IP) → relay. A refusal resets the connection; nothing is forwarded. One audit record.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{Close, Record};
use crate::identity::identify;
use crate::orig_dst::original_dst;
use crate::peek::{classify, split_host_header, Peeked, MAX_PEEK};
use crate::policy::{Decision, Reason};
use crate::policy_set::Sandbox;
use crate::shared::Shared;
use crate::target::{Host, Target};
use crate::tunnel::relay;

/// Serve one redirected connection.
pub async fn serve(
    shared: Arc<Shared>,
    mut stream: TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
) {
    let started = Instant::now();
    let _ = stream.set_nodelay(true);
    let set = shared.policy.load_full();
    let mut rec = shared.record(&set, peer, "sni");
    let orig = match original_dst(&stream) {
        Ok((a, _)) => canonical(a),
        Err(e) => {
            rec.detail = Some(format!("no original destination: {e}"));
            return reset(
                &shared,
                stream,
                rec,
                None,
                Decision::deny(Reason::InvalidTarget, None),
                started,
            );
        }
    };
    rec.original_dst = Some(orig.to_string());

    let who = match identify(
        &set,
        None,
        peer.ip(),
        shared.settings.default_sandbox.as_deref(),
    ) {
        Ok(w) => w,
        Err(refused) => {
            rec.identity = refused.method.as_str();
            return reset(
                &shared,
                stream,
                rec,
                None,
                Decision::deny(refused.reason, None),
                started,
            );
        }
    };
    rec.identity = who.method.as_str();
    let sb = who.sandbox;
    rec.sandbox = Some(sb.binding.id.clone());
    let slot = match shared.admit(&sb) {
        Ok(slot) => slot,
        Err((reason, _)) => {
            let _ = stream.set_zero_linger();
            drop(stream);
            shared.finish(
                rec,
                Some(&sb.binding.id),
                Decision::deny(reason, None),
                Close::Limit,
                started,
                0,
                0,
            );
            return;
        }
    };

    // Peek: buffer until the first bytes say what this is.
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + shared.settings.timeouts.header;
    let peeked = loop {
        match classify(&buf) {
            Peeked::Incomplete if buf.len() < MAX_PEEK => {}
            Peeked::Incomplete => {
                break Peeked::Other {
                    detail: "first bytes larger than 64 KiB",
                }
            }
            p => break p,
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) => {
                break Peeked::Other {
                    detail: "client sent nothing before closing",
                }
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(_)) => {
                rec.detail = Some("read error while peeking".into());
                return reset(
                    &shared,
                    stream,
                    rec,
                    Some(&sb),
                    Decision::deny(Reason::InvalidTarget, None),
                    started,
                );
            }
            // Server-speaks-first protocols (and stalled clients): decide on the destination.
            Err(_) => {
                break Peeked::Other {
                    detail: "no TLS or HTTP within header_ms",
                }
            }
        }
    };

    let by_address = Target {
        host: Host::Ip(orig.ip()),
        port: orig.port(),
    };
    // The name the client asked for (SNI or Host), if any, and where it came from.
    let named: Option<(&str, &str)> = match &peeked {
        Peeked::Tls(hello) => {
            rec.mode = "sni";
            rec.sni = hello.sni.clone();
            rec.alpn = (!hello.alpn.is_empty()).then(|| hello.alpn.clone());
            rec.ech = Some(hello.ech);
            hello.sni.as_deref().map(|n| (n, "SNI"))
        }
        Peeked::Http { host } => {
            rec.mode = "host";
            host.as_deref()
                .map(|h| (split_host_header(h).0, "Host header"))
        }
        Peeked::Other { detail } => {
            rec.mode = "tcp";
            rec.detail = Some((*detail).to_string());
            None
        }
        Peeked::Incomplete => None,
    };
    let target = match named {
        None => by_address,
        Some((name, what)) => match Host::parse(name) {
            Ok(host) => Target {
                host,
                port: orig.port(),
            },
            Err(_) => {
                rec.detail = Some(format!("{what} is not a valid host name"));
                return reset(
                    &shared,
                    stream,
                    rec,
                    Some(&sb),
                    Decision::deny(Reason::InvalidTarget, None),
                    started,
                );
            }
        },
    };
    rec.target_host = Some(target.host.to_string());
    rec.target_port = Some(target.port);

    // Decide, resolve once, decide on the addresses; then dial a checked address, the
    // client's own choice when it is one of them.
    let outcome =
        match crate::connect::check(&shared, &set, &sb, &target, &mut rec, Some(orig.ip())).await {
            Ok(o) => o,
            Err((decision, _)) => return reset(&shared, stream, rec, Some(&sb), decision, started),
        };
    let decision = outcome.decision.clone();
    let (mut up, addr) =
        match crate::connect::dial(&shared, &outcome.dial, target.port, Some(orig.ip())).await {
            Ok(x) => x,
            Err(reason) => {
                return reset(
                    &shared,
                    stream,
                    rec,
                    Some(&sb),
                    Decision::deny(reason, None),
                    started,
                )
            }
        };
    let _ = up.set_nodelay(true);
    rec.dialed = Some(addr.to_string());
    shared.apply_decision(&mut rec, &decision);
    let mut open = rec.clone();
    open.event = "open";
    open.close = None;
    shared.audit.write(open);
    let id = sb.binding.id.clone();
    shared.metrics.active.with_label_values(&[&id]).inc();
    let (stop, handle) = shared.register_tunnel(rec.conn_id, &id, &target, addr.ip());
    // Replay what was peeked, then relay.
    let (close, up_bytes, down_bytes) = match up.write_all(&buf).await {
        Ok(()) => {
            let limiter = slot.limiter();
            let shaper = limiter.shapes().then_some(&**limiter);
            let idle = shared.settings.timeouts.idle;
            let r = match shaper {
                None => crate::splice::relay(stream, up, idle, stop).await,
                Some(_) => relay(stream, up, idle, stop, shaper).await,
            };
            (r.close, r.up + buf.len() as u64, r.down)
        }
        Err(_) => (Close::Error, 0, 0),
    };
    shared.metrics.active.with_label_values(&[&id]).dec();
    shared.finish(
        rec,
        Some(&id),
        decision,
        close,
        started,
        up_bytes,
        down_bytes,
    );
    drop(handle);
    drop(slot);
    drop(permit);
}

/// IPv4-mapped listener addresses are reported as IPv4.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Refuse by reset (no HTTP to answer with on a redirected connection) and audit.
fn reset(
    shared: &Shared,
    stream: TcpStream,
    rec: Record,
    sb: Option<&Arc<Sandbox>>,
    decision: Decision,
    started: Instant,
) {
    let _ = stream.set_zero_linger();
    drop(stream);
    shared.finish(
        rec,
        sb.map(|s| s.binding.id.as_str()),
        decision,
        Close::Eof,
        started,
        0,
        0,
    );
}
