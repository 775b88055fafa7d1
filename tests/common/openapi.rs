//! The admin API's contract, enforced: every admin response a test receives (through
//! [`super::admin_req`] and [`super::keep_alive_request`]) is checked against
//! `docs/openapi.yaml` — the path and method are documented, the status is listed for that
//! operation, required headers are present with their documented values, the media type is
//! one the document names, and a JSON body validates against the schema (JSON Schema 2020-12,
//! as OpenAPI 3.1 uses it). A mismatch fails the test that received the response, so the
//! document cannot drift from the code.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

/// `docs/openapi.yaml` as JSON.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml");
        let text = std::fs::read_to_string(path).expect("docs/openapi.yaml is readable");
        let yaml: serde_yaml::Value =
            serde_yaml::from_str(&text).expect("docs/openapi.yaml is YAML");
        serde_json::to_value(yaml).expect("docs/openapi.yaml converts to JSON")
    })
}

/// The (operationId, status) pairs checked so far in this test binary.
pub fn seen() -> BTreeSet<(String, u16)> {
    SEEN.lock().map(|s| s.clone()).unwrap_or_default()
}

static SEEN: Mutex<BTreeSet<(String, u16)>> = Mutex::new(BTreeSet::new());

/// One response as the test received it.
pub struct Exchange<'a> {
    pub method: &'a str,
    /// The request target (a query is ignored).
    pub target: &'a str,
    pub status: u16,
    /// Header names and values as received.
    pub headers: &'a [(String, String)],
    pub body: &'a str,
}

/// Check one response against the document: `Err` says what does not conform.
pub fn check(x: &Exchange<'_>) -> Result<(), String> {
    let doc = document();
    let path = x.target.split('?').next().unwrap_or("");
    let what = format!("{} {} → {}", x.method, path, x.status);
    let Some((template, item)) = path_item(doc, path) else {
        // Outside the API: the router's plain-text 404.
        return if x.status == 404 && media_type(x.headers).as_deref() == Some("text/plain") {
            Ok(())
        } else {
            Err(format!("{what}: the path is not in docs/openapi.yaml"))
        };
    };
    let Some(op) = item.get(x.method.to_ascii_lowercase()) else {
        // A documented path with a method it does not take: 405 naming the ones it does.
        let allowed = header(x.headers, "allow").unwrap_or_default();
        let documented: Vec<String> = ["get", "put", "post", "delete"]
            .into_iter()
            .filter(|m| item.get(*m).is_some())
            .map(str::to_ascii_uppercase)
            .collect();
        let listed: Vec<String> = allowed.split(',').map(|m| m.trim().to_string()).collect();
        return if x.status == 405 && documented.iter().all(|m| listed.contains(m)) {
            Ok(())
        } else {
            Err(format!(
                "{what}: {} is not documented for {template}; expected 405 with Allow: {} (got Allow: {allowed:?})",
                x.method,
                documented.join(", ")
            ))
        };
    };
    let op_id = op["operationId"].as_str().unwrap_or(template).to_string();
    let response = op["responses"]
        .get(x.status.to_string())
        .or_else(|| op["responses"].get("default"))
        .ok_or_else(|| format!("{what}: status {} is not documented for {op_id}", x.status))?;
    let response = resolve(doc, response)?;
    if let Some(headers) = response.get("headers").and_then(Value::as_object) {
        for (name, spec) in headers {
            let spec = resolve(doc, spec)?;
            let got = header(x.headers, name);
            if spec["required"].as_bool() == Some(true) && got.is_none() {
                return Err(format!("{what}: the documented header {name} is missing"));
            }
            if let Some(got) = got {
                let value = match spec["schema"]["type"].as_str() {
                    Some("integer") => {
                        got.trim().parse::<i64>().map(Value::from).map_err(|_| {
                            format!("{what}: header {name}: {got:?} is not an integer")
                        })?
                    }
                    _ => Value::String(got),
                };
                validate(doc, &spec["schema"], &value)
                    .map_err(|e| format!("{what}: header {name}: {e}"))?;
            }
        }
    }
    match response.get("content").and_then(Value::as_object) {
        None if x.body.is_empty() => {}
        None => return Err(format!("{what}: a body where the document has none")),
        Some(content) => {
            let mt = media_type(x.headers).ok_or_else(|| format!("{what}: no Content-Type"))?;
            let spec = content.get(&mt).ok_or_else(|| {
                format!(
                    "{what}: Content-Type {mt} is not documented (documented: {})",
                    content.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?;
            let value = if mt == "application/json" {
                serde_json::from_str(x.body)
                    .map_err(|e| format!("{what}: the body is not JSON ({e}): {}", x.body))?
            } else {
                Value::String(x.body.to_string())
            };
            if let Some(schema) = spec.get("schema") {
                validate(doc, schema, &value)
                    .map_err(|e| format!("{what}: {e}; body: {}", x.body))?;
            }
        }
    }
    if let Ok(mut seen) = SEEN.lock() {
        seen.insert((op_id, x.status));
    }
    Ok(())
}

/// The path item whose template matches `path` (a `{param}` matches one non-empty segment);
/// the one with the most literal segments wins.
fn path_item<'a>(doc: &'a Value, path: &str) -> Option<(&'a str, &'a Value)> {
    let segments: Vec<&str> = path.split('/').collect();
    doc["paths"]
        .as_object()?
        .iter()
        .filter_map(|(template, item)| {
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() {
                return None;
            }
            let mut literal = 0;
            for (p, s) in parts.iter().zip(&segments) {
                if p.starts_with('{') && p.ends_with('}') {
                    if s.is_empty() {
                        return None;
                    }
                } else if p == s {
                    literal += 1;
                } else {
                    return None;
                }
            }
            Some((literal, template.as_str(), item))
        })
        .max_by_key(|(literal, _, _)| *literal)
        .map(|(_, t, item)| (t, item))
}

/// Follow a `$ref` into `#/components/...`.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> Result<&'a Value, String> {
    match v.get("$ref").and_then(Value::as_str) {
        None => Ok(v),
        Some(r) => r
            .strip_prefix('#')
            .and_then(|pointer| doc.pointer(pointer))
            .ok_or_else(|| format!("docs/openapi.yaml: unresolved $ref {r}")),
    }
}

/// Validate `value` against `schema`, whose `$ref`s point into the document's components.
fn validate(doc: &Value, schema: &Value, value: &Value) -> Result<(), String> {
    let mut root = schema.clone();
    let Some(obj) = root.as_object_mut() else {
        return Err("docs/openapi.yaml: a schema that is not an object".into());
    };
    obj.insert("components".into(), doc["components"].clone());
    let validator = jsonschema::draft202012::new(&root)
        .map_err(|e| format!("docs/openapi.yaml: an invalid schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("at `{}`: {e}", e.instance_path))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "does not match docs/openapi.yaml: {}",
            errors.join("; ")
        ))
    }
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
}

/// The Content-Type without parameters, lower case.
fn media_type(headers: &[(String, String)]) -> Option<String> {
    header(headers, "content-type").map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    })
}

/// Split a raw HTTP/1.1 response head into (status, headers).
pub fn parse_head(head: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    (status, headers)
}

/// Check, and fail the calling test on a mismatch.
pub fn conform(x: &Exchange<'_>) {
    if let Err(e) = check(x) {
        panic!("admin response does not conform to docs/openapi.yaml: {e}");
    }
}
