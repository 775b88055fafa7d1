//! `network.http[]` as written, and how each entry becomes rules: an ordinary rule (host,
//! methods, paths), a git rule (`git`, `lfs`), a protocol rule (`protocol: mcp | jsonrpc |
//! graphql` with its lists), or `preset: NAME`, which [`super::presets`] expands into
//! ordinary rules (and the egress entries they need) before anything is compiled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::http_rules::HttpRule;
use crate::policy::protocols::graphql::GraphQlRule;
use crate::policy::protocols::inference::{InferenceRule, Provider, WebTools};
use crate::policy::protocols::jsonrpc::MethodRule;
use crate::policy::protocols::lfs::LfsOp;
use crate::policy::protocols::mcp::{ArgMatch, McpRule, ToolRule};
use crate::policy::protocols::websocket::{MessageRule, WsRule, DEFAULT_MAX_MESSAGE};
use crate::policy::protocols::{Protocol, ProtocolError};

/// `network.http[]` as written.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawHttpRule {
    /// `preset: NAME`: this entry stands for the preset's rules (and nothing else is written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// `host`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// HTTP methods; with `protocol: jsonrpc`, the JSON-RPC methods (globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// `paths` (globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// `[fetch, push]`: git's smart HTTP for these services only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub git: Vec<String>,
    /// `[download, upload]`: Git LFS batch operations on the repositories `paths` name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lfs: Vec<String>,
    /// `mcp`, `jsonrpc` or `graphql`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// MCP: tool names (globs), each optionally with argument matchers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<RawTool>,
    /// MCP: resource URIs (globs, `**` across `/`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// MCP: prompt names (globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompts: Vec<String>,
    /// MCP: requests the server may send the client (`sampling/createMessage`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_requests: Vec<String>,
    /// GraphQL: `query`, `mutation`, `subscription`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<String>,
    /// GraphQL: operation names (globs); an anonymous operation is then refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// GraphQL: root fields (globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// GraphQL: persisted-query hashes and document ids allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub persisted: Vec<String>,
    /// WebSocket: what the sandbox's messages may say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Box<RawMessages>>,
    /// WebSocket: what the origin's messages may say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_messages: Option<Box<RawMessages>>,
    /// WebSocket: `allow` or `refuse` binary messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
    /// WebSocket: the largest message (and fragment series), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    /// Inference (`protocol: openai | anthropic | gemini`): the models allowed (globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Inference: provider-run web tools — `policy` (bounded by the sandbox's egress,
    /// the default), `refuse` or `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_tools: Option<String>,
    /// Inference: tool `type`s that do not reach the network, beyond those the proxy knows
    /// (another unknown type is refused unless `web_tools: allow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_types: Vec<String>,
    /// The rule is for these executables only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binaries: Vec<String>,
    /// The rule is for these vouched commands only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execs: Vec<String>,
    /// With `binaries`: for whatever they start too (an ancestor's executable counts).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub children: bool,
}

/// `messages:` / `server_messages:` of a `protocol: websocket` rule: exactly one reader.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawMessages {
    /// JSON-RPC messages: `{ methods: [...] }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonrpc: Option<RawHttpRule>,
    /// MCP messages: `{ tools, resources, prompts, server_requests }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<RawHttpRule>,
    /// GraphQL over WebSocket: `{ operations, names, fields, persisted }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphql: Option<RawHttpRule>,
    /// Text patterns (globs on the whole message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub text: Vec<String>,
}

impl RawMessages {
    fn compile(&self, key: &str) -> Result<MessageRule, String> {
        let readers = [
            ("jsonrpc", self.jsonrpc.as_ref()),
            ("mcp", self.mcp.as_ref()),
            ("graphql", self.graphql.as_ref()),
        ];
        let mut written = readers.iter().filter(|(_, r)| r.is_some());
        let reader = written.next();
        let text = !self.text.is_empty();
        if written.next().is_some() || (reader.is_some() && text) {
            return Err(format!(
                "`{key}` names exactly one of jsonrpc, mcp, graphql, text"
            ));
        }
        let Some((name, Some(lists))) = reader else {
            return match text {
                true => MessageRule::text(&self.text).map_err(ProtocolError::into_detail),
                false => Err(format!("`{key}` names one of jsonrpc, mcp, graphql, text")),
            };
        };
        let nested = RawHttpRule {
            protocol: Some((*name).to_string()),
            ..(*lists).clone()
        };
        if nested
            != (RawHttpRule {
                host: String::new(),
                paths: Vec::new(),
                git: Vec::new(),
                preset: None,
                ..nested.clone()
            })
            || nested.ws_keys_written()
            || lists.protocol.is_some()
        {
            return Err(format!("`{key}.{name}` names the protocol's lists only"));
        }
        match nested.protocol()? {
            Some(p) => Ok(MessageRule::Protocol(std::sync::Arc::new(p))),
            None => Err(format!("`{key}.{name}` names no lists")),
        }
    }
}

/// One entry of `tools:`: a name, or a name with argument matchers.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum RawTool {
    /// A tool name glob.
    Name(String),
    /// A tool name glob with argument matchers.
    Matched {
        /// The name glob.
        name: String,
        /// Matchers by argument name.
        #[serde(default)]
        arguments: BTreeMap<String, RawArg>,
    },
}

/// A matcher on one argument: exactly one of `equals`, `one_of`, `glob`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawArg {
    /// The argument is this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// The argument is one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
    /// The argument matches this glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
}

impl RawArg {
    fn compile(&self, name: &str) -> Result<ArgMatch, ProtocolError> {
        match (&self.equals, &self.one_of, &self.glob) {
            (Some(v), None, None) => Ok(ArgMatch::Equals(v.clone())),
            (None, Some(vs), None) => Ok(ArgMatch::OneOf(vs.clone())),
            (None, None, Some(g)) => ArgMatch::glob(g),
            _ => Err(ProtocolError::rule(format!(
                "argument `{name}`: write exactly one of equals, one_of, glob"
            ))),
        }
    }
}

impl RawHttpRule {
    /// Whether any of the WebSocket keys is written.
    fn ws_keys_written(&self) -> bool {
        self.messages.is_some()
            || self.server_messages.is_some()
            || self.binary.is_some()
            || self.max_message_bytes.is_some()
    }

    /// `protocol: websocket`: its message rules, binary policy and size cap.
    fn websocket(&self) -> Result<WsRule, String> {
        let side =
            |k: &str, m: &Option<Box<RawMessages>>| m.as_ref().map(|m| m.compile(k)).transpose();
        let binary = match self.binary.as_deref() {
            None => None,
            Some("allow") => Some(true),
            Some("refuse") => Some(false),
            Some(other) => return Err(format!("binary: `{other}` is not allow or refuse")),
        };
        let max_message = match self.max_message_bytes {
            None => DEFAULT_MAX_MESSAGE,
            Some(n) if (1..=(64 << 20)).contains(&n) => n as usize,
            Some(n) => {
                return Err(format!(
                    "max_message_bytes: {n} is not between 1 and 64 MiB"
                ))
            }
        };
        Ok(WsRule {
            sent: side("messages", &self.messages)?,
            received: side("server_messages", &self.server_messages)?,
            binary,
            max_message,
        })
    }

    /// Whether any of the protocol keys is written.
    fn names_protocol_lists(&self) -> bool {
        !(self.tools.is_empty()
            && self.resources.is_empty()
            && self.prompts.is_empty()
            && self.server_requests.is_empty()
            && self.operations.is_empty()
            && self.names.is_empty()
            && self.fields.is_empty()
            && self.persisted.is_empty())
    }

    /// Of the protocol lists, only `allowed` may be written with `protocol: name`.
    fn only(&self, name: &str, allowed: &[&str]) -> Result<(), String> {
        let written = [
            ("tools", self.tools.is_empty()),
            ("resources", self.resources.is_empty()),
            ("prompts", self.prompts.is_empty()),
            ("server_requests", self.server_requests.is_empty()),
            ("operations", self.operations.is_empty()),
            ("names", self.names.is_empty()),
            ("fields", self.fields.is_empty()),
            ("persisted", self.persisted.is_empty()),
        ];
        match written
            .iter()
            .find(|(k, empty)| !empty && !allowed.contains(k))
        {
            Some((k, _)) => Err(format!("`{k}` does not go with protocol: {name}")),
            None => Ok(()),
        }
    }

    fn protocol(&self) -> Result<Option<Protocol>, String> {
        let lfs = |r: &Self| -> Result<Vec<LfsOp>, String> {
            r.lfs
                .iter()
                .map(|o| LfsOp::parse(o).map_err(|e| e.into_detail()))
                .collect()
        };
        let Some(name) = self.protocol.as_deref() else {
            if self.names_protocol_lists() {
                return Err("tools, resources, prompts, server_requests, operations, names, fields and persisted need a `protocol`".into());
            }
            return Ok((!self.lfs.is_empty())
                .then(|| lfs(self))
                .transpose()?
                .map(Protocol::Lfs));
        };
        if !self.lfs.is_empty() {
            return Err("lfs goes with git, not with a protocol".into());
        }
        let only = |allowed: &[&str]| self.only(name, allowed);
        match name {
            "jsonrpc" => {
                only(&[])?;
                let r = MethodRule::new(&self.methods).map_err(ProtocolError::into_detail)?;
                Ok(Some(Protocol::plugin(r)))
            }
            "mcp" => {
                only(&["tools", "resources", "prompts", "server_requests"])?;
                self.no_methods(name)?;
                let r = self.mcp()?;
                Ok(Some(Protocol::Mcp(std::sync::Arc::new(r))))
            }
            "graphql" => {
                only(&["operations", "names", "fields", "persisted"])?;
                self.no_methods(name)?;
                let r =
                    GraphQlRule::new(&self.operations, &self.names, &self.fields, &self.persisted)
                        .map_err(ProtocolError::into_detail)?;
                Ok(Some(Protocol::GraphQl(r)))
            }
            "websocket" => {
                only(&[])?;
                self.no_methods(name)?;
                Ok(Some(Protocol::WebSocket(self.websocket()?)))
            }
            provider => match Provider::parse(provider) {
                Some(p) => {
                    only(&[])?;
                    self.no_methods(name)?;
                    self.inference(p).map(Some)
                }
                None => Err(format!(
                    "protocol `{provider}` is not mcp, jsonrpc, graphql, websocket, openai, anthropic or gemini"
                )),
            },
        }
    }

    /// `protocol: openai | anthropic | gemini`: its models and web tools policy.
    fn inference(&self, p: Provider) -> Result<Protocol, String> {
        let web = match self.web_tools.as_deref() {
            None => WebTools::Policy,
            Some(w) => WebTools::parse(w)
                .ok_or_else(|| format!("web_tools: `{w}` is not policy, refuse or allow"))?,
        };
        let r = InferenceRule::new(p, &self.models, (web, &self.tool_types))
            .map_err(ProtocolError::into_detail)?;
        Ok(Protocol::Inference(std::sync::Arc::new(r)))
    }

    /// `protocol: mcp`: its tools (with argument matchers), resources, prompts and server
    /// requests.
    fn mcp(&self) -> Result<McpRule, String> {
        let tools = self
            .tools
            .iter()
            .map(|t| match t {
                RawTool::Name(n) => ToolRule::new(n, Vec::new()),
                RawTool::Matched { name, arguments } => {
                    let args = arguments
                        .iter()
                        .map(|(k, a)| a.compile(k).map(|m| (k.clone(), m)))
                        .collect::<Result<Vec<_>, _>>()?;
                    ToolRule::new(name, args)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(ProtocolError::into_detail)?;
        McpRule::new(tools, &self.resources, &self.prompts, &self.server_requests)
            .map_err(ProtocolError::into_detail)
    }

    fn no_methods(&self, name: &str) -> Result<(), String> {
        match self.methods.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "a `protocol: {name}` rule names no methods (its HTTP methods are implied)"
            )),
        }
    }

    /// The rule this entry compiles to (a preset is expanded before this).
    pub fn compile(&self) -> Result<HttpRule, String> {
        if self.preset.is_some() {
            return Err("a preset entry names nothing else".into());
        }
        if self.host.is_empty() {
            return Err("an http rule names its host (or a preset)".into());
        }
        if self.ws_keys_written() && self.protocol.as_deref() != Some("websocket") {
            return Err(
                "messages, server_messages, binary and max_message_bytes go with protocol: websocket"
                    .into(),
            );
        }
        let inference = self.protocol.as_deref().and_then(Provider::parse);
        let inferred = !self.models.is_empty() || self.web_tools.is_some();
        if (inferred || !self.tool_types.is_empty()) && inference.is_none() {
            return Err(
                "models, web_tools and tool_types go with protocol: openai, anthropic or gemini"
                    .into(),
            );
        }
        let protocol = self.protocol()?;
        // With jsonrpc, `methods` are the JSON-RPC methods, not HTTP ones.
        let methods: &[String] = match protocol {
            Some(ref p) if p.takes_methods() => &[],
            _ => &self.methods,
        };
        let mut rule =
            HttpRule::with_protocol(&self.host, methods, &self.paths, &self.git, protocol)
                .map_err(|e| e.to_string())?;
        rule.scope = super::scoped::check_scope(&self.binaries, &self.execs, self.children)?;
        if let Some(scope) = &rule.scope {
            rule.text = format!("{} for {scope}", rule.text);
        }
        Ok(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(yaml: &str) -> Result<HttpRule, String> {
        let raw: RawHttpRule = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        raw.compile()
    }

    #[test]
    fn protocol_rules_compile_and_mistakes_are_named() {
        assert!(rule("{host: mcp.test, paths: [/mcp], protocol: mcp, tools: [search, {name: create_issue, arguments: {repo: {one_of: [a/b]}}}]}").is_ok());
        assert!(rule("{host: rpc.test, protocol: jsonrpc, methods: [eth_call]}").is_ok());
        assert!(rule("{host: gh.test, protocol: graphql, operations: [query]}").is_ok());
        assert!(rule("{host: gh.test, paths: ['/*/*'], git: [fetch], lfs: [download]}").is_ok());
        assert!(rule("{host: ws.test, paths: [/socket], protocol: websocket, messages: {jsonrpc: {methods: [ping, tools/list]}}, binary: refuse}").is_ok());
        assert!(rule("{host: ws.test, protocol: websocket, messages: {graphql: {operations: [subscription]}}, server_messages: {text: ['*']}, max_message_bytes: 4096}").is_ok());
        assert!(
            rule("{host: ws.test, protocol: websocket, messages: {mcp: {tools: [search]}}}")
                .is_ok()
        );
        assert!(rule("{host: api.openai.test, protocol: openai, models: ['gpt-4o-mini*'], web_tools: refuse}").is_ok());
        for (bad, says) in [
            ("{host: x.test, protocol: smtp}", "not mcp, jsonrpc, graphql, websocket, openai"),
            ("{host: x.test, models: [a]}", "go with protocol: openai"),
            ("{host: x.test, protocol: openai, web_tools: sometimes}", "not policy, refuse or allow"),
            ("{host: x.test, protocol: anthropic, methods: [POST]}", "names no methods"),
            ("{host: x.test, protocol: gemini, tools: [a]}", "does not go with"),
            ("{host: x.test, protocol: openai, models: ['a[']}", "model"),
            ("{host: x.test, tools: [a]}", "need a `protocol`"),
            ("{host: x.test, protocol: mcp, operations: [query]}", "does not go with"),
            ("{host: x.test, protocol: mcp, methods: [POST]}", "names no methods"),
            ("{host: x.test, protocol: graphql}", "operations"),
            ("{host: x.test, protocol: graphql, operations: [delete]}", "not query"),
            ("{host: x.test, protocol: jsonrpc}", "methods"),
            ("{host: x.test, protocol: mcp, tools: [{name: a, arguments: {b: {equals: 1, glob: x}}}]}", "exactly one"),
            ("{host: x.test, lfs: [steal]}", "not download"),
            ("{host: x.test, protocol: mcp, git: [fetch]}", "not both"),
            ("{protocol: mcp}", "host"),
            ("{host: x.test, messages: {text: [a]}}", "go with protocol: websocket"),
            ("{host: x.test, protocol: websocket, binary: maybe}", "not allow or refuse"),
            ("{host: x.test, protocol: websocket, messages: {text: [a], jsonrpc: {methods: [b]}}}", "exactly one"),
            ("{host: x.test, protocol: websocket, messages: {mcp: {host: y.test, tools: [a]}}}", "lists only"),
            ("{host: x.test, protocol: websocket, messages: {}}", "names one of"),
            ("{host: x.test, protocol: websocket, max_message_bytes: 0}", "between"),
        ] {
            let e = rule(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
