//! WebSocket on terminated hosts (issue 62), with real clients and servers: the Python
//! `websockets` library on both sides (`tests/data/ws_client.py` through the proxy with
//! CONNECT, `tests/data/ws_server.py` behind the test CA, which logs every message it
//! receives, so a refused message is seen never to have reached it).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const SECRET: &str = "sk-live-0123456789abcdefSECRET";

struct Env {
    dir: tempfile::TempDir,
    origin: ScriptOrigin,
    proxy: Proxy,
}

/// Sandbox `dev`: api.test (no credential) and other.test (a `replace_placeholder`
/// credential) on the origin's port, with the `http` rules given.
fn dev(port: u16, http: &str) -> SandboxSpec {
    dev_allowing(
        &[&format!("api.test:{port}"), &format!("other.test:{port}")],
        http,
    )
}

/// Sandbox `dev` with these `egress` entries and `http` rules.
fn dev_allowing(egress: &[&str], http: &str) -> SandboxSpec {
    let dev = SandboxSpec::new("dev")
        .token("dev-secret")
        .credential("{ name: key, hosts: [other.test], inject: { replace_placeholder: { headers: [X-Api-Key] } }, source: { env: WS_SECRET } }")
        .network("http", http);
    egress.iter().fold(dev, |dev, entry| dev.allow(entry))
}

/// The config: sandbox `sb` terminated, api.test and other.test on loopback.
fn config(dir: &Path, sb: SandboxSpec) -> ProxyConfig {
    ProxyConfig::new()
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("timeouts", "{ shutdown_grace_ms: 1000 }")
        .intercept(&dir.join("ica"), &dir.join("ca/ca.pem"))
        .sandbox(sb)
}

fn env(http: &str, compression: bool) -> Env {
    env_with(http, if compression { "deflate" } else { "none" })
}

/// [`env`] with the origin's compression mode: `none`, `deflate` (when offered) or `force`.
fn env_with(http: &str, compression: &str) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("ca")).unwrap();
    let ca = TestCa::generate(&d.join("ca"));
    ca_init(&d.join("ica"));
    std::fs::write(d.join("admin.token"), "admin-token\n").unwrap();
    let log = d.join("origin.jsonl");
    std::fs::write(&log, "").unwrap();
    let origin = ScriptOrigin::start(
        "ws_server.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            log.as_os_str(),
            SECRET.as_ref(),
            compression.as_ref(),
        ],
    );
    let proxy = config(d, dev(origin.port, http)).start_env(d, &[("WS_SECRET", SECRET)]);
    Env { dir, origin, proxy }
}

impl Env {
    /// Run the client against `host` and `path` with `messages` (JSON); its JSON report.
    fn client(&self, host: &str, path: &str, messages: &str) -> serde_json::Value {
        let out = self
            .client_cmd(host, path, messages)
            .output()
            .expect("python3");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).unwrap_or_else(|_| {
            panic!(
                "ws_client.py printed no report (are its packages installed? tests/run installs them): {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn client_cmd(&self, host: &str, path: &str, messages: &str) -> Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ws_client.py");
        let mut c = Command::new("python3");
        c.arg(script)
            .arg(format!("wss://{host}:{}{path}", self.origin.port))
            .arg(format!("http://dev:dev-secret@{}", self.proxy.proxy))
            .arg(self.dir.path().join("ica/ca.crt"))
            .arg(messages);
        c
    }

    /// What the origin received: (path, kind, text) per message.
    fn received(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("origin.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn placeholder(&self) -> String {
        let (status, body) = admin_req(
            self.proxy.admin,
            "GET",
            "/v1/sandboxes/dev/placeholders",
            "",
            Some("admin-token"),
        );
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["placeholders"][0]["placeholder"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

const RPC_RULE: &str = r#"[{ host: api.test, paths: [/rpc], protocol: websocket, messages: { jsonrpc: { methods: [ping] } } }, { host: api.test, paths: [/plain] }]"#;

#[test]
fn allowed_messages_pass_both_ways_and_a_forbidden_method_closes_1008() {
    let e = env(RPC_RULE, false);
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let drop = r#"{"jsonrpc":"2.0","id":2,"method":"admin/drop"}"#;
    let out = e.client(
        "api.test",
        "/rpc",
        &serde_json::json!([ping, drop, ping]).to_string(),
    );
    assert_eq!(out["answers"][0], format!("got:{ping}"), "{out}");
    assert_eq!(out["close"]["code"], 1008, "{out}");
    let reason = out["close"]["reason"].as_str().unwrap();
    assert!(reason.contains("admin/drop"), "{reason}");
    let got = e.received();
    assert_eq!(
        got.len(),
        1,
        "only the allowed message reached the origin: {got:?}"
    );
    assert_eq!(got[0]["text"], ping);
    let refused = e
        .proxy
        .wait_record(|r| r["reason"] == "jsonrpc_not_allowed");
    assert_eq!(refused["decision"], "deny");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("websocket message 2 from the sandbox"),
        "{refused}"
    );
    let socket = e.proxy.wait_record(|r| {
        r["status"] == 101
            && r["event"] == "end"
            && r["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("websocket:"))
    });
    let detail = socket["detail"].as_str().unwrap();
    assert!(
        detail.contains("1 messages from the sandbox, 1 from the origin; close 1008"),
        "{detail}"
    );
    assert_eq!(socket["call"], "websocket");
    assert_eq!(
        socket["close"], "refused",
        "the proxy closed it for a refused message: {socket}"
    );
}

/// `simulate` replays a WebSocket upgrade as an upgrade: the running configuration as the
/// candidate changes nothing (exit 0); a candidate that denies the host refuses the upgrade
/// and the requests on it for that reason, not "cannot tell".
#[test]
fn simulate_replays_upgrades_as_upgrades() {
    let e = env(RPC_RULE, false);
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let out = e.client("api.test", "/rpc", &serde_json::json!([ping]).to_string());
    assert_eq!(out["answers"][0], format!("got:{ping}"), "{out}");
    let refused = e.client("api.test", "/other", "[]");
    assert!(refused.to_string().contains("403"), "{refused}");
    e.proxy
        .wait_record(|r| r["call"] == "websocket" && r["event"] == "end");
    let d = e.dir.path();
    let simulate = |candidate: &Path| simulate(candidate, &d.join("audit.jsonl"));
    let (code, same) = simulate(&d.join("proxy.yaml"));
    assert_eq!(
        code,
        Some(0),
        "the running config changes nothing: {same:#}"
    );
    assert!(same["replayed"].as_u64().unwrap() >= 2, "{same:#}");
    // The same rules, the host denied: the upgrade is refused by the deny, not unknown.
    let denied = config(d, dev(e.origin.port, RPC_RULE).deny("api.test"));
    let audit = d.join("audit.jsonl");
    std::fs::write(d.join("denied.yaml"), denied.yaml(&audit)).unwrap();
    let (code, report) = simulate(&d.join("denied.yaml"));
    assert_eq!(code, Some(1), "{report:#}");
    let refused = report["newly_refused"].to_string();
    assert!(refused.contains("denied_by_rule"), "{report:#}");
    assert!(refused.contains("(websocket)"), "{report:#}");
    assert!(
        report["cannot_tell"].as_object().unwrap().is_empty(),
        "{report:#}"
    );
}

#[test]
fn an_upgrade_no_websocket_rule_allows_is_refused_before_the_origin() {
    let e = env(RPC_RULE, false);
    // A plain rule on the path does not allow a socket on it.
    let out = e.client("api.test", "/plain", r#"["hello"]"#);
    let err = out["error"].as_str().unwrap_or_default();
    assert!(err.contains("status 403"), "{out}");
    assert!(err.contains("websocket_not_allowed"), "{out}");
    assert!(e.received().is_empty());
}

#[test]
fn graphql_subscriptions_pass_and_a_mutation_in_a_message_is_refused() {
    let rule = r#"[{ host: api.test, paths: [/graphql], protocol: websocket, messages: { graphql: { operations: [query, subscription] } } }]"#;
    let e = env(rule, false);
    let init = r#"{"type":"connection_init","payload":{}}"#;
    let sub = r#"{"id":"1","type":"subscribe","payload":{"query":"subscription { ticks }"}}"#;
    let mutation = r#"{"id":"2","type":"subscribe","payload":{"query":"mutation { deleteAll }"}}"#;
    let out = e.client(
        "api.test",
        "/graphql",
        &serde_json::json!([init, sub, mutation]).to_string(),
    );
    assert_eq!(out["answers"][1], format!("got:{sub}"), "{out}");
    assert_eq!(out["close"]["code"], 1008, "{out}");
    let texts: Vec<String> = e
        .received()
        .iter()
        .map(|r| r["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts, vec![init.to_string(), sub.to_string()]);
    e.proxy
        .wait_record(|r| r["reason"] == "graphql_not_allowed");
}

#[test]
fn placeholders_become_the_secret_and_the_secret_comes_back_scrubbed_and_binary_is_refused() {
    let rule = r#"[{ host: other.test, paths: [/chat], protocol: websocket }]"#;
    let e = env(rule, false);
    let ph = e.placeholder();
    let hello = format!("auth {ph}");
    let out = e.client(
        "other.test",
        "/chat",
        &serde_json::json!([hello, "secret?", {"binary": "0001"}]).to_string(),
    );
    // The origin saw the secret; the sandbox never does.
    let got = e.received();
    assert_eq!(got[0]["text"], format!("auth {SECRET}"), "{got:?}");
    let answer = out["answers"][0].as_str().unwrap();
    assert!(!answer.contains(SECRET), "{answer}");
    let scrubbed = out["answers"][1].as_str().unwrap();
    assert!(
        !scrubbed.contains(SECRET) && scrubbed.starts_with("the key is "),
        "{scrubbed}"
    );
    // A binary frame on a socket with a credential bound is refused, and never sent.
    assert_eq!(out["close"]["code"], 1008, "{out}");
    assert!(
        out["close"]["reason"].as_str().unwrap().contains("binary"),
        "{out}"
    );
    assert_eq!(got.len(), 2, "{got:?}");
    // A placeholder bound to another host is refused in a message too.
    let e2 = env(
        r#"[{ host: api.test, paths: [/rpc], protocol: websocket }]"#,
        false,
    );
    let foreign = format!("leak {}", e2.placeholder());
    let out = e2.client(
        "api.test",
        "/rpc",
        &serde_json::json!([foreign]).to_string(),
    );
    assert_eq!(out["close"]["code"], 1008, "{out}");
    assert!(e2.received().is_empty());
    e2.proxy.wait_record(|r| r["reason"] == "credential_misuse");
}

/// Review 7b W17b, W18: a close frame's reason (up to 123 bytes) is a message — before, a
/// foreign credential's placeholder in it reached the origin unjudged and unrecorded. Now it
/// is refused like a message (1008 to the sandbox, recorded), and a bound placeholder in a
/// close reason becomes the secret like in any message.
#[test]
fn a_close_reason_is_judged_scanned_and_rewritten_like_a_message() {
    let e = env(
        r#"[{ host: api.test, paths: [/rpc], protocol: websocket }, { host: other.test, paths: [/chat], protocol: websocket }]"#,
        false,
    );
    let ph = e.placeholder();
    let out = e.client(
        "api.test",
        "/rpc",
        &serde_json::json!([{ "close": format!("leak {ph}") }]).to_string(),
    );
    assert_eq!(out["close"]["code"], 1008, "{out}");
    let got = e.received();
    assert!(
        got.iter()
            .all(|m| !m["text"].as_str().unwrap_or("").contains(&ph)),
        "the placeholder reached the origin in a close reason: {got:?}"
    );
    e.proxy.wait_record(|r| {
        r["reason"] == "credential_misuse"
            && r["detail"]
                .as_str()
                .unwrap_or("")
                .contains("message 1 from the sandbox")
    });
    // Bound to other.test: the close reason carries the secret there, as a message would.
    let out = e.client(
        "other.test",
        "/chat",
        &serde_json::json!([{ "close": format!("bye {ph}") }]).to_string(),
    );
    assert!(out.get("error").is_none(), "{out}");
    let closes = eventually(Duration::from_secs(5), "the origin's close", || {
        let closes: Vec<_> = e
            .received()
            .into_iter()
            .filter(|m| m["kind"] == "close")
            .collect();
        (!closes.is_empty()).then_some(closes)
    });
    assert_eq!(closes[0]["text"], format!("bye {SECRET}"), "{closes:?}");
}

/// An origin that chooses `permessage-deflate` although the proxy offered no extension sends
/// frames the proxy could not read: refused `502 unscannable_response`, as the docs say (it
/// answered 403 `websocket_not_allowed`, review 7b).
#[test]
fn an_origin_that_forces_compression_is_a_502() {
    let e = env_with(
        r#"[{ host: api.test, paths: [/rpc], protocol: websocket }]"#,
        "force",
    );
    let out = e.client("api.test", "/rpc", &serde_json::json!(["hi"]).to_string());
    let error = out["error"].as_str().unwrap_or("");
    assert!(error.contains("status 502"), "{out}");
    let rec = e.proxy.wait_record(|r| r["path"] == "/rpc");
    assert_eq!(rec["reason"], "unscannable_response", "{rec}");
    assert_eq!(rec["status"], 502, "{rec}");
}

#[test]
fn a_compressed_offer_is_stripped_so_every_message_is_judged() {
    // The origin would compress (permessage-deflate) if offered; the client offers it.
    let e = env(RPC_RULE, true);
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let bad = r#"{"jsonrpc":"2.0","id":2,"method":"exec"}"#;
    let out = e.client(
        "api.test",
        "/rpc",
        &serde_json::json!([ping, bad]).to_string(),
    );
    assert_eq!(out["answers"][0], format!("got:{ping}"), "{out}");
    assert_eq!(out["close"]["code"], 1008, "{out}");
    assert_eq!(e.received().len(), 1);
    let got = e.received();
    assert_eq!(
        got[0]["extensions"], "",
        "the origin was offered no extension: {got:?}"
    );
}

/// Open a socket on api.test `/rpc`, send one allowed message and wait on it (the client
/// sleeps up to 20 s): the running client, once the origin has the message.
fn open_socket(e: &Env) -> std::process::Child {
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let child = e
        .client_cmd(
            "api.test",
            "/rpc",
            &serde_json::json!([ping, "sleep:20"]).to_string(),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(15), "the first message", || {
        (!e.received().is_empty()).then_some(())
    });
    child
}

/// The client's report once it has ended, and how long after `since` it ended.
fn ended(child: std::process::Child, since: Instant) -> (serde_json::Value, Duration) {
    let out = child.wait_with_output().unwrap();
    let took = since.elapsed();
    (serde_json::from_slice(&out.stdout).unwrap(), took)
}

/// Reload `e` with `http` rules and, when given, this one `egress` entry alone.
fn reload(e: &Env, http: &str, egress: Option<&str>) {
    let d = e.dir.path();
    let sb = match egress {
        Some(entry) => dev_allowing(&[entry], http),
        None => dev(e.origin.port, http),
    };
    let narrowed = config(d, sb).yaml(&d.join("audit.jsonl"));
    std::fs::write(d.join("proxy.yaml"), narrowed).unwrap();
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some("admin-token"));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_reload_that_drops_the_rule_closes_an_open_socket() {
    let e = env(RPC_RULE, false);
    let child = open_socket(&e);
    let reloaded = Instant::now();
    reload(&e, r#"[{ host: api.test, paths: [/plain] }]"#, None);
    let (out, took) = ended(child, reloaded);
    assert_eq!(out["close"]["code"], 1008, "{out}");
    assert!(
        out["close"]["reason"]
            .as_str()
            .unwrap()
            .contains("no longer"),
        "{out}"
    );
    eprintln!("socket closed {took:?} after the reload");
    assert!(took < Duration::from_secs(10));
    let rec = e
        .proxy
        .wait_record(|r| r["status"] == 101 && r["close"] == "revoked");
    assert!(
        rec["detail"].as_str().unwrap().contains("close 1008"),
        "{rec}"
    );
}

#[test]
fn revoking_the_egress_entry_closes_the_socket_with_a_reason_before_the_tunnel_is_cut() {
    let e = env(RPC_RULE, false);
    let child = open_socket(&e);
    let reloaded = Instant::now();
    let port = e.origin.port;
    reload(&e, "[]", Some(&format!("other.test:{port}")));
    let (out, took) = ended(child, reloaded);
    assert_eq!(out["close"]["code"], 1008, "{out}");
    assert!(
        out["close"]["reason"]
            .as_str()
            .unwrap()
            .contains("no longer allows"),
        "{out}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    e.proxy
        .wait_record(|r| r["status"] == 101 && r["close"] == "revoked");
}

/// SIGTERM lets open exchanges finish for `shutdown_grace_ms` (1 s here), then stops them:
/// the socket is told 1012 (service restart) before its tunnel is cut.
#[test]
fn a_proxy_shutting_down_closes_the_socket_1012() {
    let mut e = env(RPC_RULE, false);
    let child = open_socket(&e);
    let stopped = Instant::now();
    e.proxy.terminate();
    let (out, took) = ended(child, stopped);
    assert_eq!(out["close"]["code"], 1012, "{out}");
    assert!(took < Duration::from_secs(8), "{took:?}");
}

/// Flow rules (issue 93) on terminated TLS: each message of the sandbox is a write. A socket
/// to `api.test` passes a message; a GET of the private `other.test` (terminated, through
/// CONNECT) arms `private`; the same socket's next message is refused (1008, `flow_refused`)
/// and never reaches the origin, and so is a terminated POST to `api.test`.
#[test]
fn after_a_private_read_a_socket_message_is_a_refused_write() {
    let flows = r#"{ labels: { private: ["other.test"] }, rules: [{ name: no-exfil, after: [private], refuse: writes, except: [private] }] }"#;
    let e = env(RPC_RULE, false);
    let d = e.dir.path();
    let flowing = config(d, dev(e.origin.port, RPC_RULE).network("flows", flows));
    std::fs::write(d.join("proxy.yaml"), flowing.yaml(&d.join("audit.jsonl"))).unwrap();
    assert_eq!(
        admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some("admin-token")).0,
        200
    );
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let messages = serde_json::json!([ping, "sleep:4", ping]).to_string();
    let mut cmd = e.client_cmd("api.test", "/rpc", &messages);
    let client = std::thread::spawn(move || cmd.output().expect("python3"));
    eventually(
        Duration::from_secs(10),
        "the first message at the origin",
        || (!e.received().is_empty()).then_some(()),
    );
    let port = e.origin.port.to_string();
    let proxy = format!("http://dev:dev-secret@{}", e.proxy.proxy);
    let cacert = d.join("ica/ca.crt");
    let curl_tls = |args: &[&str]| {
        let mut all = vec![
            "-s",
            "-i",
            "-p",
            "-x",
            &proxy,
            "--cacert",
            cacert.to_str().unwrap(),
        ];
        all.extend(args);
        curl(&all).text()
    };
    let read = curl_tls(&[&format!("https://other.test:{port}/doc")]);
    assert!(read.starts_with("HTTP/"), "{read}");
    let out = client.join().unwrap();
    let out: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(out["answers"][0], format!("got:{ping}"), "{out}");
    assert_eq!(out["close"]["code"], 1008, "{out}");
    assert!(
        out["close"]["reason"]
            .as_str()
            .unwrap()
            .contains("no-exfil"),
        "{out}"
    );
    assert_eq!(
        e.received().len(),
        1,
        "the refused message reached the origin"
    );
    let post = curl_tls(&[
        "--data-binary",
        "x",
        &format!("https://api.test:{port}/plain"),
    ]);
    assert!(
        post.contains("flow_refused") && post.contains("GET other.test/doc"),
        "{post}"
    );
    let r = e
        .proxy
        .wait_record(|r| r["reason"] == "flow_refused" && r["method"] == "POST");
    assert_eq!(r["labels"], "private", "{r}");
    // The terminated read that armed it carries the digest of the body the sandbox got.
    let read = e
        .proxy
        .wait_record(|r| r["path"] == "/doc" && r["armed"] == "private");
    let body = read.to_string();
    let digest = read["body_sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(digest.len(), 64, "{body}");
}
