//! The entry grammar of `network.egress` / `network.deny` (DESIGN §2): one string becomes a
//! typed [`Entry`] — a host pattern plus an optional port set — or an [`EntryError`] that says
//! what to write instead. Parse, don't validate: nothing downstream looks at entry text again.

use std::net::IpAddr;

use ipnet::IpNet;
use thiserror::Error;

use super::ports::PortSet;
use crate::policy::hostname::{normalize_name, normalize_pattern, NameError};

/// What an entry matches, before ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// `api.example.com`: exactly that (normalised) name.
    Exact(String),
    /// `*.example.com`: one or more labels below the suffix, not the suffix itself.
    Subdomains(String),
    /// `**.example.com`: the suffix itself and everything below it.
    ApexAndSubdomains(String),
    /// `ec2.*.amazonaws.com`, `api-*.example.com`, `a.**.example.com`: a label glob.
    /// `fixed_suffix` is the labels after the last wildcard label (used to index the glob).
    Glob {
        /// The pattern as written.
        pattern: String,
        /// The labels after the last wildcard label (indexes the glob).
        fixed_suffix: String,
    },
    /// `203.0.113.7`, `10.0.0.0/8`, `[2001:db8::/32]`: an address range (single addresses as
    /// /32 or /128). IPv4-mapped IPv6 is stored as IPv4.
    Net(IpNet),
    /// `localhost`: the name `localhost`, 127.0.0.0/8 and ::1.
    Localhost,
}

/// One parsed policy entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What the entry matches.
    pub host: HostPattern,
    /// `None` when the entry named no port: `defaults.ports` applies.
    pub ports: Option<PortSet>,
    /// Written `tcp://host:port`: the destination speaks a protocol the proxy does not read,
    /// and bytes it cannot read as TLS or HTTP may be relayed there (opaque TCP).
    pub opaque: bool,
}

/// Why an entry was rejected. Messages are meant for the operator who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EntryError {
    /// An empty entry.
    #[error("empty entry")]
    Empty,
    /// A URL where a host was expected.
    #[error("entries are hosts, not URLs: write `{suggestion}`")]
    Url {
        /// The host the URL names, to write instead.
        suggestion: String,
    },
    /// Whitespace or a control character in the entry.
    #[error("entry contains whitespace or control characters")]
    Whitespace,
    /// A pattern that matches every host.
    #[error("`{0}` matches every host: use `network.mode: allow-all` instead")]
    MatchesEverything(String),
    /// A wildcard with no fixed labels after it.
    #[error("a wildcard must end in fixed labels (as in `*.example.com`)")]
    NoFixedSuffix,
    /// A wildcard over a single label.
    #[error("wildcard suffix `{0}` is a single label: too broad, name at least two labels")]
    SingleLabelSuffix(String),
    /// A wildcard over a public suffix.
    #[error("wildcard suffix `{0}` is a public suffix (ICANN section): too broad")]
    PublicSuffix(String),
    /// `**` that is not a whole label.
    #[error("`**` must be a whole label (as in `**.example.com`)")]
    PartialDoubleStar,
    /// A glob character other than `*` and `**`.
    #[error("only `*` and `**` are wildcards; `{0}` is not allowed in an entry")]
    UnsupportedGlobSyntax(char),
    /// A CIDR that does not parse.
    #[error("malformed CIDR `{0}`")]
    BadCidr(String),
    /// An IPv6 address that does not parse.
    #[error("malformed IPv6 address `{0}` (write `[addr]:port` to give a port)")]
    BadIpv6(String),
    /// A port list that does not parse.
    #[error("{0}")]
    BadPort(super::ParseError),
    /// A host name that is not valid.
    #[error("invalid host name: {0}")]
    Name(#[from] NameError),
    /// `tcp://` without a port.
    #[error("a `tcp://` entry names its port (as in `tcp://{0}:5432`): opaque TCP is allowed port by port")]
    OpaqueWithoutPort(String),
}

/// The spelling that declares an entry opaque TCP.
pub const OPAQUE_SCHEME: &str = "tcp://";

/// Parse one entry string.
pub fn parse_entry(text: &str) -> Result<Entry, EntryError> {
    if text.is_empty() {
        return Err(EntryError::Empty);
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(EntryError::Whitespace);
    }
    let scheme = text.get(..OPAQUE_SCHEME.len());
    let (text, opaque) = match scheme.filter(|s| s.eq_ignore_ascii_case(OPAQUE_SCHEME)) {
        Some(_) => (&text[OPAQUE_SCHEME.len()..], true),
        None => (text, false),
    };
    if let Some(suggestion) = url_suggestion(text) {
        return Err(EntryError::Url { suggestion });
    }
    let (host, ports) = split_host_port(text)?;
    let ports = ports
        .map(PortSet::parse)
        .transpose()
        .map_err(EntryError::BadPort)?;
    if opaque && ports.is_none() {
        return Err(EntryError::OpaqueWithoutPort(host.to_string()));
    }
    Ok(Entry {
        host: parse_host_pattern(host)?,
        ports,
        opaque,
    })
}

/// `https://x/...` → `x:443`; `http://x:8080/` → `x:8080`.
fn url_suggestion(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let has_port = if authority.starts_with('[') {
        authority.contains("]:")
    } else {
        authority.contains(':')
    };
    if has_port || authority.is_empty() {
        return Some(if authority.is_empty() {
            "host:443".into()
        } else {
            authority.to_string()
        });
    }
    let port = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => 80,
        _ => 443,
    };
    Some(format!("{authority}:{port}"))
}

/// Split `host[:ports]`, `[v6-or-cidr][:ports]` or a bare IPv6 address/CIDR.
fn split_host_port(text: &str) -> Result<(&str, Option<&str>), EntryError> {
    if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest
            .split_once(']')
            .ok_or_else(|| EntryError::BadIpv6(text.to_string()))?;
        return match after {
            "" => Ok((inner, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((inner, Some(p))),
                None => Err(EntryError::BadIpv6(text.to_string())),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (h, p) = text.split_once(':').unwrap_or((text, ""));
            Ok((h, Some(p)))
        }
        // Several colons and no brackets: a bare IPv6 address or CIDR, no port.
        _ => Ok((text, None)),
    }
}

fn parse_host_pattern(host: &str) -> Result<HostPattern, EntryError> {
    if host.is_empty() {
        return Err(EntryError::Empty);
    }
    if host.contains('/') {
        let net: IpNet = host
            .parse()
            .map_err(|_| EntryError::BadCidr(host.to_string()))?;
        return Ok(HostPattern::Net(canonical_net(net.trunc())));
    }
    if host.contains(':') {
        let ip: IpAddr = host
            .parse()
            .map_err(|_| EntryError::BadIpv6(host.to_string()))?;
        return Ok(HostPattern::Net(canonical_net(IpNet::from(ip))));
    }
    if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
        return Ok(HostPattern::Net(IpNet::from(IpAddr::V4(ip))));
    }
    if host.eq_ignore_ascii_case("localhost") || host.eq_ignore_ascii_case("localhost.") {
        return Ok(HostPattern::Localhost);
    }
    if !host.contains('*') {
        return Ok(HostPattern::Exact(normalize_name(host)?));
    }
    parse_wildcard(host)
}

/// An IPv4-mapped IPv6 range (`::ffff:10.0.0.0/104`) is stored as the IPv4 range.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if let Some(v4) = v6.addr().to_ipv4_mapped() {
            if v6.prefix_len() >= 96 {
                if let Ok(n) = ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96) {
                    return IpNet::V4(n);
                }
            }
        }
    }
    net
}

fn parse_wildcard(host: &str) -> Result<HostPattern, EntryError> {
    if let Some(c) = host
        .chars()
        .find(|c| matches!(c, '?' | '[' | ']' | '{' | '}' | '!' | '\\'))
    {
        return Err(EntryError::UnsupportedGlobSyntax(c));
    }
    let pattern = normalize_pattern(host)?;
    let labels: Vec<&str> = pattern.split('.').collect();
    if labels.iter().all(|l| *l == "*" || *l == "**") {
        return Err(EntryError::MatchesEverything(host.to_string()));
    }
    if labels.iter().any(|l| l.contains("**") && *l != "**") {
        return Err(EntryError::PartialDoubleStar);
    }
    let last_wild = labels.iter().rposition(|l| l.contains('*')).unwrap_or(0);
    let fixed_suffix = labels[last_wild + 1..].join(".");
    check_suffix_breadth(&fixed_suffix)?;
    let first = labels[0];
    let simple = last_wild == 0;
    Ok(match (first, simple) {
        ("*", true) => HostPattern::Subdomains(fixed_suffix),
        ("**", true) => HostPattern::ApexAndSubdomains(fixed_suffix),
        _ => HostPattern::Glob {
            pattern,
            fixed_suffix,
        },
    })
}

/// A wildcard must keep at least two fixed labels, and those must not be an ICANN public
/// suffix (`co.uk`); private-section suffixes (`githubusercontent.com`) are fine.
fn check_suffix_breadth(suffix: &str) -> Result<(), EntryError> {
    if suffix.is_empty() {
        return Err(EntryError::NoFixedSuffix);
    }
    if !suffix.contains('.') {
        return Err(EntryError::SingleLabelSuffix(suffix.to_string()));
    }
    if let Some(s) = psl::suffix(suffix.as_bytes()) {
        if s.typ() == Some(psl::Type::Icann) && s.as_bytes() == suffix.as_bytes() {
            return Err(EntryError::PublicSuffix(suffix.to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> HostPattern {
        parse_entry(s).unwrap().host
    }

    #[test]
    fn exact_names_are_normalised() {
        assert_eq!(
            host("API.Example.com."),
            HostPattern::Exact("api.example.com".into())
        );
        assert_eq!(
            host("bücher.example"),
            HostPattern::Exact("xn--bcher-kva.example".into())
        );
        assert_eq!(parse_entry("api.example.com").unwrap().ports, None);
    }

    #[test]
    fn only_tcp_entries_are_opaque_and_they_name_a_port() {
        let db = parse_entry("tcp://db.internal:5432").unwrap();
        assert!(db.opaque);
        assert_eq!(db.host, HostPattern::Exact("db.internal".into()));
        assert_eq!(db.ports, Some(PortSet::parse("5432").unwrap()));
        assert!(parse_entry("TCP://10.0.0.0/8:5432").unwrap().opaque);
        assert!(!parse_entry("db.internal:5432").unwrap().opaque);
        assert!(!parse_entry("10.0.0.0/8:5432").unwrap().opaque);
        assert!(matches!(
            parse_entry("tcp://db.internal"),
            Err(EntryError::OpaqueWithoutPort(h)) if h == "db.internal"
        ));
        // Other schemes are still URLs written where a host belongs.
        assert!(matches!(
            parse_entry("udp://db.internal:53"),
            Err(EntryError::Url { .. })
        ));
    }

    #[test]
    fn wildcard_forms() {
        assert_eq!(
            host("*.example.com"),
            HostPattern::Subdomains("example.com".into())
        );
        assert_eq!(
            host("**.Example.com"),
            HostPattern::ApexAndSubdomains("example.com".into())
        );
        assert_eq!(
            host("ec2.*.amazonaws.com"),
            HostPattern::Glob {
                pattern: "ec2.*.amazonaws.com".into(),
                fixed_suffix: "amazonaws.com".into()
            }
        );
        assert_eq!(
            host("api-*.example.com"),
            HostPattern::Glob {
                pattern: "api-*.example.com".into(),
                fixed_suffix: "example.com".into()
            }
        );
        assert_eq!(
            host("*.*.example.com"),
            HostPattern::Glob {
                pattern: "*.*.example.com".into(),
                fixed_suffix: "example.com".into()
            }
        );
        assert_eq!(
            host("*.githubusercontent.com"),
            HostPattern::Subdomains("githubusercontent.com".into())
        );
    }

    #[test]
    fn too_broad_wildcards_are_rejected() {
        assert!(matches!(
            parse_entry("*"),
            Err(EntryError::MatchesEverything(_))
        ));
        assert!(matches!(
            parse_entry("**"),
            Err(EntryError::MatchesEverything(_))
        ));
        assert!(matches!(
            parse_entry("*.*"),
            Err(EntryError::MatchesEverything(_))
        ));
        assert!(matches!(
            parse_entry("*.com"),
            Err(EntryError::SingleLabelSuffix(_))
        ));
        assert!(matches!(
            parse_entry("**.com"),
            Err(EntryError::SingleLabelSuffix(_))
        ));
        assert!(matches!(
            parse_entry("api.*"),
            Err(EntryError::NoFixedSuffix)
        ));
        assert!(matches!(
            parse_entry("*.co.uk"),
            Err(EntryError::PublicSuffix(_))
        ));
        assert!(matches!(
            parse_entry("foo-*.co.uk"),
            Err(EntryError::PublicSuffix(_))
        ));
        assert!(matches!(
            parse_entry("a**.example.com"),
            Err(EntryError::PartialDoubleStar)
        ));
        assert!(matches!(
            parse_entry("a?.example.com"),
            Err(EntryError::Name(NameError::BadChar('?')))
        ));
        assert!(matches!(
            parse_entry("a?*.example.com"),
            Err(EntryError::UnsupportedGlobSyntax('?'))
        ));
        assert!(matches!(
            parse_entry("{a,b}*.example.com"),
            Err(EntryError::UnsupportedGlobSyntax('{'))
        ));
    }

    #[test]
    fn addresses_and_ranges() {
        assert_eq!(
            host("203.0.113.7"),
            HostPattern::Net("203.0.113.7/32".parse().unwrap())
        );
        assert_eq!(
            host("2001:db8::1"),
            HostPattern::Net("2001:db8::1/128".parse().unwrap())
        );
        assert_eq!(
            host("[2001:db8::1]"),
            HostPattern::Net("2001:db8::1/128".parse().unwrap())
        );
        assert_eq!(
            host("10.1.2.3/8"),
            HostPattern::Net("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            host("2001:db8::/32"),
            HostPattern::Net("2001:db8::/32".parse().unwrap())
        );
        assert_eq!(
            host("[::ffff:10.0.0.0]"),
            HostPattern::Net("10.0.0.0/32".parse().unwrap())
        );
        let e = parse_entry("[2001:db8::/32]:443").unwrap();
        assert_eq!(e.host, HostPattern::Net("2001:db8::/32".parse().unwrap()));
        assert!(e.ports.unwrap().contains(443));
        assert!(matches!(
            parse_entry("10.0.0.0/33"),
            Err(EntryError::BadCidr(_))
        ));
        assert!(matches!(
            parse_entry("10.0.0/8"),
            Err(EntryError::BadCidr(_))
        ));
        assert!(matches!(
            parse_entry("[2001:db8::1"),
            Err(EntryError::BadIpv6(_))
        ));
        assert!(matches!(
            parse_entry("[2001:db8::1]443"),
            Err(EntryError::BadIpv6(_))
        ));
        // Non-canonical IPv4 is neither an address nor a name.
        assert!(matches!(
            parse_entry("127.1"),
            Err(EntryError::Name(NameError::Numeric))
        ));
        assert!(matches!(
            parse_entry("010.0.0.1"),
            Err(EntryError::Name(NameError::Numeric))
        ));
    }

    #[test]
    fn localhost_and_ports() {
        assert_eq!(host("localhost"), HostPattern::Localhost);
        assert_eq!(host("LOCALHOST"), HostPattern::Localhost);
        let e = parse_entry("localhost:8000-8100").unwrap();
        assert!(e.ports.as_ref().unwrap().contains(8050));
        assert!(parse_entry("api.example.com:*")
            .unwrap()
            .ports
            .unwrap()
            .is_any());
        assert!(matches!(
            parse_entry("api.example.com:0"),
            Err(EntryError::BadPort(_))
        ));
        assert!(matches!(
            parse_entry("api.example.com:65536"),
            Err(EntryError::BadPort(_))
        ));
        assert!(matches!(
            parse_entry("api.example.com:"),
            Err(EntryError::BadPort(_))
        ));
    }

    #[test]
    fn urls_get_a_suggestion() {
        assert_eq!(
            parse_entry("https://api.example.com/v1")
                .unwrap_err()
                .to_string(),
            "entries are hosts, not URLs: write `api.example.com:443`"
        );
        assert_eq!(
            parse_entry("http://x.example:8080/").unwrap_err(),
            EntryError::Url {
                suggestion: "x.example:8080".into()
            }
        );
        assert_eq!(
            parse_entry("http://x.example").unwrap_err(),
            EntryError::Url {
                suggestion: "x.example:80".into()
            }
        );
    }

    #[test]
    fn junk_is_rejected() {
        assert_eq!(parse_entry(""), Err(EntryError::Empty));
        assert_eq!(parse_entry(":443"), Err(EntryError::Empty));
        assert_eq!(parse_entry(" api.example.com"), Err(EntryError::Whitespace));
        assert!(parse_entry("a@b.example.com").is_err());
        assert!(parse_entry("a%2e.example.com").is_err());
        assert!(parse_entry("a..example.com").is_err());
    }
}
