//! Access requests from inside a sandbox (issue 41), with the real binary, curl and the CLI:
//! a refusal says how to ask; the agent asks at `http://egress-proxy.local`; a person
//! approves with `egress-proxy approve ID --ttl`; the grant lets the same request through
//! and, at its expiry, refuses it again and cuts the tunnel it allowed; every step is in the
//! signed audit chain. Also: another sandbox cannot see or use the request, requests are
//! bounded, deny rules stay above grants, auto-approval approves only what adds no
//! dangerous reach, and a webhook approves inline — unless its reply's signature is wrong.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const ADMIN_TOKEN: &str = "approvals-admin-token";

/// An Ed25519 key pair made by openssl: (private PEM, public PEM).
fn keypair(dir: &Path) -> (PathBuf, PathBuf) {
    let sk = dir.join("audit.pem");
    let pk = dir.join("audit.pub.pem");
    let run = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .status()
            .expect("openssl")
            .success();
        assert!(ok, "openssl {args:?}");
    };
    run(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        sk.to_str().unwrap(),
    ]);
    run(&[
        "pkey",
        "-pubout",
        "-in",
        sk.to_str().unwrap(),
        "-out",
        pk.to_str().unwrap(),
    ]);
    (sk, pk)
}

struct Env {
    dir: tempfile::TempDir,
    ca: TestCa,
    https: Origin,
    proxy: Proxy,
    public_key: PathBuf,
}

/// The configuration of [`env`] in `d` (its signing key `d/audit.pem`).
fn config(d: &Path, extra: &str) -> ProxyConfig {
    ProxyConfig::new()
        .audit("chain: true")
        .audit(&format!(
            "signing_key_file: {}",
            d.join("audit.pem").display()
        ))
        .admin_token_file(&d.join("admin.token"))
        .raw(&format!("state_dir: {}", d.join("state").display()))
        .dns_server("127.0.0.1:9")
        .host("granted.test", "127.0.0.1")
        .host("denied.test", "127.0.0.1")
        .host("pub.auto.test", "127.0.0.1")
        .host("inside.auto.test", "10.1.2.3")
        .host("someone.github.io", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .raw(extra)
        .sandbox(
            SandboxSpec::new("agent")
                .token("tok-agent")
                .allow("allowed.test")
                .deny("denied.test"),
        )
        .sandbox(
            SandboxSpec::new("other")
                .token("tok-other")
                .allow("allowed.test"),
        )
}

/// A proxy with sandboxes `agent` and `other`, a signed audit chain, `extra` top-level YAML.
fn env(extra: &str) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    let (_, pk) = keypair(d);
    let config = config(d, extra);
    let ca = TestCa::generate(d);
    let https = Origin::start(Some(&ca));
    let proxy = config.start(d);
    Env {
        dir,
        ca,
        https,
        proxy,
        public_key: pk,
    }
}

impl Env {
    fn px(&self, who: &str) -> String {
        format!("http://{who}:tok-{who}@{}", self.proxy.proxy)
    }

    /// `https://HOST:PORT/PATH` through the proxy as `who`.
    fn get(&self, who: &str, host: &str, path: &str) -> CurlOut {
        let ca = self.ca.ca_pem.display().to_string();
        let url = format!("https://{host}:{}{path}", self.https.addr.port());
        curl(&["-x", &self.px(who), "--cacert", &ca, &url])
    }

    /// A call to the in-sandbox endpoint as `who`: (status, JSON body).
    fn ask(&self, who: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let url = format!("http://egress-proxy.local{path}");
        let mut args = vec![
            "-x",
            &*Box::leak(self.px(who).into_boxed_str()),
            "-X",
            method,
        ];
        if let Some(b) = body {
            args.extend(["-H", "Content-Type: application/json", "--data-binary", b]);
        }
        args.extend(["-w", "\n%{http_code}", &*Box::leak(url.into_boxed_str())]);
        let out = curl(&args);
        let text = out.text();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (
            status.trim().parse().unwrap_or(0),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }

    /// `egress-proxy ARGS --admin … --token-file …`: (exit code, output).
    fn cli(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
            .args(args)
            .arg("--admin")
            .arg(format!("http://{}", self.proxy.admin))
            .arg("--token-file")
            .arg(self.dir.path().join("admin.token"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn request(&self, who: &str, host: &str, reason: &str) -> (u16, Value) {
        let body = format!(
            r#"{{"host": "{host}", "port": {}, "reason": "{reason}"}}"#,
            self.https.addr.port()
        );
        self.ask(who, "POST", "/v1/requests", Some(&body))
    }
}

/// The whole loop: refused → asked → approved for 3 s → passes → at expiry refused again
/// and the tunnel the grant allowed is cut; the records of every step verify.
#[test]
fn the_agent_asks_a_person_approves_and_the_grant_ends_on_time() {
    let e = env("");
    // Refused, and told how to ask (JSON for an agent that asks for it).
    assert_ne!(e.get("agent", "granted.test", "/").code, 0);
    let url = format!("http://granted.test:{}/", e.https.addr.port());
    let out = curl(&[
        "-x",
        &e.px("agent"),
        "-H",
        "Accept: application/json",
        "-i",
        &url,
    ]);
    let text = out.text();
    assert!(text.contains(" 403 "), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("request-access=\"http://egress-proxy.local/v1/requests\""),
        "{text}"
    );
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").last().unwrap()).unwrap();
    assert_eq!(
        body["request_access"]["url"],
        "http://egress-proxy.local/v1/requests"
    );
    assert_eq!(body["request_access"]["body"]["host"], "granted.test");
    // What the sandbox was refused, from inside.
    let (status, denials) = e.ask("agent", "GET", "/v1/denials", None);
    assert_eq!(status, 200, "{denials}");
    assert!(
        denials["denials"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["host"] == "granted.test"),
        "{denials}"
    );

    // The agent asks; the sandbox is the connection's, never the body's.
    let (status, r) = e.request("agent", "granted.test", "fetch the docs");
    assert_eq!(status, 202, "{r}");
    assert_eq!(r["state"], "pending");
    assert_eq!(r["sandbox"], "agent");
    let id = r["id"].as_str().unwrap().to_string();
    // A long poll that nobody answers returns pending after its wait.
    let t = Instant::now();
    let (_, polled) = e.ask("agent", "GET", &format!("/v1/requests/{id}?wait=1"), None);
    assert_eq!(polled["state"], "pending");
    assert!(t.elapsed() >= Duration::from_millis(900));
    // Another sandbox neither sees it nor passes.
    let (status, _) = e.ask("other", "GET", &format!("/v1/requests/{id}"), None);
    assert_eq!(status, 404);

    // A person lists and approves it for 3 s.
    let (code, listed) = e.cli(&["requests", "--state", "pending"]);
    assert_eq!(code, 0, "{listed}");
    assert!(
        listed.contains(&id) && listed.contains("granted.test"),
        "{listed}"
    );
    let poll = {
        let (px, id) = (e.px("agent"), id.clone());
        std::thread::spawn(move || {
            let url = format!("http://egress-proxy.local/v1/requests/{id}?wait=20");
            let out = curl(&["-x", &px, &url]);
            (Instant::now(), out.text())
        })
    };
    // The long poll is parked before the approval is given.
    eventually(Duration::from_secs(10), "the long poll to wait", || {
        (e.proxy.metric("egress_approval_long_polls")? >= 1.0).then_some(())
    });
    let asked_at = Instant::now();
    let (code, approved) = e.cli(&["approve", &id, "--ttl", "3s", "--note", "ok for docs"]);
    let (answered_at, polled) = poll.join().unwrap();
    assert!(polled.contains("\"approved\""), "{polled}");
    eprintln!(
        "a waiting long poll learnt of the approval {:?} after `egress-proxy approve` started",
        answered_at.duration_since(asked_at)
    );
    assert_eq!(code, 0, "{approved}");
    assert!(
        !approved.contains(ADMIN_TOKEN),
        "the token is never printed"
    );
    let approved_at = Instant::now();
    let (_, polled) = e.ask("agent", "GET", &format!("/v1/requests/{id}?wait=5"), None);
    assert_eq!(polled["state"], "approved", "{polled}");
    assert_eq!(polled["grant"], "ttl");

    // The same request passes now, for this sandbox only, and says why.
    let out = e.get("agent", "granted.test", "/");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "granted.test" && r["decision"] == "allow");
    assert_eq!(rec["reason"], "grant_matched");
    assert!(rec["rule_source"].as_str().unwrap().contains(&id), "{rec}");
    assert_ne!(e.get("other", "granted.test", "/").code, 0);
    // Deny rules stay above every grant: the sandbox cannot even ask for them.
    let (status, r) = e.request("agent", "denied.test", "please");
    assert_eq!(status, 409, "{r}");

    // A tunnel opened under the grant, then the expiry: cut, and refused again.
    let ca = e.ca.ca_pem.display().to_string();
    let px = e.px("agent");
    let slow_url = format!("https://granted.test:{}/slow", e.https.addr.port());
    let slow = std::thread::spawn(move || curl(&["-x", &px, "--cacert", &ca, &slow_url]));
    let out = slow.join().unwrap();
    let ended = approved_at.elapsed();
    assert_ne!(out.code, 0, "the download under the grant was cut");
    assert!(ended < Duration::from_secs(30), "cut after {ended:?}");
    eprintln!("grant of 3 s: the tunnel under it ended {ended:?} after the approval");
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "granted.test" && r["close"] == "revoked");
    assert_eq!(rec["reason"], "grant_matched");
    // The record says why it was cut (clients review F4).
    assert_eq!(
        rec["detail"],
        format!("cut: grant {id} ended (expired or revoked)"),
        "{rec}"
    );
    assert_ne!(e.get("agent", "granted.test", "/").code, 0);
    let (_, r) = e.ask("agent", "GET", &format!("/v1/requests/{id}"), None);
    assert_eq!(r["state"], "expired");

    // Every step is a record, and the whole chain verifies with the public key.
    let steps = e.proxy.wait_audit("end", |r| {
        r["mode"] == "approval" && r["approval"]["step"] == "expired"
    });
    assert_eq!(steps["approval"]["request"], id.as_str());
    let recs = e.proxy.audit_records();
    for step in ["requested", "approved"] {
        assert!(
            recs.iter()
                .any(|r| r["approval"]["step"] == step && r["approval"]["request"] == id.as_str()),
            "no {step} record"
        );
    }
    let approved = recs
        .iter()
        .find(|r| r["approval"]["step"] == "approved")
        .unwrap();
    assert_eq!(approved["approval"]["by"], "admin");
    assert_eq!(approved["approval"]["text"], "ok for docs");
    let mut p = e.proxy;
    p.terminate();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["audit", "verify"])
        .arg(e.dir.path().join("audit.jsonl"))
        .arg("--public-key")
        .arg(&e.public_key)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
}

/// `once` is one exchange; a denial is final; a grant survives a restart (state_dir).
#[test]
fn once_is_one_exchange_a_denial_is_final_and_grants_survive_a_restart() {
    let mut e = env("");
    let (_, r) = e.request("agent", "granted.test", "one look");
    let id = r["id"].as_str().unwrap().to_string();
    let (code, out) = e.cli(&["approve", &id, "--once"]);
    assert_eq!(code, 0, "{out}");
    let first = e.get("agent", "granted.test", "/");
    assert_eq!(
        first.code,
        0,
        "{} {:#?}",
        first.stderr,
        e.proxy.audit_records()
    );
    assert_ne!(
        e.get("agent", "granted.test", "/").code,
        0,
        "a once grant is spent"
    );
    let rec = e.proxy.wait_record(|r| {
        r["target_host"] == "granted.test"
            && r["decision"] == "deny"
            && r["detail"].as_str().is_some_and(|d| d.contains("used"))
    });
    assert_eq!(rec["reason"], "no_rule_matched");

    // A denial: the request is final, another answer conflicts.
    let (_, r) = e.request("agent", "granted.test", "again");
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(e.cli(&["deny", &id, "--note", "no"]).0, 0);
    let (_, r) = e.ask("agent", "GET", &format!("/v1/requests/{id}?wait=2"), None);
    assert_eq!(r["state"], "denied");
    let (code, out) = e.cli(&["approve", &id]);
    assert_ne!(code, 0);
    assert!(out.contains("409"), "{out}");

    // A permanent grant is kept in state_dir and holds after a restart.
    let (_, r) = e.request("agent", "granted.test", "for good");
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(e.cli(&["approve", &id, "--permanent"]).0, 0);
    assert_eq!(e.get("agent", "granted.test", "/").code, 0);
    // A reload (the configuration read again) keeps it.
    let token = Some(ADMIN_TOKEN);
    assert_eq!(
        admin_req(e.proxy.admin, "POST", "/v1/reload", "", token).0,
        200
    );
    assert_eq!(
        e.get("agent", "granted.test", "/").code,
        0,
        "the grant survived a reload"
    );
    e.proxy.terminate();
    let d = e.dir.path();
    e.proxy = Proxy::start_with(d.join("proxy.yaml"), d.join("audit.jsonl"), &[]);
    let out = e.get("agent", "granted.test", "/");
    assert_eq!(
        out.code, 0,
        "the grant survived the restart: {}",
        out.stderr
    );
    // Standing grants are listed, restored ones included (clients review F14): by the CLI,
    // and as JSON by the admin API, with the id `revoke` takes.
    let (code, out) = e.cli(&["grants"]);
    assert_eq!(code, 0, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains(&format!("agent  granted.test:{}", e.https.addr.port()))
            && line.contains("permanent  no end  by admin"),
        "{line}"
    );
    let (code, out) = e.cli(&["grants", "--sandbox", "agent", "--json"]);
    assert_eq!(code, 0, "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let grants = listed["grants"].as_array().unwrap();
    let spent = grants
        .iter()
        .find(|g| g["kind"] == "once")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(spent["used"], true, "{listed}");
    let standing = grants.iter().find(|g| g["id"] == id.as_str()).unwrap();
    assert_eq!(
        (standing["approver"].as_str(), standing["expires"].as_str()),
        (Some("admin"), None)
    );
    let (code, out) = e.cli(&["grants", "--sandbox", "other"]);
    assert_eq!((code, out.as_str()), (0, "no grants\n"));
    // Revoked before its end: a tunnel it allowed is cut, new ones are refused.
    let ca = e.ca.ca_pem.display().to_string();
    let px = e.px("agent");
    let slow_url = format!("https://granted.test:{}/slow", e.https.addr.port());
    let opened = |p: &Proxy| {
        p.audit_records()
            .iter()
            .filter(|r| r["event"] == "open" && r["target_host"] == "granted.test")
            .count()
    };
    let before = opened(&e.proxy);
    let slow = std::thread::spawn(move || curl(&["-x", &px, "--cacert", &ca, &slow_url]));
    eventually(Duration::from_secs(10), "the tunnel opens", || {
        (opened(&e.proxy) > before).then_some(())
    });
    let (code, out) = e.cli(&["revoke", &id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"revoked\""), "{out}");
    assert_ne!(
        slow.join().unwrap().code,
        0,
        "the tunnel under the revoked grant was cut"
    );
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "granted.test" && r["close"] == "revoked");
    assert_eq!(rec["reason"], "grant_matched");
    assert_ne!(e.get("agent", "granted.test", "/").code, 0);
    // The refusal after the revoke names the revoked grant, not only the older spent `once`
    // grant for the same destination (clients review F4).
    let refused = e.proxy.wait_record(|r| {
        r["target_host"] == "granted.test"
            && r["decision"] == "deny"
            && r["detail"].as_str().is_some_and(|d| d.contains("revoked"))
    });
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("grant {id} was revoked")),
        "{refused}"
    );
    let (code, out) = e.cli(&["revoke", &id]);
    assert_ne!(code, 0, "{out}");
    let (_, out) = e.cli(&["grants", "--json"]);
    assert!(
        !out.contains(&id),
        "a revoked grant is no longer listed: {out}"
    );
}

/// Security review A04: a `once` grant's spending was never persisted, so every restart gave
/// it back (SIGTERM: 200, 200; SIGKILL: 200, 200). Spending is now journalled in `state_dir`
/// before the exchange leaves: after a stop, and after a kill straight after the spend, the
/// spent grant refuses.
#[test]
fn a_spent_once_grant_stays_spent_across_a_stop_and_a_kill() {
    let mut e = env("");
    for kill in [false, true] {
        let host = if kill {
            "granted.test"
        } else {
            "pub.auto.test"
        };
        let (_, r) = e.request("agent", host, "one look");
        let id = r["id"].as_str().unwrap().to_string();
        let (code, out) = e.cli(&["approve", &id, "--once"]);
        assert_eq!(code, 0, "{out}");
        let first = e.get("agent", host, "/");
        assert_eq!(first.code, 0, "the grant's one exchange: {}", first.stderr);
        if kill {
            let _ = e.proxy.child.kill();
            let _ = e.proxy.child.wait();
        } else {
            e.proxy.terminate();
        }
        let d = e.dir.path();
        e.proxy = Proxy::start_with(d.join("proxy.yaml"), d.join("audit.jsonl"), &[]);
        let again = e.get("agent", host, "/");
        assert_ne!(again.code, 0, "spent before the restart (kill: {kill})");
        let rec = e.proxy.wait_record(|r| {
            r["target_host"] == host
                && r["decision"] == "deny"
                && r["detail"].as_str().is_some_and(|d| d.contains("used"))
        });
        assert_eq!(rec["reason"], "no_rule_matched");
    }
}

/// Security review A05: grants outlived their sandbox. A runtime sandbox got a permanent
/// grant, was deleted and registered again by a new tenant; after any other approval for the
/// id, and after a restart, the old grant served the new tenant. A DELETE now ends the
/// sandbox's grants (memory and `state_dir`) with a `revoked` record, and the new tenant
/// starts with none — then, after another approval, and after a restart.
#[test]
fn a_deleted_sandboxs_grants_do_not_pass_to_the_next_tenant_of_its_id() {
    let mut e = env("");
    let token = Some(ADMIN_TOKEN);
    let register = |e: &Env, secret: &str| {
        let body = format!(
            r#"{{"auth":{{"token_sha256":"{}"}},"policy":{{"provider":"local","config":{{}},"network":{{"egress":["allowed.test"]}}}}}}"#,
            sha(secret)
        );
        let (code, out) = admin_req(e.proxy.admin, "PUT", "/v1/sandboxes/rt1", &body, token);
        assert!(code == 200 || code == 201, "{code} {out}");
    };
    register(&e, "tok-rt1");
    let (_, r) = e.request("rt1", "granted.test", "old tenant");
    let old = r["id"].as_str().unwrap().to_string();
    assert_eq!(e.cli(&["approve", &old, "--permanent"]).0, 0);
    assert_eq!(e.get("rt1", "granted.test", "/").code, 0, "granted");
    let (code, out) = admin_req(e.proxy.admin, "DELETE", "/v1/sandboxes/rt1", "", token);
    assert_eq!(code, 200, "{out}");
    let rec = e.proxy.wait_record(|r| {
        r["approval"]["request"] == old.as_str() && r["approval"]["step"] == "revoked"
    });
    assert_eq!(rec["approval"]["by"], "deletion", "{rec}");
    // A new tenant of the id (the test's `get` uses `tok-rt1`: same id, new registration).
    register(&e, "tok-rt1");
    let new_tenant = |e: &Env| e.get("rt1", "granted.test", "/").code;
    assert_ne!(new_tenant(&e), 0, "nothing inherited at once");
    let (_, r) = e.request("rt1", "pub.auto.test", "something else");
    let other = r["id"].as_str().unwrap().to_string();
    assert_eq!(e.cli(&["approve", &other, "--permanent"]).0, 0);
    assert_eq!(e.get("rt1", "pub.auto.test", "/").code, 0);
    assert_ne!(
        new_tenant(&e),
        0,
        "nothing inherited after another approval"
    );
    let grants = std::fs::read_to_string(e.dir.path().join("state/grants.json")).unwrap();
    assert!(!grants.contains(&old), "{grants}");
    e.proxy.terminate();
    let d = e.dir.path();
    e.proxy = Proxy::start_with(d.join("proxy.yaml"), d.join("audit.jsonl"), &[]);
    assert_ne!(new_tenant(&e), 0, "nothing inherited after a restart");
    assert_eq!(
        e.get("rt1", "pub.auto.test", "/").code,
        0,
        "its own grant holds"
    );
}

/// Security review round C, C3d: a `once` grant served five requests on one kept plain
/// connection. A `once` grant is one *request* wherever the proxy frames requests: through a
/// CONNECT tunnel carrying plain HTTP (the same relay as a transparent connection), the first
/// of five requests on the connection is served and the second ends it.
#[test]
fn a_once_grant_is_one_request_on_a_kept_plain_connection() {
    let e = env("");
    let port = keepalive_origin("127.0.0.1");
    let body = format!(r#"{{"host": "granted.test", "port": {port}, "reason": "one look"}}"#);
    let (_, r) = e.ask("agent", "POST", "/v1/requests", Some(&body));
    let id = r["id"].as_str().unwrap().to_string();
    let (code, out) = e.cli(&["approve", &id, "--once"]);
    assert_eq!(code, 0, "{out}");
    let px = e.px("agent");
    let mut args = vec!["-p", "-x", &px];
    let urls: Vec<String> = (0..5)
        .map(|i| format!("http://granted.test:{port}/kept-{i}"))
        .collect();
    args.extend(urls.iter().map(String::as_str));
    let out = curl(&args);
    assert_eq!(
        out.text().matches("hello from origin").count(),
        1,
        "{} {}",
        out.text(),
        out.stderr
    );
    let rec = e.proxy.wait_record(|r| {
        r["detail"]
            .as_str()
            .is_some_and(|d| d.contains("was for one request"))
    });
    assert_eq!(rec["decision"], "deny", "{rec}");
}

/// Security review A31: the `requested` record said `identity: "none"` for a sandbox a token
/// identified, and the `approved` one `client: 0.0.0.0:0` with no credential. Now the request
/// says how the sandbox was identified, and the answer the admin's address and which
/// credential it used (the admin token's digest, never the token).
#[test]
fn approval_records_say_who_asked_and_who_answered_from_where() {
    let e = env("");
    let (_, r) = e.request("agent", "granted.test", "who");
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(e.cli(&["approve", &id, "--once"]).0, 0);
    let asked = e.proxy.wait_record(|r| {
        r["approval"]["request"] == id.as_str() && r["approval"]["step"] == "requested"
    });
    assert_eq!(asked["identity"], "token", "{asked}");
    let answered = e.proxy.wait_record(|r| {
        r["approval"]["request"] == id.as_str() && r["approval"]["step"] == "approved"
    });
    let client = answered["client"].as_str().unwrap_or_default();
    assert!(
        client.starts_with("127.0.0.1:") && !client.ends_with(":0"),
        "{answered}"
    );
    let credential = answered["approval"]["credential"]
        .as_str()
        .unwrap_or_default();
    assert!(credential.starts_with("token sha256:"), "{answered}");
    let text = std::fs::read_to_string(e.dir.path().join("audit.jsonl")).unwrap();
    assert!(
        !text.contains(ADMIN_TOKEN),
        "the admin token is never recorded"
    );
}

/// Security review A07: a reason with bidi overrides and a line separator was printed raw to
/// the approver by `egress-proxy requests`. The CLI now shows such characters as escapes (the
/// JSON output still parses to the same reason) and the record keeps the text verbatim.
#[test]
fn reasons_are_shown_to_the_approver_escaped_and_kept_verbatim() {
    let e = env("");
    // JSON escapes in the request body: the proxy reads the characters themselves.
    let reason = r"harmless\u202e txt.exe\u2028approved by security\u200b";
    let (status, r) = e.request("agent", "granted.test", reason);
    assert_eq!(status, 202, "{r}");
    let raw = "harmless\u{202e} txt.exe\u{2028}approved by security\u{200b}";
    assert_eq!(r["reason"], raw);
    let (code, out) = e.cli(&["requests"]);
    assert_eq!(code, 0, "{out}");
    for c in ['\u{202e}', '\u{2028}', '\u{200b}'] {
        assert!(!out.contains(c), "{c:?} printed raw: {out:?}");
    }
    assert!(out.contains("\\u{202e}"), "{out}");
    let (code, out) = e.cli(&["requests", "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains('\u{202e}'), "{out:?}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["requests"][0]["reason"], raw, "the same value, escaped");
    let rec = e
        .proxy
        .wait_record(|r| r["approval"]["step"] == "requested");
    assert_eq!(rec["approval"]["text"], raw, "verbatim in the record");
}

/// A sandbox removed from the configuration file by a reload takes its grants with it, as a
/// `DELETE` does: put back by the next reload, it has none.
#[test]
fn a_sandbox_removed_by_a_reload_takes_its_grants_with_it() {
    let e = env("");
    let (_, r) = e.request("other", "granted.test", "before the reload");
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(e.cli(&["approve", &id, "--permanent"]).0, 0);
    assert_eq!(e.get("other", "granted.test", "/").code, 0, "granted");
    let cfg = e.dir.path().join("proxy.yaml");
    let full = std::fs::read_to_string(&cfg).unwrap();
    let cut = full.find("  - id: other").unwrap();
    let token = Some(ADMIN_TOKEN);
    std::fs::write(&cfg, &full[..cut]).unwrap();
    let (code, out) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", token);
    assert_eq!(code, 200, "{out}");
    let rec = e.proxy.wait_record(|r| {
        r["approval"]["request"] == id.as_str() && r["approval"]["step"] == "revoked"
    });
    assert_eq!(rec["approval"]["by"], "deletion", "{rec}");
    std::fs::write(&cfg, &full).unwrap();
    let (code, out) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", token);
    assert_eq!(code, 200, "{out}");
    assert_ne!(
        e.get("other", "granted.test", "/").code,
        0,
        "no grant after it came back"
    );
}

/// A flood costs what the caps allow: per-minute and pending caps answer 429, a long reason
/// or a body naming another sandbox 400; nothing asked of another sandbox's name leaks.
#[test]
fn requests_are_bounded_and_checked() {
    let e = env("approvals: { max_pending: 2, per_minute: 3 }");
    for i in 0..2 {
        let (status, r) = e.request("agent", &format!("h{i}.test"), "x");
        assert_eq!(status, 202, "{r}");
    }
    let (status, r) = e.request("agent", "h2.test", "x");
    assert_eq!(status, 429, "{r}");
    assert!(r["error"].as_str().unwrap().contains("max_pending"), "{r}");
    // A reload puts new bounds in force for the next request.
    let d = e.dir.path();
    let wider = config(d, "approvals: { max_pending: 3, per_minute: 3 }");
    std::fs::write(d.join("proxy.yaml"), wider.yaml(&d.join("audit.jsonl"))).unwrap();
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    let (status, r) = e.request("agent", "h2.test", "x");
    assert_eq!(status, 202, "{r}");
    let (status, r) = e.request("agent", "h5.test", "x");
    assert_eq!(status, 429, "{r}");
    let long = "y".repeat(600);
    let (status, _) = e.request("agent", "h3.test", &long);
    assert_eq!(status, 400);
    let (status, r) = e.ask(
        "agent",
        "POST",
        "/v1/requests",
        Some(r#"{"host": "h4.test", "reason": "x", "sandbox": "other"}"#),
    );
    assert_eq!(status, 400, "{r}");
    // An allowed host needs no request.
    let allowed = r#"{"host": "allowed.test", "port": 443, "reason": "x"}"#;
    let (status, r) = e.ask("other", "POST", "/v1/requests", Some(allowed));
    assert_eq!(status, 409, "{r}");
    // Without credentials the endpoint answers nobody.
    let out = curl(&[
        "-x",
        &format!("http://{}", e.proxy.proxy),
        "-i",
        "http://egress-proxy.local/v1/denials",
    ]);
    assert!(out.text().contains(" 407 "), "{}", out.text());
    // Nor is it reached over CONNECT.
    let out = curl(&[
        "-x",
        &e.px("agent"),
        "https://egress-proxy.local/v1/denials",
    ]);
    assert_ne!(out.code, 0);
}

/// Auto-approval: a matching public name at once; the same pattern for a name in 10/8, and a
/// wildcard above registrable domains (a private public suffix), wait for a person.
#[test]
fn auto_approval_grants_only_what_adds_no_dangerous_reach() {
    let e = env(r#"approvals: { auto: ["*.auto.test:*", "*.github.io:*"], auto_ttl_s: 60 }"#);
    let (status, r) = e.request("agent", "pub.auto.test", "tests");
    assert_eq!(status, 202, "{r}");
    assert_eq!(r["state"], "approved", "{r}");
    assert_eq!(r["answered_by"], "auto");
    assert!(
        r["checks"].to_string().contains("public_addresses: passed"),
        "{r}"
    );
    assert_eq!(e.get("agent", "pub.auto.test", "/").code, 0);

    let (_, r) = e.request("agent", "inside.auto.test", "tests");
    assert_eq!(r["state"], "pending", "{r}");
    assert!(
        r["checks"]
            .to_string()
            .contains("public_addresses: failed (10.1.2.3"),
        "{r}"
    );

    let (_, r) = e.request("agent", "someone.github.io", "tests");
    assert_eq!(r["state"], "pending", "{r}");
    assert!(
        r["checks"].to_string().contains("registrable: failed"),
        "{r}"
    );
    let rec = e
        .proxy
        .wait_record(|r| r["approval"]["step"] == "approved" && r["approval"]["by"] == "auto");
    assert!(
        rec["approval"]["checks"]
            .to_string()
            .contains("pattern: `*.auto.test:*`"),
        "{rec}"
    );
}

/// A webhook that signs its reply approves inline; one whose signature is wrong is ignored
/// (the request waits for a person). The request it gets is signed and verifies. A signed
/// reply with `ttl_s: u64::MAX` (security review A09: a panic that left the request
/// "approved" with no grant and no record) is refused like the admin API refuses it: the
/// request stays pending and a person can still answer it.
#[test]
fn a_webhook_approves_inline_and_a_bad_signature_is_ignored() {
    let secret = b"webhook-secret-for-tests";
    let hook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = hook.local_addr().unwrap();
    let served = std::thread::spawn(move || {
        let mut verified = Vec::new();
        for _ in 0..4 {
            let (mut s, _) = hook.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head, body) = loop {
                let n = s.read(&mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some((h, b)) = text.split_once("\r\n\r\n") {
                    let len: usize = h
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if b.len() >= len {
                        break (h.to_string(), b.to_string());
                    }
                }
            };
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| {
                        l.split_once(':')
                            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                            .map(|(_, v)| v.trim().to_string())
                    })
                    .unwrap_or_default()
            };
            let now = egress_proxy::approvals::webhook::now_secs();
            verified.push(egress_proxy::approvals::webhook::verify(
                secret,
                &header("x-egress-proxy-timestamp"),
                &header("x-egress-proxy-signature"),
                body.as_bytes(),
                now,
            ));
            let asked: Value = serde_json::from_str(&body).unwrap();
            let id = asked["request"]["id"].as_str().unwrap();
            // Chosen by what was asked, not by arrival order (the last two race).
            let ttl = if body.contains("huge ttl") {
                u64::MAX
            } else {
                60
            };
            let reply = match body.contains("no grant") {
                true => format!(r#"{{"id": "{id}", "decision": "approve"}}"#),
                false => format!(
                    r#"{{"id": "{id}", "decision": "approve", "grant": "ttl", "ttl_s": {ttl}}}"#
                ),
            };
            let key: &[u8] = if body.contains("forged") {
                b"not-the-secret"
            } else {
                secret
            };
            let sig = egress_proxy::approvals::webhook::sign(key, now, reply.as_bytes());
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Egress-Proxy-Timestamp: {now}\r\nX-Egress-Proxy-Signature: {sig}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            )
            .unwrap();
        }
        verified
    });
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("hook.secret");
    std::fs::write(&secret_file, secret).unwrap();
    let e = env(&format!(
        "approvals: {{ webhook: {{ url: \"http://{addr}/hook\", secret_file: {} }} }}",
        secret_file.display()
    ));
    let (_, r) = e.request("agent", "granted.test", "signed");
    let good = r["id"].as_str().unwrap().to_string();
    let (_, r) = e.ask(
        "agent",
        "GET",
        &format!("/v1/requests/{good}?wait=10"),
        None,
    );
    assert_eq!(r["state"], "approved", "{r}");
    assert_eq!(r["answered_by"], "webhook");
    let (_, r) = e.request("agent", "other.granted.test", "forged");
    let bad = r["id"].as_str().unwrap().to_string();
    let (_, r) = e.request("agent", "third.granted.test", "huge ttl");
    let huge = r["id"].as_str().unwrap().to_string();
    let (_, r) = e.request("agent", "fourth.granted.test", "no grant");
    let bare = r["id"].as_str().unwrap().to_string();
    let verified = served.join().unwrap();
    assert_eq!(
        verified,
        [true, true, true, true],
        "the proxy signs what it sends"
    );
    // A reply the desk refuses leaves the request pending and says why in the trail, where
    // whoever runs the webhook can see it: `{"decision": "approve"}` without a grant.
    let (_, r) = e.ask("agent", "GET", &format!("/v1/requests/{bare}?wait=2"), None);
    assert_eq!(r["state"], "pending", "{r}");
    let refused = e.proxy.wait_record(|r| {
        r["approval"]["step"] == "answer_refused" && r["approval"]["request"] == bare.as_str()
    });
    assert_eq!(refused["approval"]["by"], "webhook", "{refused}");
    assert!(
        refused["approval"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("ttl_s")),
        "{refused}"
    );
    let huge_refused = e.proxy.wait_record(|r| {
        r["approval"]["step"] == "answer_refused" && r["approval"]["request"] == huge.as_str()
    });
    assert!(huge_refused["approval"]["text"].is_string());
    let (_, r) = e.ask("agent", "GET", &format!("/v1/requests/{bad}?wait=2"), None);
    assert_eq!(
        r["state"], "pending",
        "a reply with a bad signature is ignored: {r}"
    );
    let (_, r) = e.ask("agent", "GET", &format!("/v1/requests/{huge}?wait=2"), None);
    assert_eq!(
        r["state"], "pending",
        "a ttl_s past 30 days is refused: {r}"
    );
    assert!(r["answered_by"].is_null(), "{r}");
    let token = Some(ADMIN_TOKEN);
    let path = format!("/v1/requests/{huge}/approve");
    let max = format!(r#"{{"grant": "ttl", "ttl_s": {}}}"#, u64::MAX);
    let (code, body) = admin_req(e.proxy.admin, "POST", &path, &max, token);
    assert_eq!(code, 400, "{body}");
    let (code, body) = admin_req(e.proxy.admin, "POST", &path, r#"{"grant": "once"}"#, token);
    assert_eq!(code, 200, "still answerable: {body}");
}

/// With `tls_intercept`, the endpoint answers over `CONNECT egress-proxy.local:443` too, with
/// a certificate from the interception CA (what the sandbox trusts): `https://` works, each
/// request is a record, and the sandbox is still the connection's.
#[test]
fn the_endpoint_answers_over_https_with_the_proxys_own_certificate() {
    let ca_dir = tempfile::tempdir().unwrap();
    ca_init(&ca_dir.path().join("ica"));
    let ica = ca_dir.path().join("ica");
    let e = env(&format!(
        "tls_intercept: {{ ca_cert_file: {0}/ca.crt, ca_key_file: {0}/ca.key }}",
        ica.display()
    ));
    let cacert = ica.join("ca.crt").display().to_string();
    let body = format!(
        r#"{{"host": "granted.test", "port": {}, "reason": "over https"}}"#,
        e.https.addr.port()
    );
    let out = curl(&[
        "-x",
        &e.px("agent"),
        "--cacert",
        &cacert,
        "--data-binary",
        &body,
        "https://egress-proxy.local/v1/requests",
    ]);
    let r: Value = serde_json::from_str(&out.text()).unwrap_or(Value::Null);
    assert_eq!(r["state"], "pending", "{} {}", out.text(), out.stderr);
    assert_eq!(r["sandbox"], "agent");
    let id = r["id"].as_str().unwrap();
    // Another sandbox's tunnel to the endpoint does not see it.
    let out = curl(&[
        "-x",
        &e.px("other"),
        "--cacert",
        &cacert,
        &format!("https://egress-proxy.local/v1/requests/{id}"),
    ]);
    assert!(out.text().contains("no request"), "{}", out.text());
    // Without trusting the proxy's CA, TLS fails (the certificate is the proxy's, not a public one).
    let out = curl(&[
        "-x",
        &e.px("agent"),
        "https://egress-proxy.local/v1/denials",
    ]);
    assert_ne!(out.code, 0);
    let rec = e.proxy.wait_record(|r| {
        r["mode"] == "https" && r["reason"] == "proxy_endpoint" && r["sandbox"] == "agent"
    });
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("POST /v1/requests"),
        "{rec}"
    );
}

/// Security review round A, A33: a grant scoped to `GET /docs/*` was escaped with dot
/// segments, forwarded verbatim to an origin that normalises them. A scoped grant holds only
/// for a canonical path, as `network.http` rules do.
#[test]
fn a_path_scoped_grant_is_not_escaped_by_dot_segments() {
    let e = env("");
    let plain = Origin::start(None);
    let port = plain.addr.port();
    let body = format!(
        r#"{{"host": "granted.test", "port": {port}, "methods": ["GET"], "paths": ["/docs/*"], "reason": "read the docs"}}"#
    );
    let (status, r) = e.ask("agent", "POST", "/v1/requests", Some(&body));
    assert_eq!(status, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    let (code, out) = e.cli(&["approve", &id, "--ttl", "60s"]);
    assert_eq!(code, 0, "{out}");
    let get = |path: &str| {
        let url = format!("http://granted.test:{port}{path}");
        let out = curl(&[
            "-x",
            &e.px("agent"),
            "--path-as-is",
            "-w",
            "\n%{http_code}",
            &url,
        ]);
        let text = out.text();
        let (_, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
        status.trim().parse::<u16>().unwrap_or(0)
    };
    assert_eq!(get("/docs/k"), 200);
    for escaped in [
        "/docs/../admin",
        "/docs/%2e%2e/admin",
        "/docs/..%2fadmin",
        "/docs/./../admin",
        "/docs/%2E%2E/%2E%2E/etc/passwd",
    ] {
        assert_eq!(get(escaped), 403, "{escaped}");
    }
    assert_eq!(get("/admin"), 403);
}

/// Clients review F4: a forwarded (plain HTTP) exchange cut when its grant ended was recorded
/// "the client went away before the response ended"; its record says the grant ended.
#[test]
fn a_forwarded_exchange_cut_at_its_grants_end_says_so() {
    let e = env("");
    let plain = Origin::start(None);
    let body = format!(
        r#"{{"host": "granted.test", "port": {}, "reason": "slow download"}}"#,
        plain.addr.port()
    );
    let (_, r) = e.ask("agent", "POST", "/v1/requests", Some(&body));
    let id = r["id"].as_str().unwrap().to_string();
    let (code, out) = e.cli(&["approve", &id, "--ttl", "2s"]);
    assert_eq!(code, 0, "{out}");
    let url = format!("http://granted.test:{}/slow", plain.addr.port());
    let out = curl(&["-sS", "-o", "/dev/null", "-x", &e.px("agent"), &url]);
    assert_ne!(out.code, 0, "the download under the grant was cut");
    let rec = e.proxy.wait_record(|r| {
        r["target_host"] == "granted.test" && r["mode"] == "http" && r["close"] == "revoked"
    });
    assert_eq!(rec["reason"], "grant_matched", "{rec}");
    assert_eq!(
        rec["detail"],
        format!("cut: grant {id} ended (expired or revoked)"),
        "{rec}"
    );
}
