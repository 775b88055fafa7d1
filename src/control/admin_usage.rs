//! `GET /v1/usage?sandbox=ID&since=TIME`: the usage ledger ([`crate::audit::usage`]) summed
//! per sandbox × destination × decision from `since` on (an RFC 3339 time or Unix seconds,
//! rounded down to the hour; by default the start of the current UTC day), and each sandbox's
//! daily quotas with what is spent of them today (this replica's counts plus the others' when
//! etcd shares them).

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

use super::admin::{error, json_resp};
use crate::audit::record::rfc3339;
use crate::egress::handles::Handles;
use crate::runtime::Shared;

/// The answer to `GET /v1/usage` with this query string.
pub(super) fn answer(shared: &Shared, query: Option<&str>) -> Response<Full<Bytes>> {
    let mut sandbox = None;
    let mut since = None;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "sandbox" => sandbox = Some(v.into_owned()),
            "since" => match parse_since(&v) {
                Some(s) => since = Some(s),
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "since: an RFC 3339 time (2026-11-26T00:00:00Z) or Unix seconds",
                    )
                }
            },
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter {other:?}: use sandbox and since"),
                )
            }
        }
    }
    let since_hour =
        since.map_or_else(|| crate::egress::quota::today() * 24, |s| (s / 3600) as u32);
    let usage = shared.sink.usage.sums(sandbox.as_deref(), since_hour);
    let rows: Vec<_> = usage.iter().map(usage_row).collect();
    let quotas = quotas(shared, sandbox.as_deref());
    let from = UNIX_EPOCH + Duration::from_secs(u64::from(since_hour) * 3600);
    json_resp(
        StatusCode::OK,
        json!({
            "since": rfc3339(from),
            "until": rfc3339(std::time::SystemTime::now()),
            "usage": rows,
            "quotas": quotas,
        }),
    )
}

/// Each sandbox's quotas (of `sandbox` only, when named) with what is spent of them today:
/// `/v1/usage`'s `quotas`, and the console's quota lines.
pub(super) fn quotas(shared: &Shared, sandbox: Option<&str>) -> Vec<serde_json::Value> {
    let set = shared.policy.load();
    let mut quotas = Vec::new();
    for sb in set.ids().into_iter().filter_map(|id| set.get(id)) {
        let id = sb.binding.id.as_str();
        if sandbox.is_some_and(|s| s != id) {
            continue;
        }
        // What is in force: the sandbox's own, capped by its layers'.
        let b = &sb.binding;
        let l = &*crate::egress::layer_limits::bounded(&b.limits, &b.network.layers);
        let limiter = sb.limiter(&shared.limiters);
        let set = (
            l.bytes_per_day,
            l.requests_per_day,
            l.tokens_per_day,
            l.cost_per_day,
        );
        if set != (None, None, None, None) {
            quotas.push(quota_row(id, None, set, limiter.meter()));
        }
        for q in &l.per_destination {
            let key = format!("{id}@{}", q.host);
            if let Some(m) = shared.limiters.meter_of(&key) {
                let set = (
                    q.bytes_per_day,
                    q.requests_per_day,
                    q.tokens_per_day,
                    q.cost_per_day,
                );
                quotas.push(quota_row(id, Some(&q.host), set, &m));
            }
        }
    }
    quotas
}

/// One ledger row as answered (an inference row with its model, tokens by kind and cost).
fn usage_row(c: &crate::audit::usage::Cell) -> serde_json::Value {
    let mut row = json!({
        "sandbox": c.sandbox,
        "destination": c.destination,
        "decision": c.decision,
        "connections": c.tally.connections,
        "requests": c.tally.requests,
        "bytes_up": c.tally.bytes_up,
        "bytes_down": c.tally.bytes_down,
    });
    // An inference row: its model, tokens by kind and cost.
    if let (Some(m), Some(o)) = (&c.model, row.as_object_mut()) {
        o.insert("model".into(), json!(m));
        if let Ok(serde_json::Value::Object(t)) = serde_json::to_value(c.tally.tokens) {
            o.extend(t);
        }
        o.insert("tokens".into(), json!(c.tally.tokens.total()));
    }
    row
}

/// The quotas and budgets set: bytes, requests, tokens a day, dollars a day.
type Set = (Option<u64>, Option<u64>, Option<u64>, Option<f64>);

/// One quota's row: what is set and what is spent today (tokens and cost: settled and
/// reserved by calls still answering).
fn quota_row(
    sandbox: &str,
    destination: Option<&str>,
    (bytes_per_day, requests_per_day, tokens_per_day, cost_per_day): Set,
    meter: &crate::egress::quota::Meter,
) -> serde_json::Value {
    let (mine, others) = meter.today();
    let cost = mine.cost.saturating_add(others.cost) as f64 / crate::egress::quota::NANO_USD;
    json!({
        "sandbox": sandbox,
        "destination": destination,
        "bytes_per_day": bytes_per_day,
        "requests_per_day": requests_per_day,
        "tokens_per_day": tokens_per_day,
        "cost_per_day": cost_per_day,
        "bytes": mine.bytes.saturating_add(others.bytes),
        "requests": mine.requests.saturating_add(others.requests),
        "tokens": mine.tokens.saturating_add(others.tokens),
        "cost_usd": cost,
        "spent": meter.spent().map(|s| s.key()),
    })
}

/// Unix seconds from an RFC 3339 time or a number of seconds.
fn parse_since(v: &str) -> Option<u64> {
    if let Ok(n) = v.parse::<u64>() {
        return Some(n);
    }
    let t = time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_rfc3339_or_seconds_and_nothing_else() {
        assert_eq!(parse_since("3600"), Some(3600));
        assert_eq!(parse_since("1970-01-01T01:00:00Z"), Some(3600));
        assert_eq!(parse_since("yesterday"), None);
        assert_eq!(parse_since("-5"), None);
    }
}
