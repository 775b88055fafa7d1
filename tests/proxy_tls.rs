//! The HTTPS proxy listener (`listen.proxy_tls`) with real curl and openssl: tokens over TLS,
//! client certificates that name sandboxes (and ones that name none, or come from another
//! CA), and a certificate rotation under an open tunnel.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use rcgen::SanType;

/// A CA that issues PEM files into a directory.
fn uri(s: &str) -> SanType {
    SanType::URI(s.try_into().unwrap())
}

struct Setup {
    _dir: tempfile::TempDir,
    proxy: Proxy,
    tls: std::net::SocketAddr,
    server_pki: Pki,
    client_pki: Pki,
    origin_ca: PathBuf,
    origin: Origin,
    plain: Origin,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server_pki = Pki::new(d, "proxy");
    server_pki.issue(
        "server",
        "egress-proxy",
        vec![SanType::IpAddress("127.0.0.1".parse().unwrap())],
    );
    let client_pki = Pki::new(d, "clients");
    let ca = TestCa::generate(d);
    let origin = Origin::start(Some(&ca));
    let plain = Origin::start(None);
    let proxy = ProxyConfig::new()
        .listen_at(
            "proxy_tls",
            "{ addr: 127.0.0.1:0, cert_file: server.pem, key_file: server.key, client_ca_file: clients-ca.pem, client_uri_prefix: \"spiffe://cluster.local/sandbox/\" }",
        )
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("big.test", "127.0.0.1")
        .guard_allow("127.0.0.0/8")
        .sandbox(
            SandboxSpec::new("agent1")
                .token("tok-agent1")
                .allow("api.test:*")
                .allow("127.0.0.1/32:*"),
        )
        .sandbox(SandboxSpec::new("agent2").allow("big.test:*"))
        .start(d);
    let tls = proxy_tls_addr(&proxy);
    Setup {
        origin_ca: ca.ca_pem.clone(),
        _dir: dir,
        proxy,
        tls,
        server_pki,
        client_pki,
        origin,
        plain,
    }
}

/// The TLS listener's address.
fn proxy_tls_addr(p: &Proxy) -> std::net::SocketAddr {
    p.proxy_tls.expect("listen.proxy_tls is on")
}

/// curl through the TLS proxy; (exit code, stdout + stderr).
fn curl_via(s: &Setup, extra: &[&str], url: &str) -> (i32, String) {
    let proxy = format!("https://{}", s.tls);
    let mut args = vec![
        "-sS",
        "--max-time",
        "10",
        "--proxy",
        &proxy,
        "--proxy-cacert",
    ];
    let ca = s.server_pki.ca_pem.to_str().unwrap().to_string();
    args.push(&ca);
    let origin_ca = s.origin_ca.to_str().unwrap().to_string();
    args.extend(["--cacert", &origin_ca]);
    args.extend(extra);
    args.push(url);
    let out = curl(&args);
    (out.code, format!("{}{}", out.text(), out.stderr))
}

#[test]
fn tokens_over_tls_and_client_certificates_that_name_sandboxes() {
    let s = setup();
    let op = s.origin.addr.port();
    // A token, now inside TLS.
    let (code, out) = curl_via(
        &s,
        &["--proxy-user", "agent1:tok-agent1"],
        &format!("https://api.test:{op}/over-tls"),
    );
    assert_eq!(code, 0, "{out}\n{}", s.proxy.stderr_text());
    assert!(out.contains("/over-tls"), "{out}");
    let rec = s.proxy.wait_audit("end", |r| {
        r["target_host"] == "api.test" && r["decision"] == "allow"
    });
    assert_eq!(rec["identity"], "token", "{rec}");

    // A client certificate naming agent2: its policy, not agent1's.
    let (c2, k2) = s.client_pki.issue(
        "agent2",
        "agent2",
        vec![uri("spiffe://cluster.local/sandbox/agent2")],
    );
    let (c2, k2) = (c2.to_str().unwrap(), k2.to_str().unwrap());
    let (code, out) = curl_via(
        &s,
        &["--proxy-cert", c2, "--proxy-key", k2],
        &format!("https://big.test:{op}/small"),
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = curl_via(
        &s,
        &["--proxy-cert", c2, "--proxy-key", k2, "-v"],
        &format!("https://api.test:{op}/"),
    );
    assert_ne!(code, 0);
    assert!(
        out.contains("not in network.egress of sandbox agent2"),
        "{out}"
    );
    let rec = s.proxy.wait_audit("end", |r| {
        r["target_host"] == "api.test" && r["sandbox"] == "agent2"
    });
    assert_eq!(rec["identity"], "certificate", "{rec}");

    // A valid certificate naming no configured sandbox: 407, even with agent1's token (a
    // certificate never falls through to a weaker method).
    let (c3, k3) = s.client_pki.issue(
        "stranger",
        "agent1",
        vec![uri("spiffe://cluster.local/sandbox/nobody")],
    );
    let (code, out) = curl_via(
        &s,
        &[
            "--proxy-cert",
            c3.to_str().unwrap(),
            "--proxy-key",
            k3.to_str().unwrap(),
            "--proxy-user",
            "agent1:tok-agent1",
            "-v",
        ],
        &format!("https://api.test:{op}/"),
    );
    assert_ne!(code, 0);
    assert!(out.contains("< HTTP/1.1 407"), "{out}");

    // A certificate from another CA: the handshake fails, and it is audited.
    let other = Pki::new(s._dir.path(), "other");
    let (c4, k4) = other.issue(
        "forged",
        "agent2",
        vec![uri("spiffe://cluster.local/sandbox/agent2")],
    );
    let (code, out) = curl_via(
        &s,
        &[
            "--proxy-cert",
            c4.to_str().unwrap(),
            "--proxy-key",
            k4.to_str().unwrap(),
        ],
        &format!("https://big.test:{op}/"),
    );
    assert_ne!(code, 0, "{out}");
    let rec = s.proxy.wait_audit("end", |r| {
        r["detail"]
            .as_str()
            .unwrap_or("")
            .contains("TLS handshake failed")
    });
    assert_eq!(rec["reason"], "auth_failed", "{rec}");
    assert!(rec["sandbox"].is_null(), "{rec}");
}

#[test]
fn a_certificate_rotation_keeps_open_tunnels_and_serves_the_new_one() {
    let s = setup();
    let pp = s.plain.addr.port();
    // A slow download through a tunnel over the TLS listener, still running across the
    // rotation.
    let out_file = s._dir.path().join("slow.out");
    let proxy = format!("https://{}", s.tls);
    let mut slow = Command::new("curl")
        .args([
            "-sS",
            "-p",
            "--max-time",
            "5",
            "--proxy",
            &proxy,
            "--proxy-cacert",
        ])
        .arg(&s.server_pki.ca_pem)
        .args(["--proxy-user", "agent1:tok-agent1", "-o"])
        .arg(&out_file)
        .arg(format!("http://127.0.0.1:{pp}/slow"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The tunnel is open (its `open` record is written) before the certificate rotates.
    s.proxy
        .wait_audit("open", |r| r["target_port"].as_u64() == Some(u64::from(pp)));
    s.server_pki.issue(
        "server",
        "rotated",
        vec![SanType::IpAddress("127.0.0.1".parse().unwrap())],
    );
    // The next handshake presents the new certificate (the watcher polls once a second).
    let mut text = String::new();
    within(Duration::from_millis(300), Duration::from_secs(10), || {
        let o = Command::new("openssl")
            .args(["s_client", "-connect", &s.tls.to_string(), "-CAfile"])
            .arg(&s.server_pki.ca_pem)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        text = String::from_utf8_lossy(&o.stdout).into_owned();
        (text.contains("CN=rotated") || text.contains("CN = rotated")).then_some(())
    })
    .unwrap_or_else(|| panic!("the new certificate was never served: {text}"));
    let _ = slow.wait();
    // 1 KiB every 100 ms for the whole 5 s: far more than the first second could carry.
    let got = std::fs::metadata(&out_file).map(|m| m.len()).unwrap_or(0);
    assert!(
        got > 25 * 1024,
        "the tunnel stopped at the rotation: {got} bytes"
    );
    let rec = s.proxy.wait_audit("end", |r| {
        r["target_port"] == pp && r["identity"] == "token"
    });
    // curl's --max-time ends it abruptly; what matters is that it carried on past the rotation.
    assert!(rec["bytes_down"].as_u64().unwrap() > 25 * 1024, "{rec}");
}

#[test]
fn the_admin_listener_over_tls_requires_a_client_certificate_when_given_a_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server = Pki::new(d, "proxy");
    server.issue(
        "server",
        "egress-proxy admin",
        vec![SanType::IpAddress("127.0.0.1".parse().unwrap())],
    );
    let clients = Pki::new(d, "clients");
    let (cc, ck) = clients.issue("operator", "operator", vec![]);
    let audit = d.join("audit.jsonl");
    let config = d.join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "listen:\n  proxy: 127.0.0.1:0\n  admin: 127.0.0.1:0\n  admin_tls: {{ cert_file: server.pem, key_file: server.key, client_ca_file: clients-ca.pem }}\naudit: {{ path: {} }}\n",
            audit.display()
        ),
    )
    .unwrap();
    let proxy = Proxy::start_with(config, audit, &[]);
    let url = format!("https://127.0.0.1:{}/healthz", proxy.admin.port());
    let ca = server.ca_pem.to_str().unwrap();
    let out = curl(&["--cacert", ca, &url]);
    assert_ne!(out.code, 0, "no client certificate, yet: {}", out.text());
    let out = curl(&[
        "--cacert",
        ca,
        "--cert",
        cc.to_str().unwrap(),
        "--key",
        ck.to_str().unwrap(),
        &url,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.text(), "ok\n");
    // Plain HTTP on the admin port gets nothing.
    let out = curl(&[&format!("http://127.0.0.1:{}/healthz", proxy.admin.port())]);
    assert_ne!(out.code, 0);
}
