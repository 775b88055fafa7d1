//! The AIP-36 `sandbox` block: every field parsed and validated, the network part turned into a
//! [`NetworkSpec`], the rest kept for the runtime (the proxy enforces only the network).
//!
//! Conformance applied here: plaintext credentials in `env` or provider `config` are rejected
//! (without echoing them), unknown providers are rejected unless listed in `extra_providers`,
//! a missing `network` block means no egress, mount paths must be absolute and normal.

use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};

use super::error::{redact, unknown_field, Sink};
use crate::policy::entry::parse_entry;
use crate::policy::{Mode, NetworkSpec};

/// Providers AIP-36 enumerates (Day 1).
pub const BUILTIN_PROVIDERS: &[&str] = &[
    "local",
    "mastra-e2b",
    "mastra-modal",
    "mastra-daytona",
    "mastra-blaxel",
    "node-permission",
];

/// An AIP-36 sandbox block, kept as written (minus nothing) for the runtime and the admin API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SandboxBlock {
    /// Standalone files only: always `sandbox/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Standalone files only: `@owner/slug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Standalone files only: semver of this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub provider: String,
    pub config: Mapping,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BlockLimits>,
    /// Validated by hand (to reject plaintext without echoing it), kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<BlockNetwork>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Value>,
    /// AIP-38 policy block: kept, not interpreted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Mapping>,
}

/// AIP-36 `limits` (runtime resource caps; not the proxy's connection limits).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BlockLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
}

/// `network`: the allowlist, the `deny` extension and the seed-002 `mode`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BlockNetwork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
}

/// One filesystem mount (kept for the runtime).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub source: Value,
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MountMode>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MountMode {
    ReadWrite,
    ReadOnly,
}

/// Lifecycle hints (advisory; kept for the runtime).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_idle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_idle_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_on_workspace_close: Option<bool>,
}

/// Where a block is being read, for error messages.
pub(crate) struct BlockCtx<'a> {
    pub sandbox: Option<&'a str>,
    /// Prefix for field paths (`policy.` inside proxy.yaml, empty in a SANDBOX.md).
    pub prefix: &'a str,
    /// Whether this is a standalone SANDBOX.md (schema/id/version required).
    pub standalone: bool,
    pub extra_providers: &'a [String],
    /// Line where the block starts (for locating fields).
    pub line: usize,
}

/// Keys of provider `config` per built-in provider: (key, required).
fn provider_keys(provider: &str) -> Option<&'static [(&'static str, bool)]> {
    Some(match provider {
        "local" => &[("cwd", false), ("shell", false)],
        "mastra-e2b" => &[("template", true), ("api_key_ref", true), ("region", false)],
        "mastra-modal" => &[
            ("app_name", true),
            ("function_name", true),
            ("api_token_ref", true),
        ],
        "mastra-daytona" => &[("workspace_id", true), ("api_key_ref", true)],
        "mastra-blaxel" => &[("workspace", true), ("api_key_ref", true)],
        _ => return None,
    })
}

/// Key names that carry a credential value when written inline.
fn looks_like_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    if k.ends_with("_ref") {
        return false;
    }
    ["key", "token", "secret", "password", "passwd", "credential"]
        .iter()
        .any(|w| k.contains(w))
}

/// Parse and validate a block. Returns `None` (with errors recorded) when it is unusable.
pub(crate) fn parse_block(
    value: Value,
    ctx: &BlockCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) -> Option<(SandboxBlock, NetworkSpec)> {
    let sb = ctx.sandbox;
    let p = ctx.prefix;
    let Value::Mapping(mut map) = value else {
        sink.push(
            sb,
            p.trim_end_matches('.'),
            "expected a mapping (an AIP-36 sandbox block)",
            None,
            ctx.line,
        );
        return None;
    };
    let errors_before = sink.errors.len();
    // env: checked by hand so that plaintext values are rejected without being echoed.
    if let Some(env) = map.get("env") {
        check_env(env, ctx, sink);
    }
    if let Some(Value::Mapping(cfg)) = map.get("config") {
        for (k, _) in cfg {
            if let Some(k) = k.as_str() {
                if looks_like_secret_key(k) {
                    sink.push(
                        sb,
                        format!("{p}config.{k}"),
                        "plaintext credentials are not allowed in a sandbox block (AIP-36): name a secret with a `*_ref` field",
                        Some(&format!("{k}:")),
                        ctx.line,
                    );
                }
            }
        }
        // Replace so the typed parse below does not trip over the same key again.
        let cleaned: Mapping = cfg
            .iter()
            .filter(|(k, _)| !k.as_str().is_some_and(looks_like_secret_key))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        map.insert("config".into(), Value::Mapping(cleaned));
    }
    let block: SandboxBlock = match serde_yaml::from_value(Value::Mapping(map)) {
        Ok(b) => b,
        Err(e) => {
            let msg = redact(&e.to_string());
            let hint = unknown_field(&msg).map(|f| format!("{f}:"));
            sink.push(sb, p.trim_end_matches('.'), msg, hint.as_deref(), ctx.line);
            return None;
        }
    };
    check_standalone(&block, ctx, sink);
    check_provider(&block, ctx, sink);
    check_mounts(&block, ctx, sink);
    let network = network_spec(&block, ctx, sink, warnings);
    if sink.errors.len() > errors_before {
        return None;
    }
    Some((block, network?))
}

fn check_standalone(block: &SandboxBlock, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let sb = ctx.sandbox;
    if !ctx.standalone {
        for (name, present) in [
            ("schema", block.schema.is_some()),
            ("id", block.id.is_some()),
            ("version", block.version.is_some()),
        ] {
            if present {
                sink.push(
                    sb,
                    format!("{}{name}", ctx.prefix),
                    "standalone-only field: allowed in a *.SANDBOX.md file, not in an inline block",
                    Some(&format!("{name}:")),
                    ctx.line,
                );
            }
        }
        return;
    }
    match block.schema.as_deref() {
        Some("sandbox/v1") => {}
        Some(_) => sink.push(sb, "schema", "must be `sandbox/v1`", Some("schema:"), 1),
        None => sink.push(
            sb,
            "schema",
            "required in a standalone SANDBOX.md (`schema: sandbox/v1`)",
            None,
            1,
        ),
    }
    match block.id.as_deref() {
        Some(id) if is_registry_slug(id) => {}
        Some(_) => sink.push(
            sb,
            "id",
            "must be `@owner-slug/sandbox-slug`",
            Some("id:"),
            1,
        ),
        None => sink.push(sb, "id", "required in a standalone SANDBOX.md", None, 1),
    }
    match block.version.as_deref() {
        Some(v) if is_semver(v) => {}
        Some(_) => sink.push(
            sb,
            "version",
            "must be a semantic version such as 1.0.0",
            Some("version:"),
            1,
        ),
        None => sink.push(
            sb,
            "version",
            "required in a standalone SANDBOX.md",
            None,
            1,
        ),
    }
}

/// `@owner/slug` with lowercase letters, digits, `-`, `_`, `.`.
pub(crate) fn is_registry_slug(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('@') else {
        return false;
    };
    let Some((owner, slug)) = rest.split_once('/') else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 64
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
    };
    ok(owner) && ok(slug)
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn check_provider(block: &SandboxBlock, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let sb = ctx.sandbox;
    let p = ctx.prefix;
    let known = BUILTIN_PROVIDERS.contains(&block.provider.as_str());
    let extra = ctx.extra_providers.contains(&block.provider);
    if !known && !extra {
        sink.push(
            sb,
            format!("{p}provider"),
            format!(
                "unknown provider `{}` (known: {}; register others in `extra_providers`)",
                block.provider,
                BUILTIN_PROVIDERS.join(", ")
            ),
            Some("provider:"),
            ctx.line,
        );
        return;
    }
    let Some(keys) = provider_keys(&block.provider) else {
        return;
    };
    for (k, v) in &block.config {
        let Some(k) = k.as_str() else {
            sink.push(
                sb,
                format!("{p}config"),
                "keys must be strings",
                None,
                ctx.line,
            );
            continue;
        };
        if !keys.iter().any(|(name, _)| *name == k) {
            let allowed: Vec<&str> = keys.iter().map(|(n, _)| *n).collect();
            sink.push(
                sb,
                format!("{p}config.{k}"),
                format!(
                    "unknown field for provider {} (allowed: {})",
                    block.provider,
                    allowed.join(", ")
                ),
                Some(&format!("{k}:")),
                ctx.line,
            );
        } else if !v.is_string() {
            sink.push(
                sb,
                format!("{p}config.{k}"),
                "must be a string",
                Some(&format!("{k}:")),
                ctx.line,
            );
        }
    }
    for (name, required) in keys {
        if *required && !block.config.contains_key(*name) {
            sink.push(
                sb,
                format!("{p}config.{name}"),
                format!("required for provider {}", block.provider),
                Some("config:"),
                ctx.line,
            );
        }
    }
    if block.provider == "local" {
        if let Some(shell) = block.config.get("shell").and_then(Value::as_str) {
            if shell != "/bin/bash" && shell != "/bin/sh" {
                sink.push(
                    sb,
                    format!("{p}config.shell"),
                    "must be /bin/bash or /bin/sh",
                    Some("shell:"),
                    ctx.line,
                );
            }
        }
    }
}

fn check_env(env: &Value, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let sb = ctx.sandbox;
    let p = ctx.prefix;
    let plaintext = "plaintext values are not allowed in env (AIP-36: credentials never inline): use env.auth.ref for secrets and env.passthrough for host variable names";
    let Value::Mapping(env) = env else {
        sink.push(
            sb,
            format!("{p}env"),
            "expected a mapping with `auth` and `passthrough`",
            Some("env:"),
            ctx.line,
        );
        return;
    };
    for (k, v) in env {
        match k.as_str() {
            Some("auth") => check_env_auth(v, ctx, sink),
            Some("passthrough") => {
                let Value::Sequence(items) = v else {
                    sink.push(
                        sb,
                        format!("{p}env.passthrough"),
                        "expected a list of variable names",
                        Some("passthrough:"),
                        ctx.line,
                    );
                    continue;
                };
                for (i, item) in items.iter().enumerate() {
                    match item.as_str() {
                        Some(name) if is_env_name(name) => {}
                        Some(name) if name.contains('=') => sink.push(
                            sb,
                            format!("{p}env.passthrough[{i}]"),
                            plaintext,
                            Some("passthrough:"),
                            ctx.line,
                        ),
                        _ => sink.push(
                            sb,
                            format!("{p}env.passthrough[{i}]"),
                            "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                            Some("passthrough:"),
                            ctx.line,
                        ),
                    }
                }
            }
            Some(other) => sink.push(
                sb,
                format!("{p}env.{other}"),
                plaintext,
                Some(&format!("{other}:")),
                ctx.line,
            ),
            None => sink.push(sb, format!("{p}env"), plaintext, Some("env:"), ctx.line),
        }
    }
}

fn check_env_auth(v: &Value, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let sb = ctx.sandbox;
    let p = ctx.prefix;
    let Value::Mapping(auth) = v else {
        sink.push(
            sb,
            format!("{p}env.auth"),
            "expected a mapping with `ref` and `state`",
            Some("auth:"),
            ctx.line,
        );
        return;
    };
    for (k, v) in auth {
        match k.as_str() {
            Some("ref") if v.is_string() => {}
            Some("ref") => sink.push(
                sb,
                format!("{p}env.auth.ref"),
                "must be a string (a SECRETS.md reference)",
                Some("ref:"),
                ctx.line,
            ),
            Some("state") => {
                let names = v.as_mapping().and_then(|m| {
                    if m.len() == 1 {
                        m.get("env").and_then(Value::as_sequence)
                    } else {
                        None
                    }
                });
                match names {
                    Some(list) if list.iter().all(|n| n.as_str().is_some_and(is_env_name)) => {}
                    _ => sink.push(
                        sb,
                        format!("{p}env.auth.state"),
                        "expected `{ env: [NAME, ...] }` (variable names only)",
                        Some("state:"),
                        ctx.line,
                    ),
                }
            }
            Some(other) => sink.push(
                sb,
                format!("{p}env.auth.{other}"),
                "unknown field (expected `ref`, `state`); credentials never inline",
                Some(&format!("{other}:")),
                ctx.line,
            ),
            None => sink.push(
                sb,
                format!("{p}env.auth"),
                "keys must be strings",
                None,
                ctx.line,
            ),
        }
    }
}

fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn check_mounts(block: &SandboxBlock, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let sb = ctx.sandbox;
    let p = ctx.prefix;
    for (i, m) in block.mounts.iter().enumerate() {
        let at = &m.at;
        let normal = at.starts_with('/')
            && (at == "/" || !at.ends_with('/'))
            && !at
                .split('/')
                .skip(1)
                .any(|c| c.is_empty() && at != "/" || c == "." || c == "..");
        if !normal {
            sink.push(
                sb,
                format!("{p}mounts[{i}].at"),
                "must be an absolute, normalised path (leading /, no `.`, `..` or `//`)",
                Some(&format!("at: {at}")),
                ctx.line,
            );
        }
        let source_ok = match &m.source {
            Value::String(s) => s == "workspace",
            Value::Mapping(map) => {
                map.len() == 1 && (map.contains_key("ref") || map.contains_key("inline"))
            }
            _ => false,
        };
        if !source_ok {
            sink.push(
                sb,
                format!("{p}mounts[{i}].source"),
                "must be `workspace`, `{ ref: ... }` or `{ inline: ... }` (exactly one of ref/inline)",
                Some("source:"),
                ctx.line,
            );
        }
    }
}

fn network_spec(
    block: &SandboxBlock,
    ctx: &BlockCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) -> Option<NetworkSpec> {
    let sb = ctx.sandbox;
    let p = ctx.prefix;
    let net = block.network.clone().unwrap_or(BlockNetwork {
        egress: None,
        deny: Vec::new(),
        mode: None,
    });
    let egress_texts = net.egress.clone().unwrap_or_default();
    let mode = net.mode.unwrap_or(if egress_texts.is_empty() {
        Mode::DenyAll
    } else {
        Mode::Restricted
    });
    let mut ok = true;
    let mut parse_list = |list: &[String], name: &str| {
        let mut out = Vec::with_capacity(list.len());
        for (i, text) in list.iter().enumerate() {
            match parse_entry(text) {
                Ok(e) => out.push((text.clone(), e)),
                Err(e) => {
                    ok = false;
                    let hint = format!("\"{text}\"");
                    let line = sink
                        .locate(&hint, ctx.line)
                        .or_else(|| sink.locate(text, ctx.line));
                    sink.errors.push(crate::config::ConfigError {
                        file: sink.file.clone(),
                        line,
                        sandbox: sb.map(str::to_string),
                        field: format!("{p}network.{name}[{i}]"),
                        message: format!("`{text}`: {e}"),
                        code: None,
                    });
                }
            }
        }
        out
    };
    let egress = parse_list(&egress_texts, "egress");
    let deny = parse_list(&net.deny, "deny");
    if !ok {
        return None;
    }
    let who = sb
        .map(|s| format!("sandbox {s}"))
        .unwrap_or_else(|| sink.file.to_string());
    if mode == Mode::DenyAll && !egress.is_empty() {
        warnings.push(format!(
            "{who}: network.mode is deny-all; its {} egress entries are ignored",
            egress.len()
        ));
    }
    if mode == Mode::Restricted && egress.is_empty() {
        warnings.push(format!(
            "{who}: network.mode is restricted with an empty egress list: nothing is reachable"
        ));
    }
    Some(NetworkSpec { mode, egress, deny })
}

/// Split a standalone file into its YAML frontmatter and the line it starts on.
pub(crate) fn frontmatter(text: &str) -> Result<(&str, usize), String> {
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = body.split_inclusive('\n');
    match lines.next() {
        Some(first) if first.trim_end() == "---" => {}
        _ => {
            return Err("a SANDBOX.md file must start with a `---` line (YAML frontmatter)".into())
        }
    }
    let start = body.find('\n').map(|i| i + 1).unwrap_or(body.len());
    let mut offset = start;
    for line in lines {
        if line.trim_end() == "---" {
            return Ok((&body[start..offset], 2));
        }
        offset += line.len();
    }
    Err("frontmatter is not closed by a `---` line".into())
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn frontmatter_split() {
        let (y, _) = frontmatter("---\nprovider: local\n---\n# hi\n").unwrap();
        assert_eq!(y, "provider: local\n");
        assert!(frontmatter("provider: local\n").is_err());
        assert!(frontmatter("---\nprovider: local\n").is_err());
        assert!(is_registry_slug("@acme-corp/shared-modal-policy"));
        assert!(!is_registry_slug("acme/x"));
        assert!(is_semver("1.0.0") && is_semver("1.2.3-rc.1") && !is_semver("1.0"));
    }
}
