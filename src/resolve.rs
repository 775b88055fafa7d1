//! Name resolution for the data plane and `check --resolve`: the static `dns.hosts` map first,
//! then hickory-resolver (the system's resolv.conf, or `dns.servers`), with one overall
//! timeout. Names are queried fully qualified, so no search domain can turn `db` into an
//! internal name. Resolution happens once per connection; the caller dials only what it
//! checked. Failures are typed so they map onto `dns_error` / `destination_not_found` /
//! `dns_timeout`; nothing here ever falls back to "allow".

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::config::{
    NameServerConfig, NameServerConfigGroup, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;
use thiserror::Error;

use crate::config::DnsConfig;
use crate::policy::Reason;

/// Why a name has no usable addresses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    #[error("name does not exist or has no addresses")]
    NotFound,
    #[error("resolver timed out")]
    Timeout,
    #[error("resolver error: {0}")]
    Failed(String),
}

impl ResolveError {
    /// The reason code a refusal carries.
    pub fn reason(&self) -> Reason {
        match self {
            ResolveError::NotFound => Reason::DestinationNotFound,
            ResolveError::Timeout => Reason::DnsTimeout,
            ResolveError::Failed(_) => Reason::DnsError,
        }
    }
}

/// The proxy's resolver.
pub struct Resolver {
    /// `dns.hosts`: consulted first, authoritative for the names it lists.
    hosts: BTreeMap<String, Vec<IpAddr>>,
    /// `None` when no DNS is configured (no resolv.conf): only `hosts` answers.
    dns: Option<TokioResolver>,
    /// Overall deadline for one resolution.
    timeout: Duration,
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
            b.build()
        });
        (
            Resolver {
                hosts: cfg.hosts.clone(),
                dns,
                timeout: cfg.timeout,
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
            Ok(Err(e)) => {
                let text = e.to_string();
                return Err(
                    if text.to_ascii_lowercase().contains("timed out") || text.contains("timeout") {
                        ResolveError::Timeout
                    } else {
                        ResolveError::Failed(text)
                    },
                );
            }
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
        let cfg = DnsConfig {
            // A server that will never answer: anything not in `hosts` times out.
            servers: vec!["127.0.0.1:9".parse().unwrap()],
            hosts,
            timeout: Duration::from_millis(200),
            address_rule_zones: Vec::new(),
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
        assert!(
            matches!(e, ResolveError::Timeout | ResolveError::Failed(_)),
            "{e:?}"
        );
        assert_ne!(e.reason(), Reason::RuleMatched);
    }
}
