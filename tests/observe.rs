//! `egress-proxy observe` against the real binary: decisions made while it runs appear at
//! once, filtered by sandbox (another sandbox's never do), as JSON lines or one line for a
//! person; no token, no stream.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

const ADMIN_TOKEN: &str = "observe-admin-token";

fn start(dir: &std::path::Path) -> (Proxy, Origin) {
    let origin = Origin::start(None);
    std::fs::write(dir.join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    let p = ProxyConfig::new()
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("demo")
                .source("127.0.0.0/8")
                .allow("api.test:*"),
        )
        .sandbox(
            SandboxSpec::new("other")
                .token("other-token")
                .allow("api.test:*"),
        )
        .start(dir);
    (p, origin)
}

/// `egress-proxy observe ARGS` with its stdout collected line by line.
struct Observer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Observer {
    fn start(p: &Proxy, dir: &std::path::Path, args: &[&str]) -> Observer {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_egress-proxy"));
        cmd.arg("observe");
        if !args.contains(&"--admin") {
            cmd.arg("--admin").arg(format!("http://{}", p.admin));
        }
        let mut child = cmd
            .arg("--token-file")
            .arg(dir.join("admin.token"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Observer { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A refused CONNECT of sandbox demo (a decision every observer of demo sees).
fn denied(p: &Proxy, host: &str) {
    let head = raw_exchange(
        p.proxy,
        format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    );
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
}

/// Make refusals until the observer shows one: it is subscribed from then on.
fn until_subscribed(p: &Proxy, o: &Observer) {
    eventually(Duration::from_secs(10), "the observer's first line", || {
        denied(p, "warmup.test");
        (!o.lines().is_empty()).then_some(())
    });
}

#[test]
fn observe_shows_a_sandboxs_decisions_as_they_happen_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (p, origin) = start(dir.path());
    let json = Observer::start(&p, dir.path(), &["--sandbox", "demo", "--json"]);
    let human = Observer::start(&p, dir.path(), &["--sandbox", "demo", "--decision", "deny"]);
    until_subscribed(&p, &json);
    until_subscribed(&p, &human);

    // Another sandbox's decisions: not shown.
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://other:other-token@{}", p.proxy),
        &format!("http://denied-for-other.test:{}/", origin.addr.port()),
    ]);
    assert_eq!(out.code, 0, "{}", out.text());
    // An allow and a deny of demo, made now.
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://{}", p.proxy),
        &format!("http://api.test:{}/", origin.addr.port()),
    ]);
    assert_eq!(out.code, 0, "{}", out.text());
    denied(&p, "evil.test");

    let records = eventually(Duration::from_secs(10), "the allow and the deny", || {
        let records: Vec<serde_json::Value> = json
            .lines()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let allow = records
            .iter()
            .any(|r| r["decision"] == "allow" && r["target_host"] == "api.test");
        let deny = records
            .iter()
            .any(|r| r["decision"] == "deny" && r["target_host"] == "evil.test");
        (allow && deny).then_some(records)
    });
    assert!(
        records.iter().all(|r| r["sandbox"] == "demo"),
        "{records:?}"
    );
    assert!(!json.lines().iter().any(|l| l.contains("denied-for-other")));

    // The person's view: one line per decision, denials only (as asked).
    let lines = eventually(
        Duration::from_secs(10),
        "the deny in the human view",
        || {
            let lines = human.lines();
            lines
                .iter()
                .any(|l| l.contains("DENY") && l.contains("evil.test:443 no_rule_matched"))
                .then_some(lines)
        },
    );
    assert!(lines.iter().all(|l| l.contains("DENY")), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.contains("\x1b[")),
        "no colour off a terminal"
    );
}

#[test]
fn observe_needs_the_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _origin) = start(dir.path());
    std::fs::write(dir.path().join("wrong.token"), "wrong\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["observe", "--admin", &format!("http://{}", p.admin)])
        .arg("--token-file")
        .arg(dir.path().join("wrong.token"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401"), "{err}");
    assert!(!err.contains("wrong"), "the token is never printed: {err}");
    let (status, _) = http_get(p.admin, "/v1/observe");
    assert_eq!(status, 401);
}

/// A filter value no record can carry is refused, never followed silently for ever: the CLI
/// says which values exist, the API answers 400.
#[test]
fn unknown_filter_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _origin) = start(dir.path());
    for args in [["--decision", "DENY"], ["--reason", "blocked"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
            .args(["observe", "--admin", &format!("http://{}", p.admin)])
            .arg("--token-file")
            .arg(dir.path().join("admin.token"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("possible values"), "{err}");
    }
    for query in ["decision=blocked", "reason=nope"] {
        let (status, body) = admin_req(
            p.admin,
            "GET",
            &format!("/v1/observe?{query}"),
            "",
            Some(ADMIN_TOKEN),
        );
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains("nothing would ever match"), "{body}");
    }
}

/// Without an admin token configured, observe is refused with a message that says the call
/// needs one (not that it is a "mutating" call).
#[test]
fn observe_without_a_configured_token_says_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let p = ProxyConfig::new()
        .sandbox(
            SandboxSpec::new("demo")
                .source("127.0.0.0/8")
                .allow("a.test"),
        )
        .start(dir.path());
    std::fs::write(dir.path().join("some.token"), "x\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["observe", "--admin", &format!("http://{}", p.admin)])
        .arg("--token-file")
        .arg(dir.path().join("some.token"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("403"), "{err}");
    assert!(
        err.contains("this call needs the admin token, and none is configured"),
        "{err}"
    );
    assert!(!err.contains("mutating"), "{err}");
}

/// `observe` follows an `https://` admin listener (`listen.admin_tls`), trusting its CA with
/// `--cacert`; without it the certificate is refused and nothing is sent.
#[test]
fn observe_follows_a_tls_admin_listener() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(None);
    std::fs::write(dir.path().join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    let p = ProxyConfig::new()
        .listen_at(
            "admin_tls",
            &format!(
                "{{ cert_file: {}, key_file: {} }}",
                ca.cert_pem.display(),
                ca.key_pem.display()
            ),
        )
        .admin_token_file(&dir.path().join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .sandbox(
            SandboxSpec::new("demo")
                .source("127.0.0.0/8")
                .allow("api.test:*"),
        )
        .start(dir.path());
    let url = format!("https://{}", p.admin);
    // Not trusted without --cacert.
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["observe", "--admin", &url])
        .arg("--token-file")
        .arg(dir.path().join("admin.token"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS") || err.contains("certificate"), "{err}");
    let ca_pem = ca.ca_pem.display().to_string();
    let o = Observer::start(
        &p,
        dir.path(),
        &["--admin", &url, "--cacert", &ca_pem, "--json"],
    );
    until_subscribed(&p, &o);
    drop(origin);
    assert!(
        o.lines().iter().any(|l| l.contains("warmup.test")),
        "{:?}",
        o.lines()
    );
}
