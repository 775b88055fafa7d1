//! The decider protocol, version 1 (`docs/decider.md`, with its JSON Schema): what the proxy
//! sends ([`Ask`]) and what it reads back ([`Answer`]). An answer that is not exactly one of
//! the three verdicts, or that touches a header it may not, is not understood — and what is
//! not understood is a failure (`decider_unavailable` under `on_error: deny`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{bad_answer, DeciderError};
use crate::policy::cause::worded;

/// The version of the decider protocol this proxy speaks.
pub const VERSION: u32 = 1;

/// Headers never sent to a decider (they carry credentials), whatever the request.
pub const NEVER_SENT: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-amz-security-token",
];

/// Headers a decider may neither set nor remove: framing, routing and credentials.
pub const NOT_ITS_TO_TOUCH: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-encoding",
    "expect",
];

/// Where the exchange goes.
#[derive(Debug, Serialize)]
pub struct Target {
    /// The host.
    pub host: String,
    /// The port.
    pub port: u16,
}

/// What the policy made of it.
#[derive(Debug, Serialize)]
pub struct Policy {
    /// `allow` or `report`.
    pub decision: &'static str,
    /// The rule that allowed it, if one did.
    pub rule: Option<String>,
}

/// The body, when the decider asked for it.
#[derive(Debug, Serialize)]
pub struct Body {
    /// The bytes shown, in base64.
    pub base64: String,
    /// Bytes sent (at most `need_body_max`).
    pub bytes: usize,
    /// The body is longer than what is sent.
    pub truncated: bool,
}

/// One question to the decider.
#[derive(Debug, Serialize)]
pub struct Ask {
    /// The protocol version ([`VERSION`]).
    pub version: u32,
    /// The sandbox asking.
    pub sandbox: String,
    /// How the sandbox was identified: `token` or `source`.
    pub identity: &'static str,
    /// `connect` (a tunnel or transparent connection, host level), `http` (a forwarded
    /// plain-HTTP request), `https` (a request inside a terminated tunnel).
    pub protocol: &'static str,
    /// Where it goes.
    pub target: Target,
    /// The request's method, for a request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request's path, for a request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Lower-case names; repeated headers joined with `, `; credentials never included.
    pub headers: BTreeMap<String, String>,
    /// What the policy decided.
    pub policy: Policy,
    /// The body, when the decider asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Body>,
}

/// The decider's answer, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnswer {
    verdict: String,
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    set_headers: BTreeMap<String, String>,
    #[serde(default)]
    remove_headers: Vec<String>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
}

/// Header changes an `allow` asks for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Edits {
    /// Headers to set on the request.
    pub set: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Headers to remove from it.
    pub remove: Vec<http::HeaderName>,
}

impl Edits {
    /// Whether the answer changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// What the decider said.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Allow, with these edits to the request.
    Allow(Edits),
    /// Deny, with the status and reason to answer with.
    Deny {
        /// The status answered (4xx).
        status: u16,
        /// The reason shown to the client.
        reason: String,
    },
    /// Ask again with the body.
    NeedBody,
}

/// Read an answer; `protected` are further header names it may not touch (the credentials'
/// own headers). `Err` says what is wrong with it.
pub fn read(body: &[u8], protected: &[&str]) -> Result<Answer, DeciderError> {
    let raw: RawAnswer = serde_json::from_slice(body).map_err(DeciderError::NotJson)?;
    if raw.version.is_some_and(|v| v != VERSION) {
        return Err(bad_answer(format!(
            "the answer is of protocol version {:?}, not {VERSION}",
            raw.version
        )));
    }
    let touchable = |n: &str| -> Result<http::HeaderName, DeciderError> {
        let name = http::HeaderName::from_bytes(n.as_bytes())
            .map_err(|e| bad_answer(worded(format!("`{n}` is not a header name"), e)))?;
        let s = name.as_str();
        if NOT_ITS_TO_TOUCH.contains(&s) || NEVER_SENT.contains(&s) || protected.contains(&s) {
            return Err(bad_answer(format!(
                "header `{s}` is not the decider's to touch"
            )));
        }
        Ok(name)
    };
    match raw.verdict.as_str() {
        "allow" => {
            let mut edits = Edits::default();
            for (n, v) in &raw.set_headers {
                let value = http::HeaderValue::from_str(v).map_err(|e| {
                    bad_answer(worded(
                        format!("the value of `{n}` is not a header value"),
                        e,
                    ))
                })?;
                edits.set.push((touchable(n)?, value));
            }
            for n in &raw.remove_headers {
                edits.remove.push(touchable(n)?);
            }
            Ok(Answer::Allow(edits))
        }
        "deny" => {
            let status = raw.status.unwrap_or(403);
            if !(400..=499).contains(&status) {
                return Err(bad_answer(format!(
                    "a deny's status must be 4xx, not {status}"
                )));
            }
            let reason: String = raw
                .reason
                .unwrap_or_else(|| "no reason given".into())
                .chars()
                .filter(|c| !c.is_control())
                .take(200)
                .collect();
            Ok(Answer::Deny { status, reason })
        }
        "need_body" => Ok(Answer::NeedBody),
        v => Err(bad_answer(format!(
            "verdict `{v}` is not allow, deny or need_body"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema forbids what the proxy refuses (clients review F10: it accepted
    /// `set_headers: {"Content-Length": "1"}`): its pattern for header names is this code's two
    /// lists, in any case.
    #[test]
    fn the_schema_forbids_the_headers_the_proxy_refuses() {
        let any_case = |name: &str| -> String {
            name.chars()
                .map(|c| match c.is_ascii_alphabetic() {
                    true => format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase()),
                    false => c.to_string(),
                })
                .collect()
        };
        let names: Vec<String> = NOT_ITS_TO_TOUCH
            .iter()
            .chain(NEVER_SENT)
            .map(|n| any_case(n))
            .collect();
        let pattern = format!("^({})$", names.join("|"));
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/decider.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let answer = &schema["$defs"]["Answer"]["properties"];
        assert_eq!(
            answer["set_headers"]["propertyNames"]["not"]["pattern"],
            pattern
        );
        assert_eq!(answer["remove_headers"]["items"]["not"]["pattern"], pattern);
    }

    #[test]
    fn answers_are_read_strictly() {
        assert_eq!(
            read(br#"{"verdict":"allow"}"#, &[]).ok(),
            Some(Answer::Allow(Edits::default()))
        );
        let Ok(Answer::Allow(e)) = read(
            br#"{"verdict":"allow","set_headers":{"x-team":"a"},"remove_headers":["x-debug"]}"#,
            &[],
        ) else {
            panic!("not read")
        };
        assert_eq!((e.set.len(), e.remove.len()), (1, 1));
        assert_eq!(
            read(br#"{"verdict":"deny","status":451,"reason":"no"}"#, &[]).ok(),
            Some(Answer::Deny {
                status: 451,
                reason: "no".into()
            })
        );
        assert_eq!(
            read(br#"{"verdict":"need_body"}"#, &[]).ok(),
            Some(Answer::NeedBody)
        );
        // A parse failure keeps serde's error as its source; the words read are unchanged.
        let e = read(b"{", &[]).unwrap_err();
        assert!(
            e.to_string().starts_with("the answer is not a verdict: "),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        for bad in [
            &br#"{"verdict":"maybe"}"#[..],
            br#"{"verdict":"allow","extra":1}"#,
            br#"{"verdict":"allow","set_headers":{"content-length":"1"}}"#,
            br#"{"verdict":"allow","remove_headers":["authorization"]}"#,
            br#"{"verdict":"deny","status":200}"#,
            br#"{"verdict":"allow","version":2}"#,
            b"not json",
            b"",
        ] {
            assert!(read(bad, &[]).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(read(
            br#"{"verdict":"allow","set_headers":{"x-api-token":"t"}}"#,
            &["x-api-token"]
        )
        .is_err());
    }
}
