//! Unit tests of [`super`].

use super::*;
use crate::config::ConfigError;

fn run(
    yaml: &str,
    standalone: bool,
) -> (
    Option<(SandboxBlock, NetworkSpec)>,
    Vec<ConfigError>,
    Vec<String>,
) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let value: Value = serde_yaml::from_str(yaml).unwrap();
    let mut sink = Sink::new("t.yaml".into(), yaml, &mut errors);
    let ctx = BlockCtx {
        sandbox: Some("t"),
        prefix: "policy.",
        standalone,
        extra_providers: &["flyio-machines".to_string()],
        line: 1,
    };
    let r = parse_block(value, &ctx, &mut sink, &mut warnings);
    (r, errors, warnings)
}

#[test]
fn a_named_service_port_without_tcp_is_named() {
    let yaml = "provider: local\nconfig: {}\nnetwork: { egress: [\"db.internal:5432\", \"tcp://cache.internal:6379\", \"api.test:8080\", \"10.0.0.5:22\"] }\n";
    let (r, e, w) = run(yaml, false);
    assert!(e.is_empty() && r.is_some(), "{e:?}");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("`db.internal:5432`") && w[0].contains("tcp://db.internal:5432"),
        "{w:?}"
    );
}

#[test]
fn minimal_and_full_blocks() {
    let (r, e, _) = run(
        "provider: local\nconfig: {}\nnetwork: { egress: [api.openai.com] }\n",
        false,
    );
    assert!(e.is_empty(), "{e:?}");
    let (_, net) = r.unwrap();
    assert_eq!(net.mode, Mode::Restricted);
    assert_eq!(net.egress.len(), 1);
    let (r, e, _) = run("provider: local\nconfig: {}\n", false);
    assert!(e.is_empty());
    assert_eq!(
        r.unwrap().1.mode,
        Mode::DenyAll,
        "no network block means no egress"
    );
    let full = r#"
provider: mastra-modal
config: { app_name: a, function_name: f, api_token_ref: org/acme/modal-token }
limits: { timeout_ms: 120000, memory_mb: 4096 }
env:
  auth: { ref: ./SECRETS.md, state: { env: [OPENAI_API_KEY] } }
  passthrough: [NODE_ENV]
network: { egress: [api.openai.com], deny: [bad.openai.com], mode: restricted }
mounts:
  - { source: workspace, at: /workspace, mode: read-write }
  - { source: { ref: "@agentik/python-libs" }, at: /vendor/python-libs, mode: read-only }
identity: { ref: "bot://agentik" }
lifecycle: { pause_after_idle: idle-600, destroy_on: workspace-close }
read_only: false
metadata: { team: x }
"#;
    let (r, e, _) = run(full, false);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(r.unwrap().1.deny.len(), 1);
}

#[test]
fn secrets_are_rejected_and_never_echoed() {
    let yaml = "provider: mastra-e2b\nconfig: { template: t, api_key_ref: k, api_key: sk-live-SECRET1 }\nenv:\n  OPENAI_API_KEY: sk-live-SECRET2\n  passthrough: [\"FOO=sk-live-SECRET3\"]\n";
    let (r, e, _) = run(yaml, false);
    assert!(r.is_none());
    let all = e
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!all.contains("SECRET"), "{all}");
    assert!(all.contains("policy.config.api_key"), "{all}");
    assert!(all.contains("policy.env.OPENAI_API_KEY"), "{all}");
    assert!(all.contains("policy.env.passthrough[0]"), "{all}");
    assert_eq!(e.len(), 3, "{all}");
}

#[test]
fn providers_and_their_config() {
    let (_, e, _) = run("provider: k8s-magic\nconfig: {}\n", false);
    assert!(e[0].message.contains("unknown provider `k8s-magic`"));
    let (_, e, _) = run("provider: flyio-machines\nconfig: { anything: 1 }\n", false);
    assert!(e.is_empty());
    let (_, e, _) = run("provider: mastra-e2b\nconfig: { regoin: x }\n", false);
    let msgs: Vec<_> = e.iter().map(|e| e.field.clone()).collect();
    assert_eq!(
        msgs,
        [
            "policy.config.regoin",
            "policy.config.template",
            "policy.config.api_key_ref"
        ]
    );
    let (_, e, _) = run("provider: local\nconfig: { shell: /bin/zsh }\n", false);
    assert_eq!(e.len(), 1);
}

#[test]
fn bad_entries_are_all_reported_with_index_and_line() {
    let yaml = "provider: local\nconfig: {}\nnetwork:\n  egress:\n    - ok.example.com\n    - \"*.com\"\n    - https://x.example/\n  deny: [\"10.0.0.0/33\"]\n";
    let (r, e, _) = run(yaml, false);
    assert!(r.is_none());
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].field, "policy.network.egress[1]");
    assert_eq!(e[0].line, Some(6));
    assert!(e[1].message.contains("write `x.example:443`"));
    assert_eq!(e[2].field, "policy.network.deny[0]");
}

#[test]
fn mounts_and_standalone_fields() {
    let (_, e, _) = run("provider: local\nconfig: {}\nmounts: [{ source: workspace, at: ../etc }, { source: { ref: a, inline: b }, at: /a/../b }]\n", false);
    assert_eq!(e.len(), 3, "{e:?}");
    let (_, e, _) = run("schema: sandbox/v1\nprovider: local\nconfig: {}\n", false);
    assert_eq!(e[0].field, "policy.schema");
    let (_, e, _) = run(
        "schema: sandbox/v2\nid: acme\nversion: one\nprovider: local\nconfig: {}\n",
        true,
    );
    assert_eq!(e.len(), 3, "{e:?}");
    let (_, e, _) = run(
        "provider: local\nconfig: {}\nnetwork: { egress: [] }\nbogus: 1\n",
        false,
    );
    assert!(e[0].message.contains("unknown field `bogus`"), "{e:?}");
    assert_eq!(e[0].line, Some(4));
}
