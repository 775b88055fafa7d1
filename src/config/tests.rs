//! Unit tests of the parent module.

use super::*;
use sha2::{Digest, Sha256};

fn load_text(text: &str) -> Result<Config, ConfigErrors> {
    load_str(text, "t.yaml", Path::new("."), None)
}

#[test]
fn embedded_config_loads() {
    let c = load(None).unwrap();
    assert!(c.bindings.iter().any(|b| b.id == "demo"));
    assert_eq!(c.listen.proxy, Some("127.0.0.1:3128".parse().unwrap()));
}

#[test]
fn empty_config_gets_defaults() {
    let c = load_text("").unwrap();
    assert_eq!(c.listen.admin, Some("127.0.0.1:9901".parse().unwrap()));
    assert!(c.defaults.ports.contains(443) && !c.defaults.ports.contains(80));
    assert_eq!(c.defaults.limits.max_connections, 512);
    assert!(c.audit_path.is_none());
}

#[test]
fn null_listener_disables_it() {
    let c = load_text("listen: { admin: null }").unwrap();
    assert_eq!(c.listen.admin, None);
    let e = load_text("listen: { proxy: null }").unwrap_err();
    assert!(
        e.to_string()
            .contains("at least one of `proxy`, `proxy_tls`, `transparent` and `socks5`"),
        "{e}"
    );
}

#[test]
fn listen_threads_default_to_none_and_are_bounded() {
    assert_eq!(load_text("").unwrap().listen.threads, 0);
    let c = load_text("listen: { proxy: 127.0.0.1:3128, threads: 4 }").unwrap();
    assert_eq!(c.listen.threads, 4);
    let e = load_text("listen: { proxy: 127.0.0.1:3128, threads: 65 }").unwrap_err();
    assert!(e.to_string().contains("listen.threads"), "{e}");
    assert!(load_text("listen: { threads: -1 }").is_err());
}

#[test]
fn all_errors_are_reported_at_once() {
    let text = r#"
listen: { proxy: 127.0.0.1:3128, bogus: 1 }
defaults: { ports: [0] }
sandboxes:
  - id: a
    auth: { token: hunter2-SECRET }
    policy: { provider: local, config: {}, network: { egress: ["*.com"] } }
  - id: B!
    policy: { provider: nope, config: {} }
  - id: c
    policy: { inline: { provider: local, config: {} }, ref: ./x.SANDBOX.md }
  - id: d
    policy: { ref: ./missing.SANDBOX.md }
  - id: a
    policy: { provider: local, config: {} }
"#;
    let e = load_text(text).unwrap_err();
    let s = e.to_string();
    assert!(!s.contains("hunter2"), "{s}");
    for needle in [
        "unknown field `bogus`",
        "defaults.ports: port 0",
        "sandbox a: auth.token: plaintext tokens are not allowed",
        "sandbox a: policy.network.egress[0]: `*.com`",
        "sandbox B!: id: must match",
        "unknown provider `nope`",
        "mutually exclusive",
        "sandbox d: policy.ref: sandbox_ref_unresolvable",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in:\n{s}");
    }
    // Lines are found for the located errors.
    let egress =
        e.0.iter()
            .find(|e| e.field == "policy.network.egress[0]")
            .unwrap();
    assert_eq!(egress.line, Some(7));
}

#[test]
fn admin_on_non_loopback_needs_a_token() {
    let e = load_text("listen: { admin: 0.0.0.0:9901 }").unwrap_err();
    assert!(e.to_string().contains("admin_token_file"));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("t");
    std::fs::write(&token, "a-long-random-token\n").unwrap();
    let with = format!(
        "listen: {{ admin: 0.0.0.0:9901 }}\nadmin_token_file: {}",
        token.display()
    );
    assert!(load_text(&with).is_ok());
    // A token file that cannot be read stops `run` at load, naming it.
    let e =
        load_text("listen: { admin: 0.0.0.0:9901 }\nadmin_token_file: /nonexistent/t").unwrap_err();
    assert!(
        e.to_string()
            .contains("admin_token_file: cannot read /nonexistent/t"),
        "{e}"
    );
}

#[test]
fn tokens_in_three_forms() {
    let digest = hex::encode(Sha256::digest(b"s3cret"));
    let text = format!(
            "sandboxes:\n  - id: a\n    auth: {{ token_sha256: {digest} }}\n    policy: {{ provider: local, config: {{}} }}\n"
        );
    let c = load_text(&text).unwrap();
    assert_eq!(
        c.bindings[0].token_sha256.unwrap().to_vec(),
        Sha256::digest(b"s3cret").to_vec()
    );
    let e = load_text("sandboxes:\n  - id: a\n    auth: { token_sha256: zz }\n    policy: { provider: local, config: {} }\n").unwrap_err();
    assert!(e.to_string().contains("64 hexadecimal"));
    let e = load_text("sandboxes:\n  - id: a\n    auth: { token_env: EGRESS_TEST_SURELY_UNSET }\n    policy: { provider: local, config: {} }\n").unwrap_err();
    assert!(e
        .to_string()
        .contains("EGRESS_TEST_SURELY_UNSET is not set"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tok"), "file-token\n").unwrap();
    let cfg = dir.path().join("p.yaml");
    std::fs::write(&cfg, "sandboxes:\n  - id: a\n    auth: { token_file: tok }\n    policy: { provider: local, config: {} }\n").unwrap();
    let c = load(Some(&cfg)).unwrap();
    assert_eq!(
        c.bindings[0].token_sha256.unwrap().to_vec(),
        Sha256::digest(b"file-token").to_vec()
    );
}

#[test]
fn default_sandbox_must_exist_and_sources_must_not_collide() {
    let e = load_text("listen: { default_sandbox: ghost }").unwrap_err();
    assert!(e.to_string().contains("no sandbox has id `ghost`"));
    let text = "sandboxes:\n  - { id: a, sources: [10.0.0.0/24], policy: { provider: local, config: {} } }\n  - { id: b, sources: [10.0.0.0/24], policy: { provider: local, config: {} } }\n";
    let e = load_text(text).unwrap_err();
    assert!(
        e.to_string().contains("already a source of sandbox a"),
        "{e}"
    );
}

#[test]
fn garbage_never_panics() {
    for text in [
        "[1, 2",
        "sandboxes: 5",
        "sandboxes: [5, null, [], {}]",
        "- a\n- b",
        "listen: 7",
        "\u{0}\u{1}",
        "defaults: { ports: [99999] }",
    ] {
        let _ = load_text(text);
    }
}

#[test]
fn max_connections_is_bounded_so_no_value_can_panic_the_process() {
    for bad in ["0", "10000001", "18446744073709551615"] {
        let e = load_text(&format!("max_connections: {bad}\n")).unwrap_err();
        assert!(
            e.0.iter()
                .any(|e| e.field == "max_connections" && e.message.contains("from 1 to 10000000")),
            "{bad}: {e}"
        );
    }
    let c = load_text("max_connections: 10000000\n").unwrap();
    assert_eq!(c.max_connections.get(), 10_000_000);
}

#[test]
fn hostile_runtime_bindings_are_refused_before_any_parser_sees_them() {
    let c = load_text("runtime: { max_binding_bytes: 2000000 }").unwrap();
    let deep = format!(
        "{{\"policy\": {}{}}}",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let e = c.parse_runtime_binding(&deep, "etcd", "x").unwrap_err();
    assert!(e.to_string().contains("nested deeper than"), "{e}");
    let deep_yaml = format!("policy: {}{}", "{a: ".repeat(1000), "}".repeat(1000));
    let e = c
        .parse_runtime_binding(&deep_yaml, "etcd", "x")
        .unwrap_err();
    assert!(e.to_string().contains("nested deeper than"), "{e}");
    // Brackets inside strings are not nesting.
    let quoted = format!(
        "{{\"policy\": {{\"provider\": \"local\", \"config\": {{\"note\": \"{}\"}}}}}}",
        "[".repeat(500)
    );
    assert!(!c
        .parse_runtime_binding(&quoted, "etcd", "x")
        .err()
        .is_some_and(|e| e.to_string().contains("nested deeper than")));
    let small = load_text("runtime: { max_binding_bytes: 100 }").unwrap();
    let e = small
        .parse_runtime_binding(&"x".repeat(101), "etcd", "x")
        .unwrap_err();
    assert!(
        e.to_string().contains("over runtime.max_binding_bytes"),
        "{e}"
    );
    // A JSON binding still parses (serde_json), a YAML one too.
    let json =
        r#"{"policy": {"provider": "local", "config": {}, "network": {"egress": ["a.test"]}}}"#;
    assert!(c.parse_runtime_binding(json, "etcd", "x").is_ok());
    let yaml = "policy: { provider: local, config: {}, network: { egress: [a.test] } }";
    assert!(c.parse_runtime_binding(yaml, "api", "x").is_ok());
}
