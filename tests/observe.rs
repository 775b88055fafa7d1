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
    let p = Proxy::start(
        dir,
        &format!(
            r#"admin_token_file: {admin}
dns: {{ servers: ["127.0.0.1:9"], hosts: {{ api.test: [127.0.0.1] }} }}
defaults: {{ guard_allow_ranges: [127.0.0.1/32] }}
sandboxes:
  - {{ id: demo, sources: [127.0.0.0/8], policy: {{ provider: local, config: {{}}, network: {{ egress: ["api.test:*"] }} }} }}
  - {{ id: other, auth: {{ token_sha256: {other} }}, policy: {{ provider: local, config: {{}}, network: {{ egress: ["api.test:*"] }} }} }}
"#,
            admin = dir.join("admin.token").display(),
            other = sha("other-token"),
        ),
    );
    (p, origin)
}

/// `egress-proxy observe ARGS` with its stdout collected line by line.
struct Observer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Observer {
    fn start(p: &Proxy, dir: &std::path::Path, args: &[&str]) -> Observer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
            .arg("observe")
            .arg("--admin")
            .arg(format!("http://{}", p.admin))
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
