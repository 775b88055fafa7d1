//! What a request on a terminated host says beyond its method and path, for rules that name a
//! protocol: JSON-RPC methods ([`jsonrpc`]), MCP tools, resources and prompts ([`mcp`]),
//! GraphQL operations ([`graphql`]) and Git LFS batch operations ([`lfs`]). Each reads the
//! request body (buffered by `intercept`, bounded) strictly — a body it cannot read is
//! refused, never passed ([`strict_json`]). Pure: matched per request, no I/O.

pub mod error;
pub mod form;
pub mod graphql;
pub mod inference;
mod inference_tools;
pub mod inference_usage;
pub mod json_skim;
pub mod json_tree;
pub mod jsonrpc;
pub mod lfs;
pub mod mcp;
pub mod plugin;
pub mod strict_json;
pub mod websocket;

pub use error::{ProtocolError, ProtocolErrorKind};

use crate::policy::reason::Reason;

/// The protocol a `network.http` rule names.
#[derive(Debug, Clone)]
pub enum Protocol {
    /// `protocol: mcp`: tools, resources, prompts, server requests.
    Mcp(std::sync::Arc<mcp::McpRule>),
    /// `protocol: graphql`: operations, names, root fields, persisted queries.
    GraphQl(graphql::GraphQlRule),
    /// `lfs:` on a git rule: the batch operations allowed.
    Lfs(Vec<lfs::LfsOp>),
    /// `protocol: websocket`: the upgrade on the rule's paths, and its messages.
    WebSocket(websocket::WsRule),
    /// `protocol: openai | anthropic | gemini`: an LLM provider's calls.
    Inference(std::sync::Arc<inference::InferenceRule>),
    /// A protocol that judges bodies only ([`plugin::BodyRule`]): `protocol: jsonrpc`, and
    /// (not written in rules) a POST form body read for a `_method` override ([`form`]).
    Plugin(std::sync::Arc<dyn plugin::BodyRule>),
}

/// The request as a protocol reads it (its body aside).
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// The request's method.
    pub method: &'a str,
    /// Its path.
    pub path: &'a str,
    /// Its query string, if any.
    pub query: Option<&'a str>,
    /// Its `Content-Type`, if any.
    pub content_type: Option<&'a str>,
    /// MCP's routing headers (`Mcp-Method`, `Mcp-Name`), when sent.
    pub mcp_method: Option<&'a str>,
    /// `Mcp-Name`, when sent.
    pub mcp_name: Option<&'a str>,
}

/// An allowed request: what it called (for the record), and for MCP the lists its
/// response must be filtered of.
#[derive(Debug, Clone, Default)]
pub struct BodyVerdict {
    /// What it called, for the record.
    pub call: Option<String>,
    /// For MCP: the lists its response must be filtered of, by request id.
    pub lists: mcp::Lists,
    /// For an inference rule: what the call asks for.
    pub inference: Option<Box<inference::Call>>,
}

/// A call a protocol rule refused: the [`Refusal`](crate::policy::refusal::Refusal), what it
/// called when known, and how to answer it (JSON-RPC clients are answered with JSON-RPC
/// errors for the ids they sent).
#[derive(Debug, Clone)]
pub struct RefusedCall {
    /// Why: the reason recorded and the sentence (boxed: a refusal is rare, and the `Err` of
    /// every judgement stays small).
    pub refusal: Box<crate::policy::refusal::Refusal>,
    /// What it called, when known.
    pub call: Option<String>,
    /// The ids of a JSON-RPC body's requests, and whether it was a batch (none: answer with
    /// the house refusal).
    pub rpc: Option<(Vec<serde_json::Value>, bool)>,
}

impl Protocol {
    /// A plug-in protocol's rule ([`plugin`]).
    pub fn plugin(rule: impl plugin::BodyRule + 'static) -> Self {
        Protocol::Plugin(std::sync::Arc::new(rule))
    }

    /// Whether the rule's `methods:` are the protocol's own, not HTTP methods.
    pub fn takes_methods(&self) -> bool {
        matches!(self, Protocol::Plugin(p) if p.takes_methods())
    }

    /// The name written in rules and records.
    pub fn name(&self) -> &'static str {
        match self {
            Protocol::Mcp(_) => "mcp",
            Protocol::GraphQl(_) => "graphql",
            Protocol::Lfs(_) => "lfs",
            Protocol::WebSocket(_) => "websocket",
            Protocol::Inference(r) => r.provider.name(),
            Protocol::Plugin(p) => p.name(),
        }
    }

    /// The rule as text, every part that decides included (the policy version hashes it).
    pub fn describe(&self) -> String {
        let part = |k: &str, v: Vec<String>| match v.is_empty() {
            true => String::new(),
            false => format!(" {k}:{}", v.join(",")),
        };
        match self {
            Protocol::Mcp(r) => {
                let tools: Vec<String> = r
                    .tools
                    .iter()
                    .map(|t| match t.arguments.is_empty() {
                        true => t.name.clone(),
                        false => format!("{}({:?})", t.name, t.arguments),
                    })
                    .collect();
                format!(
                    "protocol:mcp{}{}{}{}",
                    part("tools", tools),
                    part("resources", r.resources.clone()),
                    part("prompts", r.prompts.clone()),
                    part("server_requests", r.server_requests.clone())
                )
            }
            Protocol::GraphQl(r) => format!(
                "protocol:graphql{}{}{}{}",
                part(
                    "operations",
                    r.operations
                        .iter()
                        .map(|o| o.as_str().to_string())
                        .collect()
                ),
                part("names", r.names.clone()),
                part("fields", r.fields.clone()),
                part("persisted", r.persisted.clone())
            ),
            Protocol::Lfs(ops) => format!(
                "lfs:{}",
                ops.iter().map(|o| o.as_str()).collect::<Vec<_>>().join(",")
            ),
            Protocol::WebSocket(r) => r.describe(),
            Protocol::Inference(r) => r.describe(),
            Protocol::Plugin(p) => p.describe(),
        }
    }

    /// The reason a refusal of this protocol carries.
    pub fn reason(&self) -> Reason {
        match self {
            Protocol::Mcp(_) => Reason::McpNotAllowed,
            Protocol::GraphQl(_) => Reason::GraphQlNotAllowed,
            Protocol::Lfs(_) => Reason::GitNotAllowed,
            Protocol::WebSocket(_) => Reason::WebSocketNotAllowed,
            Protocol::Inference(_) => Reason::InferenceNotAllowed,
            Protocol::Plugin(p) => p.reason(),
        }
    }

    /// Whether an HTTP request with `method` can be one of this protocol's (the body still
    /// to be judged): JSON-RPC and LFS POST; MCP POST, GET (the server's event stream) and
    /// DELETE (the session's end); GraphQL POST and GET.
    pub fn carries(&self, method: &str) -> bool {
        let m = |x: &str| method.eq_ignore_ascii_case(x);
        match self {
            Protocol::Lfs(_) => m("POST"),
            Protocol::Mcp(_) => m("POST") || m("GET") || m("DELETE"),
            Protocol::GraphQl(_) => m("POST") || m("GET"),
            Protocol::WebSocket(_) => m("GET"),
            Protocol::Inference(_) => m("POST") || m("GET") || m("DELETE"),
            Protocol::Plugin(p) => p.carries(method),
        }
    }

    /// Judge a request and its body; the call recorded names the protocol first
    /// (`mcp tools/call search`, `graphql mutation createGist`, `lfs upload`).
    pub fn judge(&self, asked: Asked<'_>, body: &[u8]) -> Result<BodyVerdict, RefusedCall> {
        let named = |c: Option<String>| {
            c.map(|mut c| {
                // Not `format!` (its machinery was a tenth of judging an MCP call), and in
                // place: no second string where the first has room.
                c.insert(0, ' ');
                c.insert_str(0, self.name());
                c
            })
        };
        match self.judge_body(asked, body) {
            Ok(j) => Ok(BodyVerdict {
                call: named(j.call),
                ..j
            }),
            Err(r) => Err(RefusedCall {
                call: named(r.call),
                ..r
            }),
        }
    }

    fn judge_body(&self, asked: Asked<'_>, body: &[u8]) -> Result<BodyVerdict, RefusedCall> {
        let refuse = |detail: String, call: Option<String>, rpc| RefusedCall {
            refusal: Box::new(crate::policy::refusal::Refusal::new(self.reason(), detail)),
            call,
            rpc,
        };
        let json = |what: &str| match json_media(asked.content_type) {
            true => Ok(()),
            false => Err(refuse(media_refusal(asked.content_type, what), None, None)),
        };
        match self {
            Protocol::Mcp(rule) => {
                if !asked.method.eq_ignore_ascii_case("POST") {
                    return Ok(called(format!("{} session", asked.method.to_ascii_uppercase())));
                }
                json("an MCP")?;
                let b = jsonrpc::parse(body).map_err(|e| refuse(e.into_detail(), None, None))?;
                mcp::McpRule::headers_agree(&b, asked.mcp_method, asked.mcp_name)
                    .map_err(|e| refuse(e.into_detail(), None, Some(ids(&b))))?;
                match rule.judge(&b) {
                    Ok((calls, lists)) => Ok(BodyVerdict {
                        call: Some(calls),
                        lists,
                        inference: None,
                    }),
                    Err((why, call)) => Err(refuse(why, call, Some(ids(&b)))),
                }
            }
            Protocol::GraphQl(rule) => rule
                .judge(asked.method, asked.query, asked.content_type, body)
                .map(called)
                .map_err(|(why, call)| refuse(why, call, None)),
            Protocol::Lfs(ops) => json("an LFS")
                .and_then(|()| lfs::judge(ops, body).map_err(|(why, call)| refuse(why, call, None)))
                .map(called),
            // Its messages are judged on the socket, never a body.
            Protocol::WebSocket(_) => Err(refuse(
                "a `protocol: websocket` rule allows the upgrade to a WebSocket, not a request with a body".into(),
                None,
                None,
            )),
            Protocol::Inference(rule) => rule
                .judge(asked.method, asked.path, asked.content_type, body)
                .map(|c| BodyVerdict {
                    call: Some(c.describe()),
                    inference: Some(Box::new(c)),
                    ..BodyVerdict::default()
                })
                .map_err(|e| refuse(e.into_detail(), None, None)),
            Protocol::Plugin(p) => p.judge(asked, body),
        }
    }
}

/// An allowed request that called `call`.
fn called(call: String) -> BodyVerdict {
    BodyVerdict {
        call: Some(call),
        ..BodyVerdict::default()
    }
}

/// Whether `content_type` is JSON as every origin reads it: `application/json` or
/// `application/…+json`, with no parameter but `charset=utf-8`. Anything else (a form,
/// multipart, text, another charset, no type at all) could be read by the origin as something
/// other than the JSON judged, so a rule that reads JSON refuses it rather than guess.
pub fn json_media(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return false;
    };
    if ct == "application/json" {
        // As nearly every client writes it: the rest is not read.
        return true;
    }
    let mut parts = ct.split(';');
    let media = parts.next().unwrap_or("").trim();
    let prefix = "application/".len();
    let sub = media
        .get(..prefix)
        .filter(|k| k.eq_ignore_ascii_case("application/"))
        .and_then(|_| media.get(prefix..))
        .unwrap_or("");
    let suffix = sub.len().saturating_sub("+json".len());
    let json = sub.eq_ignore_ascii_case("json")
        || (sub.len() > 5
            && sub
                .get(suffix..)
                .is_some_and(|s| s.eq_ignore_ascii_case("+json"))
            && !sub.contains('/'));
    json && parts.all(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let v = v.trim().trim_matches('"');
        k.trim().eq_ignore_ascii_case("charset") && v.eq_ignore_ascii_case("utf-8")
    })
}

/// The refusal's words for a body of `what` (`a JSON-RPC`) whose media type is not JSON.
pub fn media_refusal(content_type: Option<&str>, what: &str) -> String {
    let shown: String = content_type
        .unwrap_or("none")
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    format!(
        "{what} body is read as JSON only when its Content-Type says so (application/json, charset utf-8 at most); `{shown}` could be read by the origin as something else: refused, never guessed"
    )
}

/// The ids of a JSON-RPC body's requests, and whether it was a batch.
fn ids(b: &jsonrpc::Body<'_>) -> (Vec<serde_json::Value>, bool) {
    let ids = b
        .messages
        .iter()
        .filter(|m| m.method().is_some())
        .filter_map(|m| m.id().map(json_tree::Json::to_value))
        .collect();
    (ids, b.batch)
}

/// A set of name globs (`*` any run of characters); `what` names them in errors.
pub(crate) fn names(globs: &[String], what: &str) -> Result<globset::GlobSet, ProtocolError> {
    let mut b = globset::GlobSetBuilder::new();
    for g in globs {
        b.add(
            globset::Glob::new(g)
                .map_err(|e| ProtocolError::rule_caused(format_args!("{what} `{g}`"), e))?,
        );
    }
    b.build().map_err(ProtocolError::rule_of)
}

#[cfg(test)]
mod tests {
    use super::json_media;

    #[test]
    fn json_is_read_only_where_the_media_type_says_json_in_utf_8() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
            "application/vnd.git-lfs+json",
        ] {
            assert!(json_media(Some(yes)), "{yes}");
        }
        for no in [
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/plain",
            "application/json; charset=utf-16",
            "application/json; boundary=x",
            "application/+json",
            "text/json",
            "\u{0}",
            "applicatio\u{e9}/json",
            "application/x\u{e9}json",
            "application/json\u{e9}",
        ] {
            assert!(!json_media(Some(no)), "{no}");
        }
        assert!(!json_media(None));
    }
}
