//! Name resolution for the data plane and `check --resolve`: the static `dns.hosts` map first,
//! then hickory-resolver (the system's resolv.conf, or `dns.servers`), with one overall
//! timeout. Names are queried fully qualified, so no search domain can turn `db` into an
//! internal name. Resolution happens once per connection; the caller dials only what it
//! checked. Failures are typed so they map onto `dns_error` / `destination_not_found` /
//! `dns_timeout`; nothing here ever falls back to "allow".
//!
//! The DNS listener asks by family ([`Resolver::lookup_family`]) and, for `dns.pass_types`,
//! by record type ([`Resolver::lookup_records`]); both come from the same cache, and carry
//! how long the answer may be kept.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    NameServerConfig, NameServerConfigGroup, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;
use thiserror::Error;

use crate::config::DnsConfig;
use crate::policy::Reason;

/// Why a name has no usable addresses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    /// The name does not exist or has no addresses (NXDOMAIN).
    #[error("name does not exist or has no addresses")]
    NotFound,
    /// The name exists but has no record of the type asked for (DNS NODATA).
    #[error("name has no records of that type")]
    NoData,
    /// The resolver did not answer in time.
    #[error("resolver timed out")]
    Timeout,
    /// The resolver failed (its words).
    #[error("resolver error: {0}")]
    Failed(String),
}

impl ResolveError {
    /// The reason code a refusal carries.
    pub fn reason(&self) -> Reason {
        match self {
            ResolveError::NotFound | ResolveError::NoData => Reason::DestinationNotFound,
            ResolveError::Timeout => Reason::DnsTimeout,
            ResolveError::Failed(_) => Reason::DnsError,
        }
    }
}

/// An address family the DNS listener asks for (A or AAAA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }
}

/// Addresses of one family and how long they may be kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    /// The addresses, in the resolver's order.
    pub addrs: Vec<IpAddr>,
    /// How long they may be kept.
    pub ttl: Duration,
}

/// How many answers the resolver caches (hickory's default is 32, too few for a proxy that
/// answers many sandboxes).
const CACHE_ENTRIES: usize = 8_192;

/// The proxy's resolver.
pub struct Resolver {
    /// `dns.hosts`: consulted first, authoritative for the names it lists.
    hosts: BTreeMap<String, Vec<IpAddr>>,
    /// `None` when no DNS is configured (no resolv.conf): only `hosts` answers.
    dns: Option<TokioResolver>,
    /// Overall deadline for one resolution.
    timeout: Duration,
    /// `dns.max_answer_ttl_s`: also the TTL of `dns.hosts` answers.
    pub max_answer_ttl: Duration,
    /// `dns.answer_grace_s`: how long past its TTL a DNS listener answer still names its
    /// addresses for transparent connections.
    pub answer_grace: Duration,
    /// `dns.pass_types`.
    pub pass_types: Vec<u16>,
}

impl Resolver {
    /// Build from configuration. A missing system configuration is not fatal: only
    /// `dns.hosts` answers then, and every other name is a `dns_error` (fail closed).
    pub fn new(cfg: &DnsConfig) -> (Self, Option<String>) {
        let mut warning = None;
        let provider = TokioConnectionProvider::default();
        let builder = if cfg.servers.is_empty() {
            match TokioResolver::builder_tokio() {
                Ok(b) => Some(b),
                Err(e) => {
                    warning = Some(format!(
                        "no system DNS configuration ({e}); only dns.hosts will resolve"
                    ));
                    None
                }
            }
        } else {
            let mut group = Vec::new();
            for s in &cfg.servers {
                group.push(NameServerConfig::new(*s, Protocol::Udp));
                group.push(NameServerConfig::new(*s, Protocol::Tcp));
            }
            let rc = ResolverConfig::from_parts(None, vec![], NameServerConfigGroup::from(group));
            Some(TokioResolver::builder_with_config(rc, provider))
        };
        let dns = builder.map(|mut b| {
            let opts: &mut ResolverOpts = b.options_mut();
            opts.timeout = cfg.timeout;
            opts.attempts = 1;
            opts.ndots = 0;
            opts.cache_size = CACHE_ENTRIES;
            b.build()
        });
        (
            Resolver {
                hosts: cfg.hosts.clone(),
                dns,
                timeout: cfg.timeout,
                max_answer_ttl: cfg.max_answer_ttl,
                answer_grace: cfg.answer_grace,
                pass_types: cfg.pass_types.clone(),
            },
            warning,
        )
    }

    /// Resolve a normalised name to its addresses (deduplicated, resolver order).
    pub async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        if let Some(addrs) = self.hosts.get(name) {
            return if addrs.is_empty() {
                Err(ResolveError::NotFound)
            } else {
                Ok(addrs.clone())
            };
        }
        let Some(dns) = &self.dns else {
            return Err(ResolveError::Failed("no DNS configured".into()));
        };
        let fqdn = format!("{name}.");
        let lookup = match tokio::time::timeout(self.timeout, dns.lookup_ip(fqdn.as_str())).await {
            Err(_) => return Err(ResolveError::Timeout),
            Ok(Err(e)) if e.is_nx_domain() || e.is_no_records_found() => {
                return Err(ResolveError::NotFound)
            }
            Ok(Err(e)) => return Err(classify(&e)),
            Ok(Ok(l)) => l,
        };
        let mut out: Vec<IpAddr> = Vec::new();
        for ip in lookup.iter() {
            let ip = ip.to_canonical();
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        if out.is_empty() {
            return Err(ResolveError::NotFound);
        }
        Ok(out)
    }
}

impl Resolver {
    /// The addresses of one family of a normalised name, for the DNS listener: `dns.hosts`
    /// first (kept `max_answer_ttl`), then DNS with CNAMEs followed (the answer holds only the
    /// final addresses) and the TTL the cache still gives them.
    pub async fn lookup_family(
        &self,
        name: &str,
        family: Family,
    ) -> Result<Addresses, ResolveError> {
        if let Some(addrs) = self.hosts.get(name) {
            let addrs: Vec<IpAddr> = addrs
                .iter()
                .copied()
                .filter(|a| family.matches(a))
                .collect();
            return Ok(Addresses {
                addrs,
                ttl: self.max_answer_ttl,
            });
        }
        let rtype = match family {
            Family::V4 => RecordType::A,
            Family::V6 => RecordType::AAAA,
        };
        let (records, ttl) = self.lookup_records(name, rtype).await?;
        let mut addrs = Vec::new();
        for r in &records {
            let ip = match r.data() {
                RData::A(a) if family == Family::V4 => IpAddr::V4(a.0),
                RData::AAAA(a) if family == Family::V6 => IpAddr::V6(a.0),
                _ => continue,
            };
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
        }
        Ok(Addresses { addrs, ttl })
    }

    /// The records of `rtype` for a normalised name, and how long they may be kept (an empty
    /// list: the name exists without such records). `dns.hosts` names have no other records.
    pub async fn lookup_records(
        &self,
        name: &str,
        rtype: RecordType,
    ) -> Result<(Vec<Record>, Duration), ResolveError> {
        if self.hosts.contains_key(name) {
            return Ok((Vec::new(), self.max_answer_ttl));
        }
        let Some(dns) = &self.dns else {
            return Err(ResolveError::Failed("no DNS configured".into()));
        };
        let fqdn = format!("{name}.");
        match tokio::time::timeout(self.timeout, dns.lookup(fqdn.as_str(), rtype)).await {
            Err(_) => Err(ResolveError::Timeout),
            Ok(Err(e)) if e.is_nx_domain() => Err(ResolveError::NotFound),
            Ok(Err(e)) if e.is_no_records_found() => Ok((Vec::new(), self.max_answer_ttl)),
            Ok(Err(e)) => Err(classify(&e)),
            Ok(Ok(l)) => {
                let ttl = l.valid_until().saturating_duration_since(Instant::now());
                Ok((l.records().to_vec(), ttl))
            }
        }
    }
}

/// A resolver failure that is neither "no such name" nor "no records".
/// Classified by hickory's error kind, never by its message text.
fn classify(e: &hickory_resolver::ResolveError) -> ResolveError {
    use hickory_resolver::proto::ProtoErrorKind;
    match e.proto().map(|p| p.kind()) {
        Some(ProtoErrorKind::Timeout) => ResolveError::Timeout,
        Some(ProtoErrorKind::Io(io)) if io.kind() == std::io::ErrorKind::TimedOut => {
            ResolveError::Timeout
        }
        _ => ResolveError::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn static_hosts_answer_first() {
        let mut hosts = BTreeMap::new();
        hosts.insert(
            "api.example.test".to_string(),
            vec!["127.0.0.1".parse().unwrap()],
        );
        hosts.insert("empty.example.test".to_string(), vec![]);
        // A server that receives queries and never answers: anything not in `hosts` times out.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let cfg = DnsConfig {
            servers: vec![silent.local_addr().unwrap()],
            hosts,
            timeout: Duration::from_millis(200),
            address_rule_zones: Vec::new(),
            max_answer_ttl: Duration::from_secs(60),
            answer_grace: Duration::from_secs(60),
            pass_types: Vec::new(),
            self_address: None,
        };
        let (r, _) = Resolver::new(&cfg);
        assert_eq!(
            r.resolve("api.example.test").await.unwrap(),
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            r.resolve("empty.example.test").await,
            Err(ResolveError::NotFound)
        );
        let e = r.resolve("other.example.test").await.unwrap_err();
        assert_eq!(e, ResolveError::Timeout);
        assert_eq!(e.reason(), Reason::DnsTimeout);
    }
}
