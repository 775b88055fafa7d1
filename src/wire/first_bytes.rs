//! What flows through a `CONNECT` tunnel — and a transparent connection, with the same
//! [`verify`]: after the `200`, the client's first bytes are read (up to the one cap,
//! [`MAX_PEEK`], within `timeouts.header_ms`) before anything is relayed upstream, and
//! checked against the target the tunnel was allowed for:
//! - on a port of `require_tls_ports` they must be a TLS ClientHello (`protocol_not_allowed`);
//! - a ClientHello's SNI must name the `CONNECT` host when that is a name (`sni_mismatch`: no
//!   domain fronting), and carry no ECH when the sandbox has `refuse_ech`;
//! - a plain HTTP/1.x request's `Host` must name the `CONNECT` host (`host_mismatch`);
//! - bytes that start like TLS or HTTP but are not a hello or a head the proxy reads
//!   unambiguously (over the cap, a leading CRLF, a lowercase method, HTTP/2 prior
//!   knowledge…) are refused on every entry (`unrecognised_protocol`): an origin could read
//!   them as a request for a host that was never decided;
//! - anything else — another protocol, a destination that speaks first, silence — only where
//!   the rule that allowed the target declares opaque TCP (`tcp://host:port`), or is an
//!   address rule (`unrecognised_protocol` otherwise). What is not read is refused.
//!
//! Server-speaks-first protocols (SSH, SMTP) are told apart by the destination speaking
//! before the client has sent anything decisive: on a port that does not require TLS the
//! tunnel then proceeds at once, without waiting for `header_ms`.

use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::policy::reason::Reason;
use crate::policy::refusal::Refusal;
use crate::policy::target::{Host, Target};
use crate::wire::peek::{classify, split_host_header, Peeked, MAX_PEEK};

/// What the start of a tunnel showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstBytes {
    /// The client's first bytes: a ClientHello, an HTTP request head, or something else
    /// (never `Incomplete`).
    Client(Peeked),
    /// The destination spoke before the client had sent anything decisive.
    ServerFirst,
    /// Nothing decisive within `header_ms`.
    Silent,
}

/// The bytes read while inspecting, to be replayed in their directions, and the verdict.
#[derive(Debug)]
pub struct Inspected {
    /// From the client, for the destination.
    pub client: Vec<u8>,
    /// From the destination, for the client (a server-speaks-first greeting).
    pub server: Vec<u8>,
    /// What the first bytes were.
    pub first: FirstBytes,
}

/// Read the client's first bytes (starting with `early`, what the HTTP layer had already
/// buffered) until they can be classified, the destination speaks first, the one cap
/// ([`MAX_PEEK`], 64 KiB) is reached or `wait` passes. Nothing is written to either side.
pub async fn read_first_bytes<C, S>(
    client: &mut C,
    server: &mut S,
    early: Vec<u8>,
    wait: Duration,
) -> std::io::Result<Inspected>
where
    C: tokio::io::AsyncRead + Unpin,
    S: tokio::io::AsyncRead + Unpin,
{
    let mut out = Inspected {
        client: early,
        server: Vec::new(),
        first: FirstBytes::Silent,
    };
    let deadline = tokio::time::Instant::now() + wait;
    // Read into the vectors' spare room: buffers in this future's state would be carried by
    // every tunnel's task for its whole life. The destination's side has no room until it
    // speaks (then a read of up to 64 bytes tells that it spoke first; the rest is relayed).
    loop {
        if out.client.capacity() - out.client.len() < 512 {
            out.client.reserve(2048);
        }
        match classify(&out.client) {
            Peeked::Incomplete if out.client.len() < MAX_PEEK => {}
            Peeked::Incomplete => {
                out.first = FirstBytes::Client(Peeked::Unrecognised {
                    detail: "first bytes larger than the cap without a complete ClientHello or request head",
                });
                return Ok(out);
            }
            p => {
                out.first = FirstBytes::Client(p);
                return Ok(out);
            }
        }
        tokio::select! {
            r = client.read_buf(&mut out.client) => if r? == 0 {
                out.first = FirstBytes::Client(Peeked::Other {
                    detail: "the client closed before sending a ClientHello or request",
                });
                return Ok(out);
            },
            r = server.read_buf(&mut out.server) => {
                let n = r?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the destination closed before the client spoke",
                    ));
                }
                out.first = FirstBytes::ServerFirst;
                return Ok(out);
            }
            _ = tokio::time::sleep_until(deadline) => {
                out.first = match out.client.is_empty() {
                    true => FirstBytes::Silent,
                    false => FirstBytes::Client(Peeked::Unrecognised {
                        detail: "an incomplete ClientHello or request head within header_ms",
                    }),
                };
                return Ok(out);
            }
        }
    }
}

/// What a tunnel's sandbox requires of it.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// The port is in `require_tls_ports`.
    pub require_tls: bool,
    /// Refuse a ClientHello that offers ECH.
    pub refuse_ech: bool,
    /// The rule that allowed the target lets opaque TCP flow (it is written `tcp://host:port`,
    /// or it is an address rule; [`crate::policy::Rule::allows_opaque`]).
    pub opaque: bool,
}

fn mismatch(reason: Reason, detail: impl Into<String>) -> Result<(), Refusal> {
    Err(Refusal::new(reason, detail))
}

fn show(host: &Host) -> String {
    match host {
        Host::Name(n) => n.to_string(),
        Host::Ip(ip) => ip.to_string(),
    }
}

/// Check what the start of a tunnel to `target` showed against `rules`.
pub fn verify(target: &Target, first: &FirstBytes, rules: Rules) -> Result<(), Refusal> {
    let port = target.port;
    match first {
        FirstBytes::Client(Peeked::Tls(hello)) => verify_hello(target, hello, rules),
        FirstBytes::Client(Peeked::Http { host }) => verify_head(target, host.as_deref(), rules),
        FirstBytes::Client(Peeked::Other { detail } | Peeked::Unrecognised { detail })
            if rules.require_tls =>
        {
            mismatch(
                Reason::ProtocolNotAllowed,
                format!("not TLS on port {port}, which requires it: {detail}"),
            )
        }
        FirstBytes::ServerFirst if rules.require_tls => mismatch(
            Reason::ProtocolNotAllowed,
            format!("the destination spoke first on port {port}, which requires TLS"),
        ),
        FirstBytes::Silent if rules.require_tls => mismatch(
            Reason::ProtocolNotAllowed,
            format!("no ClientHello within header_ms on port {port}, which requires TLS"),
        ),
        // Bytes that start like TLS or HTTP but are not read unambiguously are refused on
        // every entry, opaque or not: an origin may read them as a request for a name that was
        // never decided (a leading CRLF or a lowercase method reaches another virtual host).
        FirstBytes::Client(Peeked::Unrecognised { detail }) => mismatch(
            Reason::UnrecognisedProtocol,
            format!("{detail}: it starts like TLS or HTTP but cannot be read unambiguously, so it is refused on every entry"),
        ),
        _ if rules.opaque => Ok(()),
        FirstBytes::Client(Peeked::Other { detail }) => {
            mismatch(Reason::UnrecognisedProtocol, format!("{detail}; {OPAQUE}"))
        }
        FirstBytes::ServerFirst => mismatch(
            Reason::UnrecognisedProtocol,
            format!("the destination spoke first; {OPAQUE}"),
        ),
        FirstBytes::Silent => mismatch(
            Reason::UnrecognisedProtocol,
            format!("no ClientHello or request head within header_ms; {OPAQUE}"),
        ),
        FirstBytes::Client(Peeked::Incomplete) => Ok(()),
    }
}

/// A ClientHello: no ECH under `refuse_ech`; its SNI must name the target when that is a name.
fn verify_hello(
    target: &Target,
    hello: &crate::wire::sni::ClientHello,
    rules: Rules,
) -> Result<(), Refusal> {
    if rules.refuse_ech && hello.ech {
        return mismatch(
            Reason::ProtocolNotAllowed,
            "the ClientHello carries Encrypted Client Hello (refuse_ech)",
        );
    }
    let Host::Name(name) = &target.host else {
        // An IP literal allowed by an address rule: the SNI is recorded, not matched.
        return Ok(());
    };
    match hello.sni.as_deref() {
        None => mismatch(
            Reason::SniMismatch,
            format!("the ClientHello has no SNI; CONNECT named {name}"),
        ),
        Some(sni) => match Host::parse(sni) {
            Ok(h) if h == target.host => Ok(()),
            _ => mismatch(
                Reason::SniMismatch,
                format!("SNI {} does not match CONNECT host {name}", printable(sni)),
            ),
        },
    }
}

/// A plain HTTP request head: refused on a port that requires TLS; its `Host` (and port, when
/// it names one) must be the target's.
fn verify_head(target: &Target, host: Option<&str>, rules: Rules) -> Result<(), Refusal> {
    let port = target.port;
    if rules.require_tls {
        return mismatch(
            Reason::ProtocolNotAllowed,
            format!("a plain HTTP request on port {port}, which requires TLS"),
        );
    }
    let Some(value) = host else {
        return mismatch(
            Reason::HostMismatch,
            format!(
                "the HTTP request has no Host; CONNECT named {}",
                show(&target.host)
            ),
        );
    };
    let (h, p) = split_host_header(value);
    let same_host = Host::parse(h).is_ok_and(|h| h == target.host);
    let same_port = p.is_none_or(|p| p.parse::<u16>() == Ok(port));
    if same_host && same_port {
        Ok(())
    } else {
        mismatch(
            Reason::HostMismatch,
            format!(
                "Host {} does not match CONNECT host {}:{port}",
                printable(value),
                show(&target.host)
            ),
        )
    }
}

/// Why opaque TCP was not allowed, in the record's detail (`suggest` reads it back).
pub const OPAQUE: &str =
    "another protocol passes only where the entry declares it opaque (`tcp://host:port`) or is an address rule";

/// A client-chosen name for a record: ASCII printable, at most 255 characters.
fn printable(s: &str) -> String {
    s.chars()
        .take(255)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sni::ClientHello;

    fn target(t: &str) -> Target {
        Target::parse(t, None).unwrap()
    }

    fn tls(sni: Option<&str>, ech: bool) -> FirstBytes {
        FirstBytes::Client(Peeked::Tls(ClientHello {
            sni: sni.map(Into::into),
            alpn: vec![],
            ech,
        }))
    }

    fn http(host: Option<&str>) -> FirstBytes {
        FirstBytes::Client(Peeked::Http {
            host: host.map(Into::into),
        })
    }

    const TLS_PORT: Rules = Rules {
        require_tls: true,
        refuse_ech: false,
        opaque: false,
    };
    const OPEN_PORT: Rules = Rules {
        require_tls: false,
        refuse_ech: false,
        opaque: true,
    };

    fn reason(r: Result<(), Refusal>) -> Option<Reason> {
        r.err().map(|m| m.reason)
    }

    #[test]
    fn sni_must_name_the_connect_host() {
        let t = target("api.example.com:443");
        assert_eq!(
            reason(verify(&t, &tls(Some("api.example.com"), false), TLS_PORT)),
            None
        );
        // Case and a trailing dot are normalised away.
        assert_eq!(
            reason(verify(&t, &tls(Some("API.Example.com."), false), TLS_PORT)),
            None
        );
        for fronted in [
            Some("attacker.example"),
            Some("example.com"),
            Some("x.api.example.com"),
            None,
        ] {
            assert_eq!(
                reason(verify(&t, &tls(fronted, false), TLS_PORT)),
                Some(Reason::SniMismatch),
                "{fronted:?}"
            );
        }
        // An IP literal target: the SNI is not matched.
        let ip = target("203.0.113.7:443");
        assert_eq!(
            reason(verify(&ip, &tls(Some("anything.example"), false), TLS_PORT)),
            None
        );
        assert_eq!(reason(verify(&ip, &tls(None, false), TLS_PORT)), None);
    }

    #[test]
    fn ech_is_judged_on_the_outer_sni_and_refused_on_request() {
        let t = target("api.example.com:443");
        assert_eq!(
            reason(verify(&t, &tls(Some("api.example.com"), true), TLS_PORT)),
            None
        );
        let strict = Rules {
            refuse_ech: true,
            ..TLS_PORT
        };
        assert_eq!(
            reason(verify(&t, &tls(Some("api.example.com"), true), strict)),
            Some(Reason::ProtocolNotAllowed)
        );
    }

    #[test]
    fn tls_ports_refuse_everything_but_a_client_hello() {
        let t = target("api.example.com:443");
        let other = FirstBytes::Client(Peeked::Other { detail: "x" });
        for first in [
            http(Some("api.example.com")),
            other,
            FirstBytes::ServerFirst,
            FirstBytes::Silent,
        ] {
            assert_eq!(
                reason(verify(&t, &first, TLS_PORT)),
                Some(Reason::ProtocolNotAllowed),
                "{first:?}"
            );
        }
    }

    #[test]
    fn plain_http_must_name_the_connect_host() {
        let t = target("api.example.com:8080");
        assert_eq!(
            reason(verify(&t, &http(Some("api.example.com:8080")), OPEN_PORT)),
            None
        );
        assert_eq!(
            reason(verify(&t, &http(Some("API.example.com")), OPEN_PORT)),
            None
        );
        for host in [Some("denied.example"), Some("api.example.com:9999"), None] {
            assert_eq!(
                reason(verify(&t, &http(host), OPEN_PORT)),
                Some(Reason::HostMismatch),
                "{host:?}"
            );
        }
        // Raw protocols on ports that do not require TLS pass where the entry declares opaque TCP
        // (or is an address rule); where it does not, they are refused. Bytes that start like
        // HTTP or TLS but are not read unambiguously are refused everywhere (review B4).
        let unrecognised = FirstBytes::Client(Peeked::Unrecognised { detail: "x" });
        assert_eq!(
            reason(verify(&t, &unrecognised, OPEN_PORT)),
            Some(Reason::UnrecognisedProtocol)
        );
        let other = || FirstBytes::Client(Peeked::Other { detail: "x" });
        for first in [other(), FirstBytes::ServerFirst, FirstBytes::Silent] {
            assert_eq!(reason(verify(&t, &first, OPEN_PORT)), None);
            let by_default_ports = Rules {
                opaque: false,
                ..OPEN_PORT
            };
            assert_eq!(
                reason(verify(&t, &first, by_default_ports)),
                Some(Reason::UnrecognisedProtocol),
                "{first:?}"
            );
        }
    }

    #[test]
    fn details_quote_client_names_printably() {
        let t = target("api.example.com:443");
        let m = verify(&t, &tls(Some("evil\u{7f}\nname"), false), TLS_PORT).unwrap_err();
        assert!(m.detail.contains("evil??name"), "{}", m.detail);
    }
}
