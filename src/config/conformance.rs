//! AIP-36 conformance checks on a parsed sandbox block (the parts the proxy keeps for the
//! runtime but does not enforce): standalone-file fields, providers and their `config` keys,
//! `env` (no plaintext credentials, never echoed), and mounts.

use serde_yaml::Value;

use super::block::{BlockCtx, SandboxBlock, BUILTIN_PROVIDERS};
use super::error::Sink;

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
pub(super) fn looks_like_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    if k.ends_with("_ref") {
        return false;
    }
    ["key", "token", "secret", "password", "passwd", "credential"]
        .iter()
        .any(|w| k.contains(w))
}

pub(super) fn check_standalone(block: &SandboxBlock, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
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

pub(super) fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

pub(super) fn check_provider(block: &SandboxBlock, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let known = BUILTIN_PROVIDERS.contains(&block.provider.as_str());
    let extra = ctx.extra_providers.contains(&block.provider);
    if !known && !extra {
        ctx.err(
            sink,
            "provider",
            format!(
                "unknown provider `{}` (known: {}; register others in `extra_providers`)",
                block.provider,
                BUILTIN_PROVIDERS.join(", ")
            ),
            Some("provider:"),
        );
        return;
    }
    let Some(keys) = provider_keys(&block.provider) else {
        return;
    };
    for (k, v) in &block.config {
        let Some(k) = k.as_str() else {
            ctx.err(sink, "config", "keys must be strings", None);
            continue;
        };
        if !keys.iter().any(|(name, _)| *name == k) {
            let allowed: Vec<&str> = keys.iter().map(|(n, _)| *n).collect();
            ctx.err(
                sink,
                format!("config.{k}"),
                format!(
                    "unknown field for provider {} (allowed: {})",
                    block.provider,
                    allowed.join(", ")
                ),
                Some(&format!("{k}:")),
            );
        } else if !v.is_string() {
            ctx.err(
                sink,
                format!("config.{k}"),
                "must be a string",
                Some(&format!("{k}:")),
            );
        }
    }
    for (name, required) in keys {
        if *required && !block.config.contains_key(*name) {
            ctx.err(
                sink,
                format!("config.{name}"),
                format!("required for provider {}", block.provider),
                Some("config:"),
            );
        }
    }
    if block.provider == "local" {
        if let Some(shell) = block.config.get("shell").and_then(Value::as_str) {
            if shell != "/bin/bash" && shell != "/bin/sh" {
                ctx.err(
                    sink,
                    "config.shell",
                    "must be /bin/bash or /bin/sh",
                    Some("shell:"),
                );
            }
        }
    }
}

pub(super) fn check_env(env: &Value, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let plaintext = "plaintext values are not allowed in env (AIP-36: credentials never inline): use env.auth.ref for secrets and env.passthrough for host variable names";
    let Value::Mapping(env) = env else {
        ctx.err(
            sink,
            "env",
            "expected a mapping with `auth` and `passthrough`",
            Some("env:"),
        );
        return;
    };
    for (k, v) in env {
        match k.as_str() {
            Some("auth") => check_env_auth(v, ctx, sink),
            Some("passthrough") => {
                let Value::Sequence(items) = v else {
                    ctx.err(
                        sink,
                        "env.passthrough",
                        "expected a list of variable names",
                        Some("passthrough:"),
                    );
                    continue;
                };
                for (i, item) in items.iter().enumerate() {
                    match item.as_str() {
                        Some(name) if is_env_name(name) => {}
                        Some(name) if name.contains('=') => ctx.err(
                            sink,
                            format!("env.passthrough[{i}]"),
                            plaintext,
                            Some("passthrough:"),
                        ),
                        _ => ctx.err(
                            sink,
                            format!("env.passthrough[{i}]"),
                            "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                            Some("passthrough:"),
                        ),
                    }
                }
            }
            Some(other) => ctx.err(
                sink,
                format!("env.{other}"),
                plaintext,
                Some(&format!("{other}:")),
            ),
            None => ctx.err(sink, "env", plaintext, Some("env:")),
        }
    }
}

fn check_env_auth(v: &Value, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    let Value::Mapping(auth) = v else {
        ctx.err(
            sink,
            "env.auth",
            "expected a mapping with `ref` and `state`",
            Some("auth:"),
        );
        return;
    };
    for (k, v) in auth {
        match k.as_str() {
            Some("ref") if v.is_string() => {}
            Some("ref") => ctx.err(
                sink,
                "env.auth.ref",
                "must be a string (a SECRETS.md reference)",
                Some("ref:"),
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
                    _ => ctx.err(
                        sink,
                        "env.auth.state",
                        "expected `{ env: [NAME, ...] }` (variable names only)",
                        Some("state:"),
                    ),
                }
            }
            Some(other) => ctx.err(
                sink,
                format!("env.auth.{other}"),
                "unknown field (expected `ref`, `state`); credentials never inline",
                Some(&format!("{other}:")),
            ),
            None => ctx.err(sink, "env.auth", "keys must be strings", None),
        }
    }
}

fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

pub(super) fn check_mounts(block: &SandboxBlock, ctx: &BlockCtx<'_>, sink: &mut Sink<'_>) {
    for (i, m) in block.mounts.iter().enumerate() {
        let at = &m.at;
        let normal = at.starts_with('/')
            && (at == "/" || !at.ends_with('/'))
            && !at
                .split('/')
                .skip(1)
                .any(|c| c.is_empty() && at != "/" || c == "." || c == "..");
        if !normal {
            ctx.err(
                sink,
                format!("mounts[{i}].at"),
                "must be an absolute, normalised path (leading /, no `.`, `..` or `//`)",
                Some(&format!("at: {at}")),
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
            ctx.err(sink, format!("mounts[{i}].source"), "must be `workspace`, `{ ref: ... }` or `{ inline: ... }` (exactly one of ref/inline)", Some("source:"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_and_versions() {
        assert!(is_registry_slug("@acme-corp/shared-modal-policy"));
        assert!(!is_registry_slug("acme/x"));
        assert!(is_semver("1.0.0") && is_semver("1.2.3-rc.1") && !is_semver("1.0"));
    }
}
