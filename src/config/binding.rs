//! Sandbox bindings: one entry of `sandboxes:` (or a runtime registration) → a [`Binding`]:
//! its id, token (digest, file or environment variable — never plaintext), sources, limits
//! and its AIP-36 policy, inline or by `ref`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use serde_yaml::Value;

use super::binding_secrets::{resolve_credentials, token_digest};
use super::block::{parse_block, BlockCtx, SandboxBlock};
use super::defaults::{check_limits, resolve_limits};
use super::error::{redact, unknown_field, ConfigError, ConfigErrors, Sink};
use super::raw::{RawBinding, RawLimits};
use super::refs::{self, PolicyIndex};
use super::runtime_body::{not_at_run_time, read_bounded, settle_id};
use super::{Binding, Config, Defaults};
use crate::policy::sandbox_id::SandboxId;
use crate::policy::NetworkSpec;

impl Config {
    /// Parse a binding that arrives at run time (admin API `PUT /v1/sandboxes/{id}`, or a file
    /// of `state_dir`), with this configuration's defaults, providers and `sandbox_dirs`
    /// index. The body is JSON or YAML; its `id`, when present, must be `id` (it is filled in
    /// otherwise). Returns the binding and the body as canonical JSON, for persistence.
    pub fn parse_runtime_binding(
        &self,
        text: &str,
        origin: &str,
        id: &str,
    ) -> Result<(Binding, String), ConfigErrors> {
        let one = |message: String, line: Option<usize>| {
            ConfigErrors(vec![ConfigError {
                file: origin.into(),
                line,
                sandbox: Some(id.to_string()),
                field: String::new(),
                message,
                code: None,
            }])
        };
        let mut value = read_bounded(text, self.runtime.max_binding_bytes)
            .map_err(|(message, line)| one(message, line))?;
        let Value::Mapping(map) = &mut value else {
            return Err(one(
                "expected an object: a sandbox binding with an inline policy".into(),
                None,
            ));
        };
        settle_id(map, id).map_err(|m| one(m, None))?;
        if let Some(why) = not_at_run_time(map) {
            return Err(one(why.into(), None));
        }
        let json =
            serde_json::to_string(&value).map_err(|e| one(format!("cannot encode: {e}"), None))?;
        let (mut errors, mut warnings, mut files) = (Vec::new(), Vec::new(), Vec::new());
        let mut sink = Sink::new(origin.into(), text, &mut errors);
        let ctx = BindingCtx {
            base_dir: &self.base_dir,
            defaults: &self.defaults,
            extra_providers: &self.extra_providers,
            index: &self.index,
            id_lines: id_lines(text),
            placeholder_key: self.placeholder_key.as_ref().map(|k| k.as_slice()),
            secrets: self.secrets,
            layers: &self.layers.chains,
        };
        let b = build_binding(value, 0, &ctx, &mut sink, &mut warnings, &mut files);
        match b {
            Some(b) if errors.is_empty() => Ok((b, json)),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

impl Config {
    /// Whether `other` parses runtime bindings exactly as this configuration does (the same
    /// base directory, defaults, providers and `sandbox_dirs` index): then a reload need not
    /// parse the registrations again.
    pub fn parses_runtime_bindings_like(&self, other: &Config) -> bool {
        self.base_dir == other.base_dir
            && self.defaults == other.defaults
            && self.extra_providers == other.extra_providers
            && self.index == other.index
            && self.layers.raw == other.layers.raw
            && self.layers.runtime == other.layers.runtime
    }
}

/// What building a binding needs from its surroundings.
pub(super) struct BindingCtx<'a> {
    pub base_dir: &'a Path,
    pub defaults: &'a Defaults,
    pub extra_providers: &'a [String],
    pub index: &'a PolicyIndex,
    /// Sandbox id → the line of its first `id:` (one pass over the file, not one per binding).
    pub id_lines: HashMap<String, usize>,
    /// What credential placeholders derive from (`None`: no `tls_intercept`).
    pub placeholder_key: Option<&'a [u8]>,
    /// Whether a credential's secret must be readable (`run`) or may be absent (review tools).
    pub secrets: super::Secrets,
    /// `layers:`, for a binding's `layer:`.
    pub layers: &'a super::layers::Layers,
}

/// Map every `id: X` line of a file to its line number (first occurrence wins).
pub(super) fn id_lines(text: &str) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(pos) = line.find("id:") {
            let rest = line[pos + 3..].trim_start();
            let id: String = rest
                .trim_start_matches(['"', '\''])
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "_.-".contains(*c))
                .collect();
            if !id.is_empty() {
                out.entry(id).or_insert(i + 1);
            }
        }
    }
    out
}

/// A binding's `upstream_proxy`: inherited, `direct`, or its own parent (whose password and
/// CA files are watched like the configuration's own).
fn parent_choice(
    choice: Option<&super::upstream::RawSandboxParent>,
    ctx: &BindingCtx<'_>,
    (sb, line): (Option<&str>, usize),
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> super::upstream::ParentChoice {
    match choice {
        None => super::upstream::ParentChoice::Inherit,
        Some(choice) => {
            let path = |f: &str| {
                if Path::new(f).is_absolute() {
                    PathBuf::from(f)
                } else {
                    ctx.base_dir.join(f)
                }
            };
            if let super::upstream::RawSandboxParent::Via(r) = choice {
                if let Some(a) = &r.auth {
                    files.push(path(&a.password_file));
                }
                if let Some(ca) = &r.ca_file {
                    files.push(path(ca));
                }
            }
            let read = |f: &str| super::files::read_in(ctx.base_dir, f);
            match super::upstream::resolve_choice(choice, &read, ctx.secrets, warnings) {
                Ok(c) => c,
                Err(errs) => {
                    for e in errs {
                        sink.push(sb, "upstream_proxy", e, Some("upstream_proxy"), line);
                    }
                    super::upstream::ParentChoice::Inherit
                }
            }
        }
    }
}

/// The fields of a binding besides its policy: plaintext tokens refused by name (never
/// echoed), unknown keys refused, the id checked. `None` when they do not parse.
fn raw_binding(
    mut map: serde_yaml::Mapping,
    id_text: Option<&str>,
    (sb, line): (Option<&str>, usize),
    sink: &mut Sink<'_>,
) -> Option<RawBinding> {
    // A plaintext token is refused by name, and never echoed.
    if let Some(Value::Mapping(auth)) = map.get_mut("auth") {
        for key in ["token", "password", "secret"] {
            if auth.remove(key).is_some() {
                sink.push(
                    sb,
                    format!("auth.{key}"),
                    "plaintext tokens are not allowed in config: use token_sha256, token_file or token_env",
                    Some(&format!("{key}:")),
                    line,
                );
            }
        }
    }
    let raw: Option<RawBinding> = match serde_yaml::from_value(Value::Mapping(map)) {
        Ok(r) => Some(r),
        Err(e) => {
            let msg = redact(&e.to_string());
            let hint = unknown_field(&msg).map(|f| format!("{f}:"));
            sink.push(sb, "", msg, hint.as_deref(), line);
            None
        }
    };
    if let Some(id) = id_text {
        if !crate::policy::sandbox_id::is_valid(id) {
            sink.push(
                sb,
                "id",
                "must match [a-z0-9][a-z0-9_.-]{0,62}",
                Some("id:"),
                line,
            );
        }
    }
    raw
}

/// A binding's `id` as written, how its errors name it (the id, else its index) and its line.
fn named_at(
    map: &serde_yaml::Mapping,
    index: usize,
    ctx: &BindingCtx<'_>,
) -> (Option<String>, String, usize) {
    let id_text = map.get("id").and_then(Value::as_str).map(str::to_string);
    let label = id_text
        .clone()
        .unwrap_or_else(|| format!("sandboxes[{index}]"));
    let line = id_text
        .as_deref()
        .and_then(|id| ctx.id_lines.get(id).copied())
        .unwrap_or(1);
    (id_text, label, line)
}

pub(super) fn build_binding(
    value: Value,
    index: usize,
    ctx: &BindingCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<Binding> {
    let Value::Mapping(mut map) = value else {
        sink.top(
            format!("sandboxes[{index}]"),
            "expected a mapping with `id` and `policy`",
            None,
        );
        return None;
    };
    let (id_text, label, line) = named_at(&map, index, ctx);
    let sb = Some(label.as_str());
    let before = sink.errors.len();
    let policy_value = map.remove("policy");
    let raw = raw_binding(map, id_text.as_deref(), (sb, line), sink);
    let token_sha256 = raw.as_ref().and_then(|r| r.auth.as_ref()).and_then(|a| {
        let tcx = super::binding_secrets::TokenCtx {
            base_dir: ctx.base_dir,
            secrets: ctx.secrets,
        };
        token_digest(a, &tcx, (sb, line), sink, warnings, files)
    });
    let policy = resolve_policy(policy_value, sb, line, ctx, sink, warnings, files);
    let raw = raw?;
    let limits = resolve_limits(
        raw.limits.as_ref().unwrap_or(&RawLimits::default()),
        Some(&ctx.defaults.limits),
    );
    check_limits(&limits, sb, "limits", sink, line);
    let require_tls_ports = match &raw.require_tls_ports {
        Some(ports) => super::defaults::tls_ports(ports, "require_tls_ports", sb, line, sink),
        None => ctx.defaults.require_tls_ports.clone(),
    };
    let credentials = resolve_credentials(&raw, ctx, sb, sink, line, files, warnings);
    let upstream_proxy = parent_choice(
        raw.upstream_proxy.as_ref(),
        ctx,
        (sb, line),
        sink,
        warnings,
        files,
    );
    let (decider, dlp, identity_token) =
        super::decider::of_binding(&raw, ctx.defaults, (sb, line), sink);
    let (block, mut network, policy_file, policy_ref) = policy?;
    join_layer(&raw, ctx, &mut network, (sb, line), sink);
    let http = !network.http.is_empty() || network.layers.iter().any(|l| !l.http.is_empty());
    let terminating = (http, identity_token.is_some());
    super::identity_token::needs_intercept(ctx.placeholder_key, terminating, (sb, line), sink);
    if sink.errors.len() > before {
        return None;
    }
    let id = SandboxId::new(&raw.id).ok()?;
    Some(Binding {
        id,
        token_sha256,
        sources: raw.sources.iter().map(IpNet::trunc).collect(),
        enforcement: raw.enforcement.unwrap_or(ctx.defaults.enforcement),
        limits,
        strict_sni_dst: raw.strict_sni_dst.unwrap_or(ctx.defaults.strict_sni_dst),
        require_tls_ports,
        refuse_ech: raw.refuse_ech.unwrap_or(ctx.defaults.refuse_ech),
        block_json: serde_json::to_string(&block).unwrap_or_default().into(),
        network,
        policy_file,
        policy_ref,
        credentials: credentials.into(),
        upstream_proxy,
        decider,
        dlp,
        identity_token,
    })
}

/// `layer: id`: the network is bounded by that layer's chain (an unknown id is an error).
fn join_layer(
    raw: &RawBinding,
    ctx: &BindingCtx<'_>,
    network: &mut crate::policy::NetworkSpec,
    (sb, line): (Option<&str>, usize),
    sink: &mut Sink<'_>,
) {
    if let Err(e) = super::layers::attach(raw.layer.as_deref(), ctx.layers, network) {
        sink.push(sb, "layer", e, Some("layer:"), line);
    }
}

/// `policy: { ref: … }`: a file path or an `@owner/slug` into `sandbox_dirs`, standing alone.
fn policy_ref(
    m: &serde_yaml::Mapping,
    (sb, policy_line): (Option<&str>, usize),
    ctx: &BindingCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<ResolvedPolicy> {
    if m.len() != 1 {
        sink.push(
            sb,
            "policy",
            "`ref` stands alone: put the block in the referenced file",
            Some("ref:"),
            policy_line,
        );
        return None;
    }
    let Some(r) = m.get("ref").and_then(Value::as_str) else {
        sink.push(
            sb,
            "policy.ref",
            "must be a string: a file path or `@owner/slug`",
            Some("ref:"),
            policy_line,
        );
        return None;
    };
    let found = refs::resolve_ref(
        r,
        ctx.base_dir,
        ctx.index,
        ctx.extra_providers,
        warnings,
        files,
    );
    match found {
        Ok((block, network, file)) => Some((block, network, file, Some(r.to_string()))),
        Err(mut errs) => {
            if errs.is_empty() {
                let loc = sink.locate(r, policy_line);
                sink.errors.push(ConfigError {
                    file: sink.file.clone(),
                    line: loc,
                    sandbox: sb.map(str::to_string),
                    field: "policy.ref".into(),
                    message: format!("`{r}` cannot be resolved (no such file, or no SANDBOX.md with that id in sandbox_dirs)"),
                    code: Some("sandbox_ref_unresolvable"),
                });
            } else {
                for e in &mut errs {
                    e.sandbox = sb.map(str::to_string);
                }
                sink.errors.extend(errs);
            }
            None
        }
    }
}

type ResolvedPolicy = (SandboxBlock, NetworkSpec, Arc<str>, Option<String>);

/// A binding's `policy` (required): an AIP-36 block, `{ inline: … }` or `{ ref: … }`.
fn resolve_policy(
    value: Option<Value>,
    sb: Option<&str>,
    line: usize,
    ctx: &BindingCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<ResolvedPolicy> {
    let Some(value) = value else {
        sink.push(
            sb,
            "policy",
            "required: an AIP-36 sandbox block, `{ inline: ... }` or `{ ref: ... }`",
            None,
            line,
        );
        return None;
    };
    let policy_line = sink.locate("policy:", line).unwrap_or(line);
    let (has_inline, has_ref) = match &value {
        Value::Mapping(m) => (m.contains_key("inline"), m.contains_key("ref")),
        _ => (false, false),
    };
    if has_inline && has_ref {
        sink.push(
            sb,
            "policy",
            "`inline` and `ref` are mutually exclusive (AIP-36 conformance rule 1)",
            Some("ref:"),
            policy_line,
        );
        return None;
    }
    if has_ref {
        let Value::Mapping(m) = &value else {
            return None;
        };
        return policy_ref(m, (sb, policy_line), ctx, sink, warnings, files);
    }
    let block_value = if has_inline {
        let Value::Mapping(mut m) = value else {
            return None;
        };
        if m.len() != 1 {
            sink.push(
                sb,
                "policy",
                "`inline` stands alone: put every field inside it",
                Some("inline:"),
                policy_line,
            );
            return None;
        }
        m.remove("inline").unwrap_or(Value::Null)
    } else {
        value
    };
    let prefix = if has_inline {
        "policy.inline."
    } else {
        "policy."
    };
    let bctx = BlockCtx {
        sandbox: sb,
        prefix,
        standalone: false,
        extra_providers: ctx.extra_providers,
        line: policy_line,
    };
    let (block, network) = parse_block(block_value, &bctx, sink, warnings)?;
    Some((block, network, sink.file.clone(), None))
}

/// One warning per `sources` range nested inside another sandbox's range: identity by source
/// address takes the longest prefix, so the inner sandbox takes those addresses from the
/// outer one — legal, but worth saying. CIDR ranges are either nested or disjoint, so one
/// sorted sweep with a stack of enclosing ranges finds every pair's innermost enclosure.
pub(super) fn overlapping_sources(bindings: &[Binding]) -> Vec<String> {
    let mut nets: Vec<(IpNet, &SandboxId)> = bindings
        .iter()
        .flat_map(|b| b.sources.iter().map(move |n| (*n, &b.id)))
        .collect();
    nets.sort_by_key(|(n, _)| (n.addr().is_ipv6(), n.network(), n.prefix_len()));
    let mut warnings = Vec::new();
    let mut stack: Vec<(IpNet, &SandboxId)> = Vec::new();
    for (net, id) in nets {
        while stack.last().is_some_and(|(outer, _)| !outer.contains(&net)) {
            stack.pop();
        }
        if let Some((outer, outer_id)) = stack.iter().rev().find(|(_, o)| *o != id) {
            warnings.push(format!(
                "sources {net} of sandbox {id} lie inside {outer} of sandbox {outer_id}: the longest prefix decides, so addresses in {net} identify as {id}"
            ));
        }
        stack.push((net, id));
    }
    warnings
}
