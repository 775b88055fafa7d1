//! Sandbox identity tokens (issue 45, its first part), through the real binary: an origin
//! that verifies each token with PyJWT against the JWKS it fetches from the proxy's admin
//! listener (`tests/data/identity_origin.py`) accepts sandbox dev's token, with the SPIFFE
//! subject and the policy version; rejects that token replayed for another audience; and a
//! token the sandbox forged in the header is refused before anything is sent.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn an_origin_verifies_the_sandbox_identity_against_the_published_keys() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::generate(d);
    ca_init(&d.join("ica"));
    // The origin's port must be in the policy, and the origin needs the admin's address:
    // take a free port for the admin first.
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let jwks = format!("http://127.0.0.1:{admin_port}/.well-known/jwks.json");
    let origin = ScriptOrigin::start(
        "identity_origin.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            jwks.as_ref(),
        ],
    );
    let port = origin.port;
    let p = ProxyConfig::new()
        .admin_at(&format!("127.0.0.1:{admin_port}"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&d.join("ica"), &ca.ca_pem)
        .intercept_option(
            "identity",
            r#"{ trust_domain: agents.example, issuer: "https://egress.agents.example" }"#,
        )
        .sandbox(
            SandboxSpec::new("dev")
                .token("dev-secret")
                .entry("identity_token", "{ hosts: [api.test], ttl_s: 120 }")
                .allow(&format!("api.test:{port}"))
                .allow(&format!("other.test:{port}")),
        )
        .start(d);
    // The discovery document points at the keys.
    let (status, body) = p.admin_get("/.well-known/openid-configuration");
    assert_eq!(status, 200, "{body}");
    let disco: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(disco["issuer"], "https://egress.agents.example");
    assert!(disco["jwks_uri"]
        .as_str()
        .unwrap()
        .ends_with("/.well-known/jwks.json"));
    let (status, body) = p.admin_get("/.well-known/jwks.json");
    assert_eq!(status, 200, "{body}");
    let keys: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(keys["keys"][0]["crv"], "Ed25519", "{keys}");

    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let ica = d.join("ica/ca.crt");
    let get = |url: &str, extra: &[&str]| {
        let mut args = vec!["-sS", "-x", &px, "--cacert", ica.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.push(url);
        let out = curl(&args);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), out.stderr)
    };
    // Accepted: the origin verified the signature with the published key, for its host.
    let body = get(&format!("https://api.test:{port}/whoami"), &[]);
    let claims: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
    assert_eq!(
        claims["sub"], "spiffe://agents.example/sandbox/dev",
        "{claims}"
    );
    assert_eq!(claims["aud"], "api.test");
    assert_eq!(claims["iss"], "https://egress.agents.example");
    assert!(claims["policy_version"]
        .as_str()
        .is_some_and(|v| !v.is_empty()));
    assert!(claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap() == 120);
    // An origin that reflects the token: the sandbox reads neither the header nor the body
    // copy (security review A18: it read the live token back), and the record says so.
    let px2 = px.clone();
    let out = curl(&[
        "-sS",
        "-D",
        "-",
        "-x",
        &px2,
        "--cacert",
        ica.to_str().unwrap(),
        &format!("https://api.test:{port}/reflect"),
    ]);
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(answer.contains("\"echo\""), "{answer} {}", out.stderr);
    assert!(
        !answer.contains("eyJ"),
        "a token (header or body) reached the sandbox: {answer}"
    );
    let rec = p.wait_record(|r| r["path"] == "/reflect");
    assert_eq!(rec["secret_reflected"], "sandbox-identity", "{rec}");
    // The same token replayed toward another audience is rejected.
    let body = get(
        &format!("https://api.test:{port}/replay?aud=other.test"),
        &[],
    );
    assert!(
        body.contains("\"rejected\"") && body.contains("udience"),
        "{body}"
    );
    // A token the sandbox writes itself never leaves the proxy.
    let body = get(
        &format!("https://api.test:{port}/whoami"),
        &["-H", "X-Sandbox-Identity: eyJhbGciOiJub25lIn0.e30."],
    );
    // The refusal speaks of the header, not of a placeholder the sandbox never had (F6).
    assert!(
        body.contains("credential_misuse: x-sandbox-identity is set by the proxy (the sandbox's signed identity); a sandbox may not send it"),
        "{body}"
    );
    assert!(!body.contains("placeholder"), "{body}");
    let rec = p.wait_record(|r| r["reason"] == "credential_misuse");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .starts_with("x-sandbox-identity is set by the proxy"),
        "{rec}"
    );
    // A host the token is not bound to is not terminated and gets no token.
    let out = curl(&[
        "-sS",
        "-x",
        &px,
        "--cacert",
        ca.ca_pem.to_str().unwrap(),
        &format!("https://other.test:{port}/whoami"),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no token"));
    // Plain HTTP to the identity host gets one answer on every path: refused, forwarded as
    // in a CONNECT tunnel (review 7a: forwarded, it went out without the token).
    let body = get(&format!("http://api.test:{port}/whoami"), &[]);
    assert!(
        body.contains("credential_misuse") && body.contains("identity token"),
        "{body}"
    );
    // In a tunnel the refusal resets it; both are recorded.
    get(&format!("http://api.test:{port}/whoami"), &["-p"]);
    eventually(Duration::from_secs(10), "two plain-HTTP refusals", || {
        let n = p
            .audit_records()
            .iter()
            .filter(|r| {
                r["reason"] == "credential_misuse"
                    && r["detail"]
                        .as_str()
                        .unwrap_or("")
                        .contains("identity token")
            })
            .count();
        (n == 2).then_some(())
    });
    // No token is in the audit trail.
    let log = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    assert!(!log.contains("eyJ"), "a token in the audit log");
}
