//! The `dns:` section: upstream servers, names answered from `hosts`, the address-rule
//! zones (the system's search domains unless given), answer TTL and grace, and the record
//! types passed through, and the address `egress-proxy.local` is answered with.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::error::Sink;
use super::raw::RawDns;
use super::DnsConfig;
use crate::policy::hostname::normalize_name;

pub(super) fn resolve_dns(raw: RawDns, sink: &mut Sink<'_>) -> DnsConfig {
    let servers = servers(&raw.servers, sink);
    let hosts = hosts(raw.hosts, sink);
    if raw.timeout_ms == 0 {
        sink.top("dns.timeout_ms", "must be positive", Some("timeout_ms:"));
    }
    let zones = raw.address_rule_zones.unwrap_or_else(system_search_domains);
    let address_rule_zones = zones_of(zones, sink);
    let mut pass_types = Vec::new();
    for t in &raw.pass_types {
        match record_type_code(t) {
            Some(code) => pass_types.push(code),
            None => sink.top(
                "dns.pass_types",
                format!("`{t}` is not a DNS record type this listener can pass (A and AAAA are always answered; HTTPS and SVCB are always empty)"),
                Some(t),
            ),
        }
    }
    if raw.max_answer_ttl_s == 0 {
        sink.top(
            "dns.max_answer_ttl_s",
            "must be positive",
            Some("max_answer_ttl_s:"),
        );
    }
    if raw.answer_grace_s > 86_400 {
        sink.top(
            "dns.answer_grace_s",
            "must be at most 86400 (a day)",
            Some("answer_grace_s:"),
        );
    }
    DnsConfig {
        servers,
        hosts,
        timeout: Duration::from_millis(raw.timeout_ms.max(1)),
        address_rule_zones,
        max_answer_ttl: Duration::from_secs(u64::from(raw.max_answer_ttl_s.max(1))),
        answer_grace: Duration::from_secs(u64::from(raw.answer_grace_s)),
        pass_types,
        self_address: raw.self_address.map(|a| a.to_canonical()),
    }
}

/// `dns.servers`: each `ip` (port 53) or `ip:port`.
fn servers(raw: &[String], sink: &mut Sink<'_>) -> Vec<SocketAddr> {
    let mut servers = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        let parsed = s
            .parse::<SocketAddr>()
            .ok()
            .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)));
        match parsed {
            Some(a) => servers.push(a),
            None => sink.top(
                format!("dns.servers[{i}]"),
                format!("`{s}` is not `ip` or `ip:port`"),
                Some(s),
            ),
        }
    }
    servers
}

/// `dns.hosts`: names normalised, addresses canonical (an IPv4-mapped IPv6 is IPv4).
fn hosts(raw: BTreeMap<String, Vec<IpAddr>>, sink: &mut Sink<'_>) -> BTreeMap<String, Vec<IpAddr>> {
    let mut hosts = BTreeMap::new();
    for (name, addrs) in raw {
        match normalize_name(&name) {
            Ok(n) => {
                hosts.insert(n, addrs.into_iter().map(|a| a.to_canonical()).collect());
            }
            Err(e) => sink.top(
                format!("dns.hosts.{name}"),
                format!("invalid name: {e}"),
                Some(&name),
            ),
        }
    }
    hosts
}

/// `dns.address_rule_zones` (or the system's search domains), normalised, without dots at
/// either end.
fn zones_of(zones: Vec<String>, sink: &mut Sink<'_>) -> Vec<String> {
    let mut address_rule_zones = Vec::new();
    for z in zones {
        match normalize_name(z.trim_matches('.')) {
            Ok(n) => address_rule_zones.push(n),
            Err(_) => sink.top(
                "dns.address_rule_zones",
                format!("`{z}` is not a DNS name"),
                Some("address_rule_zones"),
            ),
        }
    }
    address_rule_zones
}

/// The numeric code of a record type named in `dns.pass_types` (`TXT`, `mx`, `TYPE99`). The
/// types the listener answers itself (A, AAAA, HTTPS, SVCB) and zone-transfer or meta types
/// cannot be passed.
fn record_type_code(name: &str) -> Option<u16> {
    use hickory_proto::rr::RecordType;
    let upper = name.trim().to_ascii_uppercase();
    let t = match upper.strip_prefix("TYPE") {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            RecordType::from(n.parse::<u16>().ok()?)
        }
        _ => upper.parse::<RecordType>().ok()?,
    };
    match t {
        RecordType::A
        | RecordType::AAAA
        | RecordType::HTTPS
        | RecordType::SVCB
        | RecordType::ANY
        | RecordType::AXFR
        | RecordType::IXFR
        | RecordType::OPT
        | RecordType::ZERO => None,
        t => Some(u16::from(t)),
    }
}

/// The `search` (or `domain`) domains of `/etc/resolv.conf`: in Kubernetes,
/// `<ns>.svc.cluster.local svc.cluster.local cluster.local`.
fn system_search_domains() -> Vec<String> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let Some("search" | "domain") = words.next() {
            out = words.map(str::to_string).collect();
        }
    }
    out
}
