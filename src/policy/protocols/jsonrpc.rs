//! JSON-RPC 2.0 messages as a rule judges them: a body is one message or a batch (an array);
//! each is a request (method and id), a notification (method, no id) or a response (id and
//! `result` or `error`). Anything else — another version, a method that is not a string, an
//! empty batch, a message that is both request and response — is refused, never guessed at.

use std::borrow::Cow;

use super::json_tree::{Json, NULL};
use super::{strict_json, ProtocolError};

/// One JSON-RPC message, its strings borrowed from the body it was read from.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// A call that waits for an answer.
    Request {
        /// Its id.
        id: Json<'a>,
        /// The method called.
        method: Cow<'a, str>,
        /// Its parameters (`null` when absent).
        params: Json<'a>,
    },
    /// A call without an id (no answer).
    Notification {
        /// The method called.
        method: Cow<'a, str>,
        /// Its parameters (`null` when absent).
        params: Json<'a>,
    },
    /// An answer (`result` or `error`).
    Response {
        /// The id of the call it answers.
        id: Json<'a>,
    },
}

impl<'a> Message<'a> {
    /// The method, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request { method, .. } | Message::Notification { method, .. } => Some(method),
            Message::Response { .. } => None,
        }
    }

    /// The id, for requests and responses.
    pub fn id(&self) -> Option<&Json<'a>> {
        match self {
            Message::Request { id, .. } | Message::Response { id } => Some(id),
            Message::Notification { .. } => None,
        }
    }

    /// The parameters, for requests and notifications (`null` otherwise).
    pub fn params(&self) -> &Json<'a> {
        match self {
            Message::Request { params, .. } | Message::Notification { params, .. } => params,
            Message::Response { .. } => &NULL,
        }
    }
}

/// A body's messages, and whether they came as a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Body<'a> {
    /// The messages, in order.
    pub messages: Vec<Message<'a>>,
    /// Whether they came as a batch (an array).
    pub batch: bool,
}

/// Read `bytes` as JSON-RPC 2.0 (see the module's documentation). The messages borrow from
/// `bytes`: no string is copied unless it carries an escape.
pub fn parse(bytes: &[u8]) -> Result<Body<'_>, ProtocolError> {
    read(strict_json::parse_borrowed(bytes)?)
}

/// [`parse`] on a document already read. The document is taken apart, not copied: a
/// request's id, method and parameters move into its [`Message`] (the copy of the
/// parameters' tree was 8 of the 93 allocations of a terminated MCP `tools/call`, by a uprobe
/// on `malloc`).
pub fn read(v: Json<'_>) -> Result<Body<'_>, ProtocolError> {
    match v {
        Json::Arr(items) if items.is_empty() => {
            Err(ProtocolError::malformed("an empty JSON-RPC batch"))
        }
        Json::Arr(items) => Ok(Body {
            messages: items.into_iter().map(message).collect::<Result<_, _>>()?,
            batch: true,
        }),
        one => Ok(Body {
            messages: vec![message(one)?],
            batch: false,
        }),
    }
}

/// One message (see [`Message`]).
pub fn message(o: Json<'_>) -> Result<Message<'_>, ProtocolError> {
    let Json::Obj(pairs) = o else {
        return Err(bad("a JSON-RPC message is not an object"));
    };
    // One pass over the members, each moved out once (no key is there twice: the reader
    // refuses it).
    let (mut version, mut id, mut method, mut params, mut answers) =
        (false, None, None, None, false);
    for (k, v) in pairs {
        match k.as_ref() {
            "jsonrpc" => version = v.as_str() == Some("2.0"),
            "id" => id = Some(v),
            "method" => method = Some(v),
            "params" => params = Some(v),
            "result" | "error" => answers = true,
            _ => {}
        }
    }
    if !version {
        return Err(bad("a JSON-RPC message without \"jsonrpc\": \"2.0\""));
    }
    let id = match id {
        None => None,
        Some(id @ (Json::Str(_) | Json::Num(_) | Json::Null)) => Some(id),
        Some(_) => return Err(bad("a JSON-RPC id that is not a string or a number")),
    };
    let params = || params.unwrap_or(Json::Null);
    match (method, id) {
        (Some(_), _) if answers => Err(bad("a JSON-RPC message that is both a call and an answer")),
        (Some(Json::Str(method)), Some(id)) => Ok(Message::Request {
            id,
            method,
            params: params(),
        }),
        (Some(Json::Str(method)), None) => Ok(Message::Notification {
            method,
            params: params(),
        }),
        (Some(_), _) => Err(bad("a JSON-RPC method that is not a string")),
        (None, Some(id)) if answers => Ok(Message::Response { id }),
        (None, _) => Err(bad(
            "a JSON-RPC message with neither a method nor an answer",
        )),
    }
}

fn bad(detail: &str) -> ProtocolError {
    ProtocolError::malformed(detail)
}

/// A JSON-RPC method rule: the methods (globs) a `protocol: jsonrpc` rule allows.
#[derive(Debug, Clone)]
pub struct MethodRule {
    /// The method globs, as written.
    pub methods: Vec<String>,
    matcher: globset::GlobSet,
}

impl MethodRule {
    /// A rule allowing `methods` (globs); `Err` when there are none or one does not compile.
    pub fn new(methods: &[String]) -> Result<MethodRule, ProtocolError> {
        if methods.is_empty() {
            return Err(ProtocolError::rule(
                "a `protocol: jsonrpc` rule names its methods (`methods: [globs]`)",
            ));
        }
        Ok(MethodRule {
            methods: methods.to_vec(),
            matcher: super::names(methods, "method")?,
        })
    }

    /// Why `body`'s messages are not all allowed (the first refused, named), if any.
    pub fn refusal(&self, body: &Body<'_>) -> Option<String> {
        body.messages.iter().find_map(|m| match m.method() {
            Some(name) if self.matcher.is_match(name) => None,
            Some(name) => Some(format!(
                "the JSON-RPC method `{name}` is not in the rule's methods"
            )),
            None => {
                Some("a JSON-RPC response sent to the server is not a call a rule allows".into())
            }
        })
    }
}

/// `protocol: jsonrpc` as a plug-in: a POST whose JSON body's every call is a method the rule
/// allows (a response sent to the server is not a call); refusals carry the calls' ids.
impl super::plugin::BodyRule for MethodRule {
    fn name(&self) -> &'static str {
        "jsonrpc"
    }

    fn describe(&self) -> String {
        format!("protocol:jsonrpc methods:{}", self.methods.join(","))
    }

    fn reason(&self) -> crate::policy::reason::Reason {
        crate::policy::reason::Reason::JsonRpcNotAllowed
    }

    fn carries(&self, method: &str) -> bool {
        method.eq_ignore_ascii_case("POST")
    }

    fn judge(
        &self,
        asked: super::Asked<'_>,
        body: &[u8],
    ) -> Result<super::BodyVerdict, super::RefusedCall> {
        let refuse = |detail, call, rpc| super::plugin::refused(self, detail, call, rpc);
        if !super::json_media(asked.content_type) {
            let why = super::media_refusal(asked.content_type, "a JSON-RPC");
            return Err(refuse(why, None, None));
        }
        let b = parse(body).map_err(|e| refuse(e.into_detail(), None, None))?;
        let call = b
            .messages
            .iter()
            .filter_map(|m| m.method())
            .collect::<Vec<_>>()
            .join(",");
        match self.refusal(&b) {
            None => Ok(super::called(call)),
            Some(why) => Err(refuse(why, Some(call), Some(super::ids(&b)))),
        }
    }

    fn takes_methods(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_read_strictly() {
        let b = parse(br#"{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[]}"#).unwrap();
        assert!(!b.batch);
        assert_eq!(b.messages[0].method(), Some("eth_call"));
        let b = parse(br#"[{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":"a","result":1}]"#)
            .unwrap();
        assert!(b.batch);
        assert!(matches!(b.messages[0], Message::Notification { .. }));
        assert!(matches!(b.messages[1], Message::Response { .. }));
        let b =
            parse(br#"{"params":{"a":[1]},"method":"m","x":0,"id":"7","jsonrpc":"2.0"}"#).unwrap();
        match &b.messages[0] {
            Message::Request { id, method, params } => {
                assert_eq!((id.as_str(), method.as_ref()), (Some("7"), "m"));
                assert_eq!(params.text(), r#"{"a":[1]}"#);
            }
            other => panic!("{other:?}"),
        }
        let n = parse(br#"{"jsonrpc":"2.0","method":"n"}"#).unwrap();
        assert_eq!(n.messages[0].params(), &Json::Null);
        for (bad, why) in [
            (&br#"[]"#[..], "empty"),
            (br#"{"id":1,"method":"m"}"#, "2.0"),
            (br#"{"jsonrpc":"1.0","id":1,"method":"m"}"#, "2.0"),
            (br#"{"jsonrpc":2.0,"id":{},"method":"m"}"#, "2.0"),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":5}"#,
                "method that is not a string",
            ),
            (
                br#"{"jsonrpc":"2.0","id":{},"method":"m"}"#,
                "id that is not",
            ),
            (br#"{"jsonrpc":"2.0","id":[],"result":1}"#, "id that is not"),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"m","result":1}"#,
                "both",
            ),
            (br#"{"jsonrpc":"2.0","method":"m","error":{}}"#, "both"),
            (br#"{"jsonrpc":"2.0","id":1}"#, "neither"),
            (br#"{"jsonrpc":"2.0","result":1}"#, "neither"),
            (br#""m""#, "not an object"),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#,
                "twice",
            ),
        ] {
            let text = String::from_utf8_lossy(bad);
            let e = parse(bad).map(|_| ()).unwrap_err().into_detail();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_batch_is_refused_when_one_call_is_not_allowed() {
        let rule = MethodRule::new(&["eth_get*".into(), "net_version".into()]).unwrap();
        let ok = parse(br#"[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance"},{"jsonrpc":"2.0","method":"net_version"}]"#).unwrap();
        assert_eq!(rule.refusal(&ok), None);
        let bad = parse(br#"[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance"},{"jsonrpc":"2.0","id":2,"method":"eth_sendTransaction"}]"#).unwrap();
        assert!(rule.refusal(&bad).unwrap().contains("eth_sendTransaction"));
        assert!(MethodRule::new(&[]).is_err());
    }
}
