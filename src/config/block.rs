//! The AIP-36 `sandbox` block: every field parsed and validated, the network part turned into a
//! [`NetworkSpec`], the rest kept for the runtime (the proxy enforces only the network).
//!
//! A missing `network` block means no egress. The conformance checks (plaintext credentials,
//! providers, mounts, standalone fields) live in [`super::conformance`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};

use super::conformance::{
    check_env, check_mounts, check_provider, check_standalone, looks_like_secret_key,
};
use super::error::{redact, unknown_field, Sink};
use crate::policy::entry::{parse_entry, Entry};
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
    /// The sandbox provider (`docker`, `firecracker`, …): the runtime's.
    pub provider: String,
    /// The provider's own settings: the runtime's.
    pub config: Mapping,
    /// Resource limits: validated, left to the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BlockLimits>,
    /// Validated by hand (to reject plaintext without echoing it), kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Value>,
    /// `network`: the part this proxy enforces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<BlockNetwork>,
    /// Mounts: validated, left to the runtime.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Identity settings: the runtime's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Value>,
    /// AIP-38 policy block: kept, not interpreted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    /// Lifecycle: validated, left to the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// Whether the root file system is read-only: the runtime's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Mapping>,
}

/// AIP-36 `limits` (runtime resource caps; not the proxy's connection limits).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BlockLimits {
    /// Wall-clock limit of a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// CPU time limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
}

/// `network`: the allowlist, the `deny` extension and the seed-002 `mode`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BlockNetwork {
    /// `network.egress`: the allowlist (absent: the mode decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
    /// `network.deny`: refused whatever else allows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// `network.mode`: restricted, deny-all or allow-all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Resolve any name when only address rules could allow it (not only names under
    /// `dns.address_rule_zones`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resolve_for_address_rules: bool,
    /// Method and path rules on hosts the proxy terminates (`tls_intercept`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<super::http_rules::RawHttpRule>,
    /// `network.scoped`: egress entries for some processes only ([`super::scoped`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoped: Vec<super::scoped::RawScoped>,
    /// `network.flows`: labels and the rules over them ([`super::flows`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<super::flows::RawFlows>,
}

/// One filesystem mount (kept for the runtime).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// What is mounted (a path or a provider's object).
    pub source: Value,
    /// Where, inside the sandbox.
    pub at: String,
    /// Read-write or read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MountMode>,
}

/// A mount's access.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MountMode {
    /// `rw`.
    ReadWrite,
    /// `ro`.
    ReadOnly,
}

/// Lifecycle hints (advisory; kept for the runtime).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// Pause after this long idle (a duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_idle: Option<String>,
    /// What destroys the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_on: Option<String>,
    /// Pause after this many milliseconds idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_idle_ms: Option<u64>,
    /// Destroy it when its workspace closes.
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

impl BlockCtx<'_> {
    /// Record an error about `field` of this block (the prefix is added), located by `hint`.
    pub fn err(
        &self,
        sink: &mut Sink<'_>,
        field: impl AsRef<str>,
        message: impl Into<String>,
        hint: Option<&str>,
    ) {
        let field = format!("{}{}", self.prefix, field.as_ref());
        sink.push(self.sandbox, field, message, hint, self.line);
    }
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
                    ctx.err(sink, format!("config.{k}"), "plaintext credentials are not allowed in a sandbox block (AIP-36): name a secret with a `*_ref` field", Some(&format!("{k}:")));
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

/// `rules` with its presets expanded (their egress entries added to `egress`); `None` when a
/// preset entry is wrong (the error is in `sink`).
fn expanded(
    rules: &[super::http_rules::RawHttpRule],
    egress: &mut Vec<String>,
    ctx: &BlockCtx<'_>,
    sink: &mut Sink<'_>,
) -> Option<Vec<super::http_rules::RawHttpRule>> {
    match super::presets::expand_all(rules, egress) {
        Ok((rules, added)) => {
            egress.extend(added);
            Some(rules)
        }
        Err((i, message)) => {
            sink.errors.push(crate::config::ConfigError {
                file: sink.file.clone(),
                line: sink.locate("preset:", ctx.line),
                sandbox: ctx.sandbox.map(str::to_string),
                field: format!("{}network.http[{i}]", ctx.prefix),
                message,
                code: None,
            });
            None
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
    let net = block.network.clone().unwrap_or_default();
    let mut egress_texts = net.egress.clone().unwrap_or_default();
    let http_rules = expanded(&net.http, &mut egress_texts, ctx, sink)?;
    let mode = net
        .mode
        .unwrap_or(if egress_texts.is_empty() && net.scoped.is_empty() {
            Mode::DenyAll
        } else {
            Mode::Restricted
        });
    let egress = entries(&egress_texts, "egress", ctx, sink);
    let deny = entries(&net.deny, "deny", ctx, sink);
    let mut ok = egress.is_some() && deny.is_some();
    let (egress, deny) = (egress.unwrap_or_default(), deny.unwrap_or_default());
    let scoped = super::scoped::parse(&net.scoped, ctx, sink);
    ok &= scoped.is_some();
    let flows = net
        .flows
        .as_ref()
        .map(|f| super::flows::parse(f, ctx, sink));
    ok &= flows.as_ref().is_none_or(Option::is_some);
    let http = compile_http(&http_rules, ctx, sink);
    if !ok {
        return None;
    }
    let http = http?;
    let who = sb
        .map(|s| format!("sandbox {s}"))
        .unwrap_or_else(|| sink.file.to_string());
    let scoped_any = scoped
        .as_ref()
        .is_some_and(|s| s.iter().any(|s| !s.egress.is_empty()));
    warn_about(mode, (&egress, scoped_any), &who, warnings);
    let scopes = scoped.iter().flatten().map(|s| ("scoped", Some(&s.scope)));
    let rules = http.iter().map(|r| ("http", r.scope.as_ref()));
    super::scoped::scope_warnings(scopes.chain(rules), p, &who, warnings);
    Some(NetworkSpec {
        mode,
        egress,
        deny,
        resolve_for_address_rules: net.resolve_for_address_rules,
        http: http.into(),
        scoped: scoped.unwrap_or_default(),
        layers: Default::default(),
        flows: flows.flatten().map(Arc::new),
    })
}

/// The entries of `network.{name}` parsed, each with its text; `None` when one is wrong (every
/// wrong one is in `sink`, at its line).
fn entries(
    list: &[String],
    name: &str,
    ctx: &BlockCtx<'_>,
    sink: &mut Sink<'_>,
) -> Option<Vec<(String, Entry)>> {
    let mut out = Vec::with_capacity(list.len());
    let mut ok = true;
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
                    sandbox: ctx.sandbox.map(str::to_string),
                    field: format!("{}network.{name}[{i}]", ctx.prefix),
                    message: format!("`{text}`: {e}"),
                    code: None,
                });
            }
        }
    }
    ok.then_some(out)
}

/// `network.http` (its presets expanded) compiled; `None` when a rule is wrong (the errors
/// are in `sink`).
fn compile_http(
    rules: &[super::http_rules::RawHttpRule],
    ctx: &BlockCtx<'_>,
    sink: &mut Sink<'_>,
) -> Option<Vec<crate::policy::http_rules::HttpRule>> {
    let mut http = Vec::with_capacity(rules.len());
    let mut ok = true;
    for (i, r) in rules.iter().enumerate() {
        match r.compile() {
            Ok(rule) => http.push(rule),
            Err(e) => {
                ok = false;
                sink.errors.push(crate::config::ConfigError {
                    file: sink.file.clone(),
                    line: sink.locate(&r.host, ctx.line),
                    sandbox: ctx.sandbox.map(str::to_string),
                    field: format!("{}network.http[{i}]", ctx.prefix),
                    message: e,
                    code: None,
                });
            }
        }
    }
    ok.then_some(http)
}

/// What a valid network block may still get wrong: egress entries a `deny-all` mode ignores,
/// a `restricted` mode with nothing in it, and address ranges wider than /8 or /16.
/// `scoped`: whether `network.scoped` reaches anything (then an empty egress list is not
/// "nothing reachable": the scoped processes reach their entries).
fn warn_about(
    mode: Mode,
    (egress, scoped): (&[(String, Entry)], bool),
    who: &str,
    warnings: &mut Vec<String>,
) {
    if mode == Mode::DenyAll && !egress.is_empty() {
        warnings.push(format!(
            "{who}: network.mode is deny-all; its {} egress entries are ignored",
            egress.len()
        ));
    }
    if mode == Mode::Restricted && egress.is_empty() && !scoped {
        warnings.push(format!(
            "{who}: network.mode is restricted with an empty egress list: nothing is reachable"
        ));
    }
    for (text, entry) in egress {
        opaque_hint(text, entry, who, warnings);
        if let crate::policy::entry::HostPattern::Net(net) = &entry.host {
            let wide = match net {
                ipnet::IpNet::V4(n) => n.prefix_len() < 8,
                ipnet::IpNet::V6(n) => n.prefix_len() < 16,
            };
            if wide {
                warnings.push(format!(
                    "{who}: network.egress entry `{text}` allows a range wider than /8 (IPv4) or /16 (IPv6): every public address in it is reachable. It opens none of the guard's private, loopback or metadata ranges (an address rule opens only the ranges it lies inside; metadata addresses need an exact /32 or /128 entry)"
                ));
            }
        }
    }
}

/// A name entry whose ports include a usual non-HTTP service (`db.internal:5432`) carries only
/// TLS or HTTP the proxy reads: say that `tcp://` declares opaque TCP.
fn opaque_hint(text: &str, entry: &Entry, who: &str, warnings: &mut Vec<String>) {
    use crate::policy::entry::HostPattern;
    if entry.opaque || matches!(entry.host, HostPattern::Net(_) | HostPattern::Localhost) {
        return;
    }
    let Some(ports) = &entry.ports else { return };
    let services = crate::policy::service_ports::services_in(ports, 3);
    if let Some((port, service)) = services.first() {
        let host = text.rsplit_once(':').map_or(text, |(h, _)| h);
        warnings.push(format!(
            "{who}: network.egress entry `{text}` allows port {port} ({service}) but carries only TLS or HTTP the proxy reads there; for another protocol write `tcp://{host}:{port}` (opaque TCP is allowed only where declared)"
        ));
    }
}

#[cfg(test)]
mod tests;
