//! Which exchanges go through a parent, and the TLS made to an `https://` one: the run-time
//! side of `upstream_proxy` (the configuration only describes it).

use std::sync::Arc;

use crate::config::upstream::{ParentTls, UpstreamProxy};
use crate::policy::entry::HostPattern;
use crate::policy::target::{Host, Target};

/// Whether `target` is dialled directly instead of through `parent`: a `bypass` entry
/// matches it. Without a port an entry matches every port. An address entry matches a target
/// given as an address: a name is not resolved to decide (a name allowed by a name rule goes
/// to the parent unresolved) — as `NO_PROXY` ranges do in curl.
pub fn bypassed(parent: &UpstreamProxy, target: &Target) -> bool {
    parent.bypass.iter().any(|b| {
        let entry = b.entry();
        if let Some(ports) = &entry.ports {
            if !ports.contains(target.port) {
                return false;
            }
        }
        match (&entry.host, &target.host) {
            (HostPattern::Exact(n), Host::Name(name)) => **name == **n,
            (HostPattern::Subdomains(d), Host::Name(name)) => below(name, d),
            (HostPattern::ApexAndSubdomains(d), Host::Name(name)) => {
                **name == **d || below(name, d)
            }
            (HostPattern::Glob { .. }, Host::Name(name)) => {
                b.glob().is_some_and(|g| g.is_match(name.replace('.', "/")))
            }
            (HostPattern::Net(net), Host::Ip(ip)) => net.contains(ip),
            (HostPattern::Localhost, Host::Name(name)) => &**name == "localhost",
            (HostPattern::Localhost, Host::Ip(ip)) => ip.is_loopback(),
            _ => false,
        }
    })
}

/// Whether `name` is strictly below the domain `d`.
fn below(name: &str, d: &str) -> bool {
    name.len() > d.len() + 1
        && name.ends_with(d)
        && name.as_bytes()[name.len() - d.len() - 1] == b'.'
}

/// The TLS connector for an `https://` parent: its client configuration (public roots plus
/// `ca_file`'s certificates), built on first use and kept in the description's slot for as
/// long as that configuration stands.
pub(super) fn connector(tls: &ParentTls) -> Result<tokio_rustls::TlsConnector, rustls::Error> {
    if let Some(held) = tls.runtime.get() {
        if let Some(config) = held.downcast_ref::<Arc<rustls::ClientConfig>>() {
            return Ok(tokio_rustls::TlsConnector::from(config.clone()));
        }
    }
    let config = client_config(tls)?;
    // A racing first use may have filled the slot; either configuration is the same.
    let _ = tls.runtime.set(Arc::new(config.clone()));
    Ok(tokio_rustls::TlsConnector::from(config))
}

fn client_config(tls: &ParentTls) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let roots = crate::egress::roots::public_and_certificates(&tls.ca);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
