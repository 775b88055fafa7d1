//! The proxy's own resolver is not an exfiltration channel: a name that no name rule allows
//! is resolved (to try address rules) only under `dns.address_rule_zones`, from `dns.hosts`,
//! or for a sandbox with `network.resolve_for_address_rules` — otherwise it is refused without
//! a DNS query, on the proxy port and through `POST /v1/check` alike.

mod common;

use std::net::{Ipv4Addr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;

const ADMIN_TOKEN: &str = "dns-channel-admin-token";

struct Env {
    _dir: tempfile::TempDir,
    dns: SlowDns,
    origin: Origin,
    proxy: Proxy,
}

/// Sandboxes `cidr` (an address rule only) and `opted` (the same, opted in); the DNS server
/// knows `db.internal.test` and `secret.exfil.example`.
fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).unwrap();
    let dns = SlowDns::start(
        Duration::ZERO,
        &[
            ("db.internal.test", Ipv4Addr::LOCALHOST),
            ("secret.exfil.example", Ipv4Addr::LOCALHOST),
        ],
    );
    let origin = Origin::start(None);
    let sandbox = |id: &str, opt: bool| {
        SandboxSpec::new(id)
            .token(&format!("{id}-secret"))
            .allow("127.0.0.0/8:*")
            .network("resolve_for_address_rules", &opt.to_string())
    };
    let proxy = ProxyConfig::new()
        .admin_token_file(&dir.path().join("admin.token"))
        .dns_server(&dns.addr.to_string())
        .dns("timeout_ms", "2000")
        .dns("address_rule_zones", "[internal.test]")
        .host("static.example", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(sandbox("cidr", false))
        .sandbox(sandbox("opted", true))
        .start(dir.path());
    Env {
        _dir: dir,
        dns,
        origin,
        proxy,
    }
}

impl Env {
    /// CONNECT `host` (the origin's port) as `id`; returns the status line.
    fn connect(&self, id: &str, host: &str) -> String {
        let mut s = TcpStream::connect(self.proxy.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let target = format!("{host}:{}", self.origin.addr.port());
        let auth = basic(id, &format!("{id}-secret"));
        std::io::Write::write_all(
            &mut s,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let head = read_head(&mut s);
        String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    fn queries(&self) -> u64 {
        self.dns.queries.load(Ordering::SeqCst)
    }
}

#[test]
fn a_name_no_rule_could_use_is_refused_without_a_dns_query() {
    let e = env();
    let before = e.queries();
    let status = e.connect("cidr", "secret.exfil.example");
    assert!(status.contains(" 403 "), "{status}");
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "secret.exfil.example");
    assert_eq!(rec["reason"], "no_rule_matched", "{rec}");
    assert_eq!(
        e.queries(),
        before,
        "the name left the proxy in a DNS query"
    );

    // The admin API's check is no side door either.
    let (status, body) = admin_req(
        e.proxy.admin,
        "POST",
        "/v1/check",
        r#"{"sandbox": "cidr", "target": "secret.exfil.example:443"}"#,
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"decision\":\"deny\""), "{body}");
    assert_eq!(e.queries(), before, "POST /v1/check resolved the name");
}

#[test]
fn names_in_address_rule_zones_and_dns_hosts_still_reach_address_rules() {
    let e = env();
    // A cluster-style service name allowed by a CIDR rule keeps working.
    let before = e.queries();
    let status = e.connect("cidr", "db.internal.test");
    assert!(status.contains(" 200 "), "{status}");
    assert!(e.queries() > before, "the zone's name was not resolved");
    // dns.hosts answers locally: no query, and the address rule applies.
    let before = e.queries();
    let status = e.connect("cidr", "static.example");
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(e.queries(), before);
}

#[test]
fn a_sandbox_that_opts_in_resolves_any_name_for_its_address_rules() {
    let e = env();
    let before = e.queries();
    let status = e.connect("opted", "secret.exfil.example");
    assert!(status.contains(" 200 "), "{status}");
    assert!(e.queries() > before);
}
