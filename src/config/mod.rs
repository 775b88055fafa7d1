//! Configuration: `proxy.yaml` (DESIGN §5), sandbox bindings, AIP-36 blocks inline or by
//! `ref` (a file path or an `@owner/slug` found in `sandbox_dirs`), turned into typed,
//! validated values. The only module that knows YAML. Loading reads the named files and
//! nothing else (no DNS, no network), collects every problem, and fails once with all of them.

pub mod error;
mod raw;
mod refs;
pub mod sandbox_block;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;
use serde_yaml::{Mapping, Value};
use sha2::{Digest, Sha256};

use error::{redact, unknown_field, Sink};
pub use error::{ConfigError, ConfigErrors};
use raw::{RawAudit, RawBinding, RawDefaults, RawDns, RawListen, TOP_LEVEL_KEYS};
pub use raw::{RawAuth, RawLimits};
use refs::PolicyIndex;
pub use sandbox_block::SandboxBlock;
use sandbox_block::{parse_block, BlockCtx};

use crate::hostname::normalize_name;
use crate::policy::ports::PortSet;
use crate::policy::{Enforcement, NetworkSpec};
use crate::sandbox_id::SandboxId;

/// The embedded default configuration (`config/proxy.yaml`), used when `--config` is absent.
pub const EMBEDDED_CONFIG: &str = include_str!("../../config/proxy.yaml");
/// How the embedded configuration is named in messages.
pub const EMBEDDED_NAME: &str = "<embedded config/proxy.yaml>";

/// Listener addresses; `None` means disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub proxy: Option<SocketAddr>,
    pub transparent: Option<SocketAddr>,
    /// The transparent listener is a TPROXY target (IP_TRANSPARENT), not a REDIRECT one.
    pub transparent_tproxy: bool,
    pub admin: Option<SocketAddr>,
    /// Sidecar mode: the sandbox of connections no other method identifies.
    pub default_sandbox: Option<String>,
}

/// Resolver settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// Empty: the system's resolv.conf.
    pub servers: Vec<SocketAddr>,
    /// Static answers consulted before DNS (normalised names).
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    pub timeout: Duration,
}

/// Proxy-side limits of one sandbox, every field resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    pub max_connections: u32,
    pub connections_per_second: f64,
    pub burst: u32,
    pub bandwidth_up_bps: Option<u64>,
    pub bandwidth_down_bps: Option<u64>,
}

/// Timeouts of the data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub idle: Duration,
    pub header: Duration,
    pub shutdown_grace: Duration,
}

/// `defaults:`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    pub ports: PortSet,
    pub enforcement: Enforcement,
    pub prohibited_ranges: Vec<IpNet>,
    pub guard_allow_ranges: Vec<IpNet>,
    pub limits: Limits,
    pub timeouts: Timeouts,
    pub strict_sni_dst: bool,
}

/// One sandbox binding: identity, proxy-side settings and its AIP-36 block.
#[derive(Debug, Clone)]
pub struct Binding {
    pub id: SandboxId,
    /// SHA-256 of the sandbox's proxy token, when it authenticates with one.
    pub token_sha256: Option<[u8; 32]>,
    /// The auth block as written (token forms only, never a token), for display.
    pub auth: Option<RawAuth>,
    pub sources: Vec<IpNet>,
    pub enforcement: Enforcement,
    /// Overrides as written (for display and persistence).
    pub limits_override: Option<RawLimits>,
    pub limits: Limits,
    pub strict_sni_dst: bool,
    pub block: SandboxBlock,
    pub network: NetworkSpec,
    /// The file the policy block lives in (the config file, or the referenced SANDBOX.md).
    pub policy_file: Arc<str>,
    /// The `ref` used, if any.
    pub policy_ref: Option<String>,
}

/// `max_connections`: a number of connections the process can actually hold — at least 1, at
/// most [`MaxConnections::LIMIT`] (a tokio semaphore cannot hold more than `usize::MAX >> 3`
/// permits, and the shutdown wait counts them in a `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxConnections(u32);

impl MaxConnections {
    pub const LIMIT: u32 = 10_000_000;

    pub fn new(n: u64) -> Option<Self> {
        (1..=u64::from(Self::LIMIT))
            .contains(&n)
            .then_some(MaxConnections(n as u32))
    }

    pub fn get(self) -> usize {
        self.0 as usize
    }

    pub fn get_u32(self) -> u32 {
        self.0
    }
}

impl Default for MaxConnections {
    fn default() -> Self {
        MaxConnections(10_000)
    }
}

/// A fully loaded configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The main file's name as shown in messages.
    pub origin: Arc<str>,
    /// Directory relative paths resolve against.
    pub base_dir: PathBuf,
    pub listen: Listen,
    pub admin_token_file: Option<PathBuf>,
    pub dns: DnsConfig,
    pub defaults: Defaults,
    /// `None`: audit to stdout.
    pub audit_path: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub extra_providers: Vec<String>,
    /// Global cap on concurrent client connections.
    pub max_connections: MaxConnections,
    pub bindings: Vec<Binding>,
    pub warnings: Vec<String>,
    /// Every file read (config, referenced and indexed SANDBOX.md files): what to watch.
    pub files: Vec<PathBuf>,
    /// Policies found in `sandbox_dirs`, for `@owner/slug` refs made later (admin PUT).
    index: Arc<PolicyIndex>,
}

/// Load a configuration file, or the embedded default when `path` is `None`.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigErrors> {
    match path {
        None => {
            let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            load_str(EMBEDDED_CONFIG, EMBEDDED_NAME, &base, None)
        }
        Some(p) => {
            let name: Arc<str> = p.display().to_string().into();
            let text = std::fs::read_to_string(p).map_err(|e| {
                ConfigErrors(vec![ConfigError {
                    file: name.clone(),
                    line: None,
                    sandbox: None,
                    field: String::new(),
                    message: format!("cannot read: {e}"),
                    code: None,
                }])
            })?;
            let base = p.parent().map(Path::to_path_buf).unwrap_or_default();
            let base = if base.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                base
            };
            load_str(&text, &name, &base, Some(p))
        }
    }
}

/// Load a configuration from text. `base_dir` anchors relative paths.
pub fn load_str(
    text: &str,
    origin: &str,
    base_dir: &Path,
    path: Option<&Path>,
) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut files: Vec<PathBuf> = path.map(|p| vec![p.to_path_buf()]).unwrap_or_default();
    let file: Arc<str> = origin.into();
    let doc: Value = match serde_yaml::from_str(text) {
        Ok(Value::Null) => Value::Mapping(Mapping::new()),
        Ok(v) => v,
        Err(e) => {
            return Err(ConfigErrors(vec![ConfigError {
                file,
                line: e.location().map(|l| l.line()),
                sandbox: None,
                field: String::new(),
                message: format!("not valid YAML: {}", redact(&e.to_string())),
                code: None,
            }]))
        }
    };
    let Value::Mapping(mut top) = doc else {
        return Err(ConfigErrors(vec![ConfigError {
            file,
            line: Some(1),
            sandbox: None,
            field: String::new(),
            message: "expected a mapping at the top level".into(),
            code: None,
        }]));
    };
    let mut sink = Sink::new(file.clone(), text, &mut errors);
    for (k, _) in &top {
        match k.as_str() {
            Some(k) if TOP_LEVEL_KEYS.contains(&k) => {}
            Some(k) => sink.push(
                None,
                k,
                format!(
                    "unknown key (expected one of: {})",
                    TOP_LEVEL_KEYS.join(", ")
                ),
                Some(&format!("{k}:")),
                1,
            ),
            None => sink.push(None, "", "top-level keys must be strings", None, 1),
        }
    }
    let listen: RawListen = section(&mut top, "listen", &mut sink).unwrap_or_default();
    let dns: RawDns = section(&mut top, "dns", &mut sink).unwrap_or_default();
    let defaults: RawDefaults = section(&mut top, "defaults", &mut sink).unwrap_or_default();
    let audit: RawAudit = section(&mut top, "audit", &mut sink).unwrap_or_default();
    let admin_token_file: Option<String> =
        section(&mut top, "admin_token_file", &mut sink).flatten();
    let state_dir: Option<String> = section(&mut top, "state_dir", &mut sink).flatten();
    let sandbox_dirs: Vec<String> =
        section(&mut top, "sandbox_dirs", &mut sink).unwrap_or_default();
    let extra_providers: Vec<String> =
        section(&mut top, "extra_providers", &mut sink).unwrap_or_default();
    let max_connections: u64 = section(&mut top, "max_connections", &mut sink).unwrap_or(10_000);
    let sandboxes: Vec<Value> = section(&mut top, "sandboxes", &mut sink).unwrap_or_default();

    for p in &extra_providers {
        if sandbox_block::BUILTIN_PROVIDERS.contains(&p.as_str()) {
            sink.push(
                None,
                "extra_providers",
                format!("`{p}` collides with a built-in provider id"),
                Some(p),
                1,
            );
        }
    }
    let defaults = resolve_defaults(defaults, &mut sink);
    let dns = resolve_dns(dns, &mut sink);
    let listen = resolve_listen(listen, admin_token_file.is_some(), &mut sink);
    let max_connections = MaxConnections::new(max_connections).unwrap_or_else(|| {
        sink.push(
            None,
            "max_connections",
            format!("must be from 1 to {}", MaxConnections::LIMIT),
            Some("max_connections:"),
            1,
        );
        MaxConnections::default()
    });

    let rel = |p: &str| -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base_dir.join(p)
        }
    };
    let index = refs::index_dirs(
        &sandbox_dirs
            .iter()
            .map(|d| (d.clone(), rel(d)))
            .collect::<Vec<_>>(),
        &extra_providers,
        &mut sink,
        &mut warnings,
        &mut files,
    );

    let ctx = BindingCtx {
        base_dir,
        defaults: &defaults,
        extra_providers: &extra_providers,
        index: &index,
        id_lines: id_lines(text),
    };
    let mut bindings = Vec::new();
    let mut seen: HashSet<SandboxId> = HashSet::new();
    let mut sources_seen: HashMap<IpNet, SandboxId> = HashMap::new();
    for (i, value) in sandboxes.into_iter().enumerate() {
        let before = sink.errors.len();
        let Some(b) = build_binding(value, i, &ctx, &mut sink, &mut warnings, &mut files) else {
            if sink.errors.len() == before {
                sink.push(None, format!("sandboxes[{i}]"), "invalid binding", None, 1);
            }
            continue;
        };
        if !seen.insert(b.id.clone()) {
            sink.push(
                Some(&b.id),
                "id",
                "duplicate sandbox id",
                Some(&format!("id: {}", b.id)),
                1,
            );
            continue;
        }
        for s in &b.sources {
            if let Some(other) = sources_seen.insert(*s, b.id.clone()) {
                sink.push(
                    Some(&b.id),
                    "sources",
                    format!("{s} is already a source of sandbox {other}"),
                    Some(&s.to_string()),
                    1,
                );
            }
        }
        if b.token_sha256.is_none()
            && b.sources.is_empty()
            && listen.default_sandbox.as_deref() != Some(&b.id)
        {
            warnings.push(format!(
                "sandbox {}: no auth, no sources and not the default sandbox: no connection can reach it",
                b.id
            ));
        }
        bindings.push(b);
    }
    if let Some(d) = &listen.default_sandbox {
        if !seen.contains(d.as_str()) {
            sink.push(
                None,
                "listen.default_sandbox",
                format!("no sandbox has id `{d}`"),
                Some("default_sandbox:"),
                1,
            );
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        origin: file,
        base_dir: base_dir.to_path_buf(),
        listen,
        admin_token_file: admin_token_file.map(|p| rel(&p)),
        dns,
        defaults,
        audit_path: (audit.path != "-").then(|| rel(&audit.path)),
        state_dir: state_dir.map(|p| rel(&p)),
        extra_providers,
        max_connections,
        bindings,
        warnings,
        files,
        index: Arc::new(index),
    })
}

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
        let mut value: Value = serde_yaml::from_str(text).map_err(|e| {
            one(
                format!("not valid JSON or YAML: {}", redact(&e.to_string())),
                e.location().map(|l| l.line()),
            )
        })?;
        let Value::Mapping(map) = &mut value else {
            return Err(one(
                "expected an object: a sandbox binding with an inline policy".into(),
                None,
            ));
        };
        match map.get("id") {
            None => {
                map.insert("id".into(), Value::String(id.to_string()));
            }
            Some(Value::String(s)) if s == id => {}
            Some(_) => {
                return Err(one(
                    format!("`id` in the body must be `{id}`, as in the path"),
                    None,
                ))
            }
        }
        if let Some(Value::Mapping(p)) = map.get("policy") {
            if p.contains_key("ref") {
                // Runtime bindings carry their policy inline; refs are for files the operator owns.
                let is_slug = p
                    .get("ref")
                    .and_then(Value::as_str)
                    .is_some_and(|r| r.starts_with('@'));
                if !is_slug {
                    return Err(one("runtime bindings take an inline policy (or an `@owner/slug` ref into sandbox_dirs), not a file path".into(), None));
                }
            }
        }
        let json =
            serde_json::to_string(&value).map_err(|e| one(format!("cannot encode: {e}"), None))?;
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut files = Vec::new();
        let mut sink = Sink::new(origin.into(), text, &mut errors);
        let ctx = BindingCtx {
            base_dir: &self.base_dir,
            defaults: &self.defaults,
            extra_providers: &self.extra_providers,
            index: &self.index,
            id_lines: id_lines(text),
        };
        let b = build_binding(value, 0, &ctx, &mut sink, &mut warnings, &mut files);
        match b {
            Some(b) if errors.is_empty() => Ok((b, json)),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// Deserialize one top-level section, recording (not returning) its error.
fn section<T: serde::de::DeserializeOwned>(
    top: &mut Mapping,
    key: &str,
    sink: &mut Sink<'_>,
) -> Option<T> {
    let value = top.remove(key)?;
    match serde_yaml::from_value(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let msg = redact(&e.to_string());
            let line = sink.locate(&format!("{key}:"), 1);
            let hint = unknown_field(&msg).map(|f| format!("{f}:"));
            let line = hint
                .and_then(|h| sink.locate(&h, line.unwrap_or(1)))
                .or(line);
            sink.errors.push(ConfigError {
                file: sink.file.clone(),
                line,
                sandbox: None,
                field: key.to_string(),
                message: msg,
                code: None,
            });
            None
        }
    }
}

fn resolve_limits(raw: &RawLimits, base: Option<&Limits>) -> Limits {
    let d = base.cloned().unwrap_or(Limits {
        max_connections: 512,
        connections_per_second: 100.0,
        burst: 200,
        bandwidth_up_bps: None,
        bandwidth_down_bps: None,
    });
    Limits {
        max_connections: raw.max_connections.unwrap_or(d.max_connections),
        connections_per_second: raw
            .connections_per_second
            .unwrap_or(d.connections_per_second),
        burst: raw.burst.unwrap_or(d.burst),
        bandwidth_up_bps: raw.bandwidth_up_bps.or(d.bandwidth_up_bps),
        bandwidth_down_bps: raw.bandwidth_down_bps.or(d.bandwidth_down_bps),
    }
}

fn check_limits(l: &Limits, sandbox: Option<&str>, field: &str, sink: &mut Sink<'_>, line: usize) {
    if l.max_connections == 0 {
        sink.push(
            sandbox,
            format!("{field}.max_connections"),
            "must be at least 1",
            Some("max_connections:"),
            line,
        );
    }
    if !(l.connections_per_second.is_finite() && l.connections_per_second > 0.0) {
        sink.push(
            sandbox,
            format!("{field}.connections_per_second"),
            "must be a positive number",
            Some("connections_per_second:"),
            line,
        );
    }
    if l.burst == 0 {
        sink.push(
            sandbox,
            format!("{field}.burst"),
            "must be at least 1",
            Some("burst:"),
            line,
        );
    }
    for (name, v) in [
        ("bandwidth_up_bps", l.bandwidth_up_bps),
        ("bandwidth_down_bps", l.bandwidth_down_bps),
    ] {
        if v == Some(0) {
            sink.push(
                sandbox,
                format!("{field}.{name}"),
                "must be positive (or null for unlimited)",
                Some(name),
                line,
            );
        }
    }
}

fn resolve_defaults(raw: RawDefaults, sink: &mut Sink<'_>) -> Defaults {
    let ports = match PortSet::from_ports(&raw.ports) {
        Ok(p) if !raw.ports.is_empty() => p,
        Ok(_) => {
            sink.push(
                None,
                "defaults.ports",
                "must list at least one port",
                Some("ports:"),
                1,
            );
            PortSet::any()
        }
        Err(e) => {
            sink.push(None, "defaults.ports", e, Some("ports:"), 1);
            PortSet::any()
        }
    };
    let limits = resolve_limits(&raw.limits, None);
    check_limits(&limits, None, "defaults.limits", sink, 1);
    let t = &raw.timeouts;
    for (name, v) in [
        ("connect_ms", t.connect_ms),
        ("idle_ms", t.idle_ms),
        ("header_ms", t.header_ms),
    ] {
        if v == 0 {
            sink.push(
                None,
                format!("defaults.timeouts.{name}"),
                "must be positive",
                Some(name),
                1,
            );
        }
    }
    Defaults {
        ports,
        enforcement: raw.enforcement,
        prohibited_ranges: raw.prohibited_ranges.iter().map(IpNet::trunc).collect(),
        guard_allow_ranges: raw.guard_allow_ranges.iter().map(IpNet::trunc).collect(),
        limits,
        timeouts: Timeouts {
            connect: Duration::from_millis(t.connect_ms),
            idle: Duration::from_millis(t.idle_ms),
            header: Duration::from_millis(t.header_ms),
            shutdown_grace: Duration::from_millis(t.shutdown_grace_ms),
        },
        strict_sni_dst: raw.strict_sni_dst,
    }
}

fn resolve_dns(raw: RawDns, sink: &mut Sink<'_>) -> DnsConfig {
    let mut servers = Vec::new();
    for (i, s) in raw.servers.iter().enumerate() {
        let parsed = s
            .parse::<SocketAddr>()
            .ok()
            .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)));
        match parsed {
            Some(a) => servers.push(a),
            None => sink.push(
                None,
                format!("dns.servers[{i}]"),
                format!("`{s}` is not `ip` or `ip:port`"),
                Some(s),
                1,
            ),
        }
    }
    let mut hosts = BTreeMap::new();
    for (name, addrs) in raw.hosts {
        match normalize_name(&name) {
            Ok(n) => {
                hosts.insert(n, addrs.into_iter().map(|a| a.to_canonical()).collect());
            }
            Err(e) => sink.push(
                None,
                format!("dns.hosts.{name}"),
                format!("invalid name: {e}"),
                Some(&name),
                1,
            ),
        }
    }
    if raw.timeout_ms == 0 {
        sink.push(
            None,
            "dns.timeout_ms",
            "must be positive",
            Some("timeout_ms:"),
            1,
        );
    }
    DnsConfig {
        servers,
        hosts,
        timeout: Duration::from_millis(raw.timeout_ms.max(1)),
    }
}

fn resolve_listen(raw: RawListen, has_admin_token: bool, sink: &mut Sink<'_>) -> Listen {
    if raw.proxy.is_none() && raw.transparent.is_none() {
        sink.push(
            None,
            "listen",
            "at least one of `proxy` and `transparent` must be set",
            Some("listen:"),
            1,
        );
    }
    if let Some(admin) = raw.admin {
        if !admin.ip().is_loopback() && !has_admin_token {
            sink.push(
                None,
                "listen.admin",
                format!("{admin} is not loopback: set `admin_token_file` so that mutating admin calls need a bearer token"),
                Some("admin:"),
                1,
            );
        }
    }
    Listen {
        proxy: raw.proxy,
        transparent: raw.transparent,
        transparent_tproxy: raw.transparent_tproxy,
        admin: raw.admin,
        default_sandbox: raw.default_sandbox,
    }
}

/// What building a binding needs from its surroundings.
struct BindingCtx<'a> {
    base_dir: &'a Path,
    defaults: &'a Defaults,
    extra_providers: &'a [String],
    index: &'a PolicyIndex,
    /// Sandbox id → the line of its first `id:` (one pass over the file, not one per binding).
    id_lines: HashMap<String, usize>,
}

/// Map every `id: X` line of a file to its line number (first occurrence wins).
fn id_lines(text: &str) -> HashMap<String, usize> {
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

fn build_binding(
    value: Value,
    index: usize,
    ctx: &BindingCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<Binding> {
    let Value::Mapping(mut map) = value else {
        sink.push(
            None,
            format!("sandboxes[{index}]"),
            "expected a mapping with `id` and `policy`",
            None,
            1,
        );
        return None;
    };
    let id_text = map.get("id").and_then(Value::as_str).map(str::to_string);
    let label = id_text
        .clone()
        .unwrap_or_else(|| format!("sandboxes[{index}]"));
    let sb = Some(label.as_str());
    let line = id_text
        .as_deref()
        .and_then(|id| ctx.id_lines.get(id).copied())
        .unwrap_or(1);
    let before = sink.errors.len();
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
    let policy_value = map.remove("policy");
    let raw: Option<RawBinding> = match serde_yaml::from_value(Value::Mapping(map)) {
        Ok(r) => Some(r),
        Err(e) => {
            let msg = redact(&e.to_string());
            let hint = unknown_field(&msg).map(|f| format!("{f}:"));
            sink.push(sb, "", msg, hint.as_deref(), line);
            None
        }
    };
    if let Some(id) = &id_text {
        if !crate::sandbox_id::is_valid(id) {
            sink.push(
                sb,
                "id",
                "must match [a-z0-9][a-z0-9_.-]{0,62}",
                Some("id:"),
                line,
            );
        }
    }
    let token_sha256 = raw
        .as_ref()
        .and_then(|r| r.auth.as_ref())
        .and_then(|a| token_digest(a, ctx.base_dir, sb, sink, line, files));
    let policy = match policy_value {
        None => {
            sink.push(
                sb,
                "policy",
                "required: an AIP-36 sandbox block, `{ inline: ... }` or `{ ref: ... }`",
                None,
                line,
            );
            None
        }
        Some(v) => resolve_policy(v, sb, line, ctx, sink, warnings, files),
    };
    let raw = raw?;
    let limits = resolve_limits(
        raw.limits.as_ref().unwrap_or(&RawLimits::default()),
        Some(&ctx.defaults.limits),
    );
    check_limits(&limits, sb, "limits", sink, line);
    let (block, network, policy_file, policy_ref) = policy?;
    if sink.errors.len() > before {
        return None;
    }
    let id = SandboxId::new(&raw.id).ok()?;
    Some(Binding {
        id,
        token_sha256,
        auth: raw.auth,
        sources: raw.sources.iter().map(IpNet::trunc).collect(),
        enforcement: raw.enforcement.unwrap_or(ctx.defaults.enforcement),
        limits_override: raw.limits,
        limits,
        strict_sni_dst: raw.strict_sni_dst.unwrap_or(ctx.defaults.strict_sni_dst),
        block,
        network,
        policy_file,
        policy_ref,
    })
}

fn token_digest(
    auth: &RawAuth,
    base_dir: &Path,
    sb: Option<&str>,
    sink: &mut Sink<'_>,
    line: usize,
    files: &mut Vec<PathBuf>,
) -> Option<[u8; 32]> {
    let forms = [
        auth.token_sha256.is_some(),
        auth.token_file.is_some(),
        auth.token_env.is_some(),
    ];
    if forms.iter().filter(|f| **f).count() != 1 {
        sink.push(
            sb,
            "auth",
            "give exactly one of token_sha256, token_file, token_env",
            Some("auth:"),
            line,
        );
        return None;
    }
    let secret = if let Some(hex_digest) = &auth.token_sha256 {
        let mut out = [0u8; 32];
        return match hex::decode_to_slice(hex_digest.trim(), &mut out) {
            Ok(()) => Some(out),
            Err(_) => {
                sink.push(
                    sb,
                    "auth.token_sha256",
                    "must be 64 hexadecimal characters (a SHA-256 digest)",
                    Some("token_sha256:"),
                    line,
                );
                None
            }
        };
    } else if let Some(f) = &auth.token_file {
        let path = if Path::new(f).is_absolute() {
            PathBuf::from(f)
        } else {
            base_dir.join(f)
        };
        files.push(path.clone());
        match std::fs::read_to_string(&path) {
            Ok(t) => t.trim().to_string(),
            Err(e) => {
                sink.push(
                    sb,
                    "auth.token_file",
                    format!("cannot read {}: {}", path.display(), e.kind()),
                    Some("token_file:"),
                    line,
                );
                return None;
            }
        }
    } else {
        let var = auth.token_env.as_deref().unwrap_or_default();
        match std::env::var(var) {
            Ok(t) => t.trim().to_string(),
            Err(_) => {
                sink.push(
                    sb,
                    "auth.token_env",
                    format!("environment variable {var} is not set"),
                    Some("token_env:"),
                    line,
                );
                return None;
            }
        }
    };
    if secret.is_empty() {
        sink.push(sb, "auth", "the token is empty", Some("auth:"), line);
        return None;
    }
    Some(Sha256::digest(secret.as_bytes()).into())
}

type ResolvedPolicy = (SandboxBlock, NetworkSpec, Arc<str>, Option<String>);

fn resolve_policy(
    value: Value,
    sb: Option<&str>,
    line: usize,
    ctx: &BindingCtx<'_>,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<ResolvedPolicy> {
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
        return match found {
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
        };
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

#[cfg(test)]
mod tests {
    use super::*;

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
                .contains("at least one of `proxy` and `transparent`"),
            "{e}"
        );
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
        assert!(load_text("listen: { admin: 0.0.0.0:9901 }\nadmin_token_file: /run/t").is_ok());
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
}
