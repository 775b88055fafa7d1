//! The admin API's OpenAPI 3.1 document (`docs/openapi.yaml`): a real validator (PyPI
//! `openapi-spec-validator`) accepts it, every operation is called on the real binary and
//! answers as documented (the check itself is in `common::openapi` and runs on every admin
//! response of every test), and the check refuses responses the document does not describe.

mod common;

use std::path::Path;
use std::process::Command;

use common::openapi::{self, Exchange};
use common::*;

const ADMIN_TOKEN: &str = "openapi-admin-token";

#[test]
fn the_document_is_valid_openapi_3_1() {
    let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml");
    let out = Command::new("python3")
        .args(["-m", "openapi_spec_validator", doc])
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "openapi-spec-validator refused docs/openapi.yaml (or is not installed: .ci/run installs it with pip): {text}"
    );
    assert!(text.contains("OK"), "{text}");
    assert_eq!(openapi::document()["openapi"], "3.1.0");
}

fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_check_refuses_what_the_document_does_not_describe() {
    let json = headers(&[("Content-Type", "application/json")]);
    let ok = |method, target, status, headers: &[(String, String)], body| {
        openapi::check(&Exchange {
            method,
            target,
            status,
            headers,
            body,
        })
    };
    let body = r#"{"id":"a","created":true,"policy_version":"0a1b2c"}"#;
    ok("PUT", "/v1/sandboxes/a", 201, &json, body).unwrap();
    // A field the document does not have.
    let extra = r#"{"id":"a","created":true,"policy_version":"0a1b2c","secret":"x"}"#;
    let e = ok("PUT", "/v1/sandboxes/a", 201, &json, extra).unwrap_err();
    assert!(e.contains("secret"), "{e}");
    // A required field missing, a wrong type.
    assert!(ok(
        "PUT",
        "/v1/sandboxes/a",
        201,
        &json,
        r#"{"id":"a","created":true}"#
    )
    .is_err());
    assert!(ok(
        "DELETE",
        "/v1/sandboxes/a",
        200,
        &json,
        r#"{"id":"a","deleted":true,"tunnels_closed":"1"}"#
    )
    .is_err());
    // A status the operation does not list.
    let e = ok("PUT", "/v1/sandboxes/a", 202, &json, body).unwrap_err();
    assert!(e.contains("202"), "{e}");
    // A media type the response does not list.
    let plain = headers(&[("Content-Type", "text/plain")]);
    assert!(ok("PUT", "/v1/sandboxes/a", 201, &plain, body).is_err());
    // A 401 without its WWW-Authenticate.
    let unauthorized = r#"{"error":"this call needs the token"}"#;
    let e = ok("POST", "/v1/reload", 401, &json, unauthorized).unwrap_err();
    assert!(e.contains("WWW-Authenticate"), "{e}");
    let with_challenge = headers(&[
        ("Content-Type", "application/json"),
        ("WWW-Authenticate", "Bearer realm=\"egress-proxy-admin\""),
    ]);
    ok("POST", "/v1/reload", 401, &with_challenge, unauthorized).unwrap();
    // A 503 of a change without Retry-After.
    assert!(ok(
        "DELETE",
        "/v1/sandboxes/a",
        503,
        &json,
        r#"{"error":"etcd"}"#
    )
    .is_err());
    // An API path the document does not have, or a method a path does not take without 405.
    assert!(ok("GET", "/v1/secrets", 200, &json, "{}").is_err());
    assert!(ok("PATCH", "/v1/sandboxes/a", 200, &json, body).is_err());
    let allow = headers(&[
        ("Content-Type", "application/json"),
        ("Allow", "GET, PUT, DELETE"),
    ]);
    ok(
        "PATCH",
        "/v1/sandboxes/a",
        405,
        &allow,
        r#"{"error":"use GET, PUT or DELETE"}"#,
    )
    .unwrap();
    // The probes' text bodies are checked too.
    let text = headers(&[("Content-Type", "text/plain; charset=utf-8")]);
    ok("GET", "/readyz", 200, &text, "ready: policy 3fa2b1\n").unwrap();
    assert!(ok("GET", "/readyz", 200, &text, "ready\n").is_err());
}

/// `proxy.yaml` with a file sandbox that brokers one credential.
fn config(dir: &Path) -> ProxyConfig {
    ca_init(&dir.join("ica"));
    std::fs::write(dir.join("admin.token"), ADMIN_TOKEN).unwrap();
    std::fs::write(dir.join("api.key"), "sk-openapi-test").unwrap();
    let credential = format!(
        "{{ name: api, hosts: [api.test], inject: {{ header: Authorization, format: \"Bearer {{secret}}\" }}, source: {{ file: {} }} }}",
        dir.join("api.key").display()
    );
    ProxyConfig::new()
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.github.com", "140.82.112.5")
        .intercept_only(&dir.join("ica"))
        .sandbox(
            SandboxSpec::new("filed")
                .source("127.0.0.0/8")
                .credential(&credential)
                .allow("api.test")
                .allow("example.com"),
        )
}

#[test]
fn every_operation_answers_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let p = config(dir.path()).start(dir.path());
    let a = p.admin;
    let t = Some(ADMIN_TOKEN);
    let binding = format!(
        r#"{{"auth": {{"token_sha256": "{}"}}, "enforcement": "report", "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["example.com", "**.github.com"]}}}}}}"#,
        sha("sandbox-token")
    );
    // Every call below is checked against the document by `admin_req`; the statuses are
    // asserted here so that each documented answer is really reached.
    assert_eq!(admin_req(a, "GET", "/healthz", "", None).0, 200);
    assert_eq!(admin_req(a, "GET", "/readyz", "", None).0, 200);
    assert_eq!(admin_req(a, "GET", "/metrics", "", None).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/sandboxes", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/sandboxes", "", None).0, 401);
    assert_eq!(
        admin_req(a, "GET", "/v1/sandboxes", "", Some("wrong")).0,
        401
    );
    assert_eq!(admin_req(a, "PUT", "/v1/sandboxes/rt", &binding, t).0, 201);
    assert_eq!(admin_req(a, "PUT", "/v1/sandboxes/rt", &binding, t).0, 200);
    assert_eq!(
        admin_req(a, "PUT", "/v1/sandboxes/rt", &binding, None).0,
        401
    );
    let (status, body) = admin_req(a, "PUT", "/v1/sandboxes/bad", r#"{"policy": 3}"#, t);
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        admin_req(a, "PUT", "/v1/sandboxes/rt?ttl_s=5", &binding, t).0,
        400
    );
    assert_eq!(
        admin_req(a, "PUT", "/v1/sandboxes/filed", &binding, t).0,
        409
    );
    assert_eq!(over_the_cap(a, "PUT", "/v1/sandboxes/big"), 413);
    assert_eq!(over_the_cap(a, "POST", "/v1/check"), 413);
    assert_eq!(admin_req(a, "GET", "/v1/sandboxes/rt", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/sandboxes/filed", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/sandboxes/nobody", "", t).0, 404);
    assert_eq!(admin_req(a, "PATCH", "/v1/sandboxes/rt", "", t).0, 405);
    assert_eq!(admin_req(a, "GET", "/v1/reload", "", t).0, 405);
    assert_eq!(admin_req(a, "GET", "/v1/nothing", "", t).0, 404);
    let check = r#"{"sandbox": "rt", "target": "api.github.com:443"}"#;
    let (status, body) = admin_req(a, "POST", "/v1/check", check, t);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""decision":"allow""#), "{body}");
    let check = r#"{"sandbox": "filed", "target": "127.0.0.1:22"}"#;
    assert_eq!(admin_req(a, "POST", "/v1/check", check, t).0, 200);
    let check = r#"{"sandbox": "filed", "target": "bad target:x"}"#;
    assert_eq!(admin_req(a, "POST", "/v1/check", check, t).0, 200);
    assert_eq!(admin_req(a, "POST", "/v1/check", "{}", t).0, 400);
    let check = r#"{"sandbox": "nobody", "target": "example.com"}"#;
    assert_eq!(admin_req(a, "POST", "/v1/check", check, t).0, 404);
    let (status, body) = admin_req(a, "GET", "/v1/sandboxes/filed/placeholders", "", t);
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("sk-openapi-test"), "{body}");
    assert_eq!(
        admin_req(a, "GET", "/v1/sandboxes/filed/placeholders", "", None).0,
        401
    );
    assert_eq!(
        admin_req(a, "GET", "/v1/sandboxes/nobody/placeholders", "", t).0,
        404
    );
    assert_eq!(
        admin_req(a, "POST", "/v1/sandboxes/rt/keepalive", "", t).0,
        400
    );
    // Access requests: two made from inside the sandbox (identified by its source), answered.
    let ask = |host: &str| {
        let body = format!(r#"{{"host": "{host}", "port": 443, "reason": "openapi"}}"#);
        let px = format!("http://{}", p.proxy);
        let out = curl(&[
            "-x",
            &px,
            "--data-binary",
            &body,
            "http://egress-proxy.local/v1/requests",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out.text()).unwrap();
        v["id"].as_str().unwrap().to_string()
    };
    let (first, second) = (ask("one.test"), ask("two.test"));
    assert_eq!(admin_req(a, "GET", "/v1/requests", "", t).0, 200);
    assert_eq!(
        admin_req(a, "GET", "/v1/requests?state=pending", "", t).0,
        200
    );
    assert_eq!(admin_req(a, "GET", "/v1/requests?state=odd", "", t).0, 400);
    assert_eq!(admin_req(a, "GET", "/v1/requests", "", None).0, 401);
    let one = format!("/v1/requests/{first}");
    assert_eq!(admin_req(a, "GET", &one, "", t).0, 200);
    assert_eq!(
        admin_req(a, "GET", "/v1/requests/r-000000000000", "", t).0,
        404
    );
    let approve = format!("{one}/approve");
    assert_eq!(admin_req(a, "POST", &approve, r#"{"ttl_s": 0}"#, t).0, 400);
    assert_eq!(admin_req(a, "POST", &approve, "{}", None).0, 401);
    let ttl = r#"{"grant": "ttl", "ttl_s": 60, "note": "openapi"}"#;
    assert_eq!(admin_req(a, "POST", &approve, ttl, t).0, 200);
    assert_eq!(admin_req(a, "POST", &approve, ttl, t).0, 409);
    // The grant it made is listed (the schema checked on a real entry).
    let (status, body) = admin_req(a, "GET", "/v1/grants", "", t);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"id\":\"{first}\"")), "{body}");
    assert_eq!(admin_req(a, "GET", "/v1/grants?sandbox=rt", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/grants?colour=red", "", t).0, 400);
    assert_eq!(admin_req(a, "GET", "/v1/grants", "", None).0, 401);
    let nobody = "/v1/requests/r-000000000000";
    assert_eq!(
        admin_req(a, "POST", &format!("{nobody}/approve"), "", t).0,
        404
    );
    let deny = format!("/v1/requests/{second}/deny");
    assert_eq!(admin_req(a, "POST", &deny, r#"{"grant": "ttl"}"#, t).0, 400);
    assert_eq!(admin_req(a, "POST", &deny, "{}", None).0, 401);
    assert_eq!(admin_req(a, "POST", &deny, r#"{"note": "no"}"#, t).0, 200);
    assert_eq!(admin_req(a, "POST", &deny, "", t).0, 409);
    assert_eq!(
        admin_req(a, "POST", &format!("{nobody}/deny"), "", t).0,
        404
    );
    assert_eq!(admin_req(a, "GET", &deny, "", t).0, 405);
    let revoke = format!("{one}/revoke");
    assert_eq!(admin_req(a, "POST", &revoke, "", None).0, 401);
    assert_eq!(admin_req(a, "POST", &revoke, "", t).0, 200);
    assert_eq!(admin_req(a, "POST", &revoke, "", t).0, 409);
    assert_eq!(
        admin_req(a, "POST", &format!("{nobody}/revoke"), "", t).0,
        404
    );
    assert_eq!(admin_req(a, "POST", "/v1/reload", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/observe?colour=red", "", t).0, 400);
    assert_eq!(admin_req(a, "GET", "/v1/observe", "", Some("wrong")).0, 401);
    // Layers and simulation.
    assert_eq!(admin_req(a, "GET", "/v1/layers", "", t).0, 200);
    let layer = r#"{"ceiling": ["**.github.com", "example.com"], "deny": ["gist.github.com"]}"#;
    assert_eq!(admin_req(a, "PUT", "/v1/layers/l1", layer, t).0, 201);
    assert_eq!(admin_req(a, "PUT", "/v1/layers/l1", layer, t).0, 200);
    let orphan = r#"{"parent": "nobody"}"#;
    assert_eq!(admin_req(a, "PUT", "/v1/layers/l2", orphan, t).0, 400);
    assert_eq!(admin_req(a, "GET", "/v1/layers/l1", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/layers/nobody", "", t).0, 404);
    let narrower = r#"{"ceiling": ["example.com"]}"#;
    let (status, body) = admin_req(a, "POST", "/v1/layers/l1/simulate", narrower, t);
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin_req(a, "POST", "/v1/sandboxes/rt/simulate", &binding, t);
    assert_eq!(status, 200, "{body}");
    assert_eq!(admin_req(a, "DELETE", "/v1/layers/l1", "", t).0, 200);
    assert_eq!(admin_req(a, "DELETE", "/v1/layers/l1", "", t).0, 404);
    // Flow labels: shown (no rules: none armed); a waiver of what is not there is a 404, a
    // waiver that says two things a 400 (tests/flows.rs arms and waives for real).
    let (status, body) = admin_req(a, "GET", "/v1/sandboxes/rt/flows", "", t);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        admin_req(a, "GET", "/v1/sandboxes/nobody/flows", "", t).0,
        404
    );
    let waive = "/v1/sandboxes/rt/flows/waive";
    assert_eq!(
        admin_req(a, "POST", waive, r#"{"label": "x", "once": true}"#, t).0,
        404
    );
    let two = r#"{"label": "x", "once": true, "reset": true}"#;
    assert_eq!(admin_req(a, "POST", waive, two, t).0, 400);
    assert_eq!(admin_req(a, "DELETE", "/v1/sandboxes/rt", "", t).0, 200);
    assert_eq!(admin_req(a, "DELETE", "/v1/sandboxes/rt", "", t).0, 404);
    assert_eq!(admin_req(a, "DELETE", "/v1/sandboxes/filed", "", t).0, 409);
    // A reload with a typo is refused and the running policy stays.
    let yaml = std::fs::read_to_string(dir.path().join("proxy.yaml")).unwrap();
    std::fs::write(
        dir.path().join("proxy.yaml"),
        format!("{yaml}lisen: {{}}\n"),
    )
    .unwrap();
    let (status, body) = admin_req(a, "POST", "/v1/reload", "", t);
    assert_eq!(status, 422, "{body}");

    // Usage: the sums and the quotas, a bad `since`, and the token.
    let (status, body) = admin_req(a, "GET", "/v1/usage?since=0", "", t);
    assert_eq!(status, 200, "{body}");
    assert_eq!(admin_req(a, "GET", "/v1/usage?sandbox=rt", "", t).0, 200);
    assert_eq!(admin_req(a, "GET", "/v1/usage?since=soon", "", t).0, 400);
    assert_eq!(admin_req(a, "GET", "/v1/usage?colour=red", "", t).0, 400);
    assert_eq!(admin_req(a, "GET", "/v1/usage", "", Some("wrong")).0, 401);

    // The identity issuer's documents are public (no token).
    for path in [
        "/.well-known/jwks.json",
        "/.well-known/openid-configuration",
    ] {
        let (status, body) = admin_req(a, "GET", path, "", None);
        assert_eq!(status, 200, "{path}: {body}");
    }

    // Every operation of the document was called and answered as documented.
    let seen: std::collections::BTreeSet<String> =
        openapi::seen().into_iter().map(|(op, _)| op).collect();
    let documented: std::collections::BTreeSet<String> = openapi::document()["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str().map(str::to_string))
        .collect();
    let missed: Vec<_> = documented.difference(&seen).collect();
    assert!(missed.is_empty(), "operations never exercised: {missed:?}");
}

/// A request announcing a body over `runtime.max_binding_bytes`, without sending it: the
/// answer must come from the announced length alone (a proxy that read first would wait).
fn over_the_cap(admin: std::net::SocketAddr, method: &str, path: &str) -> u16 {
    let text = raw_exchange(
        admin,
        format!(
            "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n{{"
        )
        .as_bytes(),
        std::time::Duration::from_secs(5),
    );
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let (status, headers) = openapi::parse_head(head);
    openapi::conform(&Exchange {
        method,
        target: path,
        status,
        headers: &headers,
        body,
    });
    status
}

#[test]
fn without_a_token_changes_are_refused_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let p = ProxyConfig::new().start(dir.path());
    let a = p.admin;
    assert_eq!(admin_req(a, "GET", "/v1/sandboxes", "", None).0, 200);
    assert_eq!(admin_req(a, "PUT", "/v1/sandboxes/x", "{}", None).0, 403);
    assert_eq!(admin_req(a, "DELETE", "/v1/sandboxes/x", "", None).0, 403);
    assert_eq!(admin_req(a, "POST", "/v1/reload", "", None).0, 403);
    assert_eq!(
        admin_req(a, "POST", "/v1/sandboxes/x/keepalive", "", None).0,
        403
    );
    assert_eq!(admin_req(a, "GET", "/v1/observe", "", None).0, 403);
    assert_eq!(
        admin_req(a, "GET", "/v1/sandboxes/default/placeholders", "", None).0,
        401
    );
}

/// Generated clients (openapi-python-client) take the first `anyOf` branch that parses, and
/// their models ignore keys they do not know: a branch whose required keys are a subset of a
/// later one's would swallow it (the `errors` list of an invalid binding was lost that way).
/// So in every `anyOf`, the more specific schema comes first.
#[test]
fn any_of_lists_the_more_specific_schema_first() {
    fn required(doc: &serde_json::Value, branch: &serde_json::Value) -> Vec<String> {
        let schema = match branch["$ref"].as_str() {
            Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap_or(branch),
            None => branch,
        };
        let mut keys: Vec<String> = schema["required"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        keys.sort();
        keys
    }
    fn walk(doc: &serde_json::Value, v: &serde_json::Value, seen: &mut usize) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(branches) = m.get("anyOf").and_then(|a| a.as_array()) {
                    *seen += 1;
                    for (i, earlier) in branches.iter().enumerate() {
                        for later in &branches[i + 1..] {
                            let (e, l) = (required(doc, earlier), required(doc, later));
                            let swallows = e.len() < l.len() && e.iter().all(|k| l.contains(k));
                            assert!(
                                !swallows,
                                "{earlier} comes before the more specific {later}"
                            );
                        }
                    }
                }
                m.values().for_each(|x| walk(doc, x, seen));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(doc, x, seen)),
            _ => {}
        }
    }
    let doc = openapi::document();
    let mut seen = 0;
    walk(doc, doc, &mut seen);
    assert!(seen >= 2, "the document's anyOf lists were not found");
}
