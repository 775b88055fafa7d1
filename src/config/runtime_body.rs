//! What a sandbox binding that arrives at run time (the admin API, an etcd key, a file of
//! `state_dir`) must be before it is built: bounded in size and depth before any parser sees
//! it, JSON or YAML, an object whose `id` is the path's, naming none of the operator's
//! secrets, files or environment.

use serde_yaml::Value;

use super::error::redact;

/// Deepest nesting of `[`/`{` a runtime binding may have (a real one has under 10).
const MAX_DEPTH: usize = 64;

/// The deepest nesting of flow collections (`[`, `{`) in `text`, outside quoted strings: a
/// cheap, linear bound checked before any parser sees the text (libyaml is super-linear in
/// depth).
fn flow_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    for &b in text.as_bytes() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if b == b'\\' && q == b'"' {
                    escaped = true;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    deepest
}

/// What a runtime registration may not carry — the operator's secrets, files and environment
/// are not the caller's to name (the answer must not even say whether such a file exists) —
/// and why; `None` when it carries none of them.
pub(super) fn not_at_run_time(map: &serde_yaml::Mapping) -> Option<&'static str> {
    if map.contains_key("credentials") {
        return Some(
            "runtime registrations cannot carry `credentials` (their secrets come from the \
             operator's files or environment): define them in the config file",
        );
    }
    if let Some(Value::Mapping(parent)) = map.get("upstream_proxy") {
        if parent.contains_key("auth") || parent.contains_key("ca_file") {
            return Some(
                "runtime registrations cannot give `upstream_proxy.auth` or \
                 `upstream_proxy.ca_file` (the parent's password and CA come from the \
                 operator's files): use a parent without them, `direct`, or define the \
                 sandbox in the config file",
            );
        }
    }
    if let Some(Value::Mapping(auth)) = map.get("auth") {
        // The proxy's own files and environment are not the caller's to name: the answer
        // must not even say whether such a file or variable exists.
        if auth.contains_key("token_file") || auth.contains_key("token_env") {
            return Some(
                "runtime registrations take `auth.token_sha256` only (`token_file` and \
                 `token_env` are for bindings in the operator's own config files)",
            );
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
                return Some("runtime bindings take an inline policy (or an `@owner/slug` ref into sandbox_dirs), not a file path");
            }
        }
    }
    None
}

/// A runtime binding's text as a value, bounded before anything parses it: a hostile value
/// (an etcd key, a state file) must cost milliseconds, never the replica. JSON (what
/// runtimes, etcd and the state log send) by serde_json, which has its own recursion limit
/// and is linear; else YAML. The error's message and line.
pub(super) fn read_bounded(text: &str, max: usize) -> Result<Value, (String, Option<usize>)> {
    if text.len() > max {
        let why = format!(
            "{} bytes, over runtime.max_binding_bytes ({max})",
            text.len()
        );
        return Err((why, None));
    }
    if flow_depth(text) > MAX_DEPTH {
        return Err((format!("nested deeper than {MAX_DEPTH} levels"), None));
    }
    if text.trim_start().starts_with('{') {
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            let why = format!("not valid JSON: {}", redact(&e.to_string()));
            (why, Some(e.line()))
        })?;
        serde_yaml::to_value(json).map_err(|e| (redact(&e.to_string()), None))
    } else {
        serde_yaml::from_str(text).map_err(|e| {
            let why = format!("not valid JSON or YAML: {}", redact(&e.to_string()));
            (why, e.location().map(|l| l.line()))
        })
    }
}

/// The body's `id`: filled in when absent, else it must be the path's.
pub(super) fn settle_id(map: &mut serde_yaml::Mapping, id: &str) -> Result<(), String> {
    match map.get("id") {
        None => {
            map.insert("id".into(), Value::String(id.to_string()));
            Ok(())
        }
        Some(Value::String(s)) if s == id => Ok(()),
        Some(_) => Err(format!("`id` in the body must be `{id}`, as in the path")),
    }
}
