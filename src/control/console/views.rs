//! The console's reading pages: *Live* (the decision stream, filtered; each refusal opens to
//! its reason, rule and detail and to what `check` says of it), *Sandboxes* (the
//! registrations, and one sandbox's effective policy with its layers and its usage per day
//! against its quotas, as charts) and *Audit* (whether the trail verifies, the last
//! checkpoint, records per minute).

use maud::{html, Markup};
use serde_json::Value;

use super::chart::{self, Bar};
use crate::control::observe::DECISIONS;
use crate::control::shown::for_person;

/// A record's string field for a person (`-` when absent).
fn s(r: &Value, k: &str) -> String {
    r[k].as_str()
        .map_or("-".into(), |v| for_person(v).into_owned())
}

/// The filters the *Live* page was asked for (`sandbox`, `decision`, `reason`, `host`).
pub type Filters = Vec<(String, String)>;

/// A record's destination, `host:port` (or the original destination).
pub fn destination(r: &Value) -> String {
    match (r["target_host"].as_str(), r["target_port"].as_u64()) {
        (Some(h), Some(p)) => format!("{}:{p}", for_person(h)),
        (Some(h), None) => for_person(h).into_owned(),
        _ => s(r, "original_dst"),
    }
}

/// A step of an access request in the *Live* table: what happened (`requested`, `approved`,
/// …) and who took it — the person, when one signed in — not a refusal.
fn approval_row(r: &Value, a: &Value) -> Markup {
    let time = r["ts"]
        .as_str()
        .and_then(|t| t.split_once('T'))
        .map_or("", |(_, t)| t);
    let step = s(a, "step");
    let who = match a["credential"].as_str() {
        Some(c) => for_person(c).into_owned(),
        None => s(a, "by"),
    };
    html! {
        tr.decision-approval data-sandbox=(s(r, "sandbox")) data-reason="approval" {
            td { (time) } td.decision { (step) } td { (s(r, "sandbox")) } td { "access request" }
            td { code { (destination(r)) } }
            td { @if step == "requested" { "asked: " (s(a, "text")) } @else { "by " (who) } }
            td { (s(a, "request")) }
        }
    }
}

/// One row of the *Live* table (the page's script builds the same from each event).
fn row(r: &Value) -> Markup {
    if let Some(a) = r.get("approval").filter(|a| a.is_object()) {
        return approval_row(r, a);
    }
    let decision = r["decision"].as_str().unwrap_or("-");
    let time = r["ts"]
        .as_str()
        .and_then(|t| t.split_once('T'))
        .map_or("", |(_, t)| t);
    let target = destination(r);
    html! {
        tr class=(format!("decision-{decision}")) data-sandbox=(s(r, "sandbox")) data-reason=(s(r, "reason")) {
            td { (time) } td.decision { (decision) } td { (s(r, "sandbox")) } td { (s(r, "mode")) @if r["event"] == "open" { " · open" } }
            td { code { (target) } } td { (s(r, "reason")) }
            td {
                @if decision != "allow" {
                    details.why {
                        summary { "why" }
                        dl {
                            dt { "Rule" } dd { (s(r, "rule")) }
                            dt { "Where" } dd { (s(r, "rule_source")) }
                            dt { "Detail" } dd { (s(r, "detail")) }
                        }
                        a.explain href=(format!("explain?sandbox={}&target={}",
                            enc(r["sandbox"].as_str().unwrap_or("")), enc(&target))) { "What check says now" }
                    }
                } @else { (s(r, "rule")) }
            }
        }
    }
}

/// `%`-encoded for a query value.
fn enc(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// *Live*: the filter form, then the kept records that pass it (newest first); the page's
/// script adds each new one from `/ui/live/events` with the same filters.
pub fn live(filters: &Filters, records: &[Value], problem: Option<&str>) -> Markup {
    let get = |k: &str| {
        filters
            .iter()
            .find(|(f, _)| f == k)
            .map_or("", |(_, v)| v.as_str())
    };
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(filters.iter())
        .finish();
    html! {
        form #filters method="get" action="live" {
            label { "sandbox " input type="text" name="sandbox" value=(get("sandbox")); }
            label { "decision " select name="decision" {
                option value="" selected[get("decision").is_empty()] { "any" }
                @for d in DECISIONS { option value=(d) selected[get("decision") == d] { (d) } }
            } }
            label { "reason " input type="text" name="reason" value=(get("reason")); }
            label { "host " input type="text" name="host" value=(get("host")); }
            button type="submit" { "Filter" }
        }
        @if let Some(p) = problem { p.problem #problem { (p) } }
        p.hint { "Newest first. With JavaScript on, new decisions appear as they are made." }
        table #live data-events=(format!("live/events?{query}")) {
            thead { tr { th { "Time" } th { "Decision" } th { "Sandbox" } th { "Mode" } th { "Destination" } th { "Reason" } th { "Rule / why" } } }
            tbody { @for r in records { (row(r)) } }
        }
    }
}

/// `GET /ui/explain`: what `check` answers for the sandbox and target now.
pub fn explain(sandbox: &str, target: &str, checked: &Value) -> Markup {
    html! {
        p { "Sandbox " code { (for_person(sandbox)) } ", target " code { (for_person(target)) } }
        dl #explained {
            dt { "Decision" } dd { (s(checked, "decision")) }
            dt { "Reason" } dd { (s(checked, "reason")) }
            dt { "Rule" } dd { (s(checked, "rule")) }
            dt { "Explanation" } dd.explanation { (s(checked, "explanation")) }
        }
        p { a href="live" { "Back to Live" } }
    }
}

/// *Sandboxes*: `GET /v1/sandboxes`'s list.
pub fn sandboxes(list: &Value) -> Markup {
    html! {
        p { "Policy version " code { (list["policy_version"].as_str().unwrap_or("-")) } }
        table #sandboxes {
            thead { tr { th { "Sandbox" } th { "Origin" } th { "Mode" } th { "Enforcement" } th { "Egress entries" } th { "Deny entries" } } }
            tbody {
                @for sb in list["sandboxes"].as_array().into_iter().flatten() {
                    @let id = sb["id"].as_str().unwrap_or_default();
                    tr { td { a href=(format!("sandboxes/{}", enc(id))) { (id) } }
                         td { (s(sb, "origin")) } td { (s(sb, "mode")) } td { (s(sb, "enforcement")) }
                         td { (sb["egress"]) } td { (sb["deny"]) } }
                }
            }
        }
    }
}

/// A list of entries, or `none`.
fn entries(v: &Value) -> Markup {
    html! {
        @match v.as_array().filter(|a| !a.is_empty()) {
            Some(a) => ul.entries { @for e in a { li { code { (e.as_str().map_or_else(|| e.to_string(), |t| for_person(t).into_owned())) } } } },
            None => span { "none" },
        }
    }
}

/// One sandbox: its effective policy (its own lists, scoped entries, every layer of its chain
/// with ceiling and deny) and its usage per day (`days`: label and the day's sums) against
/// its quotas (`quota`: the `/v1/usage` quota row, when one is set).
pub fn sandbox(
    view: &Value,
    layers: &[LayerView],
    grants: &[Value],
    days: &[(String, Usage)],
    (quota, flows): (Option<&Value>, &Value),
    waive: Option<(&str, &super::pages::Frame<'_>)>,
) -> Markup {
    let bars = |f: fn(&Usage) -> u64| -> Vec<Bar> {
        days.iter()
            .map(|(d, u)| Bar {
                label: d.clone(),
                value: f(u),
            })
            .collect()
    };
    let limit = |k: &str| quota.and_then(|q| q[k].as_u64());
    html! {
        h2 { "Effective policy" }
        dl {
            dt { "Origin" } dd { (s(view, "origin")) }
            dt { "Enforcement" } dd { (s(view, "enforcement")) }
            dt { "Egress" } dd #egress { (entries(&view["network"]["egress"])) }
            dt { "Deny" } dd { (entries(&view["network"]["deny"])) }
            @for sc in view["network"]["scoped"].as_array().into_iter().flatten() {
                dt { "Scoped to " (sc["binaries"]) " " (sc["execs"]) } dd { (entries(&sc["egress"])) }
            }
            dt { "Per-request rules (network.http)" } dd #http { (json_block(&view["policy"]["network"]["http"])) }
            dt { "Limits" } dd #limits { (json_block(&set_only(&view["limits"]))) }
        }
        h2 { "Flow labels" }
        @if flows["armed"].as_array().is_none_or(Vec::is_empty) { p #flows { "none armed" } } @else {
            ul #flows { @for a in flows["armed"].as_array().into_iter().flatten() {
                li { code { (s(a, "label")) } " armed " (s(a, "at")) " by " code { (s(a, "by")) } " (conn " (a["conn"]) ")"
                    @if let Some((id, f)) = waive {
                        form.inline method="post" action=(format!("sandboxes/{id}/flows/waive")) {
                            (f.csrf_field())
                            input type="hidden" name="label" value=(s(a, "label"));
                            button.waive type="submit" name="how" value="once" { "Waive once" }
                            button.reset type="submit" name="how" value="reset" { "Reset" }
                        }
                    }
                }
            } }
        }
        @for w in flows["waivers"].as_array().into_iter().flatten() {
            p.waiver { "Waiver of " code { (s(w, "label")) } ": " (w["lasts"]) " · by " (s(w, "by")) " · " (s(w, "at")) }
        }
        h2 { "Standing grants" }
        @if grants.is_empty() { p #grants { "none" } } @else {
            ul #grants { @for g in grants {
                li { code { (s(g, "host")) ":" (g["port"]) } " · " (s(g, "kind")) " · by " (s(g, "approver")) " · until " (s(g, "expires")) }
            } }
        }
        h2 { "Layers" }
        @if layers.is_empty() { p { "This sandbox is in no layer: its own entries are its reach." } }
        @for l in layers {
            section.layer data-layer=(l.id) {
                h3 { "Layer " (l.id) }
                p { "Ceiling: " @match &l.ceiling { Some(c) => (c.join(", ")), None => "none (this layer bounds nothing)" } }
                p { "Deny: " @if l.deny.is_empty() { "none" } @else { (l.deny.join(", ")) } }
                p.layer-http { "Per-request rules, read before the sandbox's own: " @if l.http.is_empty() { "none" } @else { (l.http.join("; ")) } }
                p.layer-limits { "Limits (the most a member may have): " (json_block(&l.limits)) }
            }
        }
        h2 { "Usage per day (UTC)" }
        (chart::bars("requests", "Requests", &bars(|u| u.requests), limit("requests_per_day"), true))
        (chart::bars("bytes", "Bytes (up + down)", &bars(|u| u.bytes), limit("bytes_per_day"), true))
        (chart::bars("tokens", "Inference tokens", &bars(|u| u.tokens), limit("tokens_per_day"), true))
    }
}

/// A value as indented JSON for a person, or `none` when it is absent or empty.
fn json_block(v: &Value) -> Markup {
    let empty = v.is_null()
        || v.as_array().is_some_and(Vec::is_empty)
        || v.as_object().is_some_and(|o| o.is_empty());
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    html! { @if empty { span { "none" } } @else { pre { (crate::control::shown::json_for_person(&text)) } } }
}

/// An object without its unset (`null`) members.
fn set_only(v: &Value) -> Value {
    match v.as_object() {
        Some(o) => Value::Object(
            o.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), x.clone()))
                .collect(),
        ),
        None => v.clone(),
    }
}

/// A layer as its member's page shows it.
pub struct LayerView {
    /// Its id.
    pub id: String,
    /// Its ceiling's entries (`None`: it sets none).
    pub ceiling: Option<Vec<String>>,
    /// Its deny entries.
    pub deny: Vec<String>,
    /// Its `network.http` rules, as written.
    pub http: Vec<String>,
    /// Its `limits` (the most a member may have), as JSON.
    pub limits: Value,
}

/// One day's sums of a sandbox's usage.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Requests (every decision).
    pub requests: u64,
    /// Bytes up and down.
    pub bytes: u64,
    /// Inference tokens.
    pub tokens: u64,
}

/// *Audit*: the trail's verification, its last checkpoint and records per minute.
pub fn audit(trail: &Value, per_minute: &[(u64, u64)], health: &str) -> Markup {
    let bars: Vec<Bar> = per_minute
        .iter()
        .map(|(m, n)| Bar {
            label: format!("{:02}:{:02}", (m / 60) % 24, m % 60),
            value: *n,
        })
        .collect();
    let verified = trail["verified"].as_bool().unwrap_or(false);
    if trail["chain"] == false {
        return html! {
            p #verified .off data-verified="off" {
                "Chain off: records are written without a hash chain (audit.chain: false), so \
                 there is nothing to verify. Turn it on to make removed or changed records show."
            }
            dl {
                dt { "Sink" } dd { (health) }
                dt { "Files" } dd { (entries(&trail["files"])) }
            }
            (chart::bars("per-minute", "Records per minute, last hour (this process)", &bars, None, false))
        };
    }
    html! {
        p #verified class=(if verified { "ok" } else { "problem" }) data-verified=(verified) {
            @if verified { "The trail verifies" } @else { "The trail does not verify" }
            @if trail["signed"].as_bool() == Some(true) { " (chain and signatures)." } @else { " (chain only: no signing key)." }
        }
        dl {
            dt { "Sink" } dd { (health) }
            dt { "Problem" } dd { (s(trail, "problem")) (s(trail, "error").trim_start_matches('-')) }
            dt { "Records" } dd #records { (trail["records"]) }
            dt { "Runs" } dd { (trail["runs"]) }
            dt { "Checkpoints" } dd { (trail["checkpoints"]) }
            dt { "Signatures checked" } dd { (trail["signatures_checked"]) }
            dt { "Only chained (after the last signature)" } dd { (trail["only_chained"]) }
            dt { "Last checkpoint" } dd #last-checkpoint {
                @match trail["last_checkpoint"].as_object() {
                    Some(c) => { (c.get("ts").and_then(|t| t.as_str()).unwrap_or("-")) " · seq " (c.get("seq").cloned().unwrap_or_default()) }
                    None => "none yet",
                }
            }
            dt { "Files" } dd { (entries(&trail["files"])) }
        }
        (chart::bars("per-minute", "Records per minute, last hour (this process)", &bars, None, false))
    }
}
