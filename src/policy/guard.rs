//! The address guard (DESIGN §3): which resolved or literal addresses the proxy may dial.
//!
//! Pure functions and one small value type. Every address is canonicalised
//! (`IpAddr::to_canonical`) and IPv4 addresses embedded in IPv6 (NAT64, 6to4, Teredo,
//! IPv4-compatible) are unwrapped, so `[::ffff:169.254.169.254]` or `64:ff9b::a9fe:a9fe` are
//! judged as the metadata address they carry. The guard never decides *policy*: the caller
//! tells it which addresses the sandbox's own address rules cover.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use crate::policy::addr_table::AddrTable;

/// IPv4 special-purpose ranges that are not globally reachable.
const SPECIAL_V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "0.0.0.0/8 (this network)"),
    ([10, 0, 0, 0], 8, "10.0.0.0/8 (private)"),
    ([100, 64, 0, 0], 10, "100.64.0.0/10 (shared address space)"),
    ([127, 0, 0, 0], 8, "127.0.0.0/8 (loopback)"),
    (
        [169, 254, 0, 0],
        16,
        "169.254.0.0/16 (link-local, cloud metadata)",
    ),
    ([172, 16, 0, 0], 12, "172.16.0.0/12 (private)"),
    (
        [192, 0, 0, 0],
        24,
        "192.0.0.0/24 (IETF protocol assignments)",
    ),
    ([192, 0, 2, 0], 24, "192.0.2.0/24 (documentation)"),
    ([192, 168, 0, 0], 16, "192.168.0.0/16 (private)"),
    ([198, 18, 0, 0], 15, "198.18.0.0/15 (benchmarking)"),
    ([198, 51, 100, 0], 24, "198.51.100.0/24 (documentation)"),
    ([203, 0, 113, 0], 24, "203.0.113.0/24 (documentation)"),
    ([224, 0, 0, 0], 4, "224.0.0.0/4 (multicast)"),
    ([240, 0, 0, 0], 4, "240.0.0.0/4 (reserved, broadcast)"),
];

/// IPv6 special-purpose ranges that are not globally reachable.
const SPECIAL_V6: &[(u128, u8, &str)] = &[
    (0, 128, "::/128 (unspecified)"),
    (1, 128, "::1/128 (loopback)"),
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        "64:ff9b:1::/48 (local-use NAT64)",
    ),
    (
        0x0100_0000_0000_0000_0000_0000_0000_0000,
        64,
        "100::/64 (discard-only)",
    ),
    (
        0x2001_0002_0000_0000_0000_0000_0000_0000,
        48,
        "2001:2::/48 (benchmarking)",
    ),
    (
        0x2001_0db8_0000_0000_0000_0000_0000_0000,
        32,
        "2001:db8::/32 (documentation)",
    ),
    (
        0x3fff_0000_0000_0000_0000_0000_0000_0000,
        20,
        "3fff::/20 (documentation)",
    ),
    (
        0x5f00_0000_0000_0000_0000_0000_0000_0000,
        16,
        "5f00::/16 (segment routing SIDs)",
    ),
    (
        0xfc00_0000_0000_0000_0000_0000_0000_0000,
        7,
        "fc00::/7 (unique local)",
    ),
    (
        0xfe80_0000_0000_0000_0000_0000_0000_0000,
        10,
        "fe80::/10 (link-local)",
    ),
    (
        0xff00_0000_0000_0000_0000_0000_0000_0000,
        8,
        "ff00::/8 (multicast)",
    ),
];

/// Cloud metadata endpoints: an address rule opens one only by naming it exactly (a `/32` or
/// `/128` entry), never as part of a wider range (AWS, GCP and Azure `169.254.169.254`; ECS
/// task metadata `169.254.170.2` and EKS Pod Identity `169.254.170.23`; AWS IPv6
/// `fd00:ec2::254` and `fd00:ec2::23`; Alibaba `100.100.100.200`).
const METADATA: &[IpAddr] = &[
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 2)),
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 23)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23)),
];

/// The built-in special-purpose range that makes the canonical `ip` prohibited, as a network
/// an address rule must lie inside to open it. An IPv6 address prohibited for the IPv4
/// address it embeds gets that range under its embedding prefix (IPv4-compatible and NAT64
/// `/96`, 6to4 `2002::/16`); a Teredo address only its own `/128`.
fn special_net(ip: IpAddr) -> Option<IpNet> {
    let v4_net = |v4: Ipv4Addr| {
        let a = u32::from(v4);
        SPECIAL_V4.iter().find_map(|(net, len, _)| {
            let mask = if *len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(*len))
            };
            (a & mask == u32::from_be_bytes(*net) & mask)
                .then_some((u32::from_be_bytes(*net), *len))
        })
    };
    let v6 = |bits: u128, len: u8| {
        ipnet::Ipv6Net::new(Ipv6Addr::from(bits), len)
            .ok()
            .map(IpNet::V6)
    };
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4_net(v4).and_then(|(net, len)| {
            ipnet::Ipv4Net::new(Ipv4Addr::from(net), len)
                .ok()
                .map(IpNet::V4)
        }),
        IpAddr::V6(addr) => {
            let a = u128::from(addr);
            if let Some((net, len, _)) =
                SPECIAL_V6.iter().find(|(n, l, _)| prefix_match6(a, *n, *l))
            {
                return v6(*net, *len);
            }
            let [first, second] = embedded_ipv4(addr);
            let (net, len) = first.and_then(v4_net).or_else(|| second.and_then(v4_net))?;
            if second.is_some() {
                return v6(a, 128); // Teredo
            }
            if prefix_match6(a, 0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
                return v6((0x2002u128 << 112) | (u128::from(net) << 80), 16 + len);
            }
            // IPv4-compatible `::/96`, NAT64 `64:ff9b::/96`.
            v6((a >> 32 << 32) | u128::from(net), 96 + len)
        }
    }
}

/// The special-purpose range `ip` falls in (after canonicalisation), if any. IPv6 addresses
/// that embed an IPv4 address are judged by that address too.
pub fn special_purpose(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => {
            let a = u128::from(v6);
            for (net, len, name) in SPECIAL_V6 {
                if prefix_match6(a, *net, *len) {
                    return Some(name);
                }
            }
            embedded_ipv4(v6).into_iter().flatten().find_map(special_v4)
        }
    }
}

fn special_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let a = u32::from(v4);
    SPECIAL_V4
        .iter()
        .find(|(net, len, _)| {
            let mask = if *len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(*len))
            };
            a & mask == u32::from_be_bytes(*net) & mask
        })
        .map(|(_, _, name)| *name)
}

fn prefix_match6(a: u128, net: u128, len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    };
    a & mask == net & mask
}

/// IPv4 addresses carried inside an IPv6 address: IPv4-mapped `::ffff:0:0/96`,
/// IPv4-compatible `::/96`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`, and
/// Teredo `2001::/32` (server and de-obfuscated client). At most two.
pub fn embedded_ipv4(v6: Ipv6Addr) -> [Option<Ipv4Addr>; 2] {
    let a = u128::from(v6);
    let low32 = Ipv4Addr::from(a as u32);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return [Some(v4), None];
    }
    if a >> 32 == 0 && a > 1 {
        return [Some(low32), None];
    }
    if prefix_match6(a, 0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96)
        || prefix_match6(a, 0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48)
    {
        return [Some(low32), None];
    }
    if prefix_match6(a, 0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
        return [Some(Ipv4Addr::from((a >> 80) as u32)), None];
    }
    if prefix_match6(a, 0x2001_0000_0000_0000_0000_0000_0000_0000, 32) {
        let server = Ipv4Addr::from((a >> 64) as u32);
        let client = Ipv4Addr::from(!(a as u32));
        return [Some(server), Some(client)];
    }
    [None, None]
}

/// Every form of `ip` a range rule should be checked against: the canonical address and any
/// embedded IPv4 address.
pub fn address_forms(ip: IpAddr) -> impl Iterator<Item = IpAddr> {
    let canonical = ip.to_canonical();
    let embedded = match canonical {
        IpAddr::V6(v6) => embedded_ipv4(v6),
        IpAddr::V4(_) => [None, None],
    };
    std::iter::once(canonical).chain(embedded.into_iter().flatten().map(IpAddr::V4))
}

/// The addresses of this host's interfaces (canonical), or none when they cannot be read.
fn local_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        tracing::warn!("cannot list this host's addresses; loop protection covers listeners, 0.0.0.0/8, :: and loopback only");
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            IpAddr::V6(v6.ip()).to_canonical()
        } else {
            continue;
        };
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// The guard's verdict on one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardVerdict {
    /// May be dialled.
    Permit,
    /// In a prohibited range (named).
    Prohibited(&'static str),
    /// One of the proxy's own listeners.
    Loop,
}

/// The process-wide part of the guard: operator ranges and the proxy's own listeners.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// `defaults.prohibited_ranges`: added to the built-in list (cluster/service CIDRs).
    prohibited: AddrTable<IpNet>,
    /// `defaults.guard_allow_ranges`: let through for every sandbox.
    allowed: AddrTable<()>,
    /// Listener addresses, so the proxy never dials itself (and its deciders' and webhook's).
    listeners: Vec<SocketAddr>,
    /// Every address of this host's interfaces (read when the set is compiled): on a
    /// listener's port, any of them reaches the proxy when it listens on `0.0.0.0` / `::`.
    local: Vec<IpAddr>,
}

impl Guard {
    /// A guard refusing `prohibited` ranges unless `allowed` says otherwise, and the proxy's own `listeners` always (no loops).
    pub fn new(prohibited: &[IpNet], allowed: &[IpNet], listeners: Vec<SocketAddr>) -> Self {
        let mut p = AddrTable::new();
        for n in prohibited {
            p.insert(*n, *n);
        }
        let mut a = AddrTable::new();
        for n in allowed {
            a.insert(*n, ());
        }
        let local = if listeners.is_empty() {
            Vec::new()
        } else {
            local_addresses()
        };
        Guard {
            prohibited: p,
            allowed: a,
            listeners,
            local,
        }
    }

    /// The same guard, with `local` as this host's interface addresses (tests).
    #[cfg(test)]
    fn with_local(mut self, local: Vec<IpAddr>) -> Self {
        self.local = local;
        self
    }

    /// Judge `ip:port`. `covering` gives the networks of the sandbox's own egress address
    /// rules that cover the (canonical) address on any port — an address passes the range
    /// checks when one of them lies inside the range that prohibits it (never the loop
    /// check). Prohibited ranges are matched against every embedded form.
    pub fn check<I: IntoIterator<Item = IpNet>>(
        &self,
        ip: IpAddr,
        port: u16,
        covering: impl Fn(IpAddr) -> I,
    ) -> GuardVerdict {
        let ip = ip.to_canonical();
        if self.is_listener(ip, port) {
            return GuardVerdict::Loop;
        }
        // The sandbox's own address rules let an address through on its canonical form only
        // (an allow rule for 8.8.8.8 does not cover a 6to4 or Teredo address embedding it),
        // and only a rule that lies inside the prohibited range: `10.1.0.0/16` opens itself,
        // `0.0.0.0/0` opens nothing private, and a metadata address needs its exact entry.
        if covering(ip).into_iter().any(|net| self.opened_by(ip, net)) {
            return GuardVerdict::Permit;
        }
        let range = special_purpose(ip).or_else(|| {
            address_forms(ip)
                .any(|f| self.prohibited.contains(f))
                .then_some("defaults.prohibited_ranges")
        });
        match range {
            Some(name) if !address_forms(ip).any(|f| self.allowed.contains(f)) => {
                GuardVerdict::Prohibited(name)
            }
            _ => GuardVerdict::Permit,
        }
    }

    /// Whether an address rule for `net` (which covers `ip`) opens `ip`: `net` lies inside
    /// every range that prohibits `ip`, and names a metadata address exactly.
    fn opened_by(&self, ip: IpAddr, net: IpNet) -> bool {
        if METADATA.contains(&ip) {
            return net.prefix_len() == net.max_prefix_len();
        }
        if let Some(range) = special_net(ip) {
            if !range.contains(&net) {
                return false;
            }
        }
        // Operator ranges (`defaults.prohibited_ranges`), matched on the canonical form; an
        // address prohibited for an embedded form only opens by its exact entry.
        let canonical_ranges: Vec<&IpNet> = self.prohibited.matches(ip).collect();
        if !canonical_ranges.iter().all(|r| r.contains(&net)) {
            return false;
        }
        let embedded_only = canonical_ranges.is_empty()
            && address_forms(ip)
                .skip(1)
                .any(|f| self.prohibited.contains(f));
        !embedded_only || net.prefix_len() == net.max_prefix_len()
    }

    /// Whether `ip:port` is (or may be) one of the proxy's own listeners: a listener's port on
    /// its own address, on any address that means "this host" (`0.0.0.0/8`, `::`, loopback),
    /// or on any address of this host's interfaces.
    fn is_listener(&self, ip: IpAddr, port: u16) -> bool {
        let this_host = match ip {
            IpAddr::V4(v4) => v4.octets()[0] == 0 || v4.is_loopback(),
            IpAddr::V6(v6) => v6.is_unspecified() || v6.is_loopback(),
        } || self.local.contains(&ip);
        self.listeners
            .iter()
            .any(|l| l.port() == port && (this_host || l.ip().to_canonical() == ip))
    }
}

#[cfg(test)]
mod tests;
