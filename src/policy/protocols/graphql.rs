//! `protocol: graphql`: which operations a GraphQL request may carry. The request is read the
//! way GraphQL over HTTP sends it — a JSON body (one request or a batch), an
//! `application/graphql` body, or a GET's `query` parameter — and its document is parsed with
//! a real GraphQL parser (`graphql-parser`, with its recursion limit). Every operation in the
//! document is judged, not only the one `operationName` picks: its kind (`operations`), its
//! name (`names`, when listed) and its root fields (`fields`, when listed; fragments spread at
//! the root are followed). A persisted query (an `extensions.persistedQuery` hash, or a
//! document id) is refused unless its hash or id is listed (`persisted`).

use graphql_parser::query::{
    parse_query, Definition, OperationDefinition, Selection, SelectionSet,
};
use serde_json::{Map, Value};

use super::{names, strict_json, ProtocolError};
use crate::policy::http_rules::percent_decode;

/// A GraphQL operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A query.
    Query,
    /// A mutation.
    Mutation,
    /// A subscription.
    Subscription,
}

impl OpKind {
    /// The kind an `operations:` entry names.
    pub fn parse(s: &str) -> Result<OpKind, ProtocolError> {
        match s {
            "query" => Ok(OpKind::Query),
            "mutation" => Ok(OpKind::Mutation),
            "subscription" => Ok(OpKind::Subscription),
            _ => Err(ProtocolError::rule(format!(
                "operations: `{s}` is not query, mutation or subscription"
            ))),
        }
    }

    /// The name written in rules and records.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Query => "query",
            OpKind::Mutation => "mutation",
            OpKind::Subscription => "subscription",
        }
    }
}

/// A `protocol: graphql` rule.
#[derive(Debug, Clone)]
pub struct GraphQlRule {
    /// The operation kinds allowed.
    pub operations: Vec<OpKind>,
    /// The operation names allowed (globs; empty: any).
    pub names: Vec<String>,
    /// The root fields allowed (globs; empty: any).
    pub fields: Vec<String>,
    /// Persisted-query hashes (lowercase hex) and document ids allowed.
    pub persisted: Vec<String>,
    name_set: globset::GlobSet,
    field_set: globset::GlobSet,
}

/// Where GraphQL requests carry a persisted document's id instead of (or beside) its text.
const DOCUMENT_IDS: &[&str] = &["id", "documentId", "doc_id", "queryId"];

/// The parameters a GraphQL request may carry in a URL.
const GRAPHQL_KEYS: &[&str] = &[
    "query",
    "operationName",
    "variables",
    "extensions",
    "id",
    "documentId",
    "doc_id",
    "queryId",
];

/// How deep fragment spreads at the root are followed.
const MAX_SPREAD_DEPTH: usize = 16;

impl GraphQlRule {
    /// A rule from its lists; `Err` when one does not compile.
    pub fn new(
        operations: &[String],
        op_names: &[String],
        fields: &[String],
        persisted: &[String],
    ) -> Result<GraphQlRule, ProtocolError> {
        if operations.is_empty() {
            return Err(ProtocolError::rule(
                "a `protocol: graphql` rule names its operations (`operations: [query]`)",
            ));
        }
        Ok(GraphQlRule {
            operations: operations
                .iter()
                .map(|o| OpKind::parse(o))
                .collect::<Result<_, _>>()?,
            names: op_names.to_vec(),
            fields: fields.to_vec(),
            persisted: persisted.iter().map(|p| p.to_ascii_lowercase()).collect(),
            name_set: names(op_names, "operation name")?,
            field_set: names(fields, "field")?,
        })
    }

    /// Judge one HTTP request: `Ok` with what it asked for (for the record), or why it is
    /// refused and, when known, what it asked for.
    pub fn judge(
        &self,
        method: &str,
        query: Option<&str>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<String, (String, Option<String>)> {
        let requests =
            requests(method, query, content_type, body).map_err(|e| (e.into_detail(), None))?;
        let mut calls = Vec::with_capacity(requests.len());
        for r in &requests {
            calls.push(self.judge_one(r)?);
        }
        Ok(calls.join("; "))
    }

    fn judge_one(&self, r: &Map<String, Value>) -> Result<String, (String, Option<String>)> {
        let persisted = r
            .get("extensions")
            .and_then(|e| e.get("persistedQuery"))
            .map(|p| p.get("sha256Hash").and_then(Value::as_str).unwrap_or(""))
            .into_iter()
            .chain(DOCUMENT_IDS.iter().filter_map(|k| match r.get(*k) {
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Number(_)) => Some("(a number)"),
                _ => None,
            }))
            .collect::<Vec<_>>();
        for p in &persisted {
            if !self.persisted.contains(&p.to_ascii_lowercase()) {
                let call = Some(format!("persisted {p}"));
                return Err((
                    format!("the persisted query `{p}` is not in the rule's persisted list"),
                    call,
                ));
            }
        }
        match r.get("query") {
            Some(Value::String(text)) => self.judge_document(text),
            None | Some(Value::Null) if !persisted.is_empty() => {
                Ok(format!("persisted {}", persisted.join(",")))
            }
            _ => Err(("a GraphQL request without a query".into(), None)),
        }
    }

    fn judge_document(&self, text: &str) -> Result<String, (String, Option<String>)> {
        let doc = parse_query::<&str>(text)
            .map_err(|e| (format!("the GraphQL document does not parse: {e}"), None))?;
        let fragments: Vec<(&str, &SelectionSet<'_, &str>)> = doc
            .definitions
            .iter()
            .filter_map(|d| match d {
                Definition::Fragment(f) => Some((f.name, &f.selection_set)),
                _ => None,
            })
            .collect();
        let mut calls = Vec::new();
        for d in &doc.definitions {
            let Definition::Operation(op) = d else {
                continue;
            };
            let (kind, name, set) = match op {
                OperationDefinition::SelectionSet(s) => (OpKind::Query, None, s),
                OperationDefinition::Query(q) => (OpKind::Query, q.name, &q.selection_set),
                OperationDefinition::Mutation(m) => (OpKind::Mutation, m.name, &m.selection_set),
                OperationDefinition::Subscription(s) => {
                    (OpKind::Subscription, s.name, &s.selection_set)
                }
            };
            let mut roots = Vec::new();
            root_fields(set, &fragments, 0, &mut roots)
                .map_err(|e| (e.into_detail(), Some(kind.as_str().to_string())))?;
            let call = format!("{} {}", kind.as_str(), roots.join(","));
            if !self.operations.contains(&kind) {
                let why = format!(
                    "a GraphQL {} is not in the rule's operations",
                    kind.as_str()
                );
                return Err((why, Some(call)));
            }
            if !self.names.is_empty() && !name.is_some_and(|n| self.name_set.is_match(n)) {
                let why = format!(
                    "the GraphQL operation name `{}` is not in the rule's names",
                    name.unwrap_or("(anonymous)")
                );
                return Err((why, Some(call)));
            }
            if !self.fields.is_empty() {
                if let Some(f) = roots.iter().find(|f| !self.field_set.is_match(f)) {
                    let why = format!("the GraphQL root field `{f}` is not in the rule's fields");
                    return Err((why, Some(call)));
                }
            }
            calls.push(call);
        }
        if calls.is_empty() {
            return Err(("a GraphQL document without an operation".into(), None));
        }
        Ok(calls.join("; "))
    }
}

/// The root fields of `set`, fragments spread at the root followed (`depth` bounded).
fn root_fields<'a>(
    set: &SelectionSet<'a, &'a str>,
    fragments: &[(&'a str, &SelectionSet<'a, &'a str>)],
    depth: usize,
    out: &mut Vec<String>,
) -> Result<(), ProtocolError> {
    if depth > MAX_SPREAD_DEPTH {
        return Err(ProtocolError::malformed(
            "GraphQL fragments spread deeper than this proxy follows",
        ));
    }
    for item in &set.items {
        match item {
            Selection::Field(f) => out.push(f.name.to_string()),
            Selection::InlineFragment(i) => {
                root_fields(&i.selection_set, fragments, depth + 1, out)?
            }
            Selection::FragmentSpread(s) => {
                let Some((_, inner)) = fragments.iter().find(|(n, _)| *n == s.fragment_name) else {
                    return Err(ProtocolError::malformed(format!(
                        "the GraphQL fragment `{}` is not defined",
                        s.fragment_name
                    )));
                };
                root_fields(inner, fragments, depth + 1, out)?;
            }
        }
    }
    Ok(())
}

/// The GraphQL requests in an HTTP request (see the module's documentation).
fn requests(
    method: &str,
    query: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<Map<String, Value>>, ProtocolError> {
    if method.eq_ignore_ascii_case("GET") {
        return Ok(vec![from_query(query.unwrap_or(""))?]);
    }
    if !method.eq_ignore_ascii_case("POST") {
        return Err(ProtocolError::malformed(format!(
            "{method} carries no GraphQL request"
        )));
    }
    // Some servers read a POST's URL parameters before its body (express-graphql): those are
    // judged too, as a request of their own.
    let mut out = Vec::new();
    if let Some(q) = query {
        let url = from_query(q)?;
        if GRAPHQL_KEYS.iter().any(|k| url.contains_key(*k)) {
            out.push(url);
        }
    }
    out.extend(body_requests(content_type, body)?);
    Ok(out)
}

/// The GraphQL requests of a POST's body.
fn body_requests(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<Map<String, Value>>, ProtocolError> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase());
    if media.as_deref() == Some("application/graphql") {
        let text = std::str::from_utf8(body)
            .map_err(|_| ProtocolError::malformed("the GraphQL body is not UTF-8"))?;
        let mut one = Map::new();
        one.insert("query".into(), Value::String(text.to_string()));
        return Ok(vec![one]);
    }
    if !super::json_media(content_type) {
        return Err(ProtocolError::malformed(
            super::media_refusal(content_type, "a GraphQL").replace(
                "(application/json,",
                "(application/json or application/graphql,",
            ),
        ));
    }
    match strict_json::parse(body)? {
        Value::Object(o) => Ok(vec![o]),
        Value::Array(items) if !items.is_empty() => items
            .into_iter()
            .map(|v| match v {
                Value::Object(o) => Ok(o),
                _ => Err(ProtocolError::malformed(
                    "a GraphQL batch entry that is not an object",
                )),
            })
            .collect(),
        _ => Err(ProtocolError::malformed(
            "the body is not a GraphQL request (an object or a batch of them)",
        )),
    }
}

/// A URL's GraphQL request: its GraphQL parameters (`query`, `operationName`, `variables` and
/// `extensions` as JSON, document ids), each at most once; other parameters are not read.
fn from_query(q: &str) -> Result<Map<String, Value>, ProtocolError> {
    let mut out = Map::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = String::from_utf8(percent_decode(k))
            .map_err(|_| ProtocolError::malformed("a query key is not UTF-8"))?;
        if !GRAPHQL_KEYS.contains(&k.as_str()) {
            continue;
        }
        let v = String::from_utf8(percent_decode(v))
            .map_err(|_| ProtocolError::malformed("a query value is not UTF-8"))?;
        let value = match k.as_str() {
            "extensions" | "variables" => strict_json::parse(v.as_bytes())?,
            _ => Value::String(v),
        };
        if out.insert(k.clone(), value).is_some() {
            return Err(ProtocolError::malformed(format!(
                "the query parameter `{k}` appears twice"
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ops: &[&str], fields: &[&str]) -> GraphQlRule {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        GraphQlRule::new(&s(ops), &[], &s(fields), &["abc123".into()]).unwrap()
    }

    fn post(r: &GraphQlRule, body: &str) -> Result<String, String> {
        r.judge("POST", None, Some("application/json"), body.as_bytes())
            .map_err(|(why, _)| why)
    }

    #[test]
    fn queries_pass_and_mutations_anywhere_in_the_document_are_refused() {
        let r = rule(&["query"], &[]);
        assert_eq!(
            post(&r, r#"{"query":"{ viewer { login } }"}"#).unwrap(),
            "query viewer"
        );
        assert!(post(&r, r#"{"query":"mutation { createGist(x: 1) { id } }"}"#).is_err());
        // operationName picks the query, but the document also holds a mutation.
        let two = r#"{"query":"query A { viewer { login } } mutation B { deleteRepo { id } }","operationName":"A"}"#;
        assert!(post(&r, two).unwrap_err().contains("mutation"));
        // A batch with one mutation is refused whole.
        assert!(post(&r, r#"[{"query":"{a}"},{"query":"mutation{b}"}]"#).is_err());
        assert!(r
            .judge("POST", None, Some("application/graphql"), b"mutation { x }")
            .is_err());
        assert!(r
            .judge("GET", Some("query=%7Bviewer%7Bid%7D%7D"), None, b"")
            .is_ok());
        assert!(r
            .judge("GET", Some("query=mutation%7Bx%7D"), None, b"")
            .is_err());
        assert!(r
            .judge(
                "GET",
                Some("query=%7Ba%7D&query=mutation%7Bx%7D"),
                None,
                b""
            )
            .is_err());
        // A POST's URL parameters are judged beside its body (some servers read them first).
        let body = br#"{"query":"{ viewer { login } }"}"#;
        let json = Some("application/json");
        assert!(r
            .judge("POST", Some("query=mutation%7Bx%7D"), json, body)
            .is_err());
        assert!(r.judge("POST", Some("trace=1&trace=2"), json, body).is_ok());
        for bad in [
            "{",
            r#"{"query":"{ a"}"#,
            r#"{"query":5}"#,
            "[]",
            r#"{"query":"fragment F on Q { a }"}"#,
        ] {
            assert!(post(&r, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn root_fields_follow_fragments_and_persisted_queries_must_be_listed() {
        let r = rule(&["query", "mutation"], &["viewer", "addComment"]);
        assert!(post(&r, r#"{"query":"mutation { addComment { id } }"}"#).is_ok());
        assert!(post(&r, r#"{"query":"mutation { createGist { id } }"}"#).is_err());
        let spread =
            r#"{"query":"mutation { ...F } fragment F on Mutation { createGist { id } }"}"#;
        assert!(post(&r, spread).unwrap_err().contains("createGist"));
        let inline = r#"{"query":"mutation { ... on Mutation { createGist { id } } }"}"#;
        assert!(post(&r, inline).is_err());
        assert!(post(&r, r#"{"query":"{ ...F } fragment F on Q { ...F }"}"#).is_err());
        let pq = |h: &str| {
            format!(r#"{{"extensions":{{"persistedQuery":{{"version":1,"sha256Hash":"{h}"}}}}}}"#)
        };
        assert!(post(&r, &pq("ABC123")).is_ok());
        assert!(post(&r, &pq("ffff")).is_err());
        assert!(post(&r, r#"{"id":"ffff","query":"{ viewer }"}"#).is_err());
        let deep = format!(
            r#"{{"query":"{}{}"}}"#,
            "{a".repeat(10_000),
            "}".repeat(10_000)
        );
        assert!(post(&r, &deep).is_err());
    }
}
