//! `listen:` resolved: the listeners' addresses (no two on one address), TLS on the proxy and
//! admin listeners and how a client certificate names its sandbox, attribution, and the
//! data-plane threads.

use std::net::SocketAddr;

use super::defaults::ADMIN_ADDR;
use super::error::Sink;
use super::raw::{RawListen, RawProxyTls};
use super::{ClientNames, Listen, ProxyTls};

/// `listen:` checked: at least one data-plane listener, no two on one address, a token for an
/// admin listener off loopback, TLS settings that agree, at most `LISTEN_THREADS_MAX` threads.
pub(super) fn resolve_listen(raw: RawListen, has_admin_token: bool, sink: &mut Sink<'_>) -> Listen {
    if raw.proxy.is_none()
        && raw.transparent.is_none()
        && raw.proxy_tls.is_none()
        && raw.socks5.is_none()
    {
        sink.top(
            "listen",
            "at least one of `proxy`, `proxy_tls`, `transparent` and `socks5` must be set",
            Some("listen:"),
        );
    }
    if let Some(admin) = raw.admin {
        if !admin.ip().is_loopback() && !has_admin_token {
            sink.top("listen.admin", format!("{admin} is not loopback: set `admin_token_file` so that mutating admin calls need a bearer token"), Some("admin:"));
        }
    }
    same_address(&raw, sink);
    if raw.threads > LISTEN_THREADS_MAX {
        sink.top(
            "listen.threads",
            format!("must be from 0 (the main runtime's workers) to {LISTEN_THREADS_MAX}"),
            Some("threads:"),
        );
    }
    let proxy_tls = raw.proxy_tls.map(|t| proxy_tls(t, sink));
    let admin_tls = raw.admin_tls.map(|t| ProxyTls {
        addr: raw.admin.unwrap_or(ADMIN_ADDR),
        cert_file: t.cert_file.into(),
        key_file: t.key_file.into(),
        require_client_cert: t.client_ca_file.is_some(),
        client_ca_file: t.client_ca_file.map(Into::into),
        client_names: ClientNames::None,
    });
    if admin_tls.is_some() && raw.admin.is_none() {
        sink.top(
            "listen.admin_tls",
            "the admin listener is off (`admin: null`)",
            Some("admin_tls"),
        );
    }
    Listen {
        proxy: raw.proxy,
        proxy_tls,
        admin_tls,
        transparent: raw.transparent,
        transparent_tproxy: raw.transparent_tproxy,
        admin: raw.admin,
        dns: raw.dns,
        socks5: raw.socks5,
        default_sandbox: raw.default_sandbox,
        observe_processes: raw
            .attribution
            .filter(|a| a.observe)
            .map(|a| a.lookups_per_second),
        threads: raw.threads,
    }
}

/// The most data-plane threads `listen.threads` may ask for.
pub const LISTEN_THREADS_MAX: usize = 64;

/// Two TCP listeners cannot share an address (the second bind would fail at start, blaming
/// whoever else holds the port): said at load, naming both. A wildcard address overlaps every
/// address of its family on the same port; port 0 lets the system choose.
fn same_address(raw: &RawListen, sink: &mut Sink<'_>) {
    let named = [
        ("proxy", raw.proxy),
        ("proxy_tls", raw.proxy_tls.as_ref().map(|t| t.addr)),
        ("transparent", raw.transparent),
        ("socks5", raw.socks5),
        ("admin", raw.admin),
        ("dns", raw.dns),
    ];
    let bound: Vec<(&str, SocketAddr)> = named
        .iter()
        .filter_map(|(n, a)| a.filter(|a| a.port() != 0).map(|a| (*n, a)))
        .collect();
    for (i, (first, a)) in bound.iter().enumerate() {
        for (second, b) in &bound[i + 1..] {
            let overlap = a.port() == b.port()
                && a.is_ipv4() == b.is_ipv4()
                && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified());
            if overlap {
                sink.top(
                    format!("listen.{second}"),
                    format!("listen.{first} ({a}) and listen.{second} ({b}) would share one address: give each listener a port of its own"),
                    Some(&format!("{second}:")),
                );
            }
        }
    }
}

/// `listen.proxy_tls`: how a client certificate names its sandbox, and the CA it needs.
fn proxy_tls(t: RawProxyTls, sink: &mut Sink<'_>) -> ProxyTls {
    let client_names = match (&t.client_uri_prefix, t.client_cn) {
        (Some(_), true) => {
            sink.top(
                "listen.proxy_tls",
                "set one of `client_uri_prefix` and `client_cn`, not both",
                Some("client_cn"),
            );
            ClientNames::None
        }
        (Some(p), false) if p.is_empty() => {
            sink.top(
                "listen.proxy_tls.client_uri_prefix",
                "must not be empty",
                Some("client_uri_prefix"),
            );
            ClientNames::None
        }
        (Some(p), false) => ClientNames::UriPrefix(p.clone()),
        (None, true) => ClientNames::CommonName,
        (None, false) => ClientNames::None,
    };
    match (&t.client_ca_file, &client_names) {
        (Some(_), ClientNames::None) if t.client_uri_prefix.is_none() && !t.client_cn => {
            sink.top(
                "listen.proxy_tls",
                "`client_ca_file` needs `client_uri_prefix` or `client_cn` (how a certificate names its sandbox)",
                Some("client_ca_file"),
            );
        }
        (None, ClientNames::UriPrefix(_) | ClientNames::CommonName) => {
            sink.top(
                "listen.proxy_tls",
                "client certificate names need `client_ca_file` (the CA that signs them)",
                Some("proxy_tls"),
            );
        }
        _ => {}
    }
    ProxyTls {
        addr: t.addr,
        cert_file: t.cert_file.into(),
        key_file: t.key_file.into(),
        client_ca_file: t.client_ca_file.map(Into::into),
        client_names,
        require_client_cert: false,
    }
}
