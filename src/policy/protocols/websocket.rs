//! `protocol: websocket` rules: a terminated host's upgrade to a WebSocket on the rule's paths,
//! and what each message of the socket may say. A text message is read by the same judges as
//! an HTTP body ([`super::Protocol::judge`]): JSON-RPC methods, MCP calls, GraphQL operations
//! (the `subscribe` / `start` payloads of `graphql-transport-ws` and `graphql-ws`), or text
//! patterns; each direction has its own rule (`messages` for what the sandbox sends,
//! `server_messages` for what the origin sends, unjudged when absent). Pure: no I/O.

use std::sync::Arc;

use serde_json::Value;

use super::{Asked, Protocol, ProtocolError, RefusedCall};
use crate::policy::reason::Reason;

/// The largest message a socket carries unless the rule says otherwise (a fragmented
/// message counts whole).
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 20;

/// What the messages of one direction may say.
#[derive(Debug, Clone)]
pub enum MessageRule {
    /// Read as this protocol's request body (JSON-RPC, MCP, GraphQL over WebSocket).
    Protocol(Arc<Protocol>),
    /// The whole text matches one of these globs (`*` any run, newlines included).
    Text(regex::RegexSet, Vec<String>),
}

/// A `protocol: websocket` rule's message part.
#[derive(Debug, Clone)]
pub struct WsRule {
    /// What the sandbox's messages may say (`None`: any).
    pub sent: Option<MessageRule>,
    /// What the origin's messages may say (`None`: any).
    pub received: Option<MessageRule>,
    /// `binary: allow | refuse` as written (`None`: refused where a credential is bound to
    /// the host or a message rule reads the direction, allowed otherwise).
    pub binary: Option<bool>,
    /// The largest message (and fragment series), in bytes.
    pub max_message: usize,
}

/// A message of the socket as the rules read it.
#[derive(Debug, Clone, Copy)]
pub enum Message<'a> {
    /// A complete text message (UTF-8, fragments joined).
    Text(&'a str),
    /// A complete binary message.
    Binary(&'a [u8]),
}

impl MessageRule {
    /// `text: [globs]`.
    pub fn text(globs: &[String]) -> Result<Self, ProtocolError> {
        let res: Vec<String> = globs.iter().map(|g| glob_regex(g)).collect();
        let set = regex::RegexSet::new(&res)
            .map_err(|e| ProtocolError::rule_caused(format_args!("text patterns"), e))?;
        Ok(MessageRule::Text(set, globs.to_vec()))
    }

    /// The rule as text (hashed into the policy version).
    pub fn describe(&self) -> String {
        match self {
            MessageRule::Protocol(p) => p.describe(),
            MessageRule::Text(_, globs) => format!("text:{}", globs.join(",")),
        }
    }

    /// Judge one text message: what it called (for the record), or why it is refused.
    pub fn judge(&self, text: &str) -> Result<Option<String>, RefusedCall> {
        match self {
            MessageRule::Text(set, _) => match set.is_match(text) {
                true => Ok(None),
                false => Err(refused(
                    Reason::WebSocketNotAllowed,
                    "the text message matches none of the rule's text patterns".into(),
                )),
            },
            MessageRule::Protocol(p) => match &**p {
                Protocol::GraphQl(_) => graphql_message(p, text),
                _ => p.judge(json_body(), text.as_bytes()).map(|j| j.call),
            },
        }
    }
}

impl WsRule {
    /// The rule as text (hashed into the policy version).
    pub fn describe(&self) -> String {
        let side = |k: &str, r: &Option<MessageRule>| match r {
            Some(r) => format!(" {k}:[{}]", r.describe()),
            None => String::new(),
        };
        let binary = match self.binary {
            Some(true) => " binary:allow",
            Some(false) => " binary:refuse",
            None => "",
        };
        format!(
            "protocol:websocket{}{}{binary} max_message:{}",
            side("messages", &self.sent),
            side("server_messages", &self.received),
            self.max_message
        )
    }

    /// Judge one message (`sent`: from the sandbox); `credentialed`: a credential is bound to
    /// the host. `Ok` with what it called, or the refusal.
    pub fn judge(
        &self,
        sent: bool,
        credentialed: bool,
        m: Message<'_>,
    ) -> Result<Option<String>, RefusedCall> {
        let rule = match sent {
            true => &self.sent,
            false => &self.received,
        };
        match m {
            Message::Text(t) => rule.as_ref().map_or(Ok(None), |r| r.judge(t)),
            Message::Binary(_) => {
                let allowed = self.binary.unwrap_or(!credentialed && rule.is_none());
                match allowed {
                    true => Ok(None),
                    false => Err(refused(
                        Reason::WebSocketNotAllowed,
                        match self.binary {
                            Some(false) => "binary messages are refused by the rule (binary: refuse)".into(),
                            _ => "binary messages are refused where a credential is bound or messages are judged, unless the rule says binary: allow".into(),
                        },
                    )),
                }
            }
        }
    }
}

/// A refusal with no JSON-RPC answer (a socket is closed, not answered).
fn refused(reason: Reason, detail: String) -> RefusedCall {
    RefusedCall {
        refusal: Box::new(crate::policy::refusal::Refusal::new(reason, detail)),
        call: None,
        rpc: None,
    }
}

/// A text message read as a JSON request body.
fn json_body() -> Asked<'static> {
    Asked {
        method: "POST",
        path: "",
        query: None,
        content_type: Some("application/json"),
        mcp_method: None,
        mcp_name: None,
    }
}

/// A GraphQL-over-WebSocket message: `subscribe` (`graphql-transport-ws`) and `start`
/// (`graphql-ws`) carry an operation, judged as a POST body; the protocol's other messages
/// pass; anything else is refused.
fn graphql_message(p: &Protocol, text: &str) -> Result<Option<String>, RefusedCall> {
    let bad = |why: String| refused(p.reason(), why);
    let v: Value = serde_json::from_str(text)
        .map_err(|e| bad(format!("a GraphQL-over-WebSocket message is not JSON: {e}")))?;
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "subscribe" | "start" => {
            let payload = v
                .get("payload")
                .ok_or_else(|| bad(format!("a `{kind}` message carries no payload")))?;
            let body = serde_json::to_vec(payload).map_err(|e| bad(e.to_string()))?;
            p.judge(json_body(), &body).map(|j| j.call)
        }
        "connection_init"
        | "connection_ack"
        | "ping"
        | "pong"
        | "complete"
        | "stop"
        | "connection_terminate"
        | "next"
        | "data"
        | "error"
        | "ka"
        | "connection_error" => Ok(None),
        other => Err(bad(format!(
            "`{}` is not a message type of graphql-transport-ws or graphql-ws",
            other.chars().take(40).collect::<String>()
        ))),
    }
}

/// A glob as an anchored regex: `*` any run of characters (newlines too), `?` one; the rest
/// literal.
fn glob_regex(glob: &str) -> String {
    let mut re = String::from("(?s)^");
    for c in glob.chars() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            c => re.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
    }
    re.push('$');
    re
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::protocols::jsonrpc::MethodRule;

    fn rule(sent: Option<MessageRule>, binary: Option<bool>) -> WsRule {
        WsRule {
            sent,
            received: None,
            binary,
            max_message: DEFAULT_MAX_MESSAGE,
        }
    }

    #[test]
    fn text_patterns_match_the_whole_message() {
        let r = rule(
            Some(MessageRule::text(&["ping*".into(), "{\"op\":?}".into()]).unwrap()),
            None,
        );
        assert!(r.judge(true, false, Message::Text("ping\nme")).is_ok());
        assert!(r.judge(true, false, Message::Text("{\"op\":1}")).is_ok());
        assert!(r.judge(true, false, Message::Text("xping")).is_err());
        assert!(r.judge(true, false, Message::Text("{\"op\":12}")).is_err());
        // The origin's messages are not judged without `server_messages`.
        assert!(r.judge(false, false, Message::Text("anything")).is_ok());
    }

    #[test]
    fn jsonrpc_messages_are_judged_like_bodies() {
        let m = MethodRule::new(&["ping".into()]).unwrap();
        let r = rule(
            Some(MessageRule::Protocol(Arc::new(Protocol::plugin(m)))),
            None,
        );
        let ok = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert_eq!(
            r.judge(true, false, Message::Text(ok)).unwrap().as_deref(),
            Some("jsonrpc ping")
        );
        let no = r#"{"jsonrpc":"2.0","id":2,"method":"admin/drop"}"#;
        let e = r.judge(true, false, Message::Text(no)).unwrap_err();
        assert_eq!(e.refusal.reason, Reason::JsonRpcNotAllowed);
        assert!(r.judge(true, false, Message::Text("not json")).is_err());
    }

    #[test]
    fn binary_is_refused_where_a_credential_is_bound_or_messages_are_judged() {
        let open = rule(None, None);
        assert!(open.judge(true, false, Message::Binary(b"x")).is_ok());
        assert!(open.judge(true, true, Message::Binary(b"x")).is_err());
        let judged = rule(Some(MessageRule::text(&["*".into()]).unwrap()), None);
        assert!(judged.judge(true, false, Message::Binary(b"x")).is_err());
        assert!(judged.judge(false, false, Message::Binary(b"x")).is_ok());
        let allowed = rule(None, Some(true));
        assert!(allowed.judge(true, true, Message::Binary(b"x")).is_ok());
        let refused = rule(None, Some(false));
        assert!(refused.judge(false, false, Message::Binary(b"x")).is_err());
    }
}
