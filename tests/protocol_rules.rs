//! Protocol rules on terminated hosts (issue 42), with real clients through the proxy to local
//! origins: the official MCP Python SDK (PyPI `mcp`) against its own streamable-HTTP server
//! (`tests/data/mcp_server.py`, JSON and SSE answers), and curl for GraphQL, JSON-RPC and Git
//! LFS batch calls against the test origin (whose `/upload` says how many body bytes arrived,
//! so a refused body is seen never to have left the proxy).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

use common::*;

/// The MCP server in `mode` (`json` or `sse`).
fn mcp_server(ca: &TestCa, mode: &str) -> ScriptOrigin {
    let mode = std::ffi::OsStr::new(mode);
    ScriptOrigin::start(
        "mcp_server.py",
        &[ca.cert_pem.as_os_str(), ca.key_pem.as_os_str(), mode],
    )
}

/// A test origin behind `ca`'s certificate, and its port.
fn api_origin(ca: &TestCa) -> (Origin, u16) {
    let origin = Origin::start(Some(ca));
    let port = origin.addr.port();
    (origin, port)
}

/// A proxy terminating mcp.test and api.test for sandbox `dev` with the `http` rules given;
/// in report mode when `report`.
fn proxy(dir: &Path, ca: &TestCa, ports: (u16, u16), http: &str, report: bool) -> Proxy {
    ca_init(&dir.join("ica"));
    let mut dev = SandboxSpec::new("dev")
        .token("dev-secret")
        .allow(&format!("mcp.test:{}", ports.0))
        .allow(&format!("api.test:{}", ports.1))
        .network("http", http);
    if report {
        dev = dev.report();
    }
    ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("mcp.test", "127.0.0.1")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .intercept_option("judge_body_bytes", "4096")
        .sandbox(dev)
        .start(dir)
}

const MCP_RULE: &str = r#"[{ host: mcp.test, paths: [/mcp], protocol: mcp, tools: [search, ask_user, { name: create_issue, arguments: { repo: { one_of: [acme/docs] } } }], resources: ["file:///docs/**"], prompts: [summarize] }]"#;

/// Run the SDK client (`mode`: its connect mode) through `p` to the MCP server on `port`.
fn mcp_client(p: &Proxy, dir: &Path, port: u16, mode: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mcp_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("https://mcp.test:{port}/mcp"))
        .arg(format!("http://dev:dev-secret@{}", p.proxy))
        .arg(dir.join("ica/ca.crt"))
        .arg(mode)
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        for r in p.audit_records() {
            eprintln!("{r}");
        }
    }
    assert!(
        out.status.success(),
        "{mode}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap()
}

#[test]
fn the_mcp_sdk_sees_and_calls_only_the_allowed_tools_in_json_and_sse() {
    // The server answers in JSON or in event streams; the client speaks the 2026 protocol
    // (auto) or the initialize handshake (legacy).
    for (mode, client_mode) in [("json", "auto"), ("sse", "auto"), ("sse", "legacy")] {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::generate(dir.path());
        let server = mcp_server(&ca, mode);
        let port = server.port;
        let p = proxy(dir.path(), &ca, (port, 9), MCP_RULE, false);
        let got = mcp_client(&p, dir.path(), port, client_mode);
        // tools/list is filtered to the rule's tools.
        let tools = serde_json::json!(["ask_user", "create_issue", "search"]);
        assert_eq!(got["tools"], tools, "{mode}: {got}");
        assert_eq!(
            got["resources"],
            serde_json::json!(["file:///docs/readme"]),
            "{mode}: {got}"
        );
        assert_eq!(
            got["prompts"],
            serde_json::json!(["summarize"]),
            "{mode}: {got}"
        );
        assert_eq!(got["search"]["ok"], "found:rust", "{mode}: {got}");
        assert_eq!(got["readme"], "ok", "{mode}: {got}");
        // Refused calls are JSON-RPC errors naming the reason.
        for k in [
            "delete_repo",
            "create_issue_other",
            "secret",
            "leak",
            "dotted",
            "encoded",
        ] {
            let e = got[k]["error"].as_str().unwrap_or_default();
            assert!(e.contains("mcp_not_allowed"), "{mode} {k}: {got}");
        }
        let rec = p.wait_record(|r| {
            r["reason"] == "mcp_not_allowed" && r["call"] == "mcp tools/call delete_repo"
        });
        assert_eq!(rec["decision"], "deny", "{rec}");
        assert_eq!(rec["status"], 200, "answered as a JSON-RPC error: {rec}");
        let listed = p.wait_record(|r| r["call"] == "mcp tools/list" && r["decision"] == "allow");
        assert!(
            listed["detail"]
                .as_str()
                .unwrap_or("")
                .contains("hid 1 list entries"),
            "{mode}: {listed}"
        );
        p.wait_record(|r| r["call"] == "mcp tools/call search" && r["decision"] == "allow");
        if client_mode == "legacy" {
            // The server's elicitation (a request to the client, on the call's event
            // stream) never reaches the client: the call ends with the proxy's error.
            let e = got["ask_user"]["error"].as_str().unwrap_or_default();
            assert!(e.contains("elicitation/create"), "{got}");
            assert_eq!(got["elicited"], serde_json::json!([]), "{got}");
            let rec = p.wait_record(|r| r["call"] == "mcp tools/call ask_user");
            let detail = rec["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains("requests were dropped: elicitation/create"),
                "{rec}"
            );
        }
        // What the SDK would never send: a forged routing header, a repeated key.
        let forged = |body: &str, header: &str| {
            let out = curl(&[
                "-x",
                &format!("http://dev:dev-secret@{}", p.proxy),
                "--cacert",
                dir.path().join("ica/ca.crt").to_str().unwrap(),
                "-H",
                "content-type: application/json",
                "-H",
                "accept: application/json, text/event-stream",
                "-H",
                header,
                "--data-binary",
                body,
                &format!("https://mcp.test:{port}/mcp"),
            ]);
            out.text()
        };
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{"q":"x"}}}"#;
        let answer = forged(call, "mcp-name: delete_repo");
        assert!(
            answer.contains("-32001") && answer.contains("Mcp-Name"),
            "{answer}"
        );
        let twice = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"search","name":"delete_repo","arguments":{}}}"#;
        let answer = forged(twice, "x-test: 1");
        assert!(
            answer.contains("mcp_not_allowed") && answer.contains("twice"),
            "{answer}"
        );
        // Escapes are read before the judging, as the server reads them: a key repeated with
        // an escape is the same key, and a tool named with escapes is the tool they spell.
        let escaped_twice = r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"search","n\u0061me":"delete_repo","arguments":{}}}"#;
        let answer = forged(escaped_twice, "x-test: 1");
        assert!(
            answer.contains("mcp_not_allowed") && answer.contains("twice"),
            "{answer}"
        );
        let spelled = r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"del\u0065te_repo","arguments":{}}}"#;
        let answer = forged(spelled, "x-test: 1");
        assert!(
            answer.contains("mcp_not_allowed") && answer.contains("`delete_repo`"),
            "{answer}"
        );
        // The dot-segment reads were refused by the proxy for their form (review B1).
        let rec = p.wait_record(|r| {
            r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("not canonical"))
        });
        assert_eq!(rec["reason"], "mcp_not_allowed", "{rec}");
        // A body on GET or DELETE is never relayed unjudged (review W1; on HTTP/2, C1e, in
        // credentials.rs against an upstream that speaks it): refused before it leaves.
        let delete = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"delete_repo","arguments":{"name":"prod"}}}"#;
        for (method, version) in [("GET", "--http1.1"), ("DELETE", "--http1.1")] {
            let out = curl(&[
                "-x",
                &format!("http://dev:dev-secret@{}", p.proxy),
                "--cacert",
                dir.path().join("ica/ca.crt").to_str().unwrap(),
                version,
                "-X",
                method,
                "-H",
                "content-type: application/json",
                "--data-binary",
                delete,
                "-w",
                "\n%{http_code} %{http_version}",
                &format!("https://mcp.test:{port}/mcp"),
            ]);
            let text = out.text();
            assert!(text.ends_with("403 1.1"), "{method} {version}: {text}");
            assert!(
                text.contains("http_not_allowed"),
                "{method} {version}: {text}"
            );
        }
    }
}

#[test]
fn a_server_request_the_rule_allows_reaches_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let server = mcp_server(&ca, "sse");
    let port = server.port;
    let rule = r#"[{ host: mcp.test, paths: [/mcp], protocol: mcp, tools: [ask_user], server_requests: [elicitation/create] }]"#;
    let p = proxy(dir.path(), &ca, (port, 9), rule, false);
    let got = mcp_client(&p, dir.path(), port, "legacy");
    assert_eq!(got["tools"], serde_json::json!(["ask_user"]), "{got}");
    assert_eq!(
        got["ask_user"]["ok"], "asked:accept:the user's secret",
        "{got}"
    );
    assert_eq!(
        got["elicited"],
        serde_json::json!(["your password?"]),
        "{got}"
    );
}

/// curl through `p` as `dev` to `https://api.test:PORT/upload`, posting `body` with
/// `content_type`: (HTTP status, body).
fn post(p: &Proxy, dir: &Path, port: u16, body: &str, content_type: &str) -> (u16, String) {
    let url = format!("https://api.test:{port}/upload");
    let out = curl(&[
        "-x",
        &format!("http://dev:dev-secret@{}", p.proxy),
        "--cacert",
        dir.join("ica/ca.crt").to_str().unwrap(),
        "-H",
        &format!("content-type: {content_type}"),
        "--data-binary",
        body,
        "-w",
        "\n%{http_code}",
        &url,
    ]);
    let text = out.text();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

const GRAPHQL_RULE: &str =
    r#"[{ host: api.test, paths: [/upload], protocol: graphql, operations: [query] }]"#;

#[test]
fn a_graphql_query_passes_and_a_mutation_is_refused_before_it_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let (origin, port) = api_origin(&ca);
    let p = proxy(dir.path(), &ca, (9, port), GRAPHQL_RULE, false);
    let query = r#"{"query":"query Me { viewer { login } }"}"#;
    let (status, body) = post(&p, dir.path(), port, query, "application/json");
    assert_eq!(
        (status, body.trim()),
        (200, format!("received {}", query.len()).as_str())
    );
    let before = origin.received.load(Ordering::SeqCst);
    for mutation in [
        r#"{"query":"mutation { createGist(files: []) { id } }"}"#,
        // The query operationName picks hides a mutation in the same document.
        r#"{"query":"query A { viewer { login } } mutation B { deleteRepo { id } }","operationName":"A"}"#,
        // A persisted query the rule does not list.
        r#"{"extensions":{"persistedQuery":{"version":1,"sha256Hash":"ab12"}}}"#,
        // A repeated key: parsers disagree on which one counts.
        r#"{"query":"{ viewer { login } }","query":"mutation { x }"}"#,
        "{ not json",
    ] {
        let (status, body) = post(&p, dir.path(), port, mutation, "application/json");
        assert_eq!(status, 403, "{mutation}: {body}");
        assert!(body.contains("graphql_not_allowed"), "{body}");
    }
    let (status, _) = post(
        &p,
        dir.path(),
        port,
        "mutation { x }",
        "application/graphql",
    );
    assert_eq!(status, 403);
    // A body over judge_body_bytes (4096 here) is refused, not passed unjudged.
    let big = format!(
        r#"{{"query":"{{ viewer {{ login }} }}","pad":"{}"}}"#,
        "x".repeat(5000)
    );
    let (status, body) = post(&p, dir.path(), port, &big, "application/json");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("judge_body_bytes"), "{body}");
    assert_eq!(
        origin.received.load(Ordering::SeqCst),
        before,
        "no refused body left the proxy"
    );
    let rec = p.wait_record(|r| r["reason"] == "graphql_not_allowed");
    assert_eq!(rec["call"], "graphql mutation createGist", "{rec}");
}

#[test]
fn report_mode_forwards_a_refused_mutation_and_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let (_origin, port) = api_origin(&ca);
    let p = proxy(dir.path(), &ca, (9, port), GRAPHQL_RULE, true);
    let m = r#"{"query":"mutation { createGist { id } }"}"#;
    let (status, body) = post(&p, dir.path(), port, m, "application/json");
    assert_eq!(
        (status, body.trim()),
        (200, format!("received {}", m.len()).as_str())
    );
    let rec = p.wait_record(|r| r["reason"] == "graphql_not_allowed");
    assert_eq!(rec["decision"], "report", "{rec}");
    assert_eq!(rec["call"], "graphql mutation createGist", "{rec}");
}

#[test]
fn a_jsonrpc_batch_with_one_forbidden_call_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let (origin, port) = api_origin(&ca);
    let rule = r#"[{ host: api.test, paths: [/upload], protocol: jsonrpc, methods: ["eth_get*", eth_call] }]"#;
    let p = proxy(dir.path(), &ca, (9, port), rule, false);
    let ok = r#"[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":[]},{"jsonrpc":"2.0","id":2,"method":"eth_call"}]"#;
    let (status, body) = post(&p, dir.path(), port, ok, "application/json");
    assert_eq!(
        (status, body.trim()),
        (200, format!("received {}", ok.len()).as_str())
    );
    let before = origin.received.load(Ordering::SeqCst);
    let bad = r#"[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance"},{"jsonrpc":"2.0","id":"x","method":"eth_sendRawTransaction","params":["0xf8"]}]"#;
    let (status, body) = post(&p, dir.path(), port, bad, "application/json");
    assert_eq!(status, 200, "{body}");
    let errors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let errors = errors.as_array().expect("a batch is answered with a batch");
    assert_eq!(errors.len(), 2, "one error per call of the batch: {body}");
    assert_eq!(errors[0]["id"], 1);
    assert_eq!(errors[1]["id"], "x");
    for e in errors {
        assert_eq!(e["error"]["code"], -32001, "{e}");
        assert_eq!(e["error"]["data"]["reason"], "jsonrpc_not_allowed", "{e}");
    }
    assert_eq!(
        origin.received.load(Ordering::SeqCst),
        before,
        "nothing of the batch was sent"
    );
    let rec = p.wait_record(|r| r["reason"] == "jsonrpc_not_allowed");
    assert_eq!(
        rec["call"], "jsonrpc eth_getBalance,eth_sendRawTransaction",
        "{rec}"
    );
}

#[test]
fn an_lfs_download_passes_and_an_upload_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let (_origin, port) = api_origin(&ca);
    // The origin's /upload stands in for the repository /upload's batch endpoint: a rule
    // naming the repository path `/upload/..` would not reach it, so the batch path is the
    // origin's own.
    let rule = r#"[{ host: api.test, paths: ["/**"], git: [fetch], lfs: [download] }]"#;
    let p = proxy(dir.path(), &ca, (9, port), rule, false);
    let url = format!("https://api.test:{port}/o/r.git/info/lfs/objects/batch");
    let send = |op: &str| {
        let out = curl(&[
            "-x",
            &format!("http://dev:dev-secret@{}", p.proxy),
            "--cacert",
            dir.path().join("ica/ca.crt").to_str().unwrap(),
            "-H",
            "content-type: application/vnd.git-lfs+json",
            "--data-binary",
            &format!(r#"{{"operation":"{op}","objects":[]}}"#),
            "-w",
            "\n%{http_code}",
            &url,
        ]);
        out.text()
    };
    assert!(send("download").ends_with("\n200"));
    let refused = send("upload");
    assert!(
        refused.ends_with("\n403") && refused.contains("git_not_allowed"),
        "{refused}"
    );
    let rec = p.wait_record(|r| r["reason"] == "git_not_allowed");
    assert_eq!(rec["call"], "lfs upload", "{rec}");
}

/// Report mode, then `suggest`: the SDK client calls tools the rule does not list; nothing is
/// filtered or refused (report), every call is recorded, and `suggest` proposes the MCP rule
/// that would allow exactly the calls seen — which `validate` accepts.
#[test]
fn suggest_learns_an_mcp_rule_from_report_mode() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let server = mcp_server(&ca, "json");
    let port = server.port;
    let rule = r#"[{ host: mcp.test, paths: [/mcp], protocol: mcp, tools: [search] }]"#;
    let p = proxy(dir.path(), &ca, (port, 9), rule, true);
    let got = mcp_client(&p, dir.path(), port, "auto");
    assert_eq!(
        got["tools"].as_array().map(Vec::len),
        Some(4),
        "not filtered in report mode: {got}"
    );
    assert_eq!(got["delete_repo"]["ok"], "deleted:prod", "{got}");
    let rec = p.wait_record(|r| r["call"] == "mcp tools/call delete_repo");
    assert_eq!(
        (rec["decision"].as_str(), rec["reason"].as_str()),
        (Some("report"), Some("mcp_not_allowed")),
        "{rec}"
    );
    p.wait_record(|r| r["call"] == "mcp prompts/get leak");
    // Nothing was filtered, and the record says what enforcing would have hidden.
    let listed = p.wait_record(|r| r["call"] == "mcp tools/list");
    let detail = listed["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("would have hidden 3 list entries"),
        "{listed}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["suggest", "--sandbox", "dev", "--audit"])
        .arg(&p.audit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let want = r#"protocol: mcp, tools: ["ask_user", "create_issue", "delete_repo", "search"], resources: ["file:///docs/readme", "file:///secret/key"], prompts: ["leak"]"#;
    assert!(text.contains(want), "{text}");
    // The proposal is configuration `validate` accepts.
    let http = text
        .lines()
        .skip_while(|l| *l != "  http:")
        .skip(1)
        .take_while(|l| l.starts_with("    - "))
        .map(|l| l.trim_start_matches("    - "))
        .collect::<Vec<_>>()
        .join(", ");
    let cfg = std::fs::read_to_string(dir.path().join("proxy.yaml")).unwrap();
    let cfg = cfg.replace(rule, &format!("[{http}]"));
    std::fs::write(dir.path().join("suggested.yaml"), cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["validate", "--config"])
        .arg(dir.path().join("suggested.yaml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("tools:ask_user,create_issue,delete_repo,search"),
        "{said}"
    );
}
