//! The file's `sandboxes[]` entries built into bindings: duplicate ids and shared sources
//! refused, a sandbox no connection can reach warned about, `listen.default_sandbox` checked,
//! and every member's entries held to the ceilings of its layers (refused, or listed for
//! `simulate`).

use std::collections::HashSet;
use std::path::PathBuf;

use serde_yaml::Value;

use super::*;

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

/// A member beyond a ceiling of its layers is an error, or listed in `beyond` when given.
pub(super) fn sandboxes_of(
    sandboxes: Vec<Value>,
    ctx: &BindingCtx<'_>,
    listen: &Listen,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
    beyond: Option<&mut Vec<String>>,
) -> Vec<Binding> {
    // A verified client certificate on the TLS listener can name any sandbox.
    let by_certificate = listen
        .proxy_tls
        .as_ref()
        .is_some_and(|t| t.client_names != ClientNames::None);
    let (bindings, seen) = build_bindings(
        sandboxes,
        ctx,
        listen.default_sandbox.as_deref(),
        by_certificate,
        sink,
        warnings,
        files,
    );
    warnings.extend(binding::overlapping_sources(&bindings));
    super::layers::check_members(&bindings, sink, beyond);
    if let Some(d) = &listen.default_sandbox {
        if !seen.contains(d.as_str()) {
            sink.top(
                "listen.default_sandbox",
                format!("no sandbox has id `{d}`"),
                Some("default_sandbox:"),
            );
        }
    }
    bindings
}
