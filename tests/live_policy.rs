//! Live policy with the real binary: reloads that revoke open tunnels, broken edits that keep
//! the old policy, reloads under load, the runtime API with its bearer token, persistence in
//! state_dir across restarts, DELETE cutting tunnels.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const ADMIN_TOKEN: &str = "admin-token-for-tests";

/// The test names on loopback, state in `dir/state`, and sandbox `tok` reaching `egress`.
fn config(dir: &Path, egress: &[&str]) -> ProxyConfig {
    let tok = egress
        .iter()
        .fold(SandboxSpec::new("tok").token("tok-secret"), |s, e| {
            s.allow(e)
        });
    around(dir).sandbox(tok)
}

/// [`config`] without its sandbox.
fn around(dir: &Path) -> ProxyConfig {
    ProxyConfig::new()
        .admin_token_file(&dir.join("admin.token"))
        .raw(&format!("state_dir: {}", dir.join("state").display()))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("slow.test", "127.0.0.1")
        .host("big.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
}

/// Write `config` as `dir/proxy.yaml`.
fn write(dir: &Path, config: &ProxyConfig) {
    std::fs::write(
        dir.join("proxy.yaml"),
        config.yaml(&dir.join("audit.jsonl")),
    )
    .unwrap();
}

struct Env {
    dir: tempfile::TempDir,
    ca: TestCa,
    https: Origin,
    proxy: Proxy,
}

fn start(dir: &Path) -> Proxy {
    Proxy::start_with(dir.join("proxy.yaml"), dir.join("audit.jsonl"), &[])
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    write(
        dir.path(),
        &config(dir.path(), &["api.test:*", "slow.test:*"]),
    );
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let proxy = start(dir.path());
    Env {
        dir,
        ca,
        https,
        proxy,
    }
}

impl Env {
    fn get(&self, creds: &str, host: &str, path: &str) -> CurlOut {
        let ca = self.ca.ca_pem.display().to_string();
        curl(&[
            "-x",
            &format!("http://{creds}@{}", self.proxy.proxy),
            "--cacert",
            &ca,
            &format!("https://{host}:{}{path}", self.https.addr.port()),
        ])
    }

    fn admin(&self, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
        admin_req(self.proxy.admin, method, path, body, token)
    }

    fn write_config(&self, egress: &[&str]) {
        write(self.dir.path(), &config(self.dir.path(), egress));
    }

    /// Start a slow download in the background; returns when its tunnel is open.
    fn slow(&self, creds: &str) -> std::thread::JoinHandle<(CurlOut, Instant)> {
        let ca = self.ca.ca_pem.display().to_string();
        let px = format!("http://{creds}@{}", self.proxy.proxy);
        let url = format!("https://slow.test:{}/slow", self.https.addr.port());
        let h =
            std::thread::spawn(move || (curl(&["-x", &px, "--cacert", &ca, &url]), Instant::now()));
        let sandbox = creds.split(':').next().unwrap().to_string();
        self.proxy.wait_audit("open", |r| {
            r["target_host"] == "slow.test" && r["sandbox"] == sandbox.as_str()
        });
        h
    }
}

fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn reload_revokes_an_open_tunnel_whose_rule_is_gone() {
    let e = env();
    let slow = e.slow("tok:tok-secret");
    e.write_config(&["api.test:*"]);
    let reloaded = Instant::now();
    let (status, body) = e.admin("POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    let (out, ended) = slow.join().unwrap();
    assert_ne!(out.code, 0, "the download was cut");
    let cut_after = ended.duration_since(reloaded);
    // The download would take a minute; the cut comes right after the reload.
    assert!(
        cut_after < Duration::from_secs(30),
        "cut after {cut_after:?}"
    );
    eprintln!("revocation: curl ended {cut_after:?} after POST /v1/reload");
    let rec = e.proxy.wait_record(|r| r["target_host"] == "slow.test");
    assert_eq!(rec["close"], "revoked");
    assert!(rec["bytes_down"].as_u64().unwrap() > 0);
    // The unchanged rule still works, with the new policy version in the record.
    assert_eq!(e.get("tok:tok-secret", "api.test", "/still").code, 0);
    let after = e.proxy.wait_record(|r| r["target_host"] == "api.test");
    assert_ne!(after["policy_version"], rec["policy_version"]);
}

#[test]
fn file_change_triggers_reload_and_revocation() {
    let e = env();
    let slow = e.slow("tok:tok-secret");
    e.write_config(&["api.test:*"]);
    let (out, _) = slow.join().unwrap();
    assert_ne!(out.code, 0);
    let rec = e.proxy.wait_record(|r| r["target_host"] == "slow.test");
    assert_eq!(rec["close"], "revoked");
    let m = e.proxy.admin_get("/metrics").1;
    assert!(
        metric(&m, "egress_config_reloads_total{result=\"ok\"}") >= 1,
        "{m}"
    );
}

#[test]
fn a_broken_edit_keeps_the_old_policy_serving() {
    let e = env();
    std::fs::write(e.dir.path().join("proxy.yaml"), "sandboxes:\n  - id: tok\n    policy: { provider: local, config: {}, network: { egress: [\"*.com\"] } }\n  bogus: [").unwrap();
    let (status, body) = e.admin("POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("reload refused"), "{body}");
    assert_eq!(
        e.get("tok:tok-secret", "api.test", "/old-policy").code,
        0,
        "old policy still serves"
    );
    e.write_config(&["*.com"]);
    let (status, body) = e.admin("POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("wildcard suffix `com` is a single label"),
        "{body}"
    );
    assert_eq!(e.get("tok:tok-secret", "api.test", "/old-policy-2").code, 0);
    let m = e.proxy.admin_get("/metrics").1;
    assert!(
        metric(&m, "egress_config_reloads_total{result=\"error\"}") >= 2,
        "{m}"
    );
    assert!(
        e.proxy.stderr_text().contains("reload refused"),
        "errors are logged"
    );
}

#[test]
fn twenty_reloads_under_steady_traffic_lose_nothing() {
    let e = env();
    let ca = e.ca.ca_pem.display().to_string();
    let px = format!("http://tok:tok-secret@{}", e.proxy.proxy);
    let url = format!("https://api.test:{}/steady", e.https.addr.port());
    let traffic = std::thread::spawn(move || {
        (0..40)
            .map(|_| curl(&["-x", &px, "--cacert", &ca, &url]).code)
            .collect::<Vec<_>>()
    });
    for i in 0..20 {
        // Alternate between two equivalent files so every reload really swaps.
        let egress = if i % 2 == 0 {
            ["api.test:*", "slow.test:*"]
        } else {
            ["slow.test:*", "api.test:*"]
        };
        e.write_config(&egress);
        let (status, body) = e.admin("POST", "/v1/reload", "", Some(ADMIN_TOKEN));
        assert_eq!(status, 200, "{body}");
    }
    let codes = traffic.join().unwrap();
    assert!(codes.iter().all(|c| *c == 0), "lost connections: {codes:?}");
    let m = e.proxy.admin_get("/metrics").1;
    assert!(
        metric(&m, "egress_config_reloads_total{result=\"ok\"}") >= 20,
        "{m}"
    );
}

fn binding(token: &str, egress: &str) -> String {
    format!(
        r#"{{"auth": {{"token_sha256": "{}"}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": [{egress}]}}}}}}"#,
        sha(token)
    )
}

#[test]
fn runtime_api_put_check_restart_delete() {
    let mut e = env();
    let body = binding("new-secret", "\"api.test:*\", \"slow.test:*\"");
    // Mutating calls need the token.
    assert_eq!(e.admin("PUT", "/v1/sandboxes/newbie", &body, None).0, 401);
    assert_eq!(
        e.admin("PUT", "/v1/sandboxes/newbie", &body, Some("wrong"))
            .0,
        401
    );
    assert_eq!(e.admin("POST", "/v1/reload", "", None).0, 401);
    assert_eq!(e.admin("DELETE", "/v1/sandboxes/newbie", "", None).0, 401);
    // Before: unknown.
    let out = e.get("newbie:new-secret", "api.test", "/");
    assert_ne!(out.code, 0);
    let (status, resp) = e.admin("PUT", "/v1/sandboxes/newbie", &body, Some(ADMIN_TOKEN));
    assert_eq!(status, 201, "{resp}");
    // Works at once.
    assert_eq!(e.get("newbie:new-secret", "api.test", "/at-once").code, 0);
    // Invalid bodies list every error; file-defined ids conflict.
    let bad = r#"{"auth": {"token": "plain"}, "policy": {"provider": "nope", "config": {}, "network": {"egress": ["*.com"]}}}"#;
    let (status, resp) = e.admin("PUT", "/v1/sandboxes/bad", bad, Some(ADMIN_TOKEN));
    assert_eq!(status, 400, "{resp}");
    for needle in ["plaintext tokens", "unknown provider", "`*.com`"] {
        assert!(resp.contains(needle), "{needle} missing: {resp}");
    }
    assert!(!resp.contains("\"plain\""), "{resp}");
    assert_eq!(
        e.admin("PUT", "/v1/sandboxes/tok", &body, Some(ADMIN_TOKEN))
            .0,
        409
    );
    assert_eq!(
        e.admin(
            "PUT",
            "/v1/sandboxes/other",
            &format!("{{\"id\": \"x\", {}", &body[1..]),
            Some(ADMIN_TOKEN)
        )
        .0,
        400
    );
    // Read-only calls need the token too (a token is configured), and never show digests.
    assert_eq!(e.admin("GET", "/v1/sandboxes", "", None).0, 401);
    assert_eq!(e.admin("GET", "/v1/sandboxes/newbie", "", None).0, 401);
    assert_eq!(e.admin("POST", "/v1/check", "{}", None).0, 401);
    let (status, list) = e.admin("GET", "/v1/sandboxes", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200);
    assert!(
        list.contains("\"id\":\"newbie\"") && list.contains("\"origin\":\"api\""),
        "{list}"
    );
    let (status, one) = e.admin("GET", "/v1/sandboxes/newbie", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200);
    assert!(!one.contains("token_sha256"), "{one}");
    assert!(!one.contains(&sha("new-secret")), "{one}");
    assert!(one.contains("\"auth\":{\"token\":true}"), "{one}");
    let (status, check) = e.admin(
        "POST",
        "/v1/check",
        r#"{"sandbox": "newbie", "target": "api.test:8443"}"#,
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(v["decision"], "allow");
    assert_eq!(v["rule"], "api.test:*");
    assert!(
        v["rule_source"]
            .as_str()
            .unwrap()
            .contains("sandbox newbie"),
        "{check}"
    );
    assert_eq!(v["resolved"], serde_json::json!(["127.0.0.1"]));
    // A URL target, as the OpenAPI document promises.
    let (status, check) = e.admin(
        "POST",
        "/v1/check",
        r#"{"sandbox": "newbie", "target": "https://api.test:8443/v1/models?x=1"}"#,
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 200, "{check}");
    let v: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(
        (&v["decision"], &v["target"]),
        (
            &serde_json::json!("allow"),
            &serde_json::json!("api.test:8443")
        ),
        "{check}"
    );
    let (_, check) = e.admin(
        "POST",
        "/v1/check",
        r#"{"sandbox": "newbie", "target": "evil.test"}"#,
        Some(ADMIN_TOKEN),
    );
    assert!(
        check.contains("\"reason\":\"no_rule_matched\"")
            && check.contains("not in network.egress of sandbox newbie"),
        "{check}"
    );
    // Persisted in the log; a corrupt line is reported and skipped at restart.
    let state = e.dir.path().join("state");
    let log = state.join("registrations.jsonl");
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("\"id\":\"newbie\""));
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, b"{ not json\n").unwrap();
    e.proxy.terminate();
    e.proxy = start(e.dir.path());
    assert_eq!(
        e.get("newbie:new-secret", "api.test", "/after-restart")
            .code,
        0,
        "{}",
        e.proxy.stderr_text()
    );
    assert!(
        e.proxy
            .stderr_text()
            .contains("registrations.jsonl:2: skipped: not JSON"),
        "{}",
        e.proxy.stderr_text()
    );
    // DELETE shuts it out and cuts its open tunnel.
    let slow = e.slow("newbie:new-secret");
    let (status, resp) = e.admin("DELETE", "/v1/sandboxes/newbie", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{resp}");
    let (out, _) = slow.join().unwrap();
    assert_ne!(out.code, 0);
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "slow.test" && r["sandbox"] == "newbie");
    assert_eq!(rec["close"], "revoked");
    let out = e.get("newbie:new-secret", "api.test", "/gone");
    assert_ne!(out.code, 0);
    // Gone for good: not back after a restart.
    e.proxy.terminate();
    e.proxy = start(e.dir.path());
    let (status, _) = e.admin("GET", "/v1/sandboxes/newbie", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 404);
    assert_eq!(
        e.admin("DELETE", "/v1/sandboxes/newbie", "", Some(ADMIN_TOKEN))
            .0,
        404
    );
    assert_eq!(
        e.admin("DELETE", "/v1/sandboxes/tok", "", Some(ADMIN_TOKEN))
            .0,
        409
    );
    // The policy version is in the metrics.
    let m = e.proxy.admin_get("/metrics").1;
    assert!(m.contains("egress_policy_info{version="), "{m}");
}

#[test]
fn limits_change_on_reload_without_dropping_open_tunnels() {
    let e = env();
    let slow = e.slow("tok:tok-secret");
    let tok = SandboxSpec::new("tok")
        .token("tok-secret")
        .limits("{ max_connections: 1 }")
        .allow("api.test:*")
        .allow("slow.test:*");
    write(e.dir.path(), &around(e.dir.path()).sandbox(tok));
    let (status, body) = e.admin("POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    // The open tunnel keeps its place; a second connection is over the new limit.
    let out = e.get("tok:tok-secret", "api.test", "/second");
    assert_ne!(out.code, 0);
    e.proxy.wait_record(|r| r["reason"] == "connection_limit");
    assert!(
        !slow.is_finished(),
        "the open tunnel was dropped by a limits change"
    );
    assert!(e
        .proxy
        .audit_records()
        .iter()
        .all(|r| !(r["event"] == "end" && r["target_host"] == "slow.test")));
}

#[test]
fn two_thousand_registrations_are_restored_and_served_at_start() {
    let e = env();
    // Through the API, as a runtime registers them (one keep-alive connection).
    let mut admin = std::io::BufReader::new(std::net::TcpStream::connect(e.proxy.admin).unwrap());
    for i in 0..2000 {
        let body = binding(&format!("tok-{i}"), "\"api.test:*\"");
        let status = keep_alive_request(
            &mut admin,
            "PUT",
            &format!("/v1/sandboxes/sb-{i}"),
            &body,
            ADMIN_TOKEN,
        );
        assert_eq!(status, 201, "PUT sb-{i}");
    }
    drop(admin);
    let mut p = e.proxy;
    p.terminate();
    let p = start(e.dir.path());
    // Ready means restored: the listeners accept only once the restored set is in force.
    let (status, ready) = p.admin_get("/readyz");
    assert_eq!(status, 200, "{ready}");
    let (status, list) = admin_req(p.admin, "GET", "/v1/sandboxes", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let api = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["origin"] == "api")
        .count();
    assert_eq!(api, 2000);
    let ca = e.ca.ca_pem.display().to_string();
    let out = curl(&[
        "-x",
        &format!("http://sb-1999:tok-1999@{}", p.proxy),
        "--cacert",
        &ca,
        &format!("https://api.test:{}/restored", e.https.addr.port()),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn dns_hosts_reload_and_unreloadable_settings_are_reported() {
    let e = env();
    let ca = e.ca.ca_pem.display().to_string();
    let get = |host: &str| {
        curl(&[
            "-x",
            &format!("http://tok:tok-secret@{}", e.proxy.proxy),
            "--cacert",
            &ca,
            "--resolve",
            &format!("{host}:{}:127.0.0.1", e.https.addr.port()),
            &format!("https://{host}:{}/", e.https.addr.port()),
        ])
    };
    // `other.test` is allowed but resolves nowhere (no dns.hosts entry, no DNS server).
    e.write_config(&["api.test:*", "other.test:*"]);
    assert_eq!(
        admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN)).0,
        200
    );
    let out = get("other.test");
    assert_ne!(out.code, 0);
    // Add it to dns.hosts: the reload applies it.
    let added =
        config(e.dir.path(), &["api.test:*", "other.test:*"]).host("other.test", "127.0.0.1");
    write(e.dir.path(), &added);
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"needs_restart\":[]"), "{body}");
    let out = get("other.test");
    assert_eq!(out.code, 0, "{}", out.stderr);
    // A listener change is not applied and says so.
    write(e.dir.path(), &added.admin_at("127.0.0.1:1"));
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"needs_restart\":[\"listen\"]"), "{body}");
}

fn md_file(egress: &str) -> String {
    format!(
        "---\nschema: sandbox/v1\nid: \"@test/md\"\nversion: 1.0.0\nprovider: local\nconfig: {{}}\nnetwork:\n  egress: [{egress}]\n---\n\n# md\n"
    )
}

/// A reload compiles only the sandboxes whose binding or referenced file changed: editing a
/// referenced `*.SANDBOX.md` is picked up by the file watcher and revokes that sandbox's
/// tunnel, and the other sandbox's tunnel is untouched.
#[test]
fn editing_a_referenced_sandbox_file_revokes_only_its_tunnels() {
    let e = env();
    let dir = e.dir.path();
    std::fs::write(dir.join("md.SANDBOX.md"), md_file("\"slow.test:*\"")).unwrap();
    let md = SandboxSpec::new("md")
        .token("md-secret")
        .policy_ref("./md.SANDBOX.md");
    write(dir, &config(dir, &["slow.test:*"]).sandbox(md));
    let (status, body) = e.admin("POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    let tok = e.slow("tok:tok-secret");
    let md = e.slow("md:md-secret");
    std::fs::write(dir.join("md.SANDBOX.md"), md_file("\"api.test:*\"")).unwrap();
    let (out, _) = md.join().unwrap();
    assert_ne!(out.code, 0, "md's download was cut");
    let rec = e
        .proxy
        .wait_record(|r| r["target_host"] == "slow.test" && r["sandbox"] == "md");
    assert_eq!(rec["close"], "revoked", "{rec}");
    // A later exchange of tok's, under the new policy: once it is recorded, a revocation of
    // tok's open tunnel (woken with md's by the same change) would have been recorded too.
    assert_eq!(e.get("tok:tok-secret", "slow.test", "/after").code, 0);
    e.proxy
        .wait_record(|r| r["sandbox"] == "tok" && r["target_host"] == "slow.test");
    assert!(
        !tok.is_finished(),
        "tok's download is still allowed and must go on"
    );
    let revoked = e
        .proxy
        .audit_records()
        .into_iter()
        .filter(|r| r["sandbox"] == "tok" && r["close"] == "revoked")
        .count();
    assert_eq!(revoked, 0, "tok's tunnel was revoked by md's change");
}

#[test]
fn batched_state_sync_loses_nothing_when_the_process_is_killed() {
    // runtime.state_sync_ms: 10000 — no sync happens between the calls and the kill: what
    // survives a SIGKILL is what the kernel held, and a process crash must lose nothing.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).unwrap();
    let config = ProxyConfig::new()
        .admin_token_file(&dir.path().join("admin.token"))
        .raw(&format!(
            "state_dir: {}",
            dir.path().join("state").display()
        ))
        .raw("runtime: { state_sync_ms: 10000 }");
    let mut p = config.start(dir.path());
    for id in ["kept", "gone"] {
        let (status, body) = admin_req(
            p.admin,
            "PUT",
            &format!("/v1/sandboxes/{id}"),
            &binding("t", "\"api.test\""),
            Some(ADMIN_TOKEN),
        );
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = admin_req(
        p.admin,
        "DELETE",
        "/v1/sandboxes/gone",
        "",
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 200, "{body}");
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let p = config.start(dir.path());
    let get = |id: &str| {
        admin_req(
            p.admin,
            "GET",
            &format!("/v1/sandboxes/{id}"),
            "",
            Some(ADMIN_TOKEN),
        )
        .0
    };
    assert_eq!(get("kept"), 200, "{}", p.stderr_text());
    assert_eq!(get("gone"), 404);
}
