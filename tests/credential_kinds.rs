//! The credential kinds that sign or mint (issue 43), through the proxy with real clients
//! against local origins that verify for real:
//! - `aws_sigv4`: boto3 with the sandbox's placeholder keys against an S3-like origin that
//!   checks every signature with the *real* keys (`tests/data/aws_origin.py`, botocore's
//!   signer for the canonical request): signed, unsigned and streaming uploads, an upload
//!   signed chunk by chunk, a presigned GET, an STS call signed over its body; another
//!   sandbox's placeholder is refused;
//! - `oauth2` and `github_app`: see their tests below.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

const ADMIN: &str = "admin-token-for-tests";
const REAL_KEY_ID: &str = "AKIAREALKEY000000001";
const REAL_SECRET: &str = "realSecretKey/0123456789abcdefghijklmnopq";

/// The admin API's placeholders of sandbox `id`.
fn placeholders(p: &Proxy, id: &str) -> serde_json::Value {
    let (status, body) = admin_req(
        p.admin,
        "GET",
        &format!("/v1/sandboxes/{id}/placeholders"),
        "",
        Some(ADMIN),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["placeholders"][0].clone()
}

/// A proxy where sandboxes `dev` and `other` each have an `aws_sigv4` credential for s3.test
/// (the same real keys), the origin on `port`.
fn aws_proxy(dir: &Path, ca: &TestCa, port: u16) -> Proxy {
    ca_init(&dir.join("ica"));
    std::fs::write(dir.join("admin.token"), ADMIN).unwrap();
    std::fs::write(dir.join("aws.id"), format!("{REAL_KEY_ID}\n")).unwrap();
    std::fs::write(dir.join("aws.secret"), REAL_SECRET).unwrap();
    let sandbox = |id: &str| {
        format!(
            r#"  - id: {id}
    auth: {{ token_sha256: {tok} }}
    credentials:
      - {{ name: aws, kind: aws_sigv4, hosts: [s3.test], source: {{ access_key_id_file: aws.id, secret_access_key_file: aws.secret }} }}
    policy:
      provider: local
      config: {{}}
      network:
        egress: ["s3.test:{port}"]
"#,
            tok = sha(&format!("{id}-secret")),
        )
    };
    Proxy::start(
        dir,
        &format!(
            r#"admin_token_file: admin.token
dns: {{ servers: ["127.0.0.1:9"], hosts: {{ s3.test: [127.0.0.1] }} }}
defaults: {{ guard_allow_ranges: [127.0.0.1/32] }}
tls_intercept: {{ ca_cert_file: {ica}/ca.crt, ca_key_file: {ica}/ca.key, upstream_ca_file: {upstream} }}
sandboxes:
{dev}{other}"#,
            ica = dir.join("ica").display(),
            upstream = ca.ca_pem.display(),
            dev = sandbox("dev"),
            other = sandbox("other"),
        ),
    )
}

/// Run `tests/data/aws_client.py` as sandbox `id` with keys `keys`.
fn aws_client(p: &Proxy, dir: &Path, id: &str, port: u16, keys: (&str, &str)) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/aws_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://{id}:{id}-secret@{}", p.proxy))
        .arg(dir.join("ica/ca.crt"))
        .arg(format!("https://s3.test:{port}"))
        .arg(keys.0)
        .arg(keys.1)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap()
}

#[test]
fn boto3_with_placeholder_keys_is_re_signed_with_the_real_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = ScriptOrigin::start(
        "aws_origin.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            REAL_KEY_ID.as_ref(),
            REAL_SECRET.as_ref(),
        ],
    );
    let p = aws_proxy(dir.path(), &ca, origin.port);
    let ph = placeholders(&p, "dev");
    assert_eq!(ph["kind"], "aws_sigv4");
    let key_id = ph["access_key_id"].as_str().unwrap().to_string();
    let secret = ph["secret_access_key"].as_str().unwrap().to_string();
    assert!(key_id.starts_with("AKIA") && key_id.len() == 20, "{ph}");
    assert_eq!(secret.len(), 40);
    assert_ne!(key_id, REAL_KEY_ID);

    let got = aws_client(&p, dir.path(), "dev", origin.port, (&key_id, &secret));
    for step in [
        "signed_put",
        "unsigned_put",
        "streaming_put",
        "signed_chunks_put",
    ] {
        assert_eq!(got[step], 200, "{step}: {got}");
    }
    for step in ["get", "same_unsigned", "same_streaming", "same_chunked"] {
        assert_eq!(got[step], true, "{step}: {got}");
    }
    assert_eq!(
        got["presigned_get"],
        serde_json::json!([200, true]),
        "{got}"
    );
    assert_eq!(
        got["sigv2_presigned"],
        serde_json::json!([403, true]),
        "{got}"
    );
    // The origin saw each payload mode the issue names.
    let modes = got["modes"].as_str().unwrap();
    for m in [
        "UNSIGNED-PAYLOAD",
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    ] {
        assert!(modes.contains(m), "{m} not in {modes}");
    }
    assert!(
        modes.split(',').any(|m| m.len() == 64),
        "no signed payload hash in {modes}"
    );
    // STS signs over the body (no x-amz-content-sha256): the proxy read and hashed it. The
    // origin answered the real key id, which came back as the placeholder.
    assert_eq!(got["caller"], key_id.as_str(), "{got}");
    let rec = p.wait_record(|r| r["mode"] == "https" && r["credential"] == "aws");
    assert_eq!(rec["decision"], "allow", "{rec}");
    let log = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(!log.contains(REAL_SECRET) && !log.contains(REAL_KEY_ID));
}

#[test]
fn another_sandboxs_placeholder_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = ScriptOrigin::start(
        "aws_origin.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            REAL_KEY_ID.as_ref(),
            REAL_SECRET.as_ref(),
        ],
    );
    let p = aws_proxy(dir.path(), &ca, origin.port);
    let other = placeholders(&p, "other");
    let (key_id, secret) = (
        other["access_key_id"].as_str().unwrap(),
        other["secret_access_key"].as_str().unwrap(),
    );
    assert_ne!(key_id, placeholders(&p, "dev")["access_key_id"]);
    // Sandbox dev signs with other's placeholder keys: nothing is re-signed.
    let got = aws_client(&p, dir.path(), "dev", origin.port, (key_id, secret));
    let refused = got["signed_put"].as_str().unwrap_or_default();
    assert!(
        refused.contains("credential_misuse") || refused.contains("403"),
        "{got}"
    );
    assert_ne!(got["presigned_get"][0], 200, "{got}");
    let rec = p.wait_record(|r| r["reason"] == "credential_misuse");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("another access key id"),
        "{rec}"
    );
    // The same keys work for the sandbox they belong to.
    let got = aws_client(&p, dir.path(), "other", origin.port, (key_id, secret));
    assert_eq!(got["signed_put"], 200, "{got}");
}
