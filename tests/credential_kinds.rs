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

/// The S3-like origin that verifies with the real keys.
fn aws_origin(ca: &TestCa) -> ScriptOrigin {
    ScriptOrigin::start(
        "aws_origin.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            REAL_KEY_ID.as_ref(),
            REAL_SECRET.as_ref(),
        ],
    )
}

/// A proxy where sandboxes `dev` and `other` each have an `aws_sigv4` credential for s3.test
/// (the same real keys), the origin on `port`.
fn aws_proxy(dir: &Path, ca: &TestCa, port: u16) -> Proxy {
    aws_proxy_with(dir, ca, port, "")
}

/// [`aws_proxy`] with a `dlp` block (YAML) in each sandbox when not empty.
fn aws_proxy_with(dir: &Path, ca: &TestCa, port: u16, dlp: &str) -> Proxy {
    ca_init(&dir.join("ica"));
    std::fs::write(dir.join("admin.token"), ADMIN).unwrap();
    std::fs::write(dir.join("aws.id"), format!("{REAL_KEY_ID}\n")).unwrap();
    std::fs::write(dir.join("aws.secret"), REAL_SECRET).unwrap();
    let sandbox = |id: &str| {
        let sb = SandboxSpec::new(id)
            .token(&format!("{id}-secret"))
            .credential("{ name: aws, kind: aws_sigv4, hosts: [s3.test], source: { access_key_id_file: aws.id, secret_access_key_file: aws.secret } }")
            .allow(&format!("s3.test:{port}"));
        if dlp.is_empty() {
            sb
        } else {
            sb.entry("dlp", dlp)
        }
    };
    ProxyConfig::new()
        .admin_token_file(Path::new("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("s3.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .sandbox(sandbox("dev"))
        .sandbox(sandbox("other"))
        .start(dir)
}

/// Run `tests/data/aws_client.py` as sandbox `id` with keys `keys`.
fn aws_client(p: &Proxy, dir: &Path, id: &str, port: u16, keys: (&str, &str)) -> serde_json::Value {
    aws_client_env(p, dir, id, port, keys, &[])
}

/// [`aws_client`] with more environment for the script.
fn aws_client_env(
    p: &Proxy,
    dir: &Path,
    id: &str,
    port: u16,
    keys: (&str, &str),
    env: &[(&str, &str)],
) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/aws_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://{id}:{id}-secret@{}", p.proxy))
        .arg(dir.join("ica/ca.crt"))
        .arg(format!("https://s3.test:{port}"))
        .arg(keys.0)
        .arg(keys.1)
        .envs(env.iter().copied())
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

/// Review 97 G4: with any `dlp` rule, a SigV4 streaming upload (`Content-Encoding:
/// aws-chunked`) was refused `dlp_blocked` — the DLP phase took aws-chunked for a compression
/// it could not undo, so boto3 uploads broke as soon as DLP was on. The payload is now scanned
/// without its framing and every upload mode passes.
#[test]
fn boto3_streaming_uploads_pass_with_dlp_on() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = aws_origin(&ca);
    let dlp = "{ max_bytes: 8388608, rules: [{ name: private_key, pattern: \"-----BEGIN [A-Z ]*PRIVATE KEY-----\" }] }";
    let p = aws_proxy_with(dir.path(), &ca, origin.port, dlp);
    let ph = placeholders(&p, "dev");
    let key_id = ph["access_key_id"].as_str().unwrap().to_string();
    let secret = ph["secret_access_key"].as_str().unwrap().to_string();
    let keys = (key_id.as_str(), secret.as_str());
    let got = aws_client_env(
        &p,
        dir.path(),
        "dev",
        origin.port,
        keys,
        &[("AWS_CLIENT_LEAK", "1")],
    );
    for step in [
        "signed_put",
        "unsigned_put",
        "streaming_put",
        "signed_chunks_put",
        "fileobj_upload",
    ] {
        assert_eq!(got[step], 200, "{step}: {got}");
    }
    // A key split by a chunk header of the SDK's framing is still found, and refused.
    assert_ne!(got["leak_put"], 200, "{got}");
    p.wait_record(|r| r["reason"] == "dlp_blocked" && r["dlp"] == "private_key");
    for step in ["same_streaming", "same_chunked"] {
        assert_eq!(got[step], true, "{step}: {got}");
    }
}

#[test]
fn boto3_with_placeholder_keys_is_re_signed_with_the_real_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = aws_origin(&ca);
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
    let origin = aws_origin(&ca);
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

/// The token/API/GitHub-like origin (`tests/data/token_origin.py`): tokens live `expires` s.
struct Tokens {
    origin: ScriptOrigin,
}

impl Tokens {
    fn start(dir: &Path, ca: &TestCa, expires: u32) -> Tokens {
        let key = dir.join("app.key");
        let pubkey = dir.join("app.pub");
        let ok = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&key)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
            && Command::new("openssl")
                .args(["pkey", "-pubout", "-in"])
                .arg(&key)
                .arg("-out")
                .arg(&pubkey)
                .status()
                .unwrap()
                .success();
        assert!(ok, "openssl made no key");
        let root = dir.join("git");
        std::fs::create_dir_all(root.join("acme")).unwrap();
        let git = |args: &[&str], cwd: &Path| {
            let out = Command::new("git")
                .args(args)
                .current_dir(cwd)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        git(&["init", "-q", "-b", "main"], &work);
        std::fs::write(work.join("README"), "docs\n").unwrap();
        git(&["add", "README"], &work);
        git(&["commit", "-qm", "first"], &work);
        git(
            &[
                "clone",
                "-q",
                "--bare",
                ".",
                root.join("acme/docs.git").to_str().unwrap(),
            ],
            &work,
        );
        let expires = expires.to_string();
        let origin = ScriptOrigin::start(
            "token_origin.py",
            &[
                ca.cert_pem.as_os_str(),
                ca.key_pem.as_os_str(),
                pubkey.as_os_str(),
                expires.as_ref(),
                root.as_os_str(),
            ],
        );
        Tokens { origin }
    }

    fn port(&self) -> u16 {
        self.origin.port
    }

    /// The origin's counters (read directly, not through the proxy).
    fn stats(&self, ca: &TestCa) -> serde_json::Value {
        let url = format!("https://auth.test:{}/_stats", self.port());
        let resolve = format!("auth.test:{}:127.0.0.1", self.port());
        let out = curl(&[
            "--cacert",
            ca.ca_pem.to_str().unwrap(),
            "--resolve",
            &resolve,
            &url,
        ]);
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// A proxy for sandbox `dev` with `credentials` (YAML list entries), reaching api.test,
/// github.com and api.github.com on `port` (auth.test, the token endpoint, too).
fn minting_proxy(dir: &Path, ca: &TestCa, port: u16, credentials: &str) -> Proxy {
    ca_init(&dir.join("ica"));
    std::fs::write(dir.join("admin.token"), ADMIN).unwrap();
    std::fs::write(dir.join("client.secret"), "client-secret-1\n").unwrap();
    std::fs::write(dir.join("refresh.token"), "refresh-0\n").unwrap();
    minting_config(dir, ca, port, credentials).start(dir)
}

/// The configuration of [`minting_proxy`].
fn minting_config(dir: &Path, ca: &TestCa, port: u16, credentials: &str) -> ProxyConfig {
    let hosts = ["api.test", "auth.test", "github.com", "api.github.com"];
    let dev = SandboxSpec::new("dev")
        .token("dev-secret")
        .entry("credentials", credentials)
        .network(
            "http",
            r#"[{ host: api.test, methods: [GET, POST], paths: ["/**"] }]"#,
        );
    let dev = hosts
        .iter()
        .fold(dev, |d, h| d.allow(&format!("{h}:{port}")));
    hosts
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
        .admin_token_file(Path::new("admin.token"))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .sandbox(dev)
}

/// A token origin whose tokens live `expires` s and a proxy with the credentials
/// `credentials(port)` gives.
struct MintEnv {
    dir: tempfile::TempDir,
    ca: TestCa,
    t: Tokens,
    p: Proxy,
    cred: String,
}

fn mint_env(expires: u32, credentials: impl Fn(u16) -> String) -> MintEnv {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let t = Tokens::start(dir.path(), &ca, expires);
    std::fs::write(dir.path().join("wrong.secret"), "not-the-secret").unwrap();
    let cred = credentials(t.port());
    let p = minting_proxy(dir.path(), &ca, t.port(), &cred);
    MintEnv {
        dir,
        ca,
        t,
        p,
        cred,
    }
}

/// curl as sandbox dev through `p` to `https://host:port/path`.
fn dev_curl(p: &Proxy, dir: &Path, host: &str, port: u16, path: &str) -> CurlOut {
    let url = format!("https://{host}:{port}{path}");
    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let ica = dir.join("ica/ca.crt");
    curl(&["-x", &px, "--cacert", ica.to_str().unwrap(), &url])
}

fn oauth2(grant: &str, source: &str, port: u16) -> String {
    format!(
        "[{{ name: api, kind: oauth2, hosts: [api.test], grant: {grant}, token_url: \"https://auth.test:{port}/token\", client_id: agent, scopes: [read, write], source: {{ {source} }} }}]"
    )
}

#[test]
fn oauth2_tokens_are_minted_for_each_grant_and_never_reach_the_sandbox() {
    for (grant, source) in [
        ("client_credentials", "client_secret_file: client.secret"),
        ("refresh_token", "refresh_token_file: refresh.token"),
        ("jwt_bearer", "private_key_file: app.key"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::generate(dir.path());
        let t = Tokens::start(dir.path(), &ca, 3600);
        let p = minting_proxy(dir.path(), &ca, t.port(), &oauth2(grant, source, t.port()));
        for _ in 0..3 {
            let out = dev_curl(&p, dir.path(), "api.test", t.port(), "/api/items");
            let body = String::from_utf8_lossy(&out.stdout).to_string();
            let v: serde_json::Value = serde_json::from_str(&body)
                .unwrap_or_else(|_| panic!("{grant}: {body} {}", out.stderr));
            assert_eq!(v["ok"], true, "{grant}: {body}");
            // The origin echoed the token; the sandbox sees the placeholder in its place.
            assert!(
                !body.contains("at-"),
                "{grant}: a minted token reached the sandbox: {body}"
            );
        }
        let stats = t.stats(&ca);
        assert_eq!(
            stats[grant], 1,
            "{grant}: one mint for three requests: {stats}"
        );
        assert_eq!(stats["api_ok"], 3, "{stats}");
        let rec = p.wait_record(|r| r["mode"] == "https" && r["credential"] == "api");
        assert_eq!(rec["decision"], "allow");
        let log = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
        assert!(!log.contains("at-1-") && !log.contains("client-secret-1"));
    }
}

#[test]
fn fifty_requests_after_expiry_refresh_the_token_once() {
    // Tokens live 10 s and are renewed a quarter of that before they end (at 7.5 s): the
    // fifty requests start past that point and have 7.5 s before a second renewal is due.
    let MintEnv {
        dir,
        ca,
        t,
        p,
        cred: _,
    } = mint_env(10, |port| {
        oauth2("refresh_token", "refresh_token_file: refresh.token", port)
    });
    let out = dev_curl(&p, dir.path(), "api.test", t.port(), "/api/first");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"ok\": true"),
        "{}",
        out.stderr
    );
    assert_eq!(t.stats(&ca)["refresh_token"], 1);
    let_time_pass(
        std::time::Duration::from_millis(7700),
        "past the renewal point (7.5 s) of a token that lives 10 s",
    );
    // Fifty requests at once, each in its own tunnel, all finding the token expired.
    let url = format!("https://api.test:{}/api/n", t.port());
    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let ica = dir.path().join("ica/ca.crt");
    let mut args = vec![
        "--parallel",
        "--parallel-immediate",
        "--parallel-max",
        "50",
        "-x",
        &px,
        "--cacert",
        ica.to_str().unwrap(),
        "-w",
        "%{http_code}\\n",
    ];
    for _ in 0..50 {
        args.extend(["-o", "/dev/null", &url]);
    }
    let out = curl(&args);
    let codes = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        codes.lines().filter(|c| *c == "200").count(),
        50,
        "{codes} {}",
        out.stderr
    );
    let stats = t.stats(&ca);
    // One refresh for all fifty (the refresh token rotates: a second one would have failed).
    assert_eq!(stats["refresh_token"], 2, "{stats}");
    assert_eq!(stats["unauthorized"], 0, "{stats}");
}

#[test]
fn a_refused_mint_is_credential_unavailable_and_nothing_is_sent() {
    let MintEnv {
        dir,
        ca,
        t,
        p,
        cred: _,
    } = mint_env(3600, |port| {
        oauth2(
            "client_credentials",
            "client_secret_file: wrong.secret",
            port,
        )
    });
    let out = dev_curl(&p, dir.path(), "api.test", t.port(), "/api/items");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("credential_unavailable"), "{body}");
    let rec = p.wait_record(|r| r["reason"] == "credential_unavailable");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("401 (invalid_client)"),
        "{rec}"
    );
    assert!(!rec.to_string().contains("not-the-secret"));
    let stats = t.stats(&ca);
    // The API never saw the request (no request went out without its credential).
    assert_eq!(
        (stats["api_ok"].as_u64(), stats["unauthorized"].as_u64()),
        (Some(0), Some(0)),
        "{stats}"
    );
}

#[test]
fn a_policy_without_the_credential_drops_its_token() {
    let MintEnv {
        dir,
        ca,
        t,
        p,
        cred,
    } = mint_env(3600, |port| {
        oauth2(
            "client_credentials",
            "client_secret_file: client.secret",
            port,
        )
    });
    let get = || dev_curl(&p, dir.path(), "api.test", t.port(), "/api/items");
    assert!(String::from_utf8_lossy(&get().stdout).contains("\"ok\": true"));
    assert!(String::from_utf8_lossy(&get().stdout).contains("\"ok\": true"));
    assert_eq!(t.stats(&ca)["client_credentials"], 1);
    let reload = |credentials: &str| {
        let d = dir.path();
        let yaml = minting_config(d, &ca, t.port(), credentials).yaml(&d.join("audit.jsonl"));
        std::fs::write(d.join("proxy.yaml"), yaml).unwrap();
        let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some(ADMIN));
        assert_eq!(status, 200, "{body}");
    };
    reload("[]");
    // Without the credential the API sees a request without a token.
    assert!(String::from_utf8_lossy(&get().stdout).contains("no valid token"));
    reload(&cred);
    // The same credential again: its old token was dropped, a new one is minted.
    assert!(String::from_utf8_lossy(&get().stdout).contains("\"ok\": true"));
    assert_eq!(t.stats(&ca)["client_credentials"], 2);
}

#[test]
fn a_github_app_installation_token_clones_over_git_and_calls_the_api() {
    let MintEnv {
        dir,
        ca,
        t,
        p,
        cred: _,
    } = mint_env(3600, |port| {
        format!(
        "[{{ name: gh, kind: github_app, hosts: [github.com, api.github.com], app_id: 7, installation_id: 42, api_url: \"https://api.github.com:{}\", source: {{ private_key_file: app.key }} }}]",
        port
    )
    });
    let out = dev_curl(
        &p,
        dir.path(),
        "api.github.com",
        t.port(),
        "/api/repos/acme/docs",
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"ok\": true"),
        "{}",
        out.stderr
    );
    let clone = dir.path().join("clone");
    let out = Command::new("git")
        .args(["-c", "http.sslCAInfo=", "clone", "-q"])
        .arg(format!("https://github.com:{}/acme/docs.git", t.port()))
        .arg(&clone)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_SSL_CAINFO", dir.path().join("ica/ca.crt"))
        .env("HTTPS_PROXY", format!("http://dev:dev-secret@{}", p.proxy))
        .env_remove("GIT_SSL_CAPATH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("README")).unwrap(),
        "docs\n"
    );
    let stats = t.stats(&ca);
    assert_eq!(
        stats["github"], 1,
        "one installation token for API and git: {stats}"
    );
    assert_eq!(stats["unauthorized"], 0, "{stats}");
}

#[test]
fn tokens_the_sandbox_obtains_itself_come_back_sealed_and_are_redeemed() {
    let MintEnv {
        dir,
        ca,
        t,
        p,
        cred: _,
    } = mint_env(3600, |port| {
        oauth2(
            "client_credentials",
            "client_secret_file: client.secret",
            port,
        )
    });
    // The sandbox's own client calls the credential's token endpoint.
    let url = format!("https://auth.test:{}/token", t.port());
    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let ica = dir.path().join("ica/ca.crt");
    let out = curl(&[
        "-x",
        &px,
        "--cacert",
        ica.to_str().unwrap(),
        "-u",
        "sandbox:sandbox-pass",
        "-d",
        "grant_type=client_credentials",
        &url,
    ]);
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{} {}", String::from_utf8_lossy(&out.stdout), out.stderr));
    let sealed = answer["access_token"].as_str().unwrap().to_string();
    assert!(sealed.starts_with("egp_sealed_"), "{answer}");
    assert_eq!(answer["token_type"], "Bearer");
    // The sealed token works on the credential's host: the proxy redeems it (and mints
    // nothing of its own).
    let auth = format!("Authorization: Bearer {sealed}");
    let api = format!("https://api.test:{}/api/items", t.port());
    let call = |auth: &str| {
        let out = curl(&[
            "-x",
            &px,
            "--cacert",
            ica.to_str().unwrap(),
            "-H",
            auth,
            &api,
        ]);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let body = call(&auth);
    assert!(body.contains("\"ok\": true"), "{body}");
    assert!(!body.contains("at-"), "the real token came back: {body}");
    let stats = t.stats(&ca);
    assert_eq!(
        (
            stats["client_credentials"].as_u64(),
            stats["api_ok"].as_u64()
        ),
        (Some(1), Some(1)),
        "{stats}"
    );
    // A forged sealed token is refused before anything is sent.
    let body = call("Authorization: Bearer egp_sealed_0000000000000000000000000000000000000000");
    assert!(body.contains("credential_misuse"), "{body}");
    assert_eq!(t.stats(&ca)["unauthorized"], 0);
    // Over plain HTTP the answer could not be sealed: refused before anything is dialled.
    let plain = format!("http://auth.test:{}/token", t.port());
    let out = curl(&["-x", &px, "-d", "grant_type=client_credentials", &plain]);
    assert!(out.text().contains("credential_misuse"), "{}", out.text());
    // The same endpoint as a router reaches it by other spellings (review B3), and its error
    // answers: every token comes back sealed.
    for path in ["/token/", "/TOKEN", "//token"] {
        let url = format!("https://auth.test:{}{path}", t.port());
        let out = curl(&[
            "-x",
            &px,
            "--cacert",
            ica.to_str().unwrap(),
            "--path-as-is",
            "-u",
            "sandbox:sandbox-pass",
            "-d",
            "grant_type=client_credentials",
            &url,
        ]);
        let text = out.text();
        assert!(
            !text.contains("at-"),
            "{path}: the real token came back: {text}"
        );
        let answer: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: {text}"));
        assert!(
            answer["access_token"]
                .as_str()
                .is_some_and(|t| t.starts_with("egp_sealed_")),
            "{path}: {answer}"
        );
    }
}

/// Clients review F11: a token endpoint that cannot be reached is `credential_unavailable`;
/// the sandbox is not told where the operator's token endpoint lives (its name, address and
/// port are in the record only), and the refusal keeps the port of the host it asked for.
#[test]
fn an_unreachable_token_endpoint_is_not_named_to_the_sandbox() {
    let held = ClosedPort::new();
    let closed = held.port();
    let MintEnv {
        dir,
        ca: _ca,
        t,
        p,
        cred: _,
    } = mint_env(3600, |_| {
        oauth2(
            "client_credentials",
            "client_secret_file: wrong.secret",
            closed,
        )
    });
    let out = dev_curl(&p, dir.path(), "api.test", t.port(), "/api/items");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.starts_with(&format!(
            "egress-proxy refused GET https://api.test:{} for sandbox dev.\nreason: credential_unavailable: credential api: the token endpoint could not be reached (where and why: the audit record)",
            t.port()
        )),
        "{body}"
    );
    assert!(!body.contains(&closed.to_string()), "{body}");
    assert!(
        !body.contains("auth.test") && !body.contains("127.0.0.1"),
        "{body}"
    );
    let rec = p.wait_record(|r| r["reason"] == "credential_unavailable");
    let detail = rec["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!(":{closed}")),
        "the record keeps where: {rec}"
    );
}
