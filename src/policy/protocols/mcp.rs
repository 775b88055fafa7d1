//! `protocol: mcp`: what a Model Context Protocol client may ask of a server, and what the
//! server may show and ask of it. Requests: `tools/call` only for the rule's tools (with
//! optional argument matchers), `resources/read` and `resources/(un)subscribe` only for its
//! resources, `prompts/get` only for its prompts; the session's own methods (`initialize`,
//! `ping`, the lists, `completion/complete`, `logging/setLevel`, notifications) always; any
//! other method is refused. Answers to the server's requests are refused unless the rule
//! allows some (`server_requests`). Responses: the lists are filtered to what the rule allows,
//! and requests the server sends (sampling, elicitation, roots) are dropped unless allowed.

use std::borrow::Cow;

use serde_json::Value;

use super::json_tree::Json;
use super::jsonrpc::{Body, Message};
use super::{names, ProtocolError};

/// A matcher on one argument of a tool call.
#[derive(Debug, Clone)]
pub enum ArgMatch {
    /// The argument is this value.
    Equals(Value),
    /// The argument is one of these values.
    OneOf(Vec<Value>),
    /// The argument is a string matching this glob (as written, compiled).
    Glob(String, globset::GlobMatcher),
}

impl ArgMatch {
    /// A matcher for string arguments matching `pattern`.
    pub fn glob(pattern: &str) -> Result<ArgMatch, ProtocolError> {
        let g = globset::Glob::new(pattern)
            .map_err(|e| ProtocolError::rule_caused(format_args!("glob `{pattern}`"), e))?;
        Ok(ArgMatch::Glob(pattern.to_string(), g.compile_matcher()))
    }

    fn matches(&self, v: &Json<'_>) -> bool {
        match self {
            ArgMatch::Equals(want) => v == want,
            ArgMatch::OneOf(any) => any.iter().any(|w| v == w),
            ArgMatch::Glob(_, g) => v.as_str().is_some_and(|s| g.is_match(s)),
        }
    }
}

/// One entry of `tools:`: a name glob and matchers on named arguments (each must be present
/// and match).
#[derive(Debug, Clone)]
pub struct ToolRule {
    /// The tool name glob, as written.
    pub name: String,
    glob: globset::GlobMatcher,
    /// The name has no glob syntax: compared as a string (the same answer, without the
    /// matcher's per-call work).
    literal: bool,
    /// Matchers on named arguments; each must be present and match.
    pub arguments: Vec<(String, ArgMatch)>,
}

impl ToolRule {
    /// A tool rule for names matching `name` with these argument matchers.
    pub fn new(name: &str, arguments: Vec<(String, ArgMatch)>) -> Result<ToolRule, ProtocolError> {
        let glob = globset::Glob::new(name)
            .map_err(|e| ProtocolError::rule_caused(format_args!("tool `{name}`"), e))?
            .compile_matcher();
        Ok(ToolRule {
            name: name.to_string(),
            glob,
            literal: !name.contains(['*', '?', '[', ']', '{', '}', '\\']),
            arguments,
        })
    }

    /// Whether a tool called `name` is one this entry names.
    fn names(&self, name: &str) -> bool {
        match self.literal {
            true => self.name == name,
            false => self.glob.is_match(name),
        }
    }
}

/// What a request asked for: a list (its response is filtered) or anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    /// `tools/list`.
    Tools,
    /// `resources/list`.
    Resources,
    /// `prompts/list`.
    Prompts,
    /// Anything else.
    Other,
}

mod lists;
pub use lists::Lists;

/// One request the client sent: what it asked for, and whether its answer has come (the
/// response filter marks it; a stream cut short answers the rest with errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// What the request asked for.
    pub list: List,
    /// Its answer has passed.
    pub answered: bool,
}

/// What the rule made of one response message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filtered {
    /// Passed as it came.
    Kept,
    /// Entries of a list were hidden (how many).
    Hid(usize),
    /// A request of the server's was dropped (its method).
    Dropped(String),
    /// A result that asked the client for input the rule does not allow (SEP-2322
    /// `inputRequests`) was replaced by an error (the method asked for).
    Answered(String),
}

/// A `protocol: mcp` rule.
#[derive(Debug, Clone)]
pub struct McpRule {
    /// The tools a `tools/call` may name.
    pub tools: Vec<ToolRule>,
    /// The resource URI globs a read or subscription may name.
    pub resources: Vec<String>,
    /// The prompt name globs `prompts/get` may name.
    pub prompts: Vec<String>,
    /// The methods the server may ask of the client (sampling, elicitation, …).
    pub server_requests: Vec<String>,
    resource_set: globset::GlobSet,
    prompt_set: globset::GlobSet,
    server_set: globset::GlobSet,
}

/// Methods every MCP session needs, allowed under any `protocol: mcp` rule.
const SESSION: &[&str] = &[
    "initialize",
    "server/discover",
    "subscriptions/listen",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
    "ping",
    "tools/list",
    "resources/list",
    "resources/templates/list",
    "prompts/list",
    "completion/complete",
    "logging/setLevel",
];

impl McpRule {
    /// A rule from its lists; `Err` when a glob does not compile.
    pub fn new(
        tools: Vec<ToolRule>,
        resources: &[String],
        prompts: &[String],
        server_requests: &[String],
    ) -> Result<McpRule, ProtocolError> {
        let mut uris = globset::GlobSetBuilder::new();
        for r in resources {
            let g = globset::GlobBuilder::new(r)
                .literal_separator(true)
                .build()
                .map_err(|e| ProtocolError::rule_caused(format_args!("resource `{r}`"), e))?;
            uris.add(g);
        }
        Ok(McpRule {
            tools,
            resources: resources.to_vec(),
            prompts: prompts.to_vec(),
            server_requests: server_requests.to_vec(),
            resource_set: uris.build().map_err(ProtocolError::rule_of)?,
            prompt_set: names(prompts, "prompt")?,
            server_set: names(server_requests, "server request")?,
        })
    }

    fn tool_allowed<'p>(&self, params: &'p Json<'_>) -> Result<&'p str, ProtocolError> {
        let Some(name) = params.get("name").and_then(Json::as_str) else {
            return Err(ProtocolError::malformed("a tools/call without a tool name"));
        };
        let args = params.get("arguments");
        let mut named = false;
        for t in self.tools.iter().filter(|t| t.names(name)) {
            named = true;
            let fits = t
                .arguments
                .iter()
                .all(|(arg, m)| args.and_then(|a| a.get(arg)).is_some_and(|v| m.matches(v)));
            if fits {
                return Ok(name);
            }
        }
        Err(ProtocolError::not_allowed(match named {
            true => format!("the arguments of tool `{name}` are not ones the rule allows"),
            false => format!("the tool `{name}` is not in the rule's tools"),
        }))
    }

    fn uri_allowed<'p>(
        &self,
        params: &'p Json<'_>,
        method: &str,
    ) -> Result<&'p str, ProtocolError> {
        let Some(uri) = params.get("uri").and_then(Json::as_str) else {
            return Err(ProtocolError::malformed(format!(
                "a {method} without a uri"
            )));
        };
        if let Err(why) = canonical_uri(uri) {
            return Err(ProtocolError::not_allowed(format!(
                "the resource uri `{}` is not canonical ({why}): the server could read it as another resource",
                uri.escape_debug()
            )));
        }
        match self.resource_set.is_match(uri) {
            true => Ok(uri),
            false => Err(ProtocolError::not_allowed(format!(
                "the resource `{uri}` is not in the rule's resources"
            ))),
        }
    }

    /// One client message: `Ok` with what it was for the record (its method, and the tool,
    /// resource or prompt it names), or why it is refused.
    fn judge_one<'m>(
        &self,
        m: &'m Message<'_>,
        lists: &mut Lists,
    ) -> Result<(&'m str, Option<&'m str>), ProtocolError> {
        let Some(method) = m.method() else {
            return match self.server_requests.is_empty() {
                true => Err(ProtocolError::not_allowed(
                    "an answer to a server request, and the rule allows none (server_requests)",
                )),
                false => Ok(("answer", None)),
            };
        };
        let params = m.params();
        if params.get("inputResponses").is_some() && self.server_requests.is_empty() {
            return Err(ProtocolError::not_allowed(
                "answers to a server's input requests, and the rule allows none (server_requests)",
            ));
        }
        let list = match method {
            "tools/list" => Some(List::Tools),
            "resources/list" => Some(List::Resources),
            "prompts/list" => Some(List::Prompts),
            _ => None,
        };
        if let Some(id) = m.id() {
            lists.ask(id, list.unwrap_or(List::Other));
        }
        match method {
            "tools/call" => Ok((method, Some(self.tool_allowed(params)?))),
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                Ok((method, Some(self.uri_allowed(params, method)?)))
            }
            "prompts/get" => {
                let name = params.get("name").and_then(Json::as_str).unwrap_or("");
                match self.prompt_set.is_match(name) && !name.is_empty() {
                    true => Ok((method, Some(name))),
                    false => Err(ProtocolError::not_allowed(format!(
                        "the prompt `{name}` is not in the rule's prompts"
                    ))),
                }
            }
            m if SESSION.contains(&m) || m.starts_with("notifications/") => Ok((m, None)),
            m => Err(ProtocolError::not_allowed(format!(
                "the MCP method `{m}` is not one a rule allows"
            ))),
        }
    }

    /// Judge a client's body: every message must be allowed (a batch with one refused call
    /// is refused whole). `Ok`: what was called (`tools/call search`, comma-separated for a
    /// batch), and the lists asked for.
    pub fn judge(&self, body: &Body<'_>) -> Result<(String, Lists), (String, Option<String>)> {
        let mut lists = Lists::new();
        let mut calls = String::new();
        for m in &body.messages {
            match self.judge_one(m, &mut lists) {
                Ok((method, named)) => {
                    // Room for a comma, a space and the protocol's name written in front
                    // (`Protocol::judge`): one allocation for one message.
                    calls.reserve(6 + method.len() + named.map_or(0, str::len));
                    if !calls.is_empty() {
                        calls.push(',');
                    }
                    calls.push_str(method);
                    if let Some(n) = named {
                        calls.push(' ');
                        calls.push_str(n);
                    }
                }
                Err(why) => {
                    let call = m.method().map(|meth| {
                        let named =
                            |k: &str| m.params().get(k).and_then(Json::as_str).unwrap_or("");
                        match meth {
                            "tools/call" | "prompts/get" => format!("{meth} {}", named("name")),
                            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                                format!("{meth} {}", named("uri"))
                            }
                            _ => meth.to_string(),
                        }
                    });
                    return Err((why.into_detail(), call));
                }
            }
        }
        Ok((calls, lists))
    }

    /// The first method a result's `inputRequests` asks for that the rule does not allow.
    fn input_refused(&self, msg: &Json<'_>) -> Option<String> {
        let asked = msg.get("result")?.get("inputRequests")?;
        let Json::Obj(requests) = asked else {
            return Some("input in a shape this proxy cannot read".into());
        };
        requests.iter().find_map(|(_, r)| {
            let m = r.get("method").and_then(Json::as_str).unwrap_or("");
            (m.is_empty() || !self.server_set.is_match(m)).then(|| m.to_string())
        })
    }

    /// Whether the routing headers of the 2026 transport (`Mcp-Method`, `Mcp-Name`) say
    /// what the body says: a server or gateway that routes by them must not be sent another
    /// call than the one judged. `Err` names the difference.
    pub fn headers_agree(
        body: &Body<'_>,
        method: Option<&str>,
        name: Option<&str>,
    ) -> Result<(), ProtocolError> {
        if method.is_none() && name.is_none() {
            return Ok(());
        }
        let [one] = &body.messages[..] else {
            return Err(ProtocolError::not_allowed(
                "Mcp-Method or Mcp-Name headers on a batch",
            ));
        };
        if method.is_some_and(|h| Some(h) != one.method()) {
            return Err(ProtocolError::not_allowed(
                "the Mcp-Method header names another method than the body",
            ));
        }
        if let Some(h) = name {
            let field = match one.method() {
                Some("resources/read") => "uri",
                _ => "name",
            };
            if Some(h) != one.params().get(field).and_then(Json::as_str) {
                return Err(ProtocolError::not_allowed(
                    "the Mcp-Name header names another tool, prompt or resource than the body",
                ));
            }
        }
        Ok(())
    }

    /// Filter one message the server sent (see the module's documentation).
    pub fn filter(&self, msg: &mut Json<'_>, lists: &Lists) -> Filtered {
        let method = msg.get("method").and_then(Json::as_str).map(str::to_string);
        if let Some(method) = method {
            let is_request = msg.get("id").is_some();
            if !is_request || method == "ping" || self.server_set.is_match(&method) {
                return Filtered::Kept;
            }
            return Filtered::Dropped(method);
        }
        if let Some(asked) = self.input_refused(msg) {
            let text = format!("egress-proxy: the server asked the client for {asked}, which the rule does not allow (server_requests)");
            msg.remove("result");
            msg.set(
                "error",
                Json::Obj(vec![
                    (Cow::Borrowed("code"), Json::Num((-32001).into())),
                    (Cow::Borrowed("message"), Json::Str(Cow::Owned(text))),
                ]),
            );
            return Filtered::Answered(asked);
        }
        let Some(list) = msg.get("id").and_then(|id| lists.get(id).map(|a| a.list)) else {
            return Filtered::Kept;
        };
        let (key, field) = match list {
            List::Tools => ("tools", "name"),
            List::Resources => ("resources", "uri"),
            List::Prompts => ("prompts", "name"),
            List::Other => return Filtered::Kept,
        };
        let Some(Json::Arr(items)) = msg.get_mut("result").and_then(|r| r.get_mut(key)) else {
            return Filtered::Kept;
        };
        let before = items.len();
        items.retain(|item| {
            let name = item.get(field).and_then(Json::as_str).unwrap_or("");
            match list {
                List::Tools => self.tools.iter().any(|t| t.names(name)),
                List::Resources => self.resource_set.is_match(name),
                List::Prompts => self.prompt_set.is_match(name),
                List::Other => true,
            }
        });
        match before - items.len() {
            0 => Filtered::Kept,
            n => Filtered::Hid(n),
        }
    }
}

/// Why a resource URI could name another resource to the server than the one a glob matched
/// (as [`crate::policy::http_rules::canonical_path`] for HTTP paths): a control byte or a
/// backslash anywhere; in its path (after `scheme:` and any `//authority`), a `.` or `..`
/// segment or a percent-encoded `.`, `/`, `\` or control byte. Servers that resolve URIs
/// (pydantic's `AnyUrl`, file-backed resources) would read `file:///docs/../secret` as
/// `file:///secret`.
pub fn canonical_uri(uri: &str) -> Result<(), &'static str> {
    if uri.bytes().any(|b| b < 0x20 || b == 0x7f || b == b'\\') {
        return Err("a control byte or a backslash");
    }
    let rest = uri.split_once(':').map_or(uri, |(_, r)| r);
    let rest = match rest.strip_prefix("//") {
        Some(r) => r.find('/').map_or("", |i| &r[i..]),
        None => rest,
    };
    let path = rest.split(['?', '#']).next().unwrap_or("");
    if path.is_empty() {
        return Ok(());
    }
    match path.starts_with('/') {
        true => crate::policy::http_rules::canonical_path(path),
        false => crate::policy::http_rules::canonical_path(&format!("/{path}")),
    }
}

#[cfg(test)]
mod tests;
