//! The steps of [`super::load_str`] that read the document: its top-level mapping and keys,
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
