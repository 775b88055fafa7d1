//! Connection targets: `host:port`, `ip:port`, `[v6]:port` as they arrive in a CONNECT line,
//! an absolute URI, a `Host` header, an SNI or on the `check` command line. A target's host is
//! either a normalised name or a canonical IP literal; anything else is `invalid_target`
//! (numeric-looking names, userinfo, empty labels, control characters, percent-encoding).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use thiserror::Error;

use crate::policy::hostname::{normalize_name_shared, NameError};

/// The proxy's own name, where a sandbox asks for access
/// (`POST http://egress-proxy.local/v1/requests`): answered by the proxy itself on every
/// listener, and by the DNS listener.
pub const PROXY_NAME: &str = "egress-proxy.local";

/// A destination host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A normalised DNS name.
    Name(Arc<str>),
    /// An IP literal, canonicalised (IPv4-mapped IPv6 becomes IPv4).
    Ip(IpAddr),
}

/// A destination host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The host: a name or an address.
    pub host: Host,
    /// The port.
    pub port: u16,
}

/// Why a target string is not usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TargetError {
    /// An empty target.
    #[error("empty target")]
    Empty,
    /// A target without a port where one is needed.
    #[error("target has no port")]
    MissingPort,
    /// A port that is not 1-65535.
    #[error("invalid port (1-65535)")]
    BadPort,
    /// A malformed IPv6 literal.
    #[error("malformed IPv6 literal")]
    BadIpv6,
    /// A host name that is not valid.
    #[error("invalid host: {0}")]
    Host(#[from] NameError),
}

impl Host {
    /// Parse a bare host (no port): `[v6]`, a bare IPv6 address, dotted-quad IPv4 or a name.
    pub fn parse(text: &str) -> Result<Host, TargetError> {
        if text.is_empty() {
            return Err(TargetError::Empty);
        }
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(TargetError::BadIpv6)?;
            let v6: Ipv6Addr = inner.parse().map_err(|_| TargetError::BadIpv6)?;
            return Ok(Host::Ip(IpAddr::V6(v6).to_canonical()));
        }
        if text.contains(':') {
            let v6: Ipv6Addr = text.parse().map_err(|_| TargetError::BadIpv6)?;
            return Ok(Host::Ip(IpAddr::V6(v6).to_canonical()));
        }
        if let Ok(v4) = text.parse::<Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(v4)));
        }
        Ok(Host::Name(normalize_name_shared(text)?))
    }

    /// The name, if this host is one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }
}

impl Target {
    /// Parse `host[:port]`; without a port, `default_port` applies or the target is refused.
    pub fn parse(text: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
        if text.is_empty() {
            return Err(TargetError::Empty);
        }
        let (host, port) = if text.starts_with('[') {
            match text.rfind(']') {
                Some(end) if end + 1 == text.len() => (text, None),
                Some(end) => match text[end + 1..].strip_prefix(':') {
                    Some(p) => (&text[..=end], Some(p)),
                    None => return Err(TargetError::BadIpv6),
                },
                None => return Err(TargetError::BadIpv6),
            }
        } else {
            match text.matches(':').count() {
                0 => (text, None),
                1 => match text.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (text, None),
                },
                _ => (text, None),
            }
        };
        let port = match port {
            Some(p) => parse_port(p)?,
            None => default_port.ok_or(TargetError::MissingPort)?,
        };
        Ok(Target {
            host: Host::parse(host)?,
            port,
        })
    }
}

fn parse_port(text: &str) -> Result<u16, TargetError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::BadPort);
    }
    match text.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(TargetError::BadPort),
    }
}

impl Host {
    /// Its text as `Display` spells it: a name as it is, an address on the stack.
    pub fn text(&self) -> HostText<'_> {
        match self {
            Host::Name(n) => HostText::Name(n),
            Host::Ip(ip) => HostText::Addr(AddrText::of(*ip, true)),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().as_str())
    }
}

/// A [`Host`]'s text, with no copy of a name and no formatter for an address.
pub enum HostText<'a> {
    /// A name, borrowed.
    Name(&'a str),
    /// An address's text.
    Addr(AddrText),
}

impl HostText<'_> {
    /// The text.
    pub fn as_str(&self) -> &str {
        match self {
            HostText::Name(n) => n,
            HostText::Addr(a) => a.as_str(),
        }
    }
}

/// An address's text, made on the stack: `10.1.2.3`, `2001:db8::1`, or `[2001:db8::1]` as a
/// [`Host`] spells it. IPv4 digit by digit: the formatter spent about 1,350 instructions on
/// one, and a connection to an address spells it up to three times (its two records and its
/// count). IPv6 through its `Display` (its zero-run compression is not worth a copy here).
pub struct AddrText {
    buf: [u8; 48],
    len: usize,
}

impl AddrText {
    /// `ip`'s text; an IPv6 address in brackets when `brackets`.
    pub fn of(ip: IpAddr, brackets: bool) -> Self {
        let mut t = AddrText {
            buf: [0; 48],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        t.push(b'.');
                    }
                    if octet >= 100 {
                        t.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        t.push(b'0' + octet / 10 % 10);
                    }
                    t.push(b'0' + octet % 10);
                }
            }
            // 47 bytes at most (`[ffff:…:255.255.255.255]`): writing cannot fail.
            IpAddr::V6(v6) if brackets => {
                let _ = fmt::Write::write_fmt(&mut t, format_args!("[{v6}]"));
            }
            IpAddr::V6(v6) => {
                let _ = fmt::Write::write_fmt(&mut t, format_args!("{v6}"));
            }
        }
        t
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Digits, dots, hex, colons and brackets: ASCII, so this never falls back.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }

    #[inline(always)]
    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }
}

impl fmt::Write for AddrText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_ips_and_ports() {
        let t = Target::parse("API.example.com.:8443", None).unwrap();
        assert_eq!(t.host, Host::Name("api.example.com".into()));
        assert_eq!(t.port, 8443);
        assert_eq!(
            Target::parse("1.2.3.4", Some(443)).unwrap().to_string(),
            "1.2.3.4:443"
        );
        assert_eq!(
            Target::parse("[2001:db8::1]:80", None).unwrap().to_string(),
            "[2001:db8::1]:80"
        );
        assert_eq!(
            Target::parse("[::ffff:10.0.0.1]:80", None)
                .unwrap()
                .to_string(),
            "10.0.0.1:80"
        );
        assert_eq!(Target::parse("2001:db8::1", Some(443)).unwrap().port, 443);
    }

    #[test]
    fn refuses_invalid_targets() {
        for bad in [
            "",
            "example.com",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:x",
            "2130706433:443",
            "127.1:443",
            "0x7f.1:443",
            "1.2.3:443",
            "a@b:443",
            "a%2eb:443",
            "a..b:443",
            "[::1:443",
            "[::1]x",
            "[fe80::1%eth0]:443",
            "exa\rmple.com:443",
            "01.2.3.4:443",
            "[1.2.3.4]:443",
        ] {
            assert!(Target::parse(bad, None).is_err(), "{bad:?}");
        }
        assert_eq!(
            Target::parse("example.com", None),
            Err(TargetError::MissingPort)
        );
    }

    proptest::proptest! {
        /// An address's text on the stack is what `Display` spells, in brackets or not, for
        /// any IPv4 and IPv6 address (IPv4-mapped and the longest forms included).
        #[test]
        fn an_address_text_is_spelt_as_display_spells_it(v4 in proptest::prelude::any::<[u8; 4]>(), v6 in proptest::prelude::any::<[u16; 8]>(), mapped in proptest::prelude::any::<bool>()) {
            let mut segs = v6;
            if mapped {
                segs[..5].fill(0);
                segs[5] = 0xffff;
            }
            for ip in [IpAddr::from(v4), IpAddr::from(segs)] {
                let (bare, bracketed) = (AddrText::of(ip, false), AddrText::of(ip, true));
                proptest::prop_assert_eq!(bare.as_str(), ip.to_string());
                let host = match ip {
                    IpAddr::V6(v6) => format!("[{v6}]"),
                    v4 => v4.to_string(),
                };
                proptest::prop_assert_eq!(bracketed.as_str(), &host);
                proptest::prop_assert_eq!(Host::Ip(ip).to_string(), host);
            }
        }
    }

    #[test]
    fn the_longest_address_texts_fit() {
        let long: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"
            .parse()
            .unwrap();
        let v4: IpAddr = "255.255.255.255".parse().unwrap();
        for ip in [long, v4, "0.0.0.0".parse().unwrap()] {
            assert_eq!(AddrText::of(ip, false).as_str(), ip.to_string());
        }
        assert!(AddrText::of(long, true).as_str().ends_with(']'));
    }
}
