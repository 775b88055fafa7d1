//! The decision value: a verdict, one closed [`Reason`] and the rule that decided. The same
//! reason drives the deny response (status, `Proxy-Status`), the audit record and the metric
//! label, so it is a closed enum with fixed string codes.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use super::Rule;

/// What happens to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
    /// Report mode: the policy would deny, the connection proceeds and is recorded.
    Report,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Report => "report",
        }
    }

    /// Whether the connection may go ahead.
    pub fn proceeds(self) -> bool {
        !matches!(self, Verdict::Deny)
    }
}

/// Every reason a connection was allowed or refused (DESIGN §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Allowed: a rule of `network.egress` matched.
    RuleMatched,
    /// Allowed: `network.mode: allow-all`.
    AllowAllMode,
    NoRuleMatched,
    DeniedByRule,
    DenyAllMode,
    PortNotAllowed,
    DestinationIpProhibited,
    ProxyLoop,
    InvalidTarget,
    AuthRequired,
    AuthFailed,
    UnknownSandbox,
    RateLimited,
    ConnectionLimit,
    DnsError,
    DestinationNotFound,
    DnsTimeout,
    ConnectionTimeout,
    ConnectionRefused,
    /// Transparent mode with `strict_sni_dst`: the client's original destination is not an
    /// address of the name it sent (SNI / Host).
    DestinationMismatch,
}

impl Reason {
    /// Every reason, for exhaustive tests and metric pre-registration.
    pub const ALL: [Reason; 20] = [
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
    ];

    /// The stable code used in audit records, metrics and `Proxy-Status` details.
    pub fn code(self) -> &'static str {
        match self {
            Reason::RuleMatched => "rule_matched",
            Reason::AllowAllMode => "allow_all_mode",
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
        }
    }

    /// HTTP status of the deny response on the explicit proxy.
    pub fn status(self) -> u16 {
        match self {
            Reason::RuleMatched | Reason::AllowAllMode => 200,
            Reason::NoRuleMatched
            | Reason::DeniedByRule
            | Reason::DenyAllMode
            | Reason::PortNotAllowed
            | Reason::DestinationIpProhibited
            | Reason::DestinationMismatch
            | Reason::ProxyLoop => 403,
            Reason::InvalidTarget => 400,
            Reason::AuthRequired | Reason::AuthFailed | Reason::UnknownSandbox => 407,
            Reason::RateLimited | Reason::ConnectionLimit => 429,
            Reason::DnsError | Reason::DestinationNotFound | Reason::ConnectionRefused => 502,
            Reason::DnsTimeout | Reason::ConnectionTimeout => 504,
        }
    }

    /// The RFC 9209 `Proxy-Status` error type.
    pub fn proxy_status_error(self) -> &'static str {
        match self {
            Reason::RuleMatched | Reason::AllowAllMode => "",
            Reason::NoRuleMatched
            | Reason::DeniedByRule
            | Reason::DenyAllMode
            | Reason::PortNotAllowed
            | Reason::AuthRequired
            | Reason::AuthFailed
            | Reason::UnknownSandbox => "http_request_denied",
            Reason::DestinationIpProhibited | Reason::DestinationMismatch => {
                "destination_ip_prohibited"
            }
            Reason::ProxyLoop => "proxy_loop_detected",
            Reason::InvalidTarget => "http_request_error",
            Reason::RateLimited | Reason::ConnectionLimit => "connection_limit_reached",
            Reason::DnsError => "dns_error",
            Reason::DestinationNotFound => "destination_not_found",
            Reason::DnsTimeout => "dns_timeout",
            Reason::ConnectionTimeout => "connection_timeout",
            Reason::ConnectionRefused => "connection_refused",
        }
    }

    /// Whether report mode may let this refusal through: only allowlist decisions, never
    /// identity, the address guard, malformed targets or operational failures.
    pub fn reportable(self) -> bool {
        matches!(
            self,
            Reason::NoRuleMatched
                | Reason::DeniedByRule
                | Reason::DenyAllMode
                | Reason::PortNotAllowed
        )
    }

    /// Whether this reason means the connection was allowed.
    pub fn is_allow(self) -> bool {
        matches!(self, Reason::RuleMatched | Reason::AllowAllMode)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The outcome of a policy decision.
#[derive(Debug, Clone)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: Reason,
    /// The rule that allowed or refused, when one did.
    pub rule: Option<Arc<Rule>>,
}

impl Decision {
    pub fn allow(reason: Reason, rule: Option<Arc<Rule>>) -> Self {
        Decision {
            verdict: Verdict::Allow,
            reason,
            rule,
        }
    }

    pub fn deny(reason: Reason, rule: Option<Arc<Rule>>) -> Self {
        Decision {
            verdict: Verdict::Deny,
            reason,
            rule,
        }
    }
}

impl Decision {
    /// One sentence for a person or an agent: what decided, and which file/rule to change.
    pub fn explain(&self, sandbox: &str, file: &str, port: u16) -> String {
        let rule = |r: &Option<Arc<Rule>>| {
            r.as_ref()
                .map(|r| format!("`{}` ({})", r.text, r.source))
                .unwrap_or_else(|| "(none)".into())
        };
        match self.reason {
            Reason::RuleMatched => match &self.rule {
                Some(_) => format!("allowed by rule {}", rule(&self.rule)),
                None => format!("allowed by network.egress of sandbox {sandbox} ({file})"),
            },
            Reason::AllowAllMode => format!("allowed: sandbox {sandbox} has network.mode allow-all ({file})"),
            Reason::NoRuleMatched => format!("not in network.egress of sandbox {sandbox} ({file})"),
            Reason::DeniedByRule => format!("denied by rule {}", rule(&self.rule)),
            Reason::DenyAllMode => {
                format!("sandbox {sandbox} has no egress (network.mode deny-all, or no network.egress) ({file})")
            }
            Reason::PortNotAllowed => match &self.rule {
                Some(r) => format!(
                    "port {port} is not allowed: rule `{}` allows port(s) {} ({}); name the port in the entry, e.g. `{}:{port}`",
                    r.text, r.ports, r.source, r.text.split(':').next().unwrap_or(&r.text)
                ),
                None => format!("port {port} is not allowed by network.egress of sandbox {sandbox} ({file})"),
            },
            Reason::DestinationIpProhibited => format!(
                "the destination resolves only to prohibited addresses (private, loopback, link-local/metadata or reserved); \
                 to reach a private service, add an address rule for it to network.egress of sandbox {sandbox} ({file})"
            ),
            Reason::ProxyLoop => "the destination is this proxy itself".into(),
            Reason::InvalidTarget => "the target is not a valid host name or canonical IP literal with a port".into(),
            Reason::AuthRequired => "no sandbox identity: send Proxy-Authorization: Basic (sandbox id and token)".into(),
            Reason::AuthFailed => "wrong sandbox id or token".into(),
            Reason::UnknownSandbox => format!("no sandbox `{sandbox}` is configured"),
            Reason::RateLimited => format!("sandbox {sandbox} is opening connections faster than its limit"),
            Reason::ConnectionLimit => format!("sandbox {sandbox} has too many open connections"),
            Reason::DnsError => "the proxy's resolver failed".into(),
            Reason::DestinationNotFound => "the name does not exist or has no addresses".into(),
            Reason::DnsTimeout => "the proxy's resolver timed out".into(),
            Reason::ConnectionTimeout => "connecting to the destination timed out".into(),
            Reason::ConnectionRefused => "the destination refused the connection".into(),
            Reason::DestinationMismatch => format!(
                "the connection's original destination is not an address of the name it asked for (strict_sni_dst of sandbox {sandbox})"
            ),
        }
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
