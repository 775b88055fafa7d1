//! Protocols that judge a request's body and nothing after it, as plug-ins: each implements
//! [`BodyRule`] in its own module and is made by one line where rules are read
//! (`config/http_rules.rs`, [`super::Protocol::plugin`]); the pipeline's driver, its body phase
//! and the protocol enum name none of them. JSON-RPC method rules ([`super::jsonrpc`]) and the
//! form `_method` reader ([`super::form`]) are plug-ins. Protocols whose *answer* a later phase
//! reads — MCP (its lists filtered), the LLM providers (their usage metered), WebSocket (its
//! messages) — keep variants of their own, which those phases match.

use super::{Asked, BodyVerdict, RefusedCall};
use crate::policy::reason::Reason;

/// A protocol a `network.http` rule names, judging request bodies.
pub trait BodyRule: std::fmt::Debug + Send + Sync {
    /// The name written in rules and records (`jsonrpc`).
    fn name(&self) -> &'static str;
    /// The rule as text, every part that decides included (the policy version hashes it).
    fn describe(&self) -> String;
    /// The reason its refusals carry.
    fn reason(&self) -> Reason;
    /// Whether a request with `method` can be one of this protocol's (its body still to be
    /// judged).
    fn carries(&self, method: &str) -> bool;
    /// Judge a request and its body; the call it names is prefixed with [`BodyRule::name`] by
    /// the caller.
    fn judge(&self, asked: Asked<'_>, body: &[u8]) -> Result<BodyVerdict, RefusedCall>;
    /// Whether the rule's `methods:` are the protocol's own (JSON-RPC methods), not HTTP ones.
    fn takes_methods(&self) -> bool {
        false
    }
}

/// A refusal of `rule`'s.
pub fn refused(
    rule: &dyn BodyRule,
    detail: String,
    call: Option<String>,
    rpc: Option<(Vec<serde_json::Value>, bool)>,
) -> RefusedCall {
    RefusedCall {
        refusal: Box::new(crate::policy::refusal::Refusal::new(rule.reason(), detail)),
        call,
        rpc,
    }
}
