//! The closed set of reasons a connection was allowed or refused (DESIGN §6). One reason
//! drives the deny response (status, `Proxy-Status`), the audit record's `reason` and the
//! metric label, so it is a closed enum with fixed string codes. It depends on nothing.

use std::fmt;

use serde::Serialize;

/// Every reason a connection was allowed or refused (DESIGN §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Allowed: a rule of `network.egress` matched.
    RuleMatched,
    /// Allowed: `network.mode: allow-all`.
    AllowAllMode,
    /// Allowed: a grant approved at run time (an access request's answer).
    GrantMatched,
    /// Answered by the proxy itself: a request to `egress-proxy.local` (access requests,
    /// denials), never resolved or dialled.
    ProxyEndpoint,
    /// No allowlist entry matched.
    NoRuleMatched,
    /// A `network.deny` entry matched.
    DeniedByRule,
    /// The sandbox's mode is deny-all.
    DenyAllMode,
    /// The name is allowed, on other ports.
    PortNotAllowed,
    /// The address guard refused every address.
    DestinationIpProhibited,
    /// The destination is the proxy itself.
    ProxyLoop,
    /// The target is not a valid host and port.
    InvalidTarget,
    /// No credential identified the sandbox.
    AuthRequired,
    /// The credential presented is not valid.
    AuthFailed,
    /// The credential names no sandbox in force.
    UnknownSandbox,
    /// The sandbox's (or the source's) connection rate was exceeded.
    RateLimited,
    /// The sandbox's (or the proxy's) connection cap was reached.
    ConnectionLimit,
    /// The resolver failed.
    DnsError,
    /// The name does not exist (or has no address).
    DestinationNotFound,
    /// The resolver did not answer in time.
    DnsTimeout,
    /// The destination did not accept in time.
    ConnectionTimeout,
    /// The destination refused the connection.
    ConnectionRefused,
    /// Transparent mode with `strict_sni_dst`: the client's original destination is not an
    /// address of the name it sent (SNI / Host).
    DestinationMismatch,
    /// A tunnel's first bytes are not what its port requires (TLS on `require_tls_ports`), or
    /// its ClientHello carries ECH and the sandbox has `refuse_ech`.
    ProtocolNotAllowed,
    /// A tunnel's TLS ClientHello names another host (or none) than its `CONNECT` target.
    SniMismatch,
    /// A plain-HTTP request in a tunnel or on a transparent connection names another host
    /// than the one the connection was decided for.
    HostMismatch,
    /// A credential's placeholder on a request to a host the credential is not bound to (or
    /// a bound host over plain HTTP).
    CredentialMisuse,
    /// On a terminated host, no `network.http` rule allows the request's method and path
    /// (or the method is TRACE).
    HttpNotAllowed,
    /// On a terminated host, a `protocol: mcp` rule refuses the MCP call (a tool, resource,
    /// prompt or method outside its lists), or the body is not MCP it can read.
    McpNotAllowed,
    /// A `protocol: jsonrpc` rule refuses a method, or the body is not JSON-RPC 2.0.
    #[serde(rename = "jsonrpc_not_allowed")]
    JsonRpcNotAllowed,
    /// A `protocol: graphql` rule refuses an operation (kind, name, root field, persisted
    /// query), or the body is not a GraphQL request it can parse.
    #[serde(rename = "graphql_not_allowed")]
    GraphQlNotAllowed,
    /// A `protocol: websocket` rule refuses a message (outside its `messages`, a binary frame
    /// it refuses, over its size cap, control frames too fast), or no such rule allows the
    /// upgrade to a WebSocket.
    #[serde(rename = "websocket_not_allowed")]
    WebSocketNotAllowed,
    /// A git rule refuses the smart-HTTP service or the Git LFS batch operation.
    GitNotAllowed,
    /// The parent proxy (`upstream_proxy`) refused the tunnel after this proxy allowed it
    /// (its status is in the record's detail).
    UpstreamProxyRefused,
    /// The audit trail cannot take the record (its sink fails, or `queue_max` records wait):
    /// nothing is served that could not be recorded (`audit.on_failure: refuse`).
    AuditUnavailable,
    /// A terminated host answered with a body the secret scanner cannot read (a
    /// `Content-Encoding` although `identity` was asked): it is not passed.
    UnscannableResponse,
    /// A credential the request needs could not be had: its token endpoint refused or did
    /// not answer (the request is not sent without it).
    CredentialUnavailable,
    /// The decider (`decider:`) refused the exchange.
    DeniedByDecider,
    /// The decider did not answer within its time, was down, busy or answered what cannot be
    /// read (`decider.on_error: deny`).
    DeciderUnavailable,
    /// A `dlp` rule found what it looks for in the request body.
    DlpBlocked,
    /// The first bytes of a connection decided by name are neither a ClientHello nor a
    /// complete, unambiguous HTTP/1.x request head, and no rule allows opaque TCP there (an
    /// entry written `tcp://host:port`, or an address rule).
    UnrecognisedProtocol,
    /// A forwarded request could not be read as the client sent it (a malformed body): the
    /// client's fault, answered 400.
    MalformedRequest,
    /// A daily quota of the sandbox (`limits.bytes_per_day`, `limits.requests_per_day`) is
    /// spent: new exchanges are refused and the one that crossed it is cut.
    QuotaExceeded,
    /// A `protocol: openai | anthropic | gemini` rule refuses the call: a model outside its
    /// `models`, a provider-run web tool the sandbox's policy does not bound, or a body it
    /// cannot read.
    InferenceNotAllowed,
    /// A token or cost budget of the sandbox (`limits.tokens_per_day`, `cost_per_day`, its
    /// own or a `per_destination` one) is spent, or would be by the call's reservation.
    BudgetExceeded,
    /// The destination is allowed only to some processes (a `network.scoped` entry, a
    /// `network.http` rule with `binaries:` or `execs:`), and this connection's process is
    /// not one of them or could not be named.
    ProcessNotAllowed,
    /// The sandbox's own policy (or a grant) allows the destination, but it lies outside the
    /// ceiling of a layer the sandbox is a member of (`layers:`): layers only narrow.
    OutsideCeiling,
    /// A flow rule (`network.flows`) refuses the request: a label the sandbox carries (armed
    /// by an earlier response from a labelled destination) forbids it — a write after
    /// `private`, a read of `private` after `untrusted`.
    FlowRefused,
}

impl Reason {
    /// Every reason, for exhaustive tests and metric pre-registration.
    pub const ALL: [Reason; 47] = [
        Reason::FlowRefused,
        Reason::OutsideCeiling,
        Reason::ProcessNotAllowed,
        Reason::InferenceNotAllowed,
        Reason::BudgetExceeded,
        Reason::QuotaExceeded,
        Reason::WebSocketNotAllowed,
        Reason::McpNotAllowed,
        Reason::JsonRpcNotAllowed,
        Reason::GraphQlNotAllowed,
        Reason::GitNotAllowed,
        Reason::ProxyEndpoint,
        Reason::GrantMatched,
        Reason::MalformedRequest,
        Reason::UnrecognisedProtocol,
        Reason::UnscannableResponse,
        Reason::CredentialUnavailable,
        Reason::DeniedByDecider,
        Reason::DeciderUnavailable,
        Reason::DlpBlocked,
        Reason::AuditUnavailable,
        Reason::UpstreamProxyRefused,
        Reason::CredentialMisuse,
        Reason::HttpNotAllowed,
        Reason::RuleMatched,
        Reason::AllowAllMode,
        Reason::NoRuleMatched,
        Reason::DeniedByRule,
        Reason::DenyAllMode,
        Reason::PortNotAllowed,
        Reason::DestinationIpProhibited,
        Reason::ProxyLoop,
        Reason::InvalidTarget,
        Reason::AuthRequired,
        Reason::AuthFailed,
        Reason::UnknownSandbox,
        Reason::RateLimited,
        Reason::ConnectionLimit,
        Reason::DnsError,
        Reason::DestinationNotFound,
        Reason::DnsTimeout,
        Reason::ConnectionTimeout,
        Reason::ConnectionRefused,
        Reason::DestinationMismatch,
        Reason::ProtocolNotAllowed,
        Reason::SniMismatch,
        Reason::HostMismatch,
    ];

    /// The stable code used in audit records, metrics and `Proxy-Status` details.
    pub fn code(self) -> &'static str {
        match self {
            Reason::RuleMatched => "rule_matched",
            Reason::AllowAllMode => "allow_all_mode",
            Reason::GrantMatched => "grant_matched",
            Reason::ProxyEndpoint => "proxy_endpoint",
            Reason::NoRuleMatched => "no_rule_matched",
            Reason::DeniedByRule => "denied_by_rule",
            Reason::DenyAllMode => "deny_all_mode",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::DestinationIpProhibited => "destination_ip_prohibited",
            Reason::ProxyLoop => "proxy_loop",
            Reason::InvalidTarget => "invalid_target",
            Reason::AuthRequired => "auth_required",
            Reason::AuthFailed => "auth_failed",
            Reason::UnknownSandbox => "unknown_sandbox",
            Reason::RateLimited => "rate_limited",
            Reason::ConnectionLimit => "connection_limit",
            Reason::DnsError => "dns_error",
            Reason::DestinationNotFound => "destination_not_found",
            Reason::DnsTimeout => "dns_timeout",
            Reason::ConnectionTimeout => "connection_timeout",
            Reason::ConnectionRefused => "connection_refused",
            Reason::DestinationMismatch => "destination_mismatch",
            Reason::ProtocolNotAllowed => "protocol_not_allowed",
            Reason::SniMismatch => "sni_mismatch",
            Reason::HostMismatch => "host_mismatch",
            Reason::CredentialMisuse => "credential_misuse",
            Reason::FlowRefused => "flow_refused",
            Reason::HttpNotAllowed => "http_not_allowed",
            Reason::McpNotAllowed => "mcp_not_allowed",
            Reason::JsonRpcNotAllowed => "jsonrpc_not_allowed",
            Reason::GraphQlNotAllowed => "graphql_not_allowed",
            Reason::WebSocketNotAllowed => "websocket_not_allowed",
            Reason::GitNotAllowed => "git_not_allowed",
            Reason::UpstreamProxyRefused => "upstream_proxy_refused",
            Reason::AuditUnavailable => "audit_unavailable",
            Reason::UnscannableResponse => "unscannable_response",
            Reason::CredentialUnavailable => "credential_unavailable",
            Reason::DeniedByDecider => "denied_by_decider",
            Reason::DeciderUnavailable => "decider_unavailable",
            Reason::DlpBlocked => "dlp_blocked",
            Reason::UnrecognisedProtocol => "unrecognised_protocol",
            Reason::MalformedRequest => "malformed_request",
            Reason::QuotaExceeded => "quota_exceeded",
            Reason::InferenceNotAllowed => "inference_not_allowed",
            Reason::BudgetExceeded => "budget_exceeded",
            Reason::ProcessNotAllowed => "process_not_allowed",
            Reason::OutsideCeiling => "outside_ceiling",
        }
    }

    /// HTTP status of the deny response on the explicit proxy.
    pub fn status(self) -> u16 {
        match self {
            Reason::RuleMatched
            | Reason::AllowAllMode
            | Reason::GrantMatched
            | Reason::ProxyEndpoint => 200,
            Reason::NoRuleMatched
            | Reason::DeniedByRule
            | Reason::DenyAllMode
            | Reason::PortNotAllowed
            | Reason::DestinationIpProhibited
            | Reason::DestinationMismatch
            | Reason::ProtocolNotAllowed
            | Reason::SniMismatch
            | Reason::HostMismatch
            | Reason::CredentialMisuse
            | Reason::InferenceNotAllowed
            | Reason::ProcessNotAllowed
            | Reason::OutsideCeiling
            | Reason::FlowRefused
            | Reason::HttpNotAllowed
            | Reason::McpNotAllowed
            | Reason::JsonRpcNotAllowed
            | Reason::GraphQlNotAllowed
            | Reason::WebSocketNotAllowed
            | Reason::GitNotAllowed
            | Reason::UnrecognisedProtocol
            | Reason::ProxyLoop => 403,
            Reason::InvalidTarget | Reason::MalformedRequest => 400,
            Reason::AuthRequired | Reason::AuthFailed | Reason::UnknownSandbox => 407,
            Reason::RateLimited | Reason::ConnectionLimit | Reason::QuotaExceeded => 429,
            Reason::BudgetExceeded => 429,
            Reason::DnsError
            | Reason::DestinationNotFound
            | Reason::ConnectionRefused
            | Reason::UpstreamProxyRefused => 502,
            Reason::DnsTimeout | Reason::ConnectionTimeout => 504,
            Reason::AuditUnavailable => 503,
            Reason::UnscannableResponse => 502,
            Reason::CredentialUnavailable | Reason::DeciderUnavailable => 503,
            Reason::DeniedByDecider | Reason::DlpBlocked => 403,
        }
    }

    /// The RFC 9209 `Proxy-Status` error type.
    pub fn proxy_status_error(self) -> &'static str {
        match self {
            Reason::RuleMatched
            | Reason::AllowAllMode
            | Reason::GrantMatched
            | Reason::ProxyEndpoint => "",
            Reason::NoRuleMatched
            | Reason::DeniedByRule
            | Reason::DenyAllMode
            | Reason::PortNotAllowed
            | Reason::AuthRequired
            | Reason::AuthFailed
            | Reason::UnknownSandbox
            | Reason::ProtocolNotAllowed
            | Reason::SniMismatch
            | Reason::HostMismatch
            | Reason::CredentialMisuse
            | Reason::UnrecognisedProtocol
            | Reason::HttpNotAllowed
            | Reason::McpNotAllowed
            | Reason::JsonRpcNotAllowed
            | Reason::GraphQlNotAllowed
            | Reason::WebSocketNotAllowed
            | Reason::InferenceNotAllowed
            | Reason::ProcessNotAllowed
            | Reason::OutsideCeiling
            | Reason::FlowRefused
            | Reason::GitNotAllowed => "http_request_denied",
            Reason::DestinationIpProhibited | Reason::DestinationMismatch => {
                "destination_ip_prohibited"
            }
            Reason::ProxyLoop => "proxy_loop_detected",
            Reason::InvalidTarget | Reason::MalformedRequest => "http_request_error",
            Reason::RateLimited | Reason::ConnectionLimit | Reason::QuotaExceeded => {
                "connection_limit_reached"
            }
            Reason::BudgetExceeded => "http_request_denied",
            Reason::DnsError => "dns_error",
            Reason::DestinationNotFound => "destination_not_found",
            Reason::DnsTimeout => "dns_timeout",
            Reason::ConnectionTimeout => "connection_timeout",
            Reason::ConnectionRefused => "connection_refused",
            Reason::UpstreamProxyRefused => "destination_unavailable",
            Reason::AuditUnavailable => "proxy_internal_error",
            Reason::UnscannableResponse => "http_response_content_coding",
            Reason::CredentialUnavailable | Reason::DeciderUnavailable => "proxy_internal_error",
            Reason::DeniedByDecider | Reason::DlpBlocked => "http_request_denied",
        }
    }

    /// Whether report mode may let this refusal through: only allowlist decisions and what
    /// flows through a tunnel, never identity, the address guard, malformed targets or
    /// operational failures.
    pub fn reportable(self) -> bool {
        matches!(
            self,
            Reason::NoRuleMatched
                | Reason::DeniedByRule
                | Reason::DenyAllMode
                | Reason::PortNotAllowed
                | Reason::ProcessNotAllowed
                | Reason::ProtocolNotAllowed
                | Reason::SniMismatch
                | Reason::HostMismatch
                | Reason::UnrecognisedProtocol
                | Reason::DeniedByDecider
                | Reason::DeciderUnavailable
                | Reason::DlpBlocked
                | Reason::FlowRefused
        ) || self.refused_by_http_rule()
    }

    /// Whether a `network.http` rule refused the request or message (its method and path, a
    /// protocol's call, git, a WebSocket message).
    pub fn refused_by_http_rule(self) -> bool {
        matches!(
            self,
            Reason::HttpNotAllowed
                | Reason::McpNotAllowed
                | Reason::JsonRpcNotAllowed
                | Reason::GraphQlNotAllowed
                | Reason::WebSocketNotAllowed
                | Reason::InferenceNotAllowed
                | Reason::GitNotAllowed
        )
    }

    /// Whether this reason means the connection was allowed.
    pub fn is_allow(self) -> bool {
        matches!(
            self,
            Reason::RuleMatched
                | Reason::AllowAllMode
                | Reason::GrantMatched
                | Reason::ProxyEndpoint
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_statuses_follow_the_table() {
        let mut codes: Vec<_> = Reason::ALL.iter().map(|r| r.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Reason::ALL.len());
        for r in Reason::ALL {
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::json!(r.code())
            );
            if !r.is_allow() {
                assert!(r.status() >= 400, "{r}");
                assert!(!r.proxy_status_error().is_empty(), "{r}");
            }
        }
        assert_eq!(Reason::PortNotAllowed.status(), 403);
        assert_eq!(
            Reason::ProxyLoop.proxy_status_error(),
            "proxy_loop_detected"
        );
        assert_eq!(Reason::DnsTimeout.status(), 504);
        assert!(!Reason::DestinationIpProhibited.reportable());
        assert!(!Reason::AuthFailed.reportable());
        assert!(Reason::DenyAllMode.reportable());
    }
}
