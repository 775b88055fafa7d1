//! The real binary's `check` and `validate`: decisions, JSON, exit codes, and the messages
//! for broken configurations.

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = bin().args(args).output().expect("run egress-proxy");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

const POLICY: &str = r#"
defaults: { ports: [443] }
dns:
  hosts:
    db.internal: [10.1.2.3]
    mixed.internal: [10.1.2.3, 8.8.8.8]
    half.internal: [10.1.2.3, 9.9.9.9]
    meta.example.com: [169.254.169.254]
sandboxes:
  - id: demo
    sources: [127.0.0.0/8]
    policy:
      provider: local
      config: {}
      network:
        egress: ["api.example.com", "*.example.org:8000-8100", "10.0.0.0/8:5432", "8.8.8.8:53", "meta.example.com"]
        deny: ["bad.example.org"]
  - id: rollout
    enforcement: report
    sources: [10.9.0.0/16]
    policy: { provider: local, config: {}, network: { egress: ["api.example.com"] } }
"#;

#[test]
fn check_decisions_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "p.yaml", POLICY);
    let cases: &[(&str, &[&str], i32, &str)] = &[
        ("demo", &["api.example.com"], 0, "rule_matched"),
        ("demo", &["API.Example.com.:443"], 0, "rule_matched"),
        ("demo", &["api.example.com:80"], 1, "port_not_allowed"),
        ("demo", &["x.example.org:8080"], 0, "rule_matched"),
        ("demo", &["bad.example.org:8080"], 1, "denied_by_rule"),
        ("demo", &["evil.example.net"], 1, "no_rule_matched"),
        ("demo", &["8.8.8.8:53"], 0, "rule_matched"),
        ("demo", &["10.1.2.3:5432"], 0, "rule_matched"),
        ("demo", &["10.1.2.3:22"], 1, "port_not_allowed"),
        ("demo", &["127.1"], 1, "invalid_target"),
        ("demo", &["2130706433:443"], 1, "invalid_target"),
        ("demo", &["a@b.example.com"], 1, "invalid_target"),
        ("demo", &["db.internal:5432"], 1, "no_rule_matched"),
        (
            "demo",
            &["--resolve", "db.internal:5432"],
            0,
            "rule_matched",
        ),
        (
            "demo",
            &["--resolve", "mixed.internal:5432"],
            1,
            "port_not_allowed",
        ),
        (
            "demo",
            &["--resolve", "half.internal:5432"],
            1,
            "no_rule_matched",
        ),
        (
            "demo",
            &["--resolve", "meta.example.com"],
            1,
            "destination_ip_prohibited",
        ),
        ("rollout", &["evil.example.net"], 0, "no_rule_matched"),
    ];
    for (sandbox, target, code, reason) in cases {
        let mut args = vec!["check", "--config", &cfg, "--sandbox", sandbox, "--json"];
        args.extend_from_slice(target);
        let (got, out, err) = run(&args);
        assert_eq!(got, *code, "{target:?}: {out}{err}");
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(v["reason"], *reason, "{target:?}: {out}");
        for key in [
            "decision",
            "reason",
            "rule",
            "rule_source",
            "sandbox",
            "target",
            "enforcement",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {out}");
        }
    }
    let (_, out, _) = run(&[
        "check",
        "--config",
        &cfg,
        "--sandbox",
        "demo",
        "--json",
        "x.example.org:8050",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["rule"], "*.example.org:8000-8100");
    assert!(v["rule_source"]
        .as_str()
        .unwrap()
        .ends_with("p.yaml: sandbox demo: network.egress[1]"));
    let (_, out, _) = run(&[
        "check",
        "--config",
        &cfg,
        "--sandbox",
        "rollout",
        "--json",
        "evil.example.net",
    ]);
    assert!(out.contains("\"decision\":\"report\""), "{out}");
    // Human output says which file to change.
    let (_, out, _) = run(&[
        "check",
        "--config",
        &cfg,
        "--sandbox",
        "demo",
        "evil.example.net",
    ]);
    assert!(
        out.contains("not in network.egress of sandbox demo"),
        "{out}"
    );
}

#[test]
fn check_usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "p.yaml", POLICY);
    let (code, _, err) = run(&[
        "check",
        "--config",
        &cfg,
        "--sandbox",
        "ghost",
        "api.example.com",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no sandbox `ghost`"), "{err}");
    let (code, _, _) = run(&["check", "--sandbox", "demo"]);
    assert_eq!(code, 2);
    let (code, _, err) = run(&[
        "check",
        "--config",
        "/nonexistent.yaml",
        "--sandbox",
        "demo",
        "x.com",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read"), "{err}");
}

#[test]
fn embedded_default_and_examples_validate() {
    let (code, out, err) = run(&["validate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("demo"), "{out}");
    let root = env!("CARGO_MANIFEST_DIR");
    let out = bin()
        .args([
            "validate",
            "--config",
            &format!("{root}/config/gateway.yaml"),
        ])
        .env("EGRESS_TOKEN_CI_RUNNER_1", "test-token")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("@acme-corp/ci"), "{text}");
    // The file's own SANDBOX.md examples pass a check through a ref.
    let out = bin()
        .args([
            "check",
            "--config",
            &format!("{root}/config/gateway.yaml"),
            "--sandbox",
            "ci-runner-1",
            "ec2.eu-west-1.amazonaws.com",
        ])
        .env("EGRESS_TOKEN_CI_RUNNER_1", "test-token")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Each broken config, and a message that must appear for it.
#[test]
fn validate_reports_every_error_with_location() {
    let cases: &[(&str, &[&str])] = &[
        ("listen: [", &["p.yaml:", "not valid YAML"]),
        ("listen: { proxy: nonsense }", &["p.yaml:1: listen:"]),
        ("lisen: {}", &["p.yaml:1: lisen: unknown key"]),
        (
            "sandboxes:\n  - id: a\n    policy: { provider: local, config: {}, network: { egress: [\"https://api.example.com/v1\"] } }\n",
            &["p.yaml:3: sandbox a: policy.network.egress[0]", "write `api.example.com:443`"],
        ),
        (
            "sandboxes:\n  - id: a\n    policy:\n      provider: local\n      config: {}\n      network:\n        egress:\n          - ok.example.com\n          - \"*.co.uk\"\n          - \"10.0.0.0/40\"\n          - \"x.example.com:70000\"\n",
            &[
                "p.yaml:9: sandbox a: policy.network.egress[1]: `*.co.uk`: wildcard suffix `co.uk` is a public suffix",
                "p.yaml:10: sandbox a: policy.network.egress[2]: `10.0.0.0/40`: malformed CIDR",
                "p.yaml:11: sandbox a: policy.network.egress[3]",
                "3 configuration error(s)",
            ],
        ),
        (
            "sandboxes:\n  - id: a\n    auth: { token: hunter2 }\n    policy: { provider: local, config: {} }\n",
            &["p.yaml:3: sandbox a: auth.token: plaintext tokens are not allowed"],
        ),
        (
            "sandboxes:\n  - id: a\n    policy:\n      provider: local\n      config: {}\n      env: { OPENAI_API_KEY: sk-live-abcdef }\n",
            &["sandbox a: policy.env.OPENAI_API_KEY: plaintext values are not allowed in env"],
        ),
        (
            "sandboxes:\n  - id: a\n    policy: { ref: ./nope.SANDBOX.md }\n",
            &["p.yaml:3: sandbox a: policy.ref: sandbox_ref_unresolvable"],
        ),
        (
            "sandboxes:\n  - id: a\n    policy: { provider: e2b, config: {} }\n",
            &["sandbox a: policy.provider: unknown provider `e2b`"],
        ),
        (
            "sandboxes:\n  - id: a\n    policy: { provider: local, config: {} }\n  - id: a\n    policy: { provider: local, config: {} }\n",
            &["sandbox a: id: duplicate sandbox id"],
        ),
        ("listen: { default_sandbox: nobody }", &["listen.default_sandbox: no sandbox has id `nobody`"]),
        (
            "sandboxes:\n  - id: a\n    enforcment: report\n    policy: { provider: local, config: {} }\n",
            &["p.yaml:3: sandbox a: unknown field `enforcment`"],
        ),
    ];
    for (text, needles) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write(dir.path(), "p.yaml", text);
        let (code, out, err) = run(&["validate", "--config", &cfg]);
        assert_eq!(code, 2, "{text}\n{out}{err}");
        for n in *needles {
            assert!(
                err.contains(n),
                "missing {n:?} for config:\n{text}\n--- stderr:\n{err}"
            );
        }
        for secret in ["hunter2", "sk-live-abcdef"] {
            assert!(
                !err.contains(secret) && !out.contains(secret),
                "secret echoed:\n{err}"
            );
        }
    }
}

#[test]
fn hash_token_reads_stdin_and_never_prints_the_token() {
    use std::io::Write;
    let mut child = bin()
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // What `echo` gives: the newline must not become part of the token.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"s3cret-token\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        format!("token_sha256: {}", sha_hex("s3cret-token"))
    );
    assert!(!stdout.contains("s3cret") && !String::from_utf8_lossy(&out.stderr).contains("s3cret"));
    // Empty input is a usage error.
    let out = bin()
        .arg("hash-token")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

fn sha_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[test]
fn config_example_is_the_embedded_config_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, _) = run(&["config", "example"]);
    assert_eq!(code, 0);
    assert_eq!(text, egress_proxy::config::EMBEDDED_CONFIG);
    let p = write(dir.path(), "example.yaml", &text);
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn validate_warns_when_an_address_rule_alone_allows_a_named_host() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.yaml",
        r#"
dns: { hosts: { allowed.test: [127.0.0.1], denied.test: [127.0.0.1] } }
sandboxes:
  - id: agent1
    sources: [127.0.0.0/8]
    policy: { provider: local, config: {}, network: { egress: ["allowed.test:18443", "127.0.0.1/32:18443"] } }
"#,
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("warning: sandbox agent1: `denied.test`"),
        "{out}"
    );
    assert!(!out.contains("`allowed.test`"), "{out}");
    // The summary counts what it prints.
    assert!(out.contains(", 1 warning, policy version"), "{out}");
    assert_eq!(out.matches("\nwarning: ").count(), 1, "{out}");
}

/// Policies are reviewed where the secrets are not: `validate`, `check` and `suggest
/// --config` work without a credential's secret file or variable (one warning each), while
/// `run` still refuses to start without them. A sandbox that only client certificates reach
/// is not called unreachable.
#[test]
fn review_tools_work_without_secrets_and_run_refuses() {
    let dir = tempfile::tempdir().unwrap();
    // A CA for tls_intercept (its key is present: only the credentials' secrets are absent).
    let ca = dir.path().join("ca");
    let (code, out, err) = run(&["ca", "init", ca.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let p = write(
        dir.path(),
        "p.yaml",
        r#"
listen:
  proxy_tls: { addr: 127.0.0.1:0, cert_file: tls.crt, key_file: tls.key, client_ca_file: clients.crt, client_cn: true }
tls_intercept: { ca_cert_file: ca/ca.crt, ca_key_file: ca/ca.key }
sandboxes:
  - id: agent1
    sources: [127.0.0.0/8]
    policy: { provider: local, config: {}, network: { egress: ["api.github.com"] } }
    credentials:
      - { name: gh, hosts: [api.github.com], inject: { header: Authorization, format: "Bearer {secret}" }, source: { env: EGRESS_TEST_ABSENT_GH_TOKEN } }
      - { name: npm, hosts: [api.github.com], inject: { header: X-Npm, format: "{secret}" }, source: { file: secrets/npm-token } }
  - id: by-cert
    policy: { provider: local, config: {}, network: { egress: ["api.github.com"] } }
"#,
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    // The two credentials' secrets, and the TLS listener's three files.
    assert!(out.contains(", 5 warnings, policy version"), "{out}");
    assert!(
        out.contains("warning: listen.proxy_tls.cert_file: cannot read "),
        "{out}"
    );
    assert!(
        out.contains("warning: sandbox agent1: credential gh: source.env: the variable EGRESS_TEST_ABSENT_GH_TOKEN is not set")
            && out.contains("warning: sandbox agent1: credential npm: source.file:")
            && out.contains("`run` refuses to start without it"),
        "{out}"
    );
    assert!(!out.contains("no connection can reach it"), "{out}");
    let (code, out, err) = run(&[
        "check",
        "--config",
        &p,
        "--sandbox",
        "agent1",
        "api.github.com",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let audit = write(dir.path(), "audit.jsonl", "");
    let (code, out, err) = run(&[
        "suggest",
        "--audit",
        &audit,
        "--sandbox",
        "agent1",
        "--config",
        &p,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // `run` needs the secrets: it exits 2 before binding anything.
    let (code, out, err) = run(&["run", "--config", &p]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("EGRESS_TEST_ABSENT_GH_TOKEN is not set"),
        "{err}"
    );
}

/// The README's 20-line policy example is a configuration `validate` accepts.
#[test]
fn the_readme_policy_example_validates() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## A policy in 20 lines")
        .nth(1)
        .expect("the README has its policy example");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a yaml block");
    assert!(yaml.lines().count() <= 20, "the example grew past 20 lines");
    let dir = tempfile::tempdir().unwrap();
    let token = write(dir.path(), "admin.token", "t");
    let yaml = yaml.replace("/etc/egress-proxy/admin.token", &token);
    let cfg = write(dir.path(), "proxy.yaml", &yaml);
    let (code, out, err) = run(&["validate", "--config", &cfg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("1 sandboxes, 4 egress rules, 1 deny rules"),
        "{out}"
    );
}

/// An all-covering address rule (`0.0.0.0/0`, `::/0`) is no key to the guard: loopback,
/// private and metadata addresses stay refused; a rule inside a range opens it; metadata
/// opens only by its exact entry; `validate` warns about the wide entries.
#[test]
fn an_all_covering_address_rule_opens_no_guarded_range() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.yaml",
        r#"
sandboxes:
  - id: wide
    policy: { provider: local, config: {}, network: { egress: ["0.0.0.0/0:*", "[::/0]:*"] } }
  - id: narrow
    policy: { provider: local, config: {}, network: { egress: ["10.1.0.0/16:*", "169.254.0.0/16:*"] } }
  - id: exact
    policy: { provider: local, config: {}, network: { egress: ["169.254.169.254/32:80"] } }
"#,
    );
    let decide = |sandbox: &str, target: &str| {
        let (code, out, err) = run(&[
            "check",
            "--config",
            &p,
            "--sandbox",
            sandbox,
            target,
            "--json",
        ]);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        (code, v["reason"].as_str().unwrap_or("").to_string())
    };
    for target in [
        "127.0.0.1:80",
        "10.1.2.3:443",
        "169.254.169.254:80",
        "[::1]:80",
        "[fd00:ec2::254]:80",
        "[::ffff:169.254.169.254]:80",
    ] {
        assert_eq!(
            decide("wide", target),
            (1, "destination_ip_prohibited".into()),
            "{target}"
        );
    }
    assert_eq!(decide("wide", "1.1.1.1:443"), (0, "rule_matched".into()));
    assert_eq!(decide("narrow", "10.1.2.3:443"), (0, "rule_matched".into()));
    assert_eq!(decide("narrow", "10.2.0.1:443").0, 1);
    assert_eq!(
        decide("narrow", "169.254.1.1:443"),
        (0, "rule_matched".into())
    );
    assert_eq!(
        decide("narrow", "169.254.169.254:80"),
        (1, "destination_ip_prohibited".into())
    );
    assert_eq!(
        decide("exact", "169.254.169.254:80"),
        (0, "rule_matched".into())
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("warning: sandbox wide: network.egress entry `0.0.0.0/0:*`"),
        "{out}"
    );
    assert!(out.contains("entry `[::/0]:*`"), "{out}");
    assert!(
        !out.contains("sandbox narrow: network.egress entry"),
        "{out}"
    );
}

/// `check` takes a URL as the OpenAPI document says (`/v1/check` shares the parser): the
/// scheme's port when none is written; credentials in it or another scheme are invalid.
#[test]
fn check_takes_url_targets() {
    let decide = |target: &str| {
        let (code, out, err) = run(&["check", "--sandbox", "demo", target, "--json"]);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        (
            code,
            v["target"].as_str().unwrap_or("").to_string(),
            v["reason"].as_str().unwrap_or("").to_string(),
        )
    };
    assert_eq!(
        decide("https://api.openai.com/v1/models"),
        (0, "api.openai.com:443".into(), "rule_matched".into())
    );
    assert_eq!(
        decide("http://example.net/"),
        (1, "example.net:80".into(), "no_rule_matched".into())
    );
    assert_eq!(decide("https://u:p@api.openai.com/").2, "invalid_target");
    assert_eq!(decide("gopher://api.openai.com/").2, "invalid_target");
}

/// Sandbox tokens and the admin token are secrets like the credentials': the review tools
/// (`validate`, `check`, `suggest --config`) warn that they could not read them and go on —
/// `check` and `suggest` say so on stderr — and `run` refuses to start, naming each with its
/// line.
#[test]
fn review_tools_work_without_tokens_and_run_names_each() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "gw.yaml",
        r#"admin_token_file: secrets/admin.token
sandboxes:
  - id: by-file
    auth: { token_file: secrets/by-file.token }
    policy: { provider: local, config: {}, network: { egress: ["api.github.com"] } }
  - id: by-env
    auth: { token_env: EGRESS_TEST_ABSENT_SANDBOX_TOKEN }
    policy: { provider: local, config: {}, network: { egress: ["pypi.org"] } }
"#,
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    for needle in [
        "warning: sandbox by-file: auth.token_file: cannot read ",
        "secrets/by-file.token: No such file or directory",
        "warning: sandbox by-env: auth.token_env: environment variable EGRESS_TEST_ABSENT_SANDBOX_TOKEN is not set",
        "warning: admin_token_file: cannot read ",
    ] {
        assert!(out.contains(needle), "{needle}\n{out}");
    }
    let (code, out, err) = run(&["check", "--config", &p, "--sandbox", "by-env", "pypi.org"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("allow by-env -> pypi.org:443"), "{out}");
    assert!(
        err.contains("warning: sandbox by-file: auth.token_file"),
        "{err}"
    );
    let audit = write(dir.path(), "audit.jsonl", "");
    let args = [
        "suggest",
        "--audit",
        &audit,
        "--sandbox",
        "by-file",
        "--config",
        &p,
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("warning: admin_token_file"), "{err}");
    let (code, out, err) = run(&["run", "--config", &p]);
    assert_eq!(code, 2, "{out}{err}");
    for needle in [
        "gw.yaml:4: sandbox by-file: auth.token_file: cannot read",
        "gw.yaml:7: sandbox by-env: auth.token_env: environment variable",
        "admin_token_file: cannot read",
    ] {
        assert!(err.contains(needle), "{needle}\n{err}");
    }
}

/// Two listeners on one address are refused by `validate` (and `run`, before binding),
/// naming both, instead of `run` failing with "Address already in use".
#[test]
fn listeners_on_one_address_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    for (listen, first, second) in [
        (
            "{ proxy: 127.0.0.1:43180, admin: 127.0.0.1:43180 }",
            "proxy",
            "admin",
        ),
        (
            "{ proxy: 0.0.0.0:43181, socks5: 127.0.0.1:43181 }",
            "proxy",
            "socks5",
        ),
    ] {
        let p = write(dir.path(), "port.yaml", &format!("listen: {listen}\n"));
        for cmd in ["validate", "run"] {
            let (code, out, err) = run(&[cmd, "--config", &p]);
            assert_eq!(code, 2, "{cmd} {listen}: {out}{err}");
            assert!(
                err.contains(&format!("listen.{first} ("))
                    && err.contains(&format!("and listen.{second} (")),
                "{err}"
            );
            assert!(err.contains("port.yaml:1: listen."), "{err}");
        }
    }
    // Distinct ports, or port 0, are fine.
    let p = write(
        dir.path(),
        "ok.yaml",
        "listen: { proxy: 127.0.0.1:0, admin: 127.0.0.1:0, socks5: 127.0.0.1:43182 }\n",
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
}

/// The TLS files a configuration names are checked one way (F14): an unreadable one is a
/// warning for `validate` and an error with its line for `run` — the TLS listener's files
/// included, which `run` used to find only when binding — and a leaf certificate given as the
/// interception CA is refused by both (clients would refuse everything it signs).
#[test]
fn tls_files_are_checked_at_load_one_way() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "tls.yaml",
        "listen:\n  proxy: 127.0.0.1:0\n  proxy_tls: { addr: 127.0.0.1:0, cert_file: nope/tls.crt, key_file: nope/tls.key }\n",
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("warning: listen.proxy_tls.cert_file: cannot read "),
        "{out}"
    );
    assert!(
        out.contains("warning: listen.proxy_tls.key_file: cannot read "),
        "{out}"
    );
    let (code, out, err) = run(&["run", "--config", &p]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("tls.yaml:3: listen.proxy_tls.cert_file: cannot read "),
        "{err}"
    );
    assert!(err.contains("configuration error(s)"), "{err}");
    // The same for an https:// parent's ca_file, located at its own line.
    let p = write(
        dir.path(),
        "up.yaml",
        "upstream_proxy:\n  url: https://127.0.0.1:3129\n\n  ca_file: nope/corp-ca.pem\n",
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("warning: upstream_proxy: ca_file: cannot read "),
        "{out}"
    );
    let (code, out, err) = run(&["run", "--config", &p]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("up.yaml:4: upstream_proxy: ca_file: cannot read "),
        "{err}"
    );
    // A leaf as the interception CA: refused by validate and run.
    let ca = dir.path().join("ca");
    let (code, out, err) = run(&["ca", "init", ca.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["leaf.test".to_string()])
        .unwrap()
        .self_signed(&leaf_key)
        .unwrap();
    write(dir.path(), "leaf.crt", &leaf.pem());
    let p = write(
        dir.path(),
        "leaf.yaml",
        "tls_intercept: { ca_cert_file: leaf.crt, ca_key_file: ca/ca.key }\n",
    );
    for cmd in ["validate", "run"] {
        let (code, out, err) = run(&[cmd, "--config", &p]);
        assert_eq!(code, 2, "{cmd}: {out}{err}");
        assert!(
            err.contains("tls_intercept.ca_cert_file:") && err.contains("not a CA certificate"),
            "{cmd}: {err}"
        );
    }
    // The CA `ca init` made is one.
    let p = write(
        dir.path(),
        "ca.yaml",
        "tls_intercept: { ca_cert_file: ca/ca.crt, ca_key_file: ca/ca.key }\n",
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
}

/// An address rule is not tried for a name outside `dns.address_rule_zones`, and the refusal
/// says so (it used to blame "not in network.egress" alone); with the opt-in it is tried.
#[test]
fn a_name_outside_the_address_rule_zones_is_told_why() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "addr.yaml",
        r#"dns: { address_rule_zones: [corp.internal], servers: ["127.0.0.1:9"], timeout_ms: 300 }
sandboxes:
  - id: s1
    sources: [127.0.0.0/8]
    policy: { provider: local, config: {}, network: { egress: ["203.0.113.0/24:443"] } }
"#,
    );
    let (code, out, err) = run(&[
        "check",
        "--config",
        &p,
        "--sandbox",
        "s1",
        "--resolve",
        "pypi.org",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("no_rule_matched"), "{out}");
    assert!(
        out.contains("address rules were not tried: `pypi.org` is outside dns.address_rule_zones"),
        "{out}"
    );
    // A name in a zone is resolved to try them (here the resolver does not answer: the
    // refusal is the policy's, with no note about zones).
    let (code, out, err) = run(&[
        "check",
        "--config",
        &p,
        "--sandbox",
        "s1",
        "--resolve",
        "db.corp.internal",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(!out.contains("address rules were not tried"), "{out}");
}

/// `config presets` prints every preset's expansion as YAML; `validate` prints a sandbox's
/// terminated-host rules with its presets expanded (and the preset's egress entries counted);
/// a preset entry with another key, or an unknown preset, is an error naming the entry.
#[test]
fn presets_are_printed_expanded_and_validated() {
    let dir = tempfile::tempdir().unwrap();
    let (code, all, _) = run(&["config", "presets"]);
    assert_eq!(code, 0);
    for name in [
        "github-read-only",
        "pypi-install",
        "npm-install",
        "crates-install",
        "openai-inference",
        "anthropic-inference",
        "gemini-inference",
    ] {
        assert!(all.contains(&format!("`preset: {name}`")), "{name}: {all}");
    }
    // docs/protocols.md shows exactly what the binary expands.
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/protocols.md"))
            .unwrap();
    assert!(
        doc.contains(all.trim_end()),
        "docs/protocols.md is behind `config presets`"
    );
    let (code, _, err) = run(&["config", "presets", "github-write"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a preset"), "{err}");
    let ca = dir.path().join("ica");
    let out = bin()
        .args(["ca", "init", ca.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let config = |http: &str| {
        format!(
            r#"
tls_intercept: {{ ca_cert_file: ica/ca.crt, ca_key_file: ica/ca.key }}
sandboxes:
  - id: agent
    sources: [127.0.0.0/8]
    policy:
      provider: local
      config: {{}}
      network:
        egress: ["example.com:443"]
        http: {http}
"#
        )
    };
    let p = write(
        dir.path(),
        "p.yaml",
        &config("[{ preset: github-read-only }]"),
    );
    let (code, out, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("egress=7"),
        "the preset's 6 entries are added: {out}"
    );
    assert!(
        out.contains("http: github.com /*/* git:fetch lfs:download"),
        "{out}"
    );
    assert!(out.contains("protocol:graphql operations:query"), "{out}");
    let p = write(
        dir.path(),
        "bad.yaml",
        &config("[{ preset: github-read-only, methods: [POST] }]"),
    );
    let (code, _, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("network.http[0]") && err.contains("stands alone"),
        "{err}"
    );
    let p = write(dir.path(), "unknown.yaml", &config("[{ preset: pypi }]"));
    let (code, _, err) = run(&["validate", "--config", &p]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a preset"), "{err}");
}

/// Security review round B, W4: an `aws_sigv4` credential bound by wildcard sent the real key
/// id and session token to any name below it (S3 buckets, API Gateway): refused at load.
#[test]
fn an_aws_sigv4_credential_bound_by_wildcard_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "aws.id", "AKIAREALKEY000000001");
    write(
        dir.path(),
        "aws.secret",
        "realSecretKey/0123456789abcdefghijklmnopq",
    );
    let ica = dir.path().join("ica");
    let (code, out, err) = run(&["ca", "init", ica.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let config = |hosts: &str| {
        format!(
            "tls_intercept: {{ ca_cert_file: ica/ca.crt, ca_key_file: ica/ca.key }}\nsandboxes:\n  - id: a\n    credentials:\n      - {{ name: aws, kind: aws_sigv4, hosts: {hosts}, source: {{ access_key_id_file: aws.id, secret_access_key_file: aws.secret }} }}\n    policy: {{ provider: local, config: {{}} }}\n"
        )
    };
    let cfg = write(dir.path(), "p.yaml", &config("[\"*.amazonaws.com\"]"));
    let (code, out, err) = run(&["validate", "--config", &cfg]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("`*.amazonaws.com`: an aws_sigv4 credential is bound to the AWS endpoints it signs for, by name"),
        "{err}"
    );
    assert!(!err.contains("realSecretKey") && !out.contains("realSecretKey"));
    let cfg = write(
        dir.path(),
        "p.yaml",
        &config("[s3.eu-west-1.amazonaws.com]"),
    );
    let (_, _, err) = run(&["validate", "--config", &cfg]);
    assert!(!err.contains("aws_sigv4 credential is bound"), "{err}");
}

/// Issue 59: `validate` says what `decider.on_error: allow` covers — failures that are not
/// the sandbox's own load — and the per-sandbox share in force.
#[test]
fn validate_says_whom_on_error_allow_covers() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(
        &p,
        "decider: { url: \"http://127.0.0.1:9/\", on_error: allow, max_in_flight: 8 }\nsandboxes:\n  - id: a\n    sources: [127.0.0.1/32]\n    policy: { provider: local, config: {}, network: { egress: [\"x.test\"] } }\n",
    )
    .unwrap();
    let (code, out, err) = run(&["validate", "--config", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let said = format!("{out}{err}");
    assert!(said.contains("not the sandbox's own"), "{said}");
    assert!(said.contains("2 of 8 asks in flight"), "{said}");
}

/// Clients review F13: every command that prints, its reader gone before it writes (`| head
/// -1`, `| grep -q`), ends quietly — killed by SIGPIPE as git, ls and cat are — instead of
/// panicking with exit 101. The pipe's read end is closed before the command starts, so its
/// first write always meets a closed pipe.
#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "p.yaml",
        "sandboxes:\n  - id: s\n    policy: { provider: local, config: {}, network: { egress: [\"a.test\"] } }\n",
    );
    let commands: [&[&str]; 6] = [
        &["validate", "--config", &cfg],
        &["config", "example"],
        &["config", "presets"],
        &["check", "--config", &cfg, "--sandbox", "s", "a.test"],
        &[
            "check",
            "--config",
            &cfg,
            "--sandbox",
            "s",
            "--json",
            "b.test",
        ],
        &["--help"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = bin()
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(
            out.status.signal(),
            Some(libc_sigpipe()),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// SIGPIPE's number on Linux.
fn libc_sigpipe() -> i32 {
    13
}

/// `validate` warns that nothing is reachable only when nothing is: a sandbox whose reach is
/// all in `network.scoped` reaches its scoped entries (clients review B5.3).
#[test]
fn validate_counts_scoped_entries_as_reach() {
    let dir = tempfile::tempdir().unwrap();
    let text = "sandboxes:\n  - id: attr\n    policy: { provider: local, config: {}, network: { mode: restricted, egress: [], scoped: [{ binaries: [/usr/bin/curl], egress: [\"origin.test:8080\"] }] } }\n  - id: none\n    policy: { provider: local, config: {}, network: { mode: restricted, egress: [] } }\n";
    let cfg = write(dir.path(), "p.yaml", text);
    let (code, out, err) = run(&["validate", "--config", &cfg]);
    assert_eq!(code, 0, "{out}{err}");
    let said = format!("{out}{err}");
    assert!(
        !said.contains("sandbox attr: network.mode is restricted with an empty egress list"),
        "{said}"
    );
    assert!(
        said.contains("sandbox none: network.mode is restricted with an empty egress list: nothing is reachable"),
        "{said}"
    );
}
