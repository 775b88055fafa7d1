//! The SOCKS5 listener (`listen.socks5`) through the real binary: real `curl
//! --socks5-hostname` and `--socks5`, Python's `httpx[socks]`, and raw RFC 1928 bytes for
//! what clients do not send. A login is the sandbox id and token; without one the source
//! address identifies; names are resolved by the proxy and address targets judged by the
//! guard; BIND and UDP ASSOCIATE are refused with "command not supported"; a forged `Host`
//! inside the tunnel is refused like in a CONNECT tunnel; a reload revokes an open tunnel.
//! Every connection has its record, `mode: "socks5"`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

struct Env {
    dir: tempfile::TempDir,
    origin: Origin,
    proxy: Proxy,
}

/// The config: sandbox `agent1` by token and `bysource` by 127.0.0.2, both allowed to reach
/// `origin.test` (the local origin) on its port, nothing else; `agent1` also `egress`.
fn config(dir: &std::path::Path, origin: SocketAddr, egress: &str) -> String {
    ProxyConfig::new()
        .no_proxy()
        .socks5()
        .admin_token_file(&dir.join("admin.token"))
        .raw("admission: { first_byte_ms: 1000 }")
        .host("origin.test", "127.0.0.1")
        .host("denied.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("timeouts", "{ header_ms: 2000 }")
        .sandbox(SandboxSpec::new("agent1").token("tok-agent1").allow(egress))
        .sandbox(
            SandboxSpec::new("bysource")
                .source("127.0.0.2/32")
                .allow(&format!("origin.test:{}", origin.port())),
        )
        .yaml(&dir.join("audit.jsonl"))
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let egress = format!("origin.test:{}", origin.addr.port());
    std::fs::write(dir.path().join("admin.token"), "socks-admin-token\n").unwrap();
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, config(dir.path(), origin.addr, &egress)).unwrap();
    let proxy = Proxy::start_with(path, dir.path().join("audit.jsonl"), &[]);
    Env { dir, origin, proxy }
}

impl Env {
    fn socks(&self) -> SocketAddr {
        self.proxy.socks5.expect("listen.socks5 is bound")
    }

    /// curl through the SOCKS5 listener: `flag` is `--socks5-hostname` (the proxy resolves)
    /// or `--socks5` (curl resolves and sends an address).
    fn curl(&self, flag: &str, login: Option<&str>, url: &str, extra: &[&str]) -> CurlOut {
        let proxy = match login {
            Some(l) => format!("{l}@{}", self.socks()),
            None => self.socks().to_string(),
        };
        let mut args = vec![flag, proxy.as_str()];
        args.extend_from_slice(extra);
        args.push(url);
        curl(&args)
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.origin.addr.port())
    }
}

#[test]
fn curl_with_a_login_reaches_an_allowed_name_and_is_recorded() {
    let e = env();
    let out = e.curl(
        "--socks5-hostname",
        Some("agent1:tok-agent1"),
        &e.url("origin.test", "/hi"),
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.text(), "hello from origin /hi\n");
    // The connection's record (each plain-HTTP request on it has its own, mode http).
    let r = e
        .proxy
        .wait_record(|r| r["target_host"] == "origin.test" && r["mode"] != "http");
    assert_eq!(r["mode"], "socks5", "{r}");
    let req = e
        .proxy
        .wait_record(|r| r["mode"] == "http" && r["path"] == "/hi");
    assert_eq!(
        (&req["sandbox"], &req["status"]),
        (&"agent1".into(), &200.into()),
        "{req}"
    );
    assert_eq!(r["sandbox"], "agent1");
    assert_eq!(r["identity"], "token");
    assert_eq!(r["decision"], "allow");
    assert_eq!(r["dialed"], e.origin.addr.to_string());
    assert!(r["bytes_down"].as_u64().unwrap() > 0, "{r}");
    // The token is never in the record.
    let all = std::fs::read_to_string(&e.proxy.audit).unwrap();
    assert!(!all.contains("tok-agent1"));
}

#[test]
fn without_a_login_the_source_address_identifies() {
    let e = env();
    let url = e.url("origin.test", "/by-source");
    // 127.0.0.2 is sandbox bysource's.
    let out = e.curl(
        "--socks5-hostname",
        None,
        &url,
        &["--interface", "127.0.0.2"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = e
        .proxy
        .wait_record(|r| r["sandbox"] == "bysource" && r["mode"] != "http");
    assert_eq!(
        (r["identity"].as_str(), r["mode"].as_str()),
        (Some("source"), Some("socks5"))
    );
    // 127.0.0.1 is nobody's: no method is acceptable, the client must log in.
    let out = e.curl("--socks5-hostname", None, &url, &[]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("No authentication method was acceptable"),
        "{}",
        out.stderr
    );
    let r = e
        .proxy
        .wait_record(|r| r["reason"] == "auth_required" && r["mode"] == "socks5");
    assert_eq!(r["decision"], "deny");
}

#[test]
fn refusals_get_reply_codes_curl_explains_and_reasons_in_the_audit() {
    let e = env();
    // A name no rule allows: "not allowed by ruleset" (reply 2).
    let out = e.curl(
        "--socks5-hostname",
        Some("agent1:tok-agent1"),
        &e.url("denied.test", "/"),
        &[],
    );
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("(2)"), "{}", out.stderr);
    let r = e.proxy.wait_record(|r| r["target_host"] == "denied.test");
    assert_eq!(
        (
            r["reason"].as_str(),
            r["mode"].as_str(),
            r["sandbox"].as_str()
        ),
        (Some("no_rule_matched"), Some("socks5"), Some("agent1"))
    );
    assert!(r["dialed"].is_null(), "nothing dialled: {r}");
    // A wrong token: the login fails (RFC 1929), and a third party's sandbox id too.
    let out = e.curl(
        "--socks5-hostname",
        Some("agent1:wrong"),
        &e.url("origin.test", "/"),
        &[],
    );
    assert!(
        out.stderr
            .contains("User was rejected by the SOCKS5 server"),
        "{}",
        out.stderr
    );
    let r = e.proxy.wait_record(|r| r["reason"] == "auth_failed");
    assert_eq!(r["mode"], "socks5");
    // An address target (curl resolves, `--socks5`): the metadata address is refused by the
    // guard before anything is dialled.
    let out = e.curl(
        "--socks5",
        Some("agent1:tok-agent1"),
        "http://169.254.169.254/latest/meta-data/",
        &[],
    );
    assert_ne!(out.code, 0);
    let r = e
        .proxy
        .wait_record(|r| r["target_host"] == "169.254.169.254");
    assert_eq!(r["decision"], "deny", "{r}");
    assert!(r["dialed"].is_null(), "{r}");
    // A name that does not resolve: "host unreachable" (reply 4).
    let out = e.curl(
        "--socks5-hostname",
        Some("agent1:tok-agent1"),
        &e.url("nowhere.invalid", "/"),
        &[],
    );
    assert_ne!(out.code, 0);
    let r = e
        .proxy
        .wait_record(|r| r["target_host"] == "nowhere.invalid");
    assert_eq!(r["decision"], "deny", "{r}");
}

/// One raw SOCKS5 exchange up to the request's reply: greeting (login), request; returns the
/// stream and the reply's first two bytes.
fn raw_request(socks: SocketAddr, request: &[u8]) -> (TcpStream, [u8; 2]) {
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 2]).unwrap();
    let mut chosen = [0u8; 2];
    s.read_exact(&mut chosen).unwrap();
    assert_eq!(chosen, [5, 2]);
    let (user, pass) = (b"agent1", b"tok-agent1");
    let mut login = vec![1, user.len() as u8];
    login.extend_from_slice(user);
    login.push(pass.len() as u8);
    login.extend_from_slice(pass);
    s.write_all(&login).unwrap();
    let mut status = [0u8; 2];
    s.read_exact(&mut status).unwrap();
    assert_eq!(status, [1, 0], "login accepted");
    s.write_all(request).unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).unwrap();
    (s, reply)
}

fn named_request(command: u8, name: &str, port: u16) -> Vec<u8> {
    let mut r = vec![5, command, 0, 3, name.len() as u8];
    r.extend_from_slice(name.as_bytes());
    r.extend_from_slice(&port.to_be_bytes());
    r
}

#[test]
fn bind_udp_associate_and_unknown_address_types_get_their_reply_codes() {
    let e = env();
    let port = e.origin.addr.port();
    for (command, name) in [(2u8, "BIND"), (3, "UDP ASSOCIATE")] {
        let (_s, reply) = raw_request(e.socks(), &named_request(command, "origin.test", port));
        assert_eq!(reply, [5, 7], "{name}: command not supported");
        let r = e.proxy.wait_record(|r| {
            r["detail"]
                .as_str()
                .is_some_and(|d| d.contains(&format!("SOCKS5 {name} is not served")))
        });
        assert_eq!(r["reason"], "protocol_not_allowed", "{r}");
    }
    let (_s, reply) = raw_request(e.socks(), &[5, 1, 0, 9, 1, 2, 3, 4, 0, 80]);
    assert_eq!(reply, [5, 8], "address type not supported");
    // SOCKS4 is not served: closed, recorded.
    let mut s = TcpStream::connect(e.socks()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[4, 1, 0, 80, 127, 0, 0, 1, 0]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    let r = e.proxy.wait_record(|r| r["reason"] == "malformed_request");
    assert_eq!(r["mode"], "socks5");
    // Nothing of these reached the origin.
    assert_eq!(
        e.origin.received.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// The tunnel's first bytes are judged like a CONNECT tunnel's: an allowed name, then an
/// HTTP request naming another host, is refused and nothing reaches the origin.
#[test]
fn a_forged_host_inside_a_socks_tunnel_is_refused() {
    let e = env();
    let port = e.origin.addr.port();
    let (mut s, reply) = raw_request(e.socks(), &named_request(1, "origin.test", port));
    assert_eq!(reply, [5, 0], "allowed");
    let mut rest = [0u8; 8];
    s.read_exact(&mut rest).unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: denied.test\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    let r = e.proxy.wait_record(|r| r["reason"] == "host_mismatch");
    assert_eq!(
        (r["mode"].as_str(), r["decision"].as_str()),
        (Some("socks5"), Some("deny"))
    );
    assert_eq!(
        e.origin.received.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[test]
fn a_reload_revokes_an_open_socks_tunnel() {
    let e = env();
    let url = e.url("origin.test", "/slow");
    let socks = format!("agent1:tok-agent1@{}", e.socks());
    let slow = std::thread::spawn(move || {
        let out = curl(&["--socks5-hostname", &socks, &url]);
        (out, Instant::now())
    });
    e.proxy.wait_audit("open", |r| r["mode"] == "socks5");
    // The rule is gone: the tunnel is cut, and the next connection refused.
    let path = e.proxy.config.clone();
    std::fs::write(&path, config(e.dir.path(), e.origin.addr, "other.test")).unwrap();
    let reloaded = Instant::now();
    unsafe_free_kill(e.proxy.child.id(), "HUP");
    let (out, ended) = slow.join().unwrap();
    assert_ne!(out.code, 0, "the download was cut");
    eprintln!(
        "revocation: curl ended {:?} after SIGHUP",
        ended.duration_since(reloaded)
    );
    let r = e
        .proxy
        .wait_record(|r| r["mode"] == "socks5" && r["close"] == "revoked");
    assert!(r["bytes_down"].as_u64().unwrap() > 0, "{r}");
    let out = e.curl(
        "--socks5-hostname",
        Some("agent1:tok-agent1"),
        &e.url("origin.test", "/after"),
        &[],
    );
    assert_ne!(out.code, 0, "refused after the reload");
    let r = e.proxy.wait_record(|r| r["reason"] == "no_rule_matched");
    assert_eq!(r["mode"], "socks5");
}

/// Python's httpx with `httpx[socks]` (socksio): allowed, and a refusal whose exception
/// says the ruleset refused it.
#[test]
fn python_httpx_over_socks5() {
    let e = env();
    let code = format!(
        r#"
import httpx
proxy = "socks5://agent1:tok-agent1@{socks}"
with httpx.Client(proxy=proxy, timeout=10) as c:
    print("allowed", c.get("{ok}").text.strip())
    try:
        c.get("{denied}")
    except Exception as x:
        print("refused", repr(x))
"#,
        socks = e.socks(),
        ok = e.url("origin.test", "/py"),
        denied = e.url("denied.test", "/"),
    );
    let out = Command::new("python3")
        .args(["-c", &code])
        .output()
        .expect("python3");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("allowed hello from origin /py"), "{text}");
    assert!(
        text.contains("refused") && text.contains("Connection not allowed by ruleset"),
        "{text}"
    );
    e.proxy
        .wait_record(|r| r["target_host"] == "denied.test" && r["mode"] == "socks5");
}

/// `egress-proxy observe` shows SOCKS5 decisions as they happen, like every listener's.
#[test]
fn observe_shows_socks5_decisions() {
    let e = env();
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .arg("observe")
        .arg("--admin")
        .arg(format!("http://{}", e.proxy.admin))
        .arg("--token-file")
        .arg(e.dir.path().join("admin.token"))
        .args(["--sandbox", "agent1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let out = child.stdout.take().unwrap();
    let seen = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            seen.lock().unwrap().push(line);
        }
    });
    let denied = e.url("denied.test", "/");
    let line = eventually(Duration::from_secs(15), "a SOCKS5 refusal observed", || {
        e.curl("--socks5-hostname", Some("agent1:tok-agent1"), &denied, &[]);
        let l = lines.lock().unwrap();
        l.iter().find(|l| l.contains("\"socks5\"")).cloned()
    });
    let _ = child.kill();
    let _ = child.wait();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (
            v["sandbox"].as_str(),
            v["reason"].as_str(),
            v["target_host"].as_str()
        ),
        (Some("agent1"), Some("no_rule_matched"), Some("denied.test"))
    );
}

/// A client that connects and says nothing is closed after `admission.first_byte_ms`; one
/// that greets and stalls, after `timeouts.header_ms`. Each is recorded.
#[test]
fn silent_and_stalled_clients_are_closed_and_recorded() {
    let e = env();
    let mut silent = TcpStream::connect(e.socks()).unwrap();
    let mut stalled = TcpStream::connect(e.socks()).unwrap();
    stalled.write_all(&[5, 1, 2]).unwrap();
    for s in [&mut silent, &mut stalled] {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        // The stalled one got its method chosen before it stalled.
        let _ = s.read_to_end(&mut rest);
        assert!(rest.len() <= 2, "{rest:?}");
    }
    e.proxy.wait_record(|r| {
        r["mode"] == "socks5"
            && r["close"] == "idle"
            && r["detail"] == "no SOCKS5 greeting within admission.first_byte_ms"
    });
    e.proxy.wait_record(|r| {
        r["mode"] == "socks5"
            && r["close"] == "idle"
            && r["detail"] == "SOCKS5 negotiation not finished within timeouts.header_ms"
    });
}
