//! An inference call on a terminated host (`protocol: openai | anthropic | gemini`), after the
//! body phase allowed it: its provider-run web tools bounded by the sandbox's own egress
//! policy, its tokens (and cost) reserved against every budget that applies, its answer read
//! for the usage the provider reports as it passes ([`Tapped`]), and the reservation settled
//! at that usage when the answer ends — with the record's `tokens` block. Refusals are in the
//! provider's own error shape so that its SDK raises them with the reason.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;

use super::prepared::Prepared;
use crate::audit::record::TokenFacts;
use crate::audit::AuditGuard;
use crate::config::prices::{self, Price, TokenKinds};
use crate::egress::quota::{share, OverBudget, Reservation, NANO_USD};
use crate::pipeline::Refusal;
use crate::policy::protocols::inference::{Call, InferenceRule, WebTools};
use crate::policy::protocols::inference_usage::UsageReader;
use crate::policy::reason::Reason;
use crate::relay::liveness::Liveness;

/// One admitted call's accounting: what it reserved, and the reader of its answer.
pub(super) struct Metered {
    call: Box<Call>,
    prices: Vec<Price>,
    reservation: Option<Reservation>,
    reader: Arc<Mutex<Option<UsageReader>>>,
    /// The output bound the proxy set on the call (the body is written with it), if it did.
    pub(super) bound: Option<u64>,
}

impl Metered {
    /// The request with the output bound the proxy set written into its body (recorded); a
    /// body that cannot carry it is refused rather than sent unbounded.
    pub(super) fn bound_request(
        &self,
        req: http::Request<super::up_body::UpBody>,
        audit: &mut AuditGuard,
    ) -> Result<http::Request<super::up_body::UpBody>, Refusal> {
        let (mut parts, body) = req.into_parts();
        let rewritten = body
            .bytes()
            .and_then(|b| self.bounded_body(parts.uri.path(), b));
        let Some((bytes, why)) = rewritten else {
            let why = "the call's output bound could not be set in its body: under a budget every call is bounded";
            return Err(Refusal::new(Reason::BudgetExceeded, why));
        };
        parts
            .headers
            .insert(http::header::CONTENT_LENGTH, bytes.len().into());
        audit.detail(why);
        Ok(http::Request::from_parts(
            parts,
            super::up_body::UpBody::whole(bytes),
        ))
    }

    /// `body` with the output bound the proxy set, and the record's words for it; `None`
    /// when the proxy set none (or the body cannot be written again).
    fn bounded_body(&self, path: &str, body: &[u8]) -> Option<(Bytes, String)> {
        let bound = self.bound?;
        let out = crate::policy::protocols::inference::with_output_bound(
            self.call.provider,
            path,
            body,
            bound,
        )?;
        let was = match self.call.max_output {
            Some(m) => format!("lowered from {m}"),
            None => "set (the call gave none)".into(),
        };
        let why = format!(
            "the call's output bound was {was} to {bound} tokens: what today's budget has left after its input"
        );
        Some((Bytes::from(out), why))
    }
}

/// How many output tokens the budgets leave a call of `input` tokens: the least of the token
/// budget's rest and what the cost budget's rest buys at `price` (`None`: neither bounds it).
fn output_room(
    (tokens_left, cost_left): (Option<u64>, Option<u64>),
    input: u64,
    price: Option<&Price>,
) -> Option<u64> {
    let by_tokens = tokens_left.map(|t| t.saturating_sub(input));
    let by_cost = match (cost_left, price) {
        (Some(c), Some(p)) => {
            let input_cost = p.cost(&TokenKinds {
                input,
                ..TokenKinds::default()
            });
            let per_token = p.output * 1e3;
            let rest = c.saturating_sub(input_cost) as f64;
            Some(match per_token > 0.0 {
                true => (rest / per_token).floor().min(u64::MAX as f64) as u64,
                false => u64::MAX,
            })
        }
        _ => None,
    };
    match (by_tokens, by_cost) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Metered {
    /// The accounting of an allowed inference call, if the request is one, reserved on
    /// `live`'s budgets (`Err`: refused; answered in its provider's shape, the host's).
    pub(super) async fn admit(
        live: &Liveness,
        p: &Prepared,
        allowed: &mut crate::pipeline::body::Allowed,
        verdict: crate::policy::Verdict,
    ) -> Result<Option<Metered>, Refusal> {
        let Some(ic) = allowed.inference.take() else {
            return Ok(None);
        };
        // A call the rules refused in report mode goes on unmetered (and without credentials).
        if verdict != crate::policy::Verdict::Allow || ic.1.body_bytes == 0 {
            return Ok(None);
        }
        Self::admit_call(live, p, ic).await.map(Some)
    }

    /// Admit an allowed call: its web tools, then its reservation. `Err`: refused (the
    /// reservation is not taken).
    async fn admit_call(
        live: &Liveness,
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
        if call.background && live.budgeted() {
            return Err(Refusal::new(
                Reason::InferenceNotAllowed,
                "a background response (background: true) under a token or cost budget: its answer and usage are fetched later by a GET the proxy cannot charge to this call (security review B03)",
            ));
        }
        if !call.reports_usage && live.budgeted() {
            return Err(Refusal::new(
                Reason::InferenceNotAllowed,
                "a streamed chat completion under a token or cost budget must ask for its usage (stream_options: { include_usage: true }): the proxy counts what the provider reports",
            ));
        }
        let prices = p.binding.limits.prices.clone();
        let price = prices::find(&prices, call.model.as_deref().unwrap_or("")).cloned();
        let (reservation, bound) = Self::reserve_call(live, &call, price.as_ref()).await?;
        Ok(Metered {
            call,
            prices,
            reservation: Some(reservation),
            reader: Arc::new(Mutex::new(None)),
            bound,
        })
    }

    /// Reserve a call against the budgets. Under a token or cost budget the call is bounded:
    /// its output bound is set (or lowered) to what is left after its input estimate, and the
    /// whole reservation must fit in what is left — so calls in flight cannot overshoot a
    /// budget by more than their input estimates' error (security review B05b). Returns the
    /// reservation and the bound the proxy set, when it set one.
    async fn reserve_call(
        live: &Liveness,
        call: &Call,
        price: Option<&Price>,
    ) -> Result<(Reservation, Option<u64>), Refusal> {
        let input = call.body_bytes.div_ceil(4);
        let cost = |output: u64| {
            price.map(|p| {
                p.cost(&TokenKinds {
                    input,
                    output,
                    ..TokenKinds::default()
                })
            })
        };
        let asked = call.max_output.unwrap_or(0);
        if !live.budgeted() {
            let r = live.reserve_budget(input.saturating_add(asked), cost(asked))?;
            return Ok((r, None));
        }
        let deadline = tokio::time::Instant::now() + share::LEASE_WAIT;
        let refused = |e: OverBudget| Refusal::new(Reason::BudgetExceeded, e.0);
        let mut raced = 0;
        loop {
            let room = output_room(live.budget_left(), input, price);
            if room == Some(0) {
                // Not even the input fits: refused, in the words that name the budget.
                let r = live.reserve_budget_within(input.saturating_add(1), cost(1));
                return r.map(|r| (r, Some(1))).map_err(refused);
            }
            let output = match (room, call.max_output) {
                (Some(r), Some(m)) => r.min(m),
                (Some(r), None) => r,
                (None, m) => m.unwrap_or(0),
            };
            let bound = (room.is_some() && Some(output) != call.max_output).then_some(output);
            let tokens = input.saturating_add(output);
            match live.reserve_budget_within(tokens, cost(output)) {
                Ok(r) => return Ok((r, bound)),
                // On a fleet, this replica's share is too small: it waits for the next
                // chunk (the next look at what is left may bound the call lower).
                Err(OverBudget(why, Some(meter))) => {
                    if !share::wait_grown(&meter, deadline).await {
                        return Err(refused(OverBudget(why, None)));
                    }
                }
                // A price is missing (said at once).
                Err(e) if price.is_none() => return Err(refused(e)),
                // Another call took what was left meanwhile, or a budget is spent (the next
                // look says which).
                Err(_) if raced < 4 => raced += 1,
                Err(_) => break,
            }
        }
        Err(Refusal::new(
            Reason::BudgetExceeded,
            "today's budget is taken by calls in flight",
        ))
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
        let bad = domains
            .iter()
            .find(|d| !self.reaches_domain(d, tool.exact))?;
        let what = match tool.exact {
            true => "names the server",
            false => "allows the domain",
        };
        Some(format!(
            "the call's `{}` {what} `{}`, which the sandbox's network.egress does not allow{}: the provider would reach for the sandbox what the sandbox cannot",
            tool.name,
            bad.chars().take(100).collect::<String>(),
            if tool.exact { "" } else { " (with its subdomains)" },
        ))
    }

    /// Whether the sandbox's egress allows `domain` on port 443, and a name under it unless
    /// `exact` (an MCP server's host).
    fn reaches_domain(&self, domain: &str, exact: bool) -> bool {
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
        let probe = format!("egress-proxy-probe.{d}");
        let names = match exact {
            true => vec![d.to_string()],
            false => vec![d.to_string(), probe],
        };
        names.iter().all(|name| {
            crate::policy::target::Target::parse(&format!("{name}:443"), None).is_ok_and(|t| {
                policy.decide(&t, None, &guard).decision.verdict == crate::policy::Verdict::Allow
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

    /// The answer ended (or was never read): settle the reservation — charging what was
    /// spent, never less — and write the record's `tokens` block.
    /// - The answer came whole with its usage: the usage the provider reported (`reported`).
    /// - The answer was cut (the client hung up, the origin broke off) before the provider's
    ///   final count (only a count from its start was read, or none of a body not delivered):
    ///   the provider may have billed more than the sandbox saw, so the call is charged the
    ///   larger of its reservation and what was reported so far (`estimated`; security
    ///   review B01, B02).
    /// - A whole success with no usage: its reservation (`reserved`); an error answer: nothing
    ///   (not billed).
    pub(super) fn finish(mut self, status: u16, complete: bool, audit: &mut AuditGuard) {
        let reader = self.reader.lock().ok().and_then(|mut r| r.take());
        let usage = reader.and_then(UsageReader::finish);
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let (reserved_tokens, reserved_cost) = reservation.reserved();
        let provider = self.call.provider.name();
        let success = (200..300).contains(&status);
        let reported = usage.as_ref().map(|u| {
            let model = u.model.clone().or_else(|| self.call.model.clone());
            let price = prices::find(&self.prices, model.as_deref().unwrap_or(""))
                .or_else(|| prices::find(&self.prices, self.call.model.as_deref().unwrap_or("")));
            (u, model, price.map(|p| p.cost(&u.kinds)))
        });
        match reported {
            Some((u, model, cost)) if u.complete || !success => {
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
            None if !success => reservation.settle(0, 0),
            seen => {
                let (seen_tokens, seen_cost, model) = match &seen {
                    Some((u, m, c)) => (u.kinds.total(), c.unwrap_or(0), m.clone()),
                    None => (0, 0, self.call.model.clone()),
                };
                let tokens = reserved_tokens.max(seen_tokens);
                let cost = reserved_cost.max(seen_cost);
                let cut = !complete || seen.is_some();
                audit.detail(match !cut {
                    true => "the provider reported no usage: the call is counted at its reservation".to_string(),
                    false => format!(
                        "the answer was cut before the provider's usage arrived: the call is counted at the larger of its reservation ({reserved_tokens}) and the usage seen so far ({seen_tokens})"
                    ),
                });
                reservation.settle(tokens, cost);
                audit.tokens(TokenFacts {
                    provider,
                    model: model.map(Into::into),
                    input: self.call.body_bytes.div_ceil(4),
                    output: self.call.max_output.unwrap_or(0),
                    total: tokens,
                    cost_usd: (cost > 0).then(|| cost as f64 / NANO_USD),
                    counted: if cut { "estimated" } else { "reserved" },
                    ..TokenFacts::default()
                });
            }
        }
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
