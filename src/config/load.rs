//! Loading a configuration ([`load_str`], from a file or the embedded default), and the steps
//! that read the document: its top-level mapping and keys,
//! one section at a time (an error is recorded, never returned, so every problem is
//! reported at once), and the `sandboxes[]` entries built into bindings.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde_yaml::{Mapping, Value};

use super::*;

/// The document's top-level mapping (an empty document is an empty mapping).
pub(super) fn parse_top(text: &str, file: &Arc<str>) -> Result<Mapping, ConfigErrors> {
    let error = |line: Option<usize>, message: String| {
        ConfigErrors(vec![ConfigError::in_file(file.clone(), line, message)])
    };
    match serde_yaml::from_str(text) {
        Ok(Value::Null) => Ok(Mapping::new()),
        Ok(Value::Mapping(top)) => Ok(top),
        Ok(_) => Err(error(Some(1), "expected a mapping at the top level".into())),
        Err(e) => Err(error(
            e.location().map(|l| l.line()),
            format!("not valid YAML: {}", redact(&e.to_string())),
        )),
    }
}

/// Every top-level key is one the loader knows.
pub(super) fn check_top_keys(top: &Mapping, sink: &mut Sink<'_>) {
    for (k, _) in top {
        match k.as_str() {
            Some(k) if TOP_LEVEL_KEYS.contains(&k) => {}
            Some(k) => sink.top(
                k,
                format!(
                    "unknown key (expected one of: {})",
                    TOP_LEVEL_KEYS.join(", ")
                ),
                Some(&format!("{k}:")),
            ),
            None => sink.top("", "top-level keys must be strings", None),
        }
    }
}

/// Every `sandboxes[]` entry built; duplicate ids and sources shared by two sandboxes are
/// errors, a sandbox no connection can reach a warning. Returns the bindings and their ids.
pub(super) fn build_bindings(
    sandboxes: Vec<Value>,
    ctx: &BindingCtx<'_>,
    default_sandbox: Option<&str>,
    by_certificate: bool,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> (Vec<Binding>, HashSet<SandboxId>) {
    let mut bindings = Vec::new();
    let mut seen: HashSet<SandboxId> = HashSet::new();
    let mut sources_seen: HashMap<IpNet, SandboxId> = HashMap::new();
    for (i, value) in sandboxes.into_iter().enumerate() {
        let before = sink.errors.len();
        let Some(b) = build_binding(value, i, ctx, sink, warnings, files) else {
            if sink.errors.len() == before {
                sink.top(format!("sandboxes[{i}]"), "invalid binding", None);
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
            && default_sandbox != Some(b.id.as_str())
            && !by_certificate
        {
            warnings.push(format!(
                "sandbox {}: no auth, no sources, no client certificates (listen.proxy_tls.client_names) and not the default sandbox: no connection can reach it",
                b.id
            ));
        }
        bindings.push(b);
    }
    (bindings, seen)
}

/// Deserialize one top-level section, recording (not returning) its error.
pub(super) fn section<T: serde::de::DeserializeOwned>(
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

pub(super) fn load_with(path: Option<&Path>, secrets: Secrets) -> Result<Config, ConfigErrors> {
    match path {
        None => {
            let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            load_str_with(EMBEDDED_CONFIG, EMBEDDED_NAME, &base, None, secrets)
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
            load_str_with(&text, &name, &base, Some(p), secrets)
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
    load_str_with(text, origin, base_dir, path, Secrets::Required)
}

#[allow(
    clippy::too_many_lines,
    reason = "reads then resolves the top-level sections in load order, so errors come in file order; a Sections type is the next split (issue 38)"
)]
fn load_str_with(
    text: &str,
    origin: &str,
    base_dir: &Path,
    path: Option<&Path>,
    secrets: Secrets,
) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut files: Vec<PathBuf> = path.map(|p| vec![p.to_path_buf()]).unwrap_or_default();
    let file: Arc<str> = origin.into();
    let mut top = parse_top(text, &file)?;
    let mut sink = Sink::new(file.clone(), text, &mut errors);
    check_top_keys(&top, &mut sink);
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
    let max_connections: u64 =
        section(&mut top, "max_connections", &mut sink).unwrap_or(defaults::MAX_CONNECTIONS);
    let admission: RawAdmission = section(&mut top, "admission", &mut sink).unwrap_or_default();
    let runtime: RawRuntime = section(&mut top, "runtime", &mut sink).unwrap_or_default();
    let forward_keepalive: RawForwardKeepalive =
        section(&mut top, "forward_keepalive", &mut sink).unwrap_or_default();
    let control_plane: RawControlPlane =
        section(&mut top, "control_plane", &mut sink).unwrap_or_default();
    let raw_intercept: Option<credentials::RawIntercept> =
        section(&mut top, "tls_intercept", &mut sink).flatten();
    let raw_upstream: Option<upstream::RawUpstreamProxy> =
        section(&mut top, "upstream_proxy", &mut sink).flatten();
    let sandboxes: Vec<Value> = section(&mut top, "sandboxes", &mut sink).unwrap_or_default();
    let admission = resolve_admission(admission, &mut sink);
    let runtime = resolve_runtime(runtime, &mut sink);
    let forward_keepalive = resolve_forward_keepalive(forward_keepalive, &mut sink);

    for p in &extra_providers {
        if block::BUILTIN_PROVIDERS.contains(&p.as_str()) {
            sink.top(
                "extra_providers",
                format!("`{p}` collides with a built-in provider id"),
                Some(p),
            );
        }
    }
    let defaults = resolve_defaults(defaults, &mut sink);
    let dns = resolve_dns(dns, &mut sink);
    let listen = resolve_listen(listen, admin_token_file.is_some(), &mut sink);
    let max_connections = MaxConnections::new(max_connections).unwrap_or_else(|| {
        sink.top(
            "max_connections",
            format!("must be from 1 to {}", MaxConnections::LIMIT),
            Some("max_connections:"),
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
    let etcd = resolve_control_plane(control_plane, &rel, &mut sink);
    let (intercept, placeholder_key) = credentials::resolve_intercept(
        raw_intercept,
        &rel,
        &mut sink,
        &mut files,
        secrets,
        &mut warnings,
    );
    let upstream_proxy = raw_upstream
        .and_then(|raw| top_parent(&raw, &rel, secrets, &mut sink, &mut warnings, &mut files));
    let audit_trail = audit::resolve_trail(audit.trail.clone(), audit.path != "-", &rel, &mut sink);
    if etcd.is_some() && state_dir.is_some() {
        warnings.push(
            "state_dir is not used for registrations when control_plane.etcd is set: etcd keeps them"
                .into(),
        );
    }
    let mut listen = listen;
    relative_tls_paths(&mut listen, &rel);
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
        placeholder_key: placeholder_key.as_ref().map(|k| k.as_slice()),
        secrets,
    };
    // A verified client certificate on the TLS listener can name any sandbox.
    let by_certificate = listen
        .proxy_tls
        .as_ref()
        .is_some_and(|t| t.client_names != ClientNames::None);
    let (bindings, seen) = build_bindings(
        sandboxes,
        &ctx,
        listen.default_sandbox.as_deref(),
        by_certificate,
        &mut sink,
        &mut warnings,
        &mut files,
    );
    warnings.extend(binding::overlapping_sources(&bindings));
    if let Some(d) = &listen.default_sandbox {
        if !seen.contains(d.as_str()) {
            sink.top(
                "listen.default_sandbox",
                format!("no sandbox has id `{d}`"),
                Some("default_sandbox:"),
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
        audit_queue_max: audit.queue_max.max(1),
        audit_dns: audit.dns,
        audit_trail,
        admission,
        runtime,
        forward_keepalive,
        upstream_proxy,
        etcd,
        intercept,
        placeholder_key,
        secrets,
        state_dir: state_dir.map(|p| rel(&p)),
        extra_providers,
        max_connections,
        bindings,
        warnings,
        files,
        index: Arc::new(index),
    })
}

/// The top-level `upstream_proxy`, its password and CA files read relative to the
/// configuration (and watched); every problem goes to `sink`.
fn top_parent(
    raw: &upstream::RawUpstreamProxy,
    rel: &dyn Fn(&str) -> PathBuf,
    secrets: Secrets,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<upstream::UpstreamProxy> {
    if let Some(a) = &raw.auth {
        files.push(rel(&a.password_file));
    }
    if let Some(ca) = &raw.ca_file {
        files.push(rel(ca));
    }
    let read = |f: &str| {
        let path = rel(f);
        std::fs::read_to_string(&path).map_err(|source| files::ReadError { path, source })
    };
    match upstream::resolve(raw, &read, secrets, warnings) {
        Ok(u) => Some(u),
        Err(errs) => {
            for e in errs {
                sink.top("upstream_proxy", e, Some("upstream_proxy"));
            }
            None
        }
    }
}

/// The TLS listeners' certificate, key and client CA files, relative to the configuration.
fn relative_tls_paths(listen: &mut Listen, rel: &dyn Fn(&str) -> PathBuf) {
    for t in listen
        .proxy_tls
        .iter_mut()
        .chain(listen.admin_tls.iter_mut())
    {
        t.cert_file = rel(&t.cert_file.to_string_lossy());
        t.key_file = rel(&t.key_file.to_string_lossy());
        t.client_ca_file = t.client_ca_file.as_ref().map(|p| rel(&p.to_string_lossy()));
    }
}
