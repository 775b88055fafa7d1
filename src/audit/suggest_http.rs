//! What `suggest` proposes for terminated hosts: from the requests whose record names a
//! `call` (a protocol rule judged them, or a git rule matched), one rule per host, path and
//! protocol that would allow every call seen — the MCP tools, resources and prompts called,
//! the JSON-RPC methods, the GraphQL operation kinds and root fields, the git services and
//! LFS operations on the repositories used. Calls that were refused or reported are
//! proposed too (report mode is how the list is learnt); review before enforcing.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// What one host and path saw, by protocol.
#[derive(Debug, Default)]
struct Seen {
    tools: BTreeSet<String>,
    resources: BTreeSet<String>,
    prompts: BTreeSet<String>,
    methods: BTreeSet<String>,
    operations: BTreeSet<String>,
    fields: BTreeSet<String>,
    git: BTreeSet<String>,
    lfs: BTreeSet<String>,
}

/// The calls seen, by (host, protocol, path).
#[derive(Debug, Default)]
pub struct Calls {
    seen: BTreeMap<(String, &'static str, String), Seen>,
}

/// The repository a git or LFS request's path names.
fn repository(path: &str) -> &str {
    [
        "/info/refs",
        "/git-upload-pack",
        "/git-receive-pack",
        "/info/lfs/objects/batch",
    ]
    .iter()
    .find_map(|s| path.strip_suffix(s))
    .unwrap_or(path)
}

impl Calls {
    /// Take one `end` record of the sandbox (those without a `call` are ignored).
    pub fn add(&mut self, v: &Value) {
        let (Some(call), Some(host), Some(path)) = (
            v["call"].as_str(),
            v["target_host"].as_str(),
            v["path"].as_str(),
        ) else {
            return;
        };
        let Some((protocol, rest)) = call.split_once(' ') else {
            return;
        };
        let (protocol, path) = match protocol {
            "mcp" => ("mcp", path),
            "jsonrpc" => ("jsonrpc", path),
            "graphql" => ("graphql", path),
            "git" | "lfs" => ("git", repository(path)),
            _ => return,
        };
        let s = self
            .seen
            .entry((host.to_ascii_lowercase(), protocol, path.to_string()))
            .or_default();
        let kind = call.split(' ').next().unwrap_or("");
        match kind {
            "mcp" => {
                for c in rest.split(',') {
                    match c.split_once(' ') {
                        Some(("tools/call", t)) => s.tools.insert(t.to_string()),
                        // A URI that could name another resource is never proposed (the
                        // rule would refuse it anyway).
                        Some(("resources/read", r))
                            if crate::policy::protocols::mcp::canonical_uri(r).is_ok() =>
                        {
                            s.resources.insert(r.to_string())
                        }
                        Some(("prompts/get", p)) => s.prompts.insert(p.to_string()),
                        _ => false,
                    };
                }
            }
            "jsonrpc" => s.methods.extend(rest.split(',').map(str::to_string)),
            "graphql" => {
                for op in rest.split("; ") {
                    let (k, fields) = op.split_once(' ').unwrap_or((op, ""));
                    s.operations.insert(k.to_string());
                    s.fields.extend(
                        fields
                            .split(',')
                            .filter(|f| !f.is_empty())
                            .map(str::to_string),
                    );
                }
            }
            "git" => {
                s.git.insert(rest.to_string());
            }
            _ => {
                s.lfs.insert(rest.to_string());
            }
        }
    }

    /// Whether no calls were seen.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The proposed `network.http` rules, as YAML lines under `network:`.
    pub fn render(&self) -> String {
        let list = |k: &str, set: &BTreeSet<String>| match set.is_empty() {
            true => String::new(),
            false => {
                let items: Vec<String> = set
                    .iter()
                    .map(|x| Value::from(x.as_str()).to_string())
                    .collect();
                format!(", {k}: [{}]", items.join(", "))
            }
        };
        let mut out = String::from("  http:\n");
        for ((host, protocol, path), s) in &self.seen {
            let head = format!(
                "    - {{ host: {}, paths: [{}]",
                Value::from(host.as_str()),
                Value::from(path.as_str())
            );
            let body = match *protocol {
                "mcp" => format!(
                    ", protocol: mcp{}{}{}",
                    list("tools", &s.tools),
                    list("resources", &s.resources),
                    list("prompts", &s.prompts)
                ),
                "jsonrpc" => format!(", protocol: jsonrpc{}", list("methods", &s.methods)),
                "graphql" => format!(
                    ", protocol: graphql{}{}",
                    list("operations", &s.operations),
                    list("fields", &s.fields)
                ),
                _ => format!("{}{}", list("git", &s.git), list("lfs", &s.lfs)),
            };
            out.push_str(&format!("{head}{body} }}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_become_one_rule_per_host_path_and_protocol() {
        let mut c = Calls::default();
        let rec = |call: &str, host: &str, path: &str| json!({"call": call, "target_host": host, "path": path});
        c.add(&rec("mcp tools/call search", "mcp.test", "/mcp"));
        c.add(&rec(
            "mcp tools/call delete_repo,tools/list",
            "mcp.test",
            "/mcp",
        ));
        c.add(&rec(
            "mcp resources/read file:///docs/a",
            "mcp.test",
            "/mcp",
        ));
        c.add(&rec(
            "graphql query viewer; mutation addComment",
            "api.test",
            "/graphql",
        ));
        c.add(&rec("git fetch", "git.test", "/org/app.git/info/refs"));
        c.add(&rec(
            "lfs download",
            "git.test",
            "/org/app.git/info/lfs/objects/batch",
        ));
        c.add(&json!({"target_host": "x.test", "path": "/"}));
        let y = c.render();
        assert!(y.contains(r#"{ host: "mcp.test", paths: ["/mcp"], protocol: mcp, tools: ["delete_repo", "search"], resources: ["file:///docs/a"] }"#), "{y}");
        assert!(y.contains(r#"protocol: graphql, operations: ["mutation", "query"], fields: ["addComment", "viewer"]"#), "{y}");
        assert!(y.contains(r#"{ host: "git.test", paths: ["/org/app.git"], git: ["fetch"], lfs: ["download"] }"#), "{y}");
        assert_eq!(y.lines().count(), 4, "{y}");
    }
}
