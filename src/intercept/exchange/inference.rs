//! An inference call on a terminated host (`protocol: openai | anthropic | gemini`), after the
//! body phase allowed it: its provider-run web tools bounded by the sandbox's own egress
//! policy, its tokens (and cost) reserved against every budget that applies, its answer read
//! for the usage the provider reports as it passes ([`Tapped`]), and the reservation settled
//! at that usage when the answer ends — with the record's `tokens` block. Refusals are in the
//! provider's own error shape so that its SDK raises them with the reason.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Response;
use http_body::Frame;
use http_body_util::BodyExt;

use super::prepared::Prepared;
use super::{Exchange, ResBody};
use crate::audit::record::TokenFacts;
use crate::audit::AuditGuard;
use crate::config::prices::{self, Price, TokenKinds};
use crate::egress::quota::{Reservation, NANO_USD};
use crate::pipeline::Refusal;
use crate::policy::protocols::inference::{Call, InferenceRule, Provider, WebTools};
use crate::policy::protocols::inference_usage::UsageReader;
use crate::policy::reason::Reason;
use crate::relay::deny;

/// One admitted call's accounting: what it reserved, and the reader of its answer.
pub(super) struct Metered {
    call: Box<Call>,
    prices: Vec<Price>,
    reservation: Option<Reservation>,
    reader: Arc<Mutex<Option<UsageReader>>>,
}

impl Exchange {
    /// The accounting of an allowed inference call, if the request is one (`Err`: refused,
    /// with the provider whose shape the refusal takes).
    pub(super) fn metered(
        &self,
        p: &Prepared,
        allowed: &mut crate::pipeline::body::Allowed,
        verdict: crate::policy::Verdict,
    ) -> Result<Option<Metered>, (Provider, Refusal)> {
        let Some(ic) = allowed.inference.take() else {
            return Ok(None);
        };
        // A call the rules refused in report mode goes on unmetered (and without credentials).
        if verdict != crate::policy::Verdict::Allow || ic.1.body_bytes == 0 {
            return Ok(None);
        }
        let provider = ic.1.provider;
        self.admit_call(p, ic).map(Some).map_err(|r| (provider, r))
    }

    /// A refused inference call, recorded, answered in its provider's shape.
    pub(super) fn refused_call_recorded(
        &self,
        mut audit: AuditGuard,
        asked: &super::Asked,
        provider: Provider,
        r: Refusal,
    ) -> Response<ResBody> {
        audit.verdict(crate::policy::Verdict::Deny, r.reason);
        audit.detail(r.detail.clone());
        audit.http(asked.facts(r.reason.status(), None));
        drop(audit);
        self.refused_inference(provider, &r)
    }

    /// Admit an allowed call: its web tools, then its reservation. `Err`: refused (the
    /// reservation is not taken).
    fn admit_call(
        &self,
        p: &Prepared,
        (rule, call): (Arc<InferenceRule>, Box<Call>),
    ) -> Result<Metered, Refusal> {
        if rule.web_tools == WebTools::Policy {
            for tool in &call.web {
                if let Some(why) = p.web_tool_refusal(tool) {
                    return Err(Refusal::new(Reason::InferenceNotAllowed, why));
                }
            }
        }
        if !call.reports_usage && self.live.budgeted() {
            return Err(Refusal::new(
                Reason::InferenceNotAllowed,
                "a streamed chat completion under a token or cost budget must ask for its usage (stream_options: { include_usage: true }): the proxy counts what the provider reports",
            ));
        }
        let prices = p.binding.limits.prices.clone();
        let model = call.model.as_deref().unwrap_or("");
        let estimate = TokenKinds {
            input: call.body_bytes.div_ceil(4),
            output: call.max_output.unwrap_or(0),
            ..TokenKinds::default()
        };
        let cost = prices::find(&prices, model).map(|p| p.cost(&estimate));
        let reservation = self.live.reserve_budget(call.estimate(), cost)?;
        Ok(Metered {
            call,
            prices,
            reservation: Some(reservation),
            reader: Arc::new(Mutex::new(None)),
        })
    }

    /// The LLM provider whose rules judge this host, when one does: every refusal here is
    /// then answered in that provider's error shape (an SDK shows its message), not only a
    /// refused call's — a path no rule allows (`models.list()`), a refused upgrade, an origin
    /// that cannot be reached.
    pub(super) fn provider_here(&self) -> Option<Provider> {
        let (binding, _) = (self.current)()?;
        crate::pipeline::head::provider_of(&binding, &self.dest.host)
    }

    /// A refused call, answered in its provider's error shape: `reason`'s status, the
    /// explanation as the error's message, `Retry-After` and `x-should-retry: false` on a
    /// budget (the official SDKs would otherwise retry a 429).
    pub(super) fn refused_inference(&self, provider: Provider, r: &Refusal) -> Response<ResBody> {
        let id = (self.current)().map(|(b, _)| b.id.to_string());
        deny::provider_shaped(provider, r.reason, r.shown(), id.as_deref())
    }
}

impl Prepared {
    /// Why a provider-run web tool is refused under `web_tools: policy`, if it is: it names
    /// no `allowed_domains`, or one of them (or a name under it: the providers include
    /// subdomains) is not reachable by the sandbox's own `network.egress`.
    pub(super) fn web_tool_refusal(
        &self,
        tool: &crate::policy::protocols::inference::WebTool,
    ) -> Option<String> {
        let Some(domains) = &tool.allowed else {
            return Some(format!(
                "the call asks the provider to run `{}` with no allowed_domains: the provider would reach what the sandbox's policy does not (name allowed_domains the sandbox may reach, or web_tools: allow)",
                tool.name
            ));
        };
        let bad = domains.iter().find(|d| !self.reaches_domain(d))?;
        Some(format!(
            "the call's `{}` allows the domain `{}`, which the sandbox's network.egress does not allow (with its subdomains): the provider would fetch for the sandbox what the sandbox cannot",
            tool.name,
            bad.chars().take(100).collect::<String>()
        ))
    }

    /// Whether the sandbox's egress allows `domain` and a name under it on port 443.
    fn reaches_domain(&self, domain: &str) -> bool {
        let d = domain
            .trim()
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let d = d.split('/').next().unwrap_or("").trim_start_matches("*.");
        if d.is_empty() || d.contains('*') {
            return false;
        }
        let Some(policy) = self.compiled_egress() else {
            return false;
        };
        let guard = crate::policy::guard::Guard::new(&[], &[], Vec::new());
        [d.to_string(), format!("egress-proxy-probe.{d}")]
            .iter()
            .all(|name| {
                crate::policy::target::Target::parse(&format!("{name}:443"), None).is_ok_and(|t| {
                    policy.decide(&t, None, &guard).decision.verdict
                        == crate::policy::Verdict::Allow
                })
            })
    }
}

impl Metered {
    /// The answer's body, read for its usage as it passes (an event stream event by event,
    /// JSON whole up to its bound).
    pub(super) fn tap<B>(&self, headers: &http::HeaderMap, body: B) -> Tapped<B>
    where
        B: http_body::Body<Data = Bytes>,
    {
        let ct = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let events = UsageReader::is_event_stream(ct);
        if let Ok(mut r) = self.reader.lock() {
            *r = Some(UsageReader::new(self.call.provider, events));
        }
        let reader = self.reader.clone();
        let copy: CopyFrame = Box::new(move |f: Frame<Bytes>| {
            if let (Some(d), Ok(mut r)) = (f.data_ref(), reader.lock()) {
                if let Some(r) = r.as_mut() {
                    r.feed(d);
                }
            }
            f
        });
        body.map_frame(copy)
    }

    /// The answer ended (or was never read): settle the reservation at the reported usage —
    /// or, when none was reported, give it back for an error answer (not billed) and keep it
    /// for a success — and write the record's `tokens` block.
    pub(super) fn finish(mut self, status: u16, audit: &mut AuditGuard) {
        let reader = self.reader.lock().ok().and_then(|mut r| r.take());
        let usage = reader.and_then(UsageReader::finish);
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let (reserved_tokens, reserved_cost) = reservation.reserved();
        let provider = self.call.provider.name();
        let Some(u) = usage else {
            let success = (200..300).contains(&status);
            match success {
                true => {
                    audit.detail(
                        "the provider reported no usage: the call is counted at its reservation",
                    );
                    audit.tokens(TokenFacts {
                        provider,
                        model: self.call.model.as_deref().map(Into::into),
                        input: self.call.body_bytes.div_ceil(4),
                        output: self.call.max_output.unwrap_or(0),
                        total: reserved_tokens,
                        cost_usd: (reserved_cost > 0).then(|| reserved_cost as f64 / NANO_USD),
                        counted: "reserved",
                        ..TokenFacts::default()
                    });
                    reservation.settle(reserved_tokens, reserved_cost);
                }
                false => reservation.settle(0, 0),
            }
            return;
        };
        let model = u.model.clone().or_else(|| self.call.model.clone());
        let price = prices::find(&self.prices, model.as_deref().unwrap_or(""))
            .or_else(|| prices::find(&self.prices, self.call.model.as_deref().unwrap_or("")));
        let cost = price.map(|p| p.cost(&u.kinds));
        reservation.settle(u.kinds.total(), cost.unwrap_or(0));
        audit.tokens(TokenFacts {
            provider,
            model: model.map(Into::into),
            input: u.kinds.input,
            cached_input: u.kinds.cached_input,
            cache_write: u.kinds.cache_write,
            output: u.kinds.output,
            reasoning: u.reasoning,
            total: u.kinds.total(),
            cost_usd: cost.map(|c| c as f64 / NANO_USD),
            counted: "reported",
        });
    }
}

impl Drop for Metered {
    /// A call refused after its reservation (the decider, DLP, a credential) or whose
    /// request could not be sent gives its reservation back: it was not answered.
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            r.settle(0, 0);
        }
    }
}

/// A body whose data frames are copied to a [`UsageReader`] as they pass, unchanged and
/// unheld.
pub(super) type Tapped<B> = http_body_util::combinators::MapFrame<B, CopyFrame>;

/// What copies each data frame to the reader.
pub(super) type CopyFrame = Box<dyn FnMut(Frame<Bytes>) -> Frame<Bytes> + Send + Sync>;
