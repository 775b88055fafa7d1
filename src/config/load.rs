//! Loading a configuration ([`load_str`], from a file or the embedded default), and the steps
//! that read the document: its top-level mapping and keys,
//! one section at a time (an error is recorded, never returned, so every problem is
//! reported at once); the `sandboxes[]` entries are built in [`super::sandboxes`].

use std::mem::take;
use std::path::PathBuf;
use std::sync::Arc;

use serde_yaml::{Mapping, Value};

use super::control_plane::notes;
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

/// `listed`: members beyond a ceiling are listed in `beyond_ceiling` rather than refused.
pub(super) fn load_with(
    path: Option<&Path>,
    secrets: Secrets,
    listed: bool,
) -> Result<Config, ConfigErrors> {
    match path {
        None => {
            let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            load_str_with(
                EMBEDDED_CONFIG,
                EMBEDDED_NAME,
                &base,
                None,
                (secrets, listed),
            )
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
            load_str_with(&text, &name, &base, Some(p), (secrets, listed))
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
    load_str_with(text, origin, base_dir, path, (Secrets::Required, false))
}

/// The top-level sections as written, each read (and its errors reported) in load order,
/// so errors come in file order.
struct Sections {
    listen: RawListen,
    dns: RawDns,
    defaults: RawDefaults,
    audit: RawAudit,
    admin_token_file: Option<String>,
    admin: Option<Value>,
    state_dir: Option<String>,
    sandbox_dirs: Vec<String>,
    extra_providers: Vec<String>,
    max_connections: u64,
    admission: RawAdmission,
    runtime: RawRuntime,
    forward_keepalive: RawForwardKeepalive,
    control_plane: RawControlPlane,
    approvals: super::approvals::RawApprovals,
    raw_intercept: Option<credentials::RawIntercept>,
    raw_upstream: Option<upstream::RawUpstreamProxy>,
    decider: Option<super::decider::RawDecider>,
    otel: Option<super::otel::RawOtel>,
    sandboxes: Vec<Value>,
    layers: Option<Value>,
}

impl Sections {
    fn read(top: &mut Mapping, sink: &mut Sink<'_>) -> Sections {
        Sections {
            listen: section(top, "listen", sink).unwrap_or_default(),
            dns: section(top, "dns", sink).unwrap_or_default(),
            defaults: section(top, "defaults", sink).unwrap_or_default(),
            audit: section(top, "audit", sink).unwrap_or_default(),
            admin_token_file: section(top, "admin_token_file", sink).flatten(),
            admin: top.remove("admin"),
            state_dir: section(top, "state_dir", sink).flatten(),
            sandbox_dirs: section(top, "sandbox_dirs", sink).unwrap_or_default(),
            extra_providers: section(top, "extra_providers", sink).unwrap_or_default(),
            max_connections: section(top, "max_connections", sink)
                .unwrap_or(defaults::MAX_CONNECTIONS),
            admission: section(top, "admission", sink).unwrap_or_default(),
            runtime: section(top, "runtime", sink).unwrap_or_default(),
            forward_keepalive: section(top, "forward_keepalive", sink).unwrap_or_default(),
            control_plane: section(top, "control_plane", sink).unwrap_or_default(),
            approvals: section(top, "approvals", sink).unwrap_or_default(),
            raw_intercept: section(top, "tls_intercept", sink).flatten(),
            raw_upstream: section(top, "upstream_proxy", sink).flatten(),
            decider: section(top, "decider", sink).flatten(),
            otel: section(top, "otel", sink).flatten(),
            sandboxes: section(top, "sandboxes", sink).unwrap_or_default(),
            layers: top.remove("layers"),
        }
    }
}

/// The top-level settings that need nothing but their own section.
struct Knobs {
    defaults: Defaults,
    dns: DnsConfig,
    listen: Listen,
    admission: Admission,
    runtime: RuntimeLimits,
    forward_keepalive: ForwardKeepalive,
    max_connections: MaxConnections,
}

impl Knobs {
    fn resolve(s: &mut Sections, base_dir: &Path, sink: &mut Sink<'_>) -> Knobs {
        let mut defaults = resolve_defaults(take(&mut s.defaults), sink);
        if let Some(raw) = s.decider.take() {
            let mut errors = Vec::new();
            defaults.decider = super::decider::resolve_decider(&raw, &mut errors);
            let rel = |f: &str| files::path_in(base_dir, f);
            super::decider::read_secret(defaults.decider.as_mut(), &raw, &rel, &mut errors);
            for e in errors {
                sink.top("decider", e, Some("decider:"));
            }
        }
        let dns = resolve_dns(take(&mut s.dns), sink);
        let has_admin_token = s.admin_token_file.is_some();
        let mut listen = resolve_listen(take(&mut s.listen), has_admin_token, sink);
        relative_tls_paths(&mut listen, &|p: &str| files::path_in(base_dir, p));
        let knobs = Knobs {
            defaults,
            dns,
            listen,
            admission: resolve_admission(take(&mut s.admission), sink),
            runtime: resolve_runtime(take(&mut s.runtime), sink),
            forward_keepalive: resolve_forward_keepalive(
                take(&mut s.forward_keepalive),
                "forward_keepalive",
                sink,
            ),
            max_connections: max_connections(s.max_connections, sink),
        };
        check_extra_providers(&s.extra_providers, sink);
        knobs
    }
}

/// How the sections that name secrets are read: paths relative to the configuration, and
/// whether a secret that cannot be read is an error (`run`) or a warning (review tools).
struct Secretly<'a> {
    rel: &'a dyn Fn(&str) -> PathBuf,
    secrets: Secrets,
}

/// The top-level sections that name secrets, resolved.
type SecretSections = (
    Option<super::credentials::InterceptConfig>,
    Option<[u8; 32]>,
    Option<super::upstream::UpstreamProxy>,
    (
        Option<PathBuf>,
        super::console::ConsoleConfig,
        super::approvals::ApprovalsConfig,
    ),
);

impl Secretly<'_> {
    /// `tls_intercept` (and the placeholder key), `upstream_proxy`, `admin_token_file`,
    /// `admin` (users' token files), `approvals` (the webhook's secret).
    fn sections(
        &self,
        s: &mut Sections,
        sink: &mut Sink<'_>,
        warnings: &mut Vec<String>,
        files: &mut Vec<PathBuf>,
    ) -> SecretSections {
        let (rel, secrets) = (self.rel, self.secrets);
        let (intercept, placeholder_key) = credentials::resolve_intercept(
            s.raw_intercept.take(),
            &rel,
            sink,
            files,
            secrets,
            warnings,
        );
        let upstream_proxy = s
            .raw_upstream
            .take()
            .and_then(|raw| top_parent(&raw, &rel, secrets, sink, warnings, files));
        let admin_token_file = s
            .admin_token_file
            .take()
            .map(|f| admin_token(&rel(&f), secrets, sink, warnings));
        let console = super::console::resolve(s.admin.take(), rel, secrets, sink, warnings);
        let approvals = take(&mut s.approvals);
        let approvals =
            super::approvals::resolve_approvals(approvals, rel, secrets, sink, warnings);
        let admin = (admin_token_file, console, approvals);
        (intercept, placeholder_key, upstream_proxy, admin)
    }
}

impl Secretly<'_> {
    /// The TLS listeners' certificate, key and client CA files, and the interception CA's
    /// certificate, checked one way ([`tls_files`]).
    fn tls_files(
        &self,
        listen: &Listen,
        intercept: Option<&super::credentials::InterceptConfig>,
        sink: &mut Sink<'_>,
        warnings: &mut Vec<String>,
    ) {
        use tls_files::Holds;
        let tls = [
            ("proxy_tls", &listen.proxy_tls),
            ("admin_tls", &listen.admin_tls),
        ];
        let mut wanted = Vec::new();
        for (name, t) in tls {
            let Some(t) = t else { continue };
            wanted.push((
                format!("listen.{name}.cert_file"),
                &t.cert_file,
                Holds::Certificates,
            ));
            wanted.push((format!("listen.{name}.key_file"), &t.key_file, Holds::Key));
            if let Some(ca) = &t.client_ca_file {
                wanted.push((
                    format!("listen.{name}.client_ca_file"),
                    ca,
                    Holds::Certificates,
                ));
            }
        }
        if let Some(i) = intercept {
            let field = "tls_intercept.ca_cert_file".to_string();
            wanted.push((field, &i.ca_cert_file, Holds::CaCertificate));
        }
        for (field, path, holds) in wanted {
            tls_files::report(path, &field, holds, self.secrets, sink, warnings);
        }
    }
}

/// `admin_token_file` must hold a token when the proxy runs (a review tool only warns).
fn admin_token(
    path: &Path,
    secrets: Secrets,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) -> PathBuf {
    let problem = match std::fs::read_to_string(path) {
        Ok(t) if t.trim().is_empty() => Some(format!("{} is empty", path.display())),
        Ok(_) => None,
        Err(e) => Some(format!("cannot read {}: {e}", path.display())),
    };
    match (problem, secrets) {
        (None, _) => {}
        (Some(why), Secrets::MayBeAbsent) => warnings.push(format!(
            "admin_token_file: {why}; {}",
            super::ABSENT_SECRET_NOTE
        )),
        (Some(why), Secrets::Required) => {
            sink.top("admin_token_file", why, Some("admin_token_file"))
        }
    }
    path.to_path_buf()
}

/// `max_connections`, within its bounds.
fn max_connections(n: u64, sink: &mut Sink<'_>) -> MaxConnections {
    MaxConnections::new(n).unwrap_or_else(|| {
        sink.top(
            "max_connections",
            format!("must be from 1 to {}", MaxConnections::LIMIT),
            Some("max_connections:"),
        );
        MaxConnections::default()
    })
}

/// `extra_providers` may not reuse a built-in provider's id.
fn check_extra_providers(extra: &[String], sink: &mut Sink<'_>) {
    for p in extra {
        if block::BUILTIN_PROVIDERS.contains(&p.as_str()) {
            sink.top(
                "extra_providers",
                format!("`{p}` collides with a built-in provider id"),
                Some(p),
            );
        }
    }
}

/// The sandboxes' bindings; `listen.default_sandbox` must name one of them.
fn load_str_with(
    text: &str,
    origin: &str,
    base_dir: &Path,
    path: Option<&Path>,
    (secrets, listed): (Secrets, bool),
) -> Result<Config, ConfigErrors> {
    let (mut errors, mut warnings, mut beyond_ceiling) = (Vec::new(), Vec::new(), Vec::new());
    let mut files: Vec<PathBuf> = path.map(|p| vec![p.to_path_buf()]).unwrap_or_default();
    let file: Arc<str> = origin.into();
    let mut top = parse_top(text, &file)?;
    let mut sink = Sink::new(file.clone(), text, &mut errors);
    check_top_keys(&top, &mut sink);
    let mut s = Sections::read(&mut top, &mut sink);
    let knobs = Knobs::resolve(&mut s, base_dir, &mut sink);
    let rel = |p: &str| files::path_in(base_dir, p);
    let read = Secretly { rel: &rel, secrets };
    let (intercept, placeholder_key, upstream_proxy, (admin_token_file, console, approvals)) =
        read.sections(&mut s, &mut sink, &mut warnings, &mut files);
    read.tls_files(&knobs.listen, intercept.as_ref(), &mut sink, &mut warnings);
    let etcd = resolve_control_plane(s.control_plane, &rel, &mut sink);
    let otel = super::otel::resolve_otel(s.otel.take(), &rel, &mut sink);
    let within = (s.audit.path.as_str(), s.state_dir.as_deref());
    let audit_trail = audit::resolve_trail(s.audit.trail.clone(), within, &rel, &mut sink);
    warnings.extend(audit::loss_warning(&audit_trail, &rel(&s.audit.path)));
    warnings.extend(notes(&etcd, &s.state_dir, &knobs.defaults));
    let dirs: Vec<_> = s.sandbox_dirs.iter().map(|d| (d.clone(), rel(d))).collect();
    let (providers, w, f) = (&s.extra_providers, &mut warnings, &mut files);
    let index = refs::index_dirs(&dirs, providers, &mut sink, w, f);
    let layers = super::layers::resolve(s.layers.take(), &file, &knobs.defaults.ports, &mut sink);
    let ctx = BindingCtx {
        layers: &layers.chains,
        base_dir,
        defaults: &knobs.defaults,
        extra_providers: &s.extra_providers,
        index: &index,
        id_lines: id_lines(text),
        placeholder_key: placeholder_key.as_ref().map(|k| k.as_slice()),
        secrets,
    };
    let bindings = super::sandboxes::sandboxes_of(
        s.sandboxes,
        &ctx,
        &knobs.listen,
        &mut sink,
        &mut warnings,
        &mut files,
        listed.then_some(&mut beyond_ceiling),
    );
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        layers,
        admission: knobs.admission,
        runtime: knobs.runtime,
        forward_keepalive: knobs.forward_keepalive,
        max_connections: knobs.max_connections,
        defaults: knobs.defaults,
        dns: knobs.dns,
        listen: knobs.listen,
        origin: file,
        base_dir: base_dir.to_path_buf(),
        admin_token_file,
        console,
        audit_path: (s.audit.path != "-").then(|| rel(&s.audit.path)),
        audit_queue_max: s.audit.queue_max.max(1),
        audit_dns: s.audit.dns,
        audit_trail,
        upstream_proxy,
        etcd,
        approvals,
        otel,
        intercept,
        placeholder_key,
        secrets,
        state_dir: s.state_dir.map(|p| rel(&p)),
        extra_providers: s.extra_providers,
        bindings,
        warnings,
        beyond_ceiling,
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
            // Each error names its key first (`ca_file: …`): located at that key's line
            // below the block's, else at the block.
            let block = sink.locate("upstream_proxy", 1).unwrap_or(1);
            for e in errs {
                let key = e
                    .split_once(':')
                    .map(|(k, _)| k.rsplit('.').next().unwrap_or(k));
                let at = key
                    .map(|k| format!("{k}:"))
                    .filter(|k| sink.locate(k, block).is_some());
                let hint = at.as_deref().unwrap_or("upstream_proxy");
                sink.push(None, "upstream_proxy", e, Some(hint), block);
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
