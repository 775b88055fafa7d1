//! The tools an inference call asks for, read for what the provider would reach on the
//! sandbox's behalf: provider-run web search and fetch with their domains, remote MCP servers
//! (OpenAI's `type: mcp`, Anthropic's `mcp_servers`) with their hosts, and the tool types the
//! reader does not know — refused unless the rule names them (`tool_types`), so a new
//! network-reaching tool fails closed.

use serde_json::Value;

use super::inference::WebTool;
use super::ProtocolError;

/// Tool types the providers run without reaching the network for the call (code in their
/// own sandboxes, files the account uploaded, image generation), or that the client runs
/// (functions, shell, editor, computer use): nothing of the sandbox's policy to bound.
const LOCAL_TOOL_TYPES: [&str; 12] = [
    "function",
    "custom",
    "file_search",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "computer_use_preview",
    "computer_use",
    "tool_search",
    "mcp_toolset",
];

/// Anthropic's versioned tool types the client (or the provider, without network) runs.
const LOCAL_TOOL_PREFIXES: [&str; 5] = [
    "bash_",
    "text_editor_",
    "computer_",
    "code_execution_",
    "memory_",
];

/// Gemini's tool keys that run without the network for the call.
const LOCAL_GEMINI_KEYS: [&str; 5] = [
    "functionDeclarations",
    "function_declarations",
    "codeExecution",
    "code_execution",
    "computerUse",
];

/// The provider-run tools that reach the network, and the tool types the reader does not
/// know. Network: Anthropic's `web_search_*` / `web_fetch_*`, OpenAI's `web_search` /
/// `web_search_preview` (domains under `filters`) and `web_search_options`, Gemini's
/// `google_search` / `url_context`, OpenAI's remote MCP tool (`type: mcp`, its
/// `server_url`'s host) and Anthropic's MCP connector (`mcp_servers`, each `url`'s host) —
/// the provider connects wherever the call names (security review L02c, L02d).
pub(super) fn web_tools(
    o: &serde_json::Map<String, Value>,
) -> Result<(Vec<WebTool>, Vec<String>), ProtocolError> {
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    if o.contains_key("web_search_options") {
        out.push(WebTool {
            name: "web_search_options".into(),
            allowed: None,
            exact: false,
        });
    }
    if let Some(servers) = o.get("mcp_servers") {
        let Value::Array(servers) = servers else {
            return Err(ProtocolError::malformed("`mcp_servers` is not a list"));
        };
        for s in servers {
            out.push(mcp_server("mcp_servers", s.get("url"))?);
        }
    }
    let Some(tools) = o.get("tools") else {
        return Ok((out, unknown));
    };
    let Value::Array(tools) = tools else {
        return Err(ProtocolError::malformed("`tools` is not a list"));
    };
    for t in tools {
        let Value::Object(t) = t else {
            return Err(ProtocolError::malformed(
                "an entry of `tools` is not an object",
            ));
        };
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        let gemini = [
            "google_search",
            "googleSearch",
            "google_search_retrieval",
            "googleSearchRetrieval",
            "url_context",
            "urlContext",
        ]
        .into_iter()
        .find(|k| t.contains_key(*k));
        if kind == "mcp" {
            out.push(mcp_server("mcp", t.get("server_url"))?);
            continue;
        }
        let name = if kind.starts_with("web_search") || kind.starts_with("web_fetch") {
            kind.to_string()
        } else if let Some(g) = gemini {
            g.to_string()
        } else {
            if !local(kind, t) {
                let named = match kind.is_empty() {
                    true => t.keys().next().cloned().unwrap_or_default(),
                    false => kind.to_string(),
                };
                unknown.push(named);
            }
            continue;
        };
        out.push(WebTool {
            allowed: allowed_domains(&name, t)?,
            name,
            exact: false,
        });
    }
    Ok((out, unknown))
}

/// Whether a tool of type `kind` runs without the provider reaching the network for it.
fn local(kind: &str, t: &serde_json::Map<String, Value>) -> bool {
    LOCAL_TOOL_TYPES.contains(&kind)
        || LOCAL_TOOL_PREFIXES.iter().any(|p| kind.starts_with(p))
        // Anthropic's own tools carry no type; Gemini's are keyed by kind.
        || (kind.is_empty() && (t.contains_key("input_schema") || t.contains_key("name")))
        || (kind.is_empty() && LOCAL_GEMINI_KEYS.iter().any(|k| t.contains_key(*k)))
}

/// A web tool's `allowed_domains` (OpenAI's under `filters`; `None`: the whole web).
fn allowed_domains(
    name: &str,
    t: &serde_json::Map<String, Value>,
) -> Result<Option<Vec<String>>, ProtocolError> {
    let domains = t
        .get("allowed_domains")
        .or_else(|| t.get("filters").and_then(|f| f.get("allowed_domains")));
    Ok(match domains {
        None | Some(Value::Null) => None,
        Some(Value::Array(d)) => Some(
            d.iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ProtocolError::malformed(format!(
                        "`{name}` allowed_domains is not a list of names"
                    ))
                })?,
        ),
        Some(_) => {
            return Err(ProtocolError::malformed(format!(
                "`{name}` allowed_domains is not a list"
            )))
        }
    })
}

/// A remote MCP server the provider would connect to: the host of its URL (a URL without
/// one bounds nothing: the whole web).
fn mcp_server(name: &str, url: Option<&Value>) -> Result<WebTool, ProtocolError> {
    let url = match url {
        Some(Value::String(u)) => u,
        _ => {
            return Err(ProtocolError::malformed(format!(
                "`{name}` names no server URL"
            )))
        }
    };
    let host = url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()));
    Ok(WebTool {
        name: name.to_string(),
        allowed: host.map(|h| vec![h]),
        exact: true,
    })
}
