//! The decision value: a verdict, one closed [`Reason`] and the rule that decided, and the
//! one-sentence explanation a person or an agent reads.

use std::sync::Arc;

use serde::Serialize;

use super::Rule;
pub use crate::policy::reason::Reason;

/// What happens to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The exchange may go on.
    Allow,
    /// The exchange is refused.
    Deny,
    /// Report mode: the policy would deny, the connection proceeds and is recorded.
    Report,
}

impl Verdict {
    /// The name written in records and metrics (`allow`, `deny`, `report`).
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

/// The outcome of a policy decision.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Allowed, refused, or reported (report mode).
    pub verdict: Verdict,
    /// Why: the one closed reason that drives the status, the record and the metric.
    pub reason: Reason,
    /// The rule that allowed or refused, when one did.
    pub rule: Option<Arc<Rule>>,
}

impl Decision {
    /// An allowing decision for `reason`, by `rule` when one matched.
    pub fn allow(reason: Reason, rule: Option<Arc<Rule>>) -> Self {
        Decision {
            verdict: Verdict::Allow,
            reason,
            rule,
        }
    }

    /// A refusing decision for `reason`, by `rule` when one matched.
    pub fn deny(reason: Reason, rule: Option<Arc<Rule>>) -> Self {
        Decision {
            verdict: Verdict::Deny,
            reason,
            rule,
        }
    }
}

impl Decision {
    /// Whether a connection to `target` allowed by this decision may carry a protocol the
    /// proxy cannot read (opaque TCP): the target is an address, or the rule that allowed it
    /// names its port or is an address rule.
    pub fn allows_opaque(&self, target: &crate::policy::target::Target) -> bool {
        matches!(target.host, crate::policy::target::Host::Ip(_))
            || self.rule.as_ref().is_some_and(|r| r.allows_opaque)
    }

    /// `process_not_allowed`: the scoped entry (or the host's scoped http rules) that would
    /// allow the destination to other processes.
    fn process_refusal(&self, sandbox: &str, file: &str) -> String {
        match &self.rule {
            Some(r) => format!(
                "{} ({}) allows this destination only to the processes its scope names, and this connection's process is not one of them",
                r.text, r.source
            ),
            None => format!(
                "the network.http rules of sandbox {sandbox} for this host apply only to the processes their scopes name, and this connection's process is not one of them ({file})"
            ),
        }
    }

    /// `outside_ceiling`: the layer whose ceiling the destination is outside of.
    fn ceiling_refusal(&self, sandbox: &str) -> String {
        match &self.rule {
            Some(r) => format!(
                "outside the ceiling of {} (it allows only {}): sandbox {sandbox}'s own entries and grants cannot reach beyond its layers",
                r.source, r.text
            ),
            None => format!("outside a ceiling of the layers of sandbox {sandbox}"),
        }
    }

    /// One sentence for a person or an agent: what decided, and which file/rule to change.
    pub fn explain(&self, sandbox: &str, file: &str, port: u16) -> String {
        let said = fixed(self.reason);
        if !said.is_empty() {
            return said.into();
        }
        let rule = shown_rule;
        match self.reason {
            Reason::RuleMatched => match &self.rule {
                Some(_) => format!("allowed by rule {}", rule(&self.rule)),
                None => format!("allowed by network.egress of sandbox {sandbox} ({file})"),
            },
            Reason::AllowAllMode => format!("allowed: sandbox {sandbox} has network.mode allow-all ({file})"),
            Reason::GrantMatched => format!("allowed by {}", rule(&self.rule)),
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
                 to reach a private service, allow its name in network.egress of sandbox {sandbox} ({file}) and its range in \
                 defaults.guard_allow_ranges (an address rule instead would allow every name that resolves into the range)"
            ),
            Reason::RateLimited => format!("sandbox {sandbox} is opening connections faster than its limit"),
            Reason::ConnectionLimit => format!("sandbox {sandbox} has too many open connections"),
            Reason::QuotaExceeded => format!(
                "sandbox {sandbox} has spent a daily quota (limits.bytes_per_day or limits.requests_per_day) until midnight UTC"
            ),
            Reason::ProtocolNotAllowed => format!(
                "the tunnel did not carry what its port requires (TLS on require_tls_ports, no ECH with refuse_ech) for sandbox {sandbox} ({file})"
            ),
            Reason::DestinationMismatch => format!(
                "the connection's original destination is not an address of the name it asked for (strict_sni_dst of sandbox {sandbox})"
            ),
            Reason::CredentialMisuse => format!(
                "the request carries a credential placeholder of sandbox {sandbox} to a host the credential is not bound to (or over plain HTTP) ({file})"
            ),
            Reason::ProcessNotAllowed => self.process_refusal(sandbox, file),
            Reason::OutsideCeiling => self.ceiling_refusal(sandbox),
            Reason::HttpNotAllowed => format!(
                "no network.http rule of sandbox {sandbox} allows this method and path on this host ({file})"
            ),
            r @ (Reason::McpNotAllowed
            | Reason::JsonRpcNotAllowed
            | Reason::GraphQlNotAllowed
            | Reason::WebSocketNotAllowed
            | Reason::InferenceNotAllowed
            | Reason::GitNotAllowed) => format!(
                "the {} rule of sandbox {sandbox} does not allow this call (its tool, method, operation or service), or the body is not one it can read ({file})",
                r.code().trim_end_matches("_not_allowed")
            ),
            Reason::UnrecognisedProtocol => format!(
                "the connection's first bytes are neither a TLS ClientHello nor a complete, unambiguous HTTP/1.x request, and no rule of sandbox {sandbox} allows another protocol there: name the port in the entry (`host:{port}`) or use an address rule ({file})"
            ),
            // Said by `fixed` (a test holds every reason to a sentence).
            _ => String::new(),
        }
    }
}

/// A rule as an explanation names it: `` `text` (source) ``.
fn shown_rule(r: &Option<Arc<Rule>>) -> String {
    r.as_ref()
        .map(|r| format!("`{}` ({})", r.text, r.source))
        .unwrap_or_else(|| "(none)".into())
}

/// The explanations that name neither sandbox nor file.
fn fixed(r: Reason) -> &'static str {
    match r {
        Reason::BudgetExceeded => "a daily token or cost budget of the sandbox (limits.tokens_per_day or limits.cost_per_day, its own or a per_destination one) is spent until midnight UTC, or the call's model has no price under a cost budget",
        Reason::UpstreamProxyRefused => {
            "the parent proxy (upstream_proxy) refused the tunnel after this proxy allowed it"
        }
        Reason::MalformedRequest => "the request could not be read as sent (a malformed body)",
        Reason::UnscannableResponse => "the upstream answered with a compressed or otherwise encoded body although identity was asked; it cannot be scanned for the credentials brokered to it, so it is not passed",
        Reason::CredentialUnavailable => "a credential this host needs could not be minted (its token endpoint refused or did not answer); the request was not sent without it",
        Reason::DeniedByDecider => "the decider this sandbox is bound to refused it (its reason is in the record's detail)",
        Reason::DeciderUnavailable => "the decider did not answer in time, was unreachable or busy, or answered what cannot be read; decider.on_error is deny",
        Reason::DlpBlocked => "the request body carries what a dlp rule of this sandbox looks for (the rule is named in the record)",
        Reason::FlowRefused => "a flow rule of this sandbox (network.flows) refuses it: a label an earlier response armed forbids it (the rule, the label and the arming request are in the record's detail); a person may waive the label (egress-proxy flows waive)",
        Reason::AuditUnavailable => "the audit trail cannot be written right now, and nothing is served that could not be recorded (audit.on_failure: refuse)",
        Reason::ProxyEndpoint => "answered by the proxy itself (egress-proxy.local)",
        Reason::ProxyLoop => "the destination is this proxy itself",
        Reason::InvalidTarget => "the target is not a valid host name or canonical IP literal with a port",
        Reason::AuthRequired => "no sandbox identity: send Proxy-Authorization: Basic (sandbox id and token)",
        Reason::AuthFailed => "wrong sandbox id or token",
        Reason::UnknownSandbox => "the sandbox id in Proxy-Authorization is not configured",
        Reason::DnsError => "the proxy's resolver failed",
        Reason::DestinationNotFound => "the name does not exist or has no addresses",
        Reason::DnsTimeout => "the proxy's resolver timed out",
        Reason::ConnectionTimeout => "connecting to the destination timed out",
        Reason::ConnectionRefused => "the destination refused the connection",
        Reason::SniMismatch => "the TLS ClientHello names another host than the CONNECT target (domain fronting is refused)",
        Reason::HostMismatch => "the HTTP request's Host names another host than the connection was allowed for",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason explains itself in a sentence: a new reason said neither by `fixed` nor by
    /// `explain` fails here.
    #[test]
    fn every_reason_has_a_sentence() {
        for r in Reason::ALL {
            let why = Decision::deny(r, None).explain("agent1", "policy.yaml", 443);
            assert!(!why.is_empty(), "{r:?}");
        }
    }

    /// The hint for a refused private address leads to the safe fix — the name allowed, its
    /// range opened in the guard — and away from an address rule, which would allow every
    /// name that resolves into the range.
    #[test]
    fn a_refused_private_address_points_to_a_name_rule_and_the_guard_ranges() {
        let why = Decision::deny(Reason::DestinationIpProhibited, None).explain(
            "agent1",
            "policy.yaml",
            5432,
        );
        assert!(
            why.contains("allow its name in network.egress of sandbox agent1"),
            "{why}"
        );
        assert!(why.contains("defaults.guard_allow_ranges"), "{why}");
        assert!(!why.contains("add an address rule"), "{why}");
    }
}
