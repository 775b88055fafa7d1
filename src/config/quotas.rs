//! `limits.per_destination` (daily quotas on the hosts of a pattern): validated here; what
//! they do is [`crate::egress::quota`]'s.

use super::error::Sink;
use super::Limits;

/// Most `per_destination` entries one sandbox may have.
const MAX_DESTINATION_QUOTAS: usize = 64;

pub(super) fn check_destination_quotas(
    l: &Limits,
    sandbox: Option<&str>,
    field: &str,
    sink: &mut Sink<'_>,
    line: usize,
) {
    let mut push = |what: String, why: &str| {
        sink.push(sandbox, what, why, Some("per_destination"), line);
    };
    if l.per_destination.len() > MAX_DESTINATION_QUOTAS {
        push(format!("{field}.per_destination"), "at most 64 entries");
    }
    for (i, q) in l.per_destination.iter().enumerate() {
        let at = format!("{field}.per_destination[{i}]");
        let name = q.host.strip_prefix("*.").unwrap_or(&q.host);
        let valid = !name.is_empty()
            && !name.contains('*')
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':')
            });
        if !valid {
            push(
                format!("{at}.host"),
                "a host name (api.example.com), `*.` and a domain, or an IP address",
            );
        }
        if q.bytes_per_day.is_none()
            && q.requests_per_day.is_none()
            && q.tokens_per_day.is_none()
            && q.cost_per_day.is_none()
        {
            push(
                at.clone(),
                "needs bytes_per_day, requests_per_day, tokens_per_day or cost_per_day",
            );
        }
        if [q.bytes_per_day, q.requests_per_day, q.tokens_per_day].contains(&Some(0))
            || q.cost_per_day.is_some_and(|c| !budget_dollars(c))
        {
            push(at, "quotas must be positive (leave one out for unlimited)");
        }
    }
    if let Some(p) = &l.per_process {
        if p.processes == Some(0) || [p.bytes_per_day, p.requests_per_day].contains(&Some(0)) {
            sink.push(
                sandbox,
                format!("{field}.per_process"),
                "quotas and `processes` must be positive (leave one out for its default)",
                Some("per_process"),
                line,
            );
        }
    }
    let mut push = |what: String, why: &str| {
        sink.push(sandbox, what, why, Some("per_destination"), line);
    };
    if l.cost_per_day.is_some_and(|c| !budget_dollars(c)) {
        push(
            format!("{field}.cost_per_day"),
            "must be a positive number of dollars (or null for unlimited)",
        );
    }
}

/// Whether `c` is a cost budget that can be counted in nano-dollars.
fn budget_dollars(c: f64) -> bool {
    c.is_finite() && c > 0.0 && c < 1e9
}
