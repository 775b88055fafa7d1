//! Policy layers and simulation (issue 65), through the real binary: an organisation layer in
//! the file and a team layer defined at run time bound a registered sandbox — an entry outside
//! a ceiling is refused at `PUT` naming the layer, a layer's `deny` refuses even a report-mode
//! member, a grant outside the ceiling can be neither asked nor approved, tightening the team's
//! ceiling cuts the member's open tunnel, and the runtime layer survives a restart. `simulate`
//! replays a real trail (forwarded, CONNECT, terminated path and MCP requests) under a
//! candidate and reports exactly what changes, "cannot tell" for what the trail cannot show;
//! the admin endpoint agrees with the CLI, and `?require_simulation` refuses a widening change.
//! The etcd test (ignored like every etcd test; `.ci/run` includes it) has two replicas agree.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use common::*;

const ADMIN_TOKEN: &str = "layers-admin-token";

fn admin(p: &Proxy, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, text) = admin_req(p.admin, method, path, body, Some(ADMIN_TOKEN));
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// What layer `org` denies.
const ORG_DENY: &str = r#"["*.evil.example", "secret.corp.example"]"#;

/// The file: layer `org` (denying `org_deny`), a report-mode member of it, and what the tests
/// need around them; `extra` (YAML) at the top level.
fn org_config(d: &Path, extra: &str, org_deny: &str) -> ProxyConfig {
    std::fs::write(d.join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    let names = [
        "api.corp.example",
        "db.corp.example",
        "files.corp.example",
        "secret.corp.example",
        "pypi.org",
        "github.com",
    ];
    names
        .iter()
        .fold(ProxyConfig::new(), |c, n| c.host(n, "127.0.0.1"))
        .admin_token_file(Path::new("admin.token"))
        .raw(extra)
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .raw(&format!(
            r#"layers: [{{ id: org, ceiling: ["*.corp.example:*", "pypi.org:*"], deny: {org_deny} }}]"#
        ))
        .sandbox(
            SandboxSpec::new("reporter")
                .entry("layer", "org")
                .report()
                .token("reporter-secret")
                .allow("*.corp.example:*"),
        )
}

/// A registration of `id` (token `{id}-secret`) in layer `layer` with `egress`.
fn member(id: &str, layer: &str, egress: &[&str]) -> String {
    let egress: Vec<String> = egress.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"{{"layer":"{layer}","auth":{{"token_sha256":"{}"}},"policy":{{"provider":"local","config":{{}},"network":{{"egress":[{}]}}}}}}"#,
        sha(&format!("{id}-secret")),
        egress.join(",")
    )
}

fn get(p: &Proxy, ca: &TestCa, who: &str, url: &str) -> CurlOut {
    let px = format!("http://{who}:{who}-secret@{}", p.proxy);
    curl(&["-x", &px, "--cacert", &ca.ca_pem.display().to_string(), url])
}

/// A plain-HTTP request inside a CONNECT tunnel that stays open (keep-alive) afterwards.
fn open_tunnel(p: &Proxy, who: &str, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_on(&mut s, target, Some(&basic(who, &format!("{who}-secret"))));
    let host = target.split(':').next().unwrap();
    write!(s, "GET /held HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).contains("200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    s
}

#[test]
fn layers_bound_registrations_grants_and_open_tunnels() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::generate(d);
    let https = Origin::start(Some(&ca));
    let plain = Origin::start(None);
    let (port, hport) = (https.addr.port(), plain.addr.port());
    let state = format!("state_dir: {}", d.join("state").display());
    let mut p = org_config(d, &state, ORG_DENY).start(d);

    // A team layer may narrow its organisation, never widen it.
    let wide = r#"{"parent":"org","ceiling":["github.com:*"]}"#;
    let (status, body) = admin(&p, "PUT", "/v1/layers/team-a", wide);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("outside the ceiling of its ancestor layer org"),
        "{body}"
    );
    let team = r#"{"parent":"org","ceiling":["api.corp.example:*","db.corp.example:*","files.corp.example:*"]}"#;
    let (status, body) = admin(&p, "PUT", "/v1/layers/team-a", team);
    assert_eq!(status, 201, "{body}");

    // A member's entry outside a ceiling is refused where it is written, naming the layer.
    let outside = member("s1", "team-a", &["api.corp.example:*", "github.com:*"]);
    let (status, body) = admin(&p, "PUT", "/v1/sandboxes/s1", &outside);
    assert_eq!(status, 400, "{body}");
    let why = body["error"].as_str().unwrap();
    assert!(
        why.contains("`github.com:*` is outside the ceiling of layer org"),
        "{why}"
    );
    let inside = member("s1", "team-a", &["api.corp.example:*", "db.corp.example:*"]);
    let (status, body) = admin(&p, "PUT", "/v1/sandboxes/s1", &inside);
    assert_eq!(status, 201, "{body}");
    let (_, view) = admin(&p, "GET", "/v1/sandboxes/s1", "");
    assert_eq!(
        view["layers"],
        serde_json::json!(["org", "team-a"]),
        "{view}"
    );
    let (_, layer) = admin(&p, "GET", "/v1/layers/team-a", "");
    assert_eq!(layer["members"], serde_json::json!(["s1"]), "{layer}");
    let out = get(
        &p,
        &ca,
        "s1",
        &format!("https://api.corp.example:{port}/ok"),
    );
    assert!(out.text().contains("hello from origin"), "{}", out.stderr);

    // The organisation's deny wins over a member's own entry, and report mode does not relax it.
    let out = get(
        &p,
        &ca,
        "reporter",
        &format!("https://secret.corp.example:{port}/"),
    );
    assert!(out.stderr.contains("403"), "{}", out.stderr);
    let rec = p.wait_record(|r| r["target_host"] == "secret.corp.example" && r["event"] == "end");
    assert_eq!(
        (rec["decision"].as_str(), rec["reason"].as_str()),
        (Some("deny"), Some("denied_by_rule")),
        "{rec}"
    );
    assert!(
        rec["rule_source"]
            .as_str()
            .unwrap()
            .ends_with("layer org: deny[1]"),
        "{rec}"
    );

    // Access requests: outside the team's ceiling cannot even be asked; inside can.
    let ask = |host: &str| {
        let body = format!(r#"{{"host":"{host}","port":{port},"reason":"need it"}}"#);
        let px = format!("http://s1:s1-secret@{}", p.proxy);
        let out = curl(&[
            "-x",
            &px,
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &body,
            "-w",
            "\n%{http_code}",
            "http://egress-proxy.local/v1/requests",
        ]);
        let text = out.text();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (
            code.trim().parse::<u16>().unwrap_or(0),
            serde_json::from_str::<Value>(body).unwrap_or(Value::Null),
        )
    };
    let (status, body) = ask("pypi.org");
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("layer team-a: ceiling"), "{body}");
    let (status, pending) = ask("files.corp.example");
    assert_eq!(status, 202, "{pending}");
    let request = pending["id"].as_str().unwrap().to_string();

    // Tightening the team's ceiling cuts the member's open tunnel to what it no longer admits.
    let mut held = open_tunnel(&p, "s1", &format!("db.corp.example:{hport}"));
    let tight = r#"{"parent":"org","ceiling":["api.corp.example:*"]}"#;
    let (status, body) = admin(&p, "PUT", "/v1/layers/team-a", tight);
    assert_eq!(status, 200, "{body}");
    let mut buf = [0u8; 64];
    match held.read(&mut buf) {
        Ok(0) => {}
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        still => panic!("the tunnel is still open: {still:?}"),
    }
    let rec = p.wait_record(|r| {
        r["target_host"] == "db.corp.example" && r["event"] == "end" && r["mode"] != "http"
    });
    assert_eq!(rec["close"], "revoked", "{rec}");
    let check = format!(r#"{{"sandbox":"s1","target":"db.corp.example:{port}"}}"#);
    let (_, decided) = admin(&p, "POST", "/v1/check", &check);
    assert_eq!(decided["reason"], "outside_ceiling", "{decided}");
    assert!(
        decided["rule_source"]
            .as_str()
            .unwrap()
            .ends_with("layer team-a: ceiling"),
        "{decided}"
    );
    assert!(
        decided["explanation"]
            .as_str()
            .unwrap()
            .contains("outside the ceiling of"),
        "{decided}"
    );

    // The pending request is now outside the ceiling: it cannot be approved.
    let path = format!("/v1/requests/{request}/approve");
    let (status, body) = admin(&p, "POST", &path, r#"{"grant":"once"}"#);
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("outside the ceiling of"),
        "{body}"
    );
    // A layer with members cannot be deleted from under them.
    let (status, body) = admin(&p, "DELETE", "/v1/layers/team-a", "");
    assert_eq!(status, 409, "{body}");

    // After a restart the runtime layer is restored before the registration that names it.
    p.terminate();
    let p = Proxy::start_with(d.join("proxy.yaml"), d.join("audit.jsonl"), &[]);
    let (status, layer) = admin(&p, "GET", "/v1/layers/team-a", "");
    assert_eq!(status, 200, "{layer}");
    assert_eq!(
        layer["ceiling"],
        serde_json::json!(["api.corp.example:*"]),
        "{layer}"
    );
    let out = get(&p, &ca, "s1", &format!("https://db.corp.example:{port}/"));
    assert!(out.stderr.contains("403"), "{}", out.stderr);
    let out = get(
        &p,
        &ca,
        "s1",
        &format!("https://api.corp.example:{port}/again"),
    );
    assert!(out.text().contains("hello from origin"), "{}", out.stderr);

    // The organisation tightens (its file, reloaded): the member's open tunnel is cut.
    let mut held = open_tunnel(&p, "s1", &format!("api.corp.example:{hport}"));
    let tighter = org_config(
        d,
        &state,
        r#"["*.evil.example", "secret.corp.example", "api.corp.example"]"#,
    );
    std::fs::write(d.join("proxy.yaml"), tighter.yaml(&d.join("audit.jsonl"))).unwrap();
    let (status, body) = admin(&p, "POST", "/v1/reload", "");
    assert_eq!(status, 200, "{body}");
    let mut buf = [0u8; 64];
    match held.read(&mut buf) {
        Ok(0) => {}
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        still => panic!("the tunnel is still open after the org tightened: {still:?}"),
    }
    let check = format!(r#"{{"sandbox":"s1","target":"api.corp.example:{port}"}}"#);
    let (_, decided) = admin(&p, "POST", "/v1/check", &check);
    assert_eq!(decided["reason"], "denied_by_rule", "{decided}");
    assert!(
        decided["rule_source"]
            .as_str()
            .unwrap()
            .ends_with("layer org: deny[2]"),
        "{decided}"
    );
}

/// The registration of `dev` for the simulation test: `extra_egress` and `extra_http` added.
fn dev(port: u16, hport: u16, gone: bool, extra_http: &str) -> Value {
    let mut egress = vec![format!("api.test:{port}"), format!("fwd.test:{hport}")];
    if gone {
        egress.push(format!("gone.test:{port}"));
    }
    let http = format!(
        r#"[{{"host":"api.test","methods":["GET"],"paths":["/v1/*"]}},{{"host":"api.test","paths":["/mcp"],"protocol":"mcp","tools":["search"]}}{extra_http}]"#
    );
    let http: Value = serde_json::from_str(&http).unwrap();
    serde_json::json!({
        "auth": { "token_sha256": sha("dev-secret") },
        "policy": { "provider": "local", "config": {}, "network": { "egress": egress, "http": http } }
    })
}

const V2: &str = r#",{"host":"api.test","methods":["GET"],"paths":["/v2/*"]}"#;

fn mcp_call(p: &Proxy, d: &Path, port: u16, tool: &str) -> String {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    );
    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let out = curl(&[
        "-x",
        &px,
        "--cacert",
        d.join("ica/ca.crt").to_str().unwrap(),
        "-H",
        "content-type: application/json",
        "-H",
        "accept: application/json, text/event-stream",
        "--data-binary",
        &body,
        "-w",
        "\n%{http_code}",
        &format!("https://api.test:{port}/mcp"),
    ]);
    out.text()
}

#[test]
fn simulate_reports_exactly_what_a_candidate_changes_and_the_api_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::generate(d);
    ca_init(&d.join("ica"));
    let https = Origin::start(Some(&ca));
    let plain = Origin::start(None);
    let (port, hport) = (https.addr.port(), plain.addr.port());
    std::fs::write(d.join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    let config = ["api.test", "gone.test", "fwd.test", "other.test"]
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
        .admin_token_file(Path::new("admin.token"))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .intercept(&d.join("ica"), &ca.ca_pem)
        .intercept_option("judge_body_bytes", "4096");
    let p = config.start(d);
    // The files `simulate` and `policy diff` read: this configuration with more YAML.
    let base = config.yaml(&d.join("audit.jsonl"));
    let registered = dev(port, hport, true, "").to_string();
    let (status, body) = admin(&p, "PUT", "/v1/sandboxes/dev", &registered);
    assert_eq!(status, 201, "{body}");

    // The trail: terminated path and MCP requests, a plain CONNECT tunnel, a forwarded request.
    let ica = d.join("ica/ca.crt");
    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let fetch = |url: &str| {
        curl(&[
            "-x",
            &px,
            "--cacert",
            ica.to_str().unwrap(),
            "-w",
            "\n%{http_code}",
            url,
        ])
        .text()
    };
    assert!(fetch(&format!("https://api.test:{port}/v1/items")).ends_with("200"));
    assert!(fetch(&format!("https://api.test:{port}/v2/items")).ends_with("403"));
    let searched = mcp_call(&p, d, port, "search");
    assert!(!searched.contains("mcp_not_allowed"), "{searched}");
    // An MCP refusal is a JSON-RPC error the client can read.
    let refused = mcp_call(&p, d, port, "delete_repo");
    assert!(refused.contains("mcp_not_allowed"), "{refused}");
    let gone = curl(&[
        "-x",
        &px,
        "--cacert",
        ca.ca_pem.to_str().unwrap(),
        "-w",
        "\n%{http_code}",
        &format!("https://gone.test:{port}/"),
    ]);
    assert!(gone.text().ends_with("200"), "{}", gone.stderr);
    assert!(fetch(&format!("http://fwd.test:{hport}/x")).ends_with("200"));
    let other = curl(&["-x", &px, &format!("https://other.test:{port}/")]);
    assert!(other.stderr.contains("403"), "{}", other.stderr);
    eventually(Duration::from_secs(10), "every exchange recorded", || {
        let ends = p
            .audit_records()
            .into_iter()
            .filter(|r| r["event"] == "end" && r["sandbox"] == "dev")
            .count();
        (ends >= 11).then_some(())
    });

    // The candidate: gone.test removed, a path rule added on api.test.
    let candidate = dev(port, hport, false, V2);
    let file = d.join("candidate.yaml");
    let mut sandbox = candidate.clone();
    sandbox["id"] = "dev".into();
    std::fs::write(&file, format!("{base}sandboxes:\n  - {sandbox}\n")).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["simulate", "--json", "--sandbox", "dev", "--config"])
        .arg(&file)
        .arg(&p.audit)
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(
        cli.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let by_cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    let only = |m: &Value| -> (String, u64) {
        let o = m.as_object().unwrap();
        assert_eq!(o.len(), 1, "{m:#}");
        let (k, v) = o.iter().next().unwrap();
        (k.clone(), v["count"].as_u64().unwrap())
    };
    let (refused_by, n) = only(&by_cli["newly_refused"]);
    assert_eq!(n, 1, "{by_cli:#}");
    assert!(refused_by.starts_with("no_rule_matched"), "{refused_by}");
    assert!(
        by_cli["newly_refused"][&refused_by]["examples"][0]
            .as_str()
            .unwrap()
            .contains("gone.test"),
        "{by_cli:#}"
    );
    let (allowed_by, n) = only(&by_cli["newly_allowed"]);
    assert_eq!(n, 1, "{by_cli:#}");
    assert!(
        by_cli["newly_allowed"][&allowed_by]["examples"][0]
            .as_str()
            .unwrap()
            .contains("GET /v2/items"),
        "{by_cli:#}"
    );
    let (why, n) = only(&by_cli["cannot_tell"]);
    assert_eq!(n, 2, "the two MCP calls: {by_cli:#}");
    assert!(why.contains("reads this request's body (mcp)"), "{why}");
    let replayed = by_cli["replayed"].as_u64().unwrap();
    assert_eq!(
        by_cli["unchanged"].as_u64().unwrap() + 4,
        replayed,
        "{by_cli:#}"
    );

    let text = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["simulate", "--sandbox", "dev", "--config"])
        .arg(&file)
        .arg(&p.audit)
        .current_dir(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    eprintln!("{text}");
    assert!(text.contains("1 newly refused, 1 newly allowed"), "{text}");

    // What the team asks before narrowing a ceiling: the candidate loads although a member
    // now reaches beyond it; the member's entries are listed first and its exchanges beyond
    // the ceiling are refused `outside_ceiling`. A host denied outright refuses its MCP calls
    // whatever their bodies.
    let run = |yaml: String, name: &str| -> (Option<i32>, Value, String) {
        let file = d.join(name);
        std::fs::write(&file, yaml).unwrap();
        let run = |json: bool| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_egress-proxy"));
            c.arg("simulate");
            if json {
                c.arg("--json");
            }
            c.args(["--sandbox", "dev", "--config"])
                .arg(&file)
                .arg(&p.audit)
                .current_dir(d)
                .output()
                .unwrap()
        };
        let (j, t) = (run(true), run(false));
        let report = serde_json::from_slice(&j.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&j.stderr)));
        (
            j.status.code(),
            report,
            String::from_utf8_lossy(&t.stdout).into_owned(),
        )
    };
    let mut member = dev(port, hport, true, "");
    member["id"] = "dev".into();
    member["layer"] = "org".into();
    let ceiling = format!(
        "{base}layers:\n  - {{ id: org, ceiling: [\"api.test:*\"] }}\nsandboxes:\n  - {member}\n"
    );
    let (code, report, text) = run(ceiling, "ceiling.yaml");
    assert_eq!(code, Some(1), "{report:#}");
    let beyond = report["beyond_ceiling"].to_string();
    assert!(
        beyond.contains("sandbox dev") && beyond.contains("gone.test"),
        "{report:#}"
    );
    assert!(
        report["newly_refused"]
            .to_string()
            .contains("outside_ceiling"),
        "{report:#}"
    );
    assert!(
        text.starts_with("3 member entries reach beyond the candidate's ceilings")
            || text.contains("member entries reach beyond"),
        "{text}"
    );
    let first_line = text.lines().next().unwrap_or_default();
    assert!(
        first_line.contains("beyond the candidate's ceilings"),
        "{text}"
    );
    let mut denied = dev(port, hport, true, "");
    denied["id"] = "dev".into();
    denied["policy"]["network"]["deny"] = serde_json::json!(["api.test"]);
    let (code, report, _) = run(format!("{base}sandboxes:\n  - {denied}\n"), "deny.yaml");
    assert_eq!(code, Some(1), "{report:#}");
    let refused = report["newly_refused"].to_string();
    assert!(refused.contains("denied_by_rule"), "{report:#}");
    assert!(
        !report["cannot_tell"].to_string().contains("mcp"),
        "an MCP call to a denied host is refused, not unknown: {report:#}"
    );

    // The admin endpoint replays the proxy's own trail under the same candidate: the same report.
    let (status, by_api) = admin(
        &p,
        "POST",
        "/v1/sandboxes/dev/simulate",
        &candidate.to_string(),
    );
    assert_eq!(status, 200, "{by_api}");
    assert_eq!(by_api["simulation"], by_cli, "{by_api:#}");
    assert_eq!(by_api["widens"], true);

    // A pipeline that requires simulation: the widening change is refused and nothing changes;
    // the narrowing one (the host removed only) goes through.
    let (status, body) = admin(
        &p,
        "PUT",
        "/v1/sandboxes/dev?require_simulation",
        &candidate.to_string(),
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("widens reach"),
        "{body}"
    );
    assert!(fetch(&format!("https://api.test:{port}/v2/items")).ends_with("403"));
    let narrower = dev(port, hport, false, "").to_string();
    let (status, body) = admin(&p, "PUT", "/v1/sandboxes/dev?require_simulation", &narrower);
    assert_eq!(status, 200, "{body}");

    // `policy diff` between the running file and the candidate names both changes.
    let mut now = dev(port, hport, true, "");
    now["id"] = "dev".into();
    std::fs::write(d.join("now.yaml"), format!("{base}sandboxes:\n  - {now}\n")).unwrap();
    let diff = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["policy", "diff"])
        .arg(d.join("now.yaml"))
        .arg(&file)
        .current_dir(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&diff.stdout);
    eprintln!("{text}");
    assert_eq!(
        diff.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    assert!(
        text.contains(&format!("network.egress - gone.test:{port}")),
        "{text}"
    );
    assert!(text.contains("network.http added"), "{text}");
    assert!(text.contains("widens reach"), "{text}");
}

#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn two_replicas_on_etcd_agree_on_layers_and_their_members() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let plain = Origin::start(None);
    let (port, hport) = (https.addr.port(), plain.addr.port());
    let etcd = Etcd::start(dir.path());
    let plane = format!(
        "control_plane: {{ etcd: {{ endpoints: [\"127.0.0.1:{}\"], prefix: /layers-test/, request_timeout_ms: 3000 }} }}",
        etcd.client_port
    );
    let start = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        let p = org_config(&d, &plane, ORG_DENY).start(&d);
        eventually(Duration::from_secs(20), "/readyz", || {
            (admin_req(p.admin, "GET", "/readyz", "", None).0 == 200).then_some(())
        });
        p
    };
    let (a, b) = (start("a"), start("b"));
    // A layer written through one replica is in force on the other.
    let team = r#"{"parent":"org","ceiling":["api.corp.example:*","db.corp.example:*"]}"#;
    let (status, body) = admin(&a, "PUT", "/v1/layers/team-a", team);
    assert_eq!(status, 201, "{body}");
    eventually(Duration::from_secs(10), "replica b has team-a", || {
        (admin(&b, "GET", "/v1/layers/team-a", "").0 == 200).then_some(())
    });
    // Replica b refuses an entry outside it, as a would; a member registered through b is
    // bounded on a.
    let outside = member("s1", "team-a", &["api.corp.example:*", "pypi.org:*"]);
    let (status, body) = admin(&b, "PUT", "/v1/sandboxes/s1", &outside);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("outside the ceiling of layer team-a"),
        "{body}"
    );
    let inside = member("s1", "team-a", &["api.corp.example:*", "db.corp.example:*"]);
    let (status, body) = admin(&b, "PUT", "/v1/sandboxes/s1", &inside);
    assert_eq!(status, 201, "{body}");
    eventually(Duration::from_secs(10), "replica a has s1", || {
        (admin(&a, "GET", "/v1/sandboxes/s1", "").0 == 200).then_some(())
    });
    let out = get(&a, &ca, "s1", &format!("https://db.corp.example:{port}/"));
    assert!(out.text().contains("hello from origin"), "{}", out.stderr);
    // Tightened through b: a's open tunnel is cut, and both decide alike.
    let mut held = open_tunnel(&a, "s1", &format!("db.corp.example:{hport}"));
    let tight = r#"{"parent":"org","ceiling":["api.corp.example:*"]}"#;
    let (status, body) = admin(&b, "PUT", "/v1/layers/team-a", tight);
    assert_eq!(status, 200, "{body}");
    let mut buf = [0u8; 64];
    match held.read(&mut buf) {
        Ok(0) => {}
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        still => panic!("the tunnel on replica a is still open: {still:?}"),
    }
    let check = format!(r#"{{"sandbox":"s1","target":"db.corp.example:{port}"}}"#);
    for p in [&a, &b] {
        let decided = eventually(Duration::from_secs(10), "outside_ceiling", || {
            let (_, d) = admin(p, "POST", "/v1/check", &check);
            (d["reason"] == "outside_ceiling").then_some(d)
        });
        assert_eq!(decided["decision"], "deny", "{decided}");
    }
    let (_, va) = admin(&a, "GET", "/v1/layers", "");
    let (_, vb) = admin(&b, "GET", "/v1/layers", "");
    assert_eq!(va, vb);
}

/// Layers carry limits and `network.http` rules (issue 94). Layer `org` sets
/// `tokens_per_day: 2000000, requests_per_day: 4` and GitHub read-only (`GET`, `HEAD`); its
/// member asks for 5,000,000 tokens and writes its own rule allowing `POST`. The member is
/// capped (the usage API shows the layer's numbers in force, and its fifth request of the day
/// is refused `quota_exceeded`), and its `POST` is refused by the layer's rule before its own
/// is read (`http_not_allowed`, naming the layer) — nothing reaches the origin. On the old
/// code the file did not load (`limits` and `http` were unknown layer keys).
#[test]
fn a_layers_limits_cap_its_members_and_its_http_rules_come_first() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::generate(d);
    ca_init(&d.join("ica"));
    let https = Origin::start(Some(&ca));
    let port = https.addr.port();
    std::fs::write(d.join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    let greedy = |layer: &str| {
        ProxyConfig::new()
            .admin_token_file(Path::new("admin.token"))
            .dns_server("127.0.0.1:9")
            .host("github.com", "127.0.0.1")
            .guard_allow("127.0.0.1/32")
            .intercept(&d.join("ica"), &ca.ca_pem)
            .raw(&format!("layers: [{layer}]"))
            .sandbox(
                SandboxSpec::new("greedy")
                    .entry("layer", "org")
                    .token("greedy-secret")
                    .limits("{ tokens_per_day: 5000000 }")
                    .allow("github.com:*")
                    .network("http", "[{ host: github.com, methods: [GET, POST] }]"),
            )
    };
    let p = greedy("{ id: org, limits: { tokens_per_day: 2000000, requests_per_day: 4 }, http: [{ host: github.com, methods: [GET, HEAD] }] }").start(d);
    // `check` shows what the layer adds at the target: its rule and the limits in force.
    let checked = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["check", "--config"])
        .arg(&p.config)
        .args([
            "--sandbox",
            "greedy",
            "--json",
            &format!("github.com:{port}"),
        ])
        .current_dir(d)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(v["layers"]["http"][0]["layer"], "org", "{v}");
    assert_eq!(v["layers"]["limits"]["tokens_per_day"], 2_000_000, "{v}");
    // `policy diff` against a candidate that lifts the layer's tokens and drops its rule.
    let lifted = greedy("{ id: org, limits: { tokens_per_day: 9000000, requests_per_day: 4 } }");
    std::fs::write(d.join("lifted.yaml"), lifted.yaml(&d.join("audit.jsonl"))).unwrap();
    let diff = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["policy", "diff"])
        .arg(&p.config)
        .arg(d.join("lifted.yaml"))
        .current_dir(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(
        text.contains("limits.tokens_per_day 2000000 → 9000000"),
        "{text}"
    );
    assert!(text.contains("http rule removed"), "{text}");
    assert!(text.contains("widens"), "{text}");
    let (_, used) = admin(&p, "GET", "/v1/usage?sandbox=greedy", "");
    let q = &used["quotas"][0];
    assert_eq!(
        (&q["tokens_per_day"], &q["requests_per_day"]),
        (&Value::from(2_000_000), &Value::from(4)),
        "{used}"
    );
    let px = format!("http://greedy:greedy-secret@{}", p.proxy);
    let ica = d.join("ica/ca.crt").display().to_string();
    let url = format!("https://github.com:{port}/repos");
    let call = |method: &str| {
        let out = curl(&[
            "-x",
            &px,
            "--cacert",
            &ica,
            "-X",
            method,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ]);
        out.text()
    };
    assert_eq!(call("GET"), "200");
    let before = https.received.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(call("POST"), "403");
    let refused = p.wait_record(|r| r["reason"] == "http_not_allowed");
    let detail = refused["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("layer org"), "{refused}");
    assert_eq!(
        https.received.load(std::sync::atomic::Ordering::SeqCst),
        before
    );
    // The layer's requests_per_day: three more GETs, then the day is spent (the refused POST
    // was never counted).
    for _ in 0..3 {
        assert_eq!(call("GET"), "200");
    }
    // Refused at the tunnel: the CONNECT is answered 429 (curl's `%{http_connect}`).
    let out = curl(&[
        "-x",
        &px,
        "--cacert",
        &ica,
        "-o",
        "/dev/null",
        "-w",
        "%{http_connect}",
        &url,
    ]);
    assert_eq!(out.text(), "429", "{}", out.stderr);
    p.wait_record(|r| {
        r["reason"] == "quota_exceeded"
            && r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("requests_per_day quota (4)"))
    });
}
