//! `egress-proxy simulate` and `POST /v1/sandboxes/{id}/simulate` (DESIGN §7.6): what a
//! candidate policy would have done to the exchanges an audit trail recorded. Each `end`
//! record is replayed under the candidate — its host, port and recorded addresses through the
//! same decision the data plane makes (layers, scoped entries and the guard included), the
//! method and path of a request through the candidate's `network.http` rules — and compared
//! with the verdict recorded. What changes is reported, grouped by the rule that refuses (or
//! the entry that newly allows) with counts and examples.
//!
//! The candidate's flow rules (`network.flows`) are replayed in the trail's order: each
//! exchange the candidate allows is judged with the labels the sandbox's earlier exchanges
//! armed under the candidate, then arms its own ([`Replay::flow`]).
//!
//! A WebSocket upgrade is replayed as the upgrade it was (`call: websocket`), and a request
//! to a host the candidate refuses outright is refused whatever its body. A member of a
//! layer whose candidate ceiling no longer admits its entries is listed first
//! ([`Simulation::beyond_ceiling`]) and its exchanges refused `outside_ceiling`.
//!
//! Never guessed: a record that lacks what the candidate needs is counted as *cannot tell*,
//! with why — a request the candidate would judge by its body (a protocol rule on a host it
//! still allows: the trail keeps the call's summary, not the body), a tunnel whose requests the candidate would judge
//! although the proxy did not read them when it was recorded, a decision that needs addresses
//! the record does not carry, a record allowed by a grant (grants are not part of a
//! candidate). Records no policy decided (identity, rate limits, resolver failures) are
//! counted apart.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use serde::Serialize;
use serde_json::Value;

use crate::control::check::asked_process;
use crate::pipeline::head::{Head, HeadVerdict, HostRules};
use crate::policy::flows::state::Labels;
use crate::policy::flows::{Act, Dest};
use crate::policy::process::Process;
use crate::policy::target::Target;
use crate::policy::Verdict;
use crate::sandboxes::set::PolicySet;

/// Examples kept per group.
const EXAMPLES: usize = 3;

/// One group of changed (or undecidable) exchanges.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Group {
    /// How many exchanges.
    pub count: u64,
    /// A few of them, as one line each.
    pub examples: Vec<String>,
}

impl Group {
    fn add(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
        }
    }
}

/// What a replay found.
#[derive(Debug, Default, Serialize)]
pub struct Simulation {
    /// Members' entries beyond a ceiling of the candidate's layers (`run` refuses such a
    /// candidate; the decisions here refuse them `outside_ceiling`).
    pub beyond_ceiling: Vec<String>,
    /// Lines read (records of every sandbox and kind).
    pub records: u64,
    /// Exchanges replayed under the candidate.
    pub replayed: u64,
    /// Of them, decided as recorded.
    pub unchanged: u64,
    /// Recorded as allowed, refused by the candidate: by the candidate's rule (or reason).
    pub newly_refused: BTreeMap<String, Group>,
    /// Recorded as refused, allowed by the candidate: by the entry that widens.
    pub newly_allowed: BTreeMap<String, Group>,
    /// What the trail cannot show the candidate: by why.
    pub cannot_tell: BTreeMap<String, Group>,
    /// Records not replayed, by why (another sandbox, DNS, decided by no policy).
    pub skipped: BTreeMap<String, u64>,
    /// Lines that are not JSON records.
    pub unreadable: u64,
}

impl Simulation {
    /// How many exchanges changed verdict.
    pub fn changed(&self) -> u64 {
        let sum = |m: &BTreeMap<String, Group>| m.values().map(|g| g.count).sum::<u64>();
        sum(&self.newly_refused) + sum(&self.newly_allowed)
    }

    /// How many exchanges the candidate newly allows.
    pub fn widened(&self) -> u64 {
        self.newly_allowed.values().map(|g| g.count).sum()
    }
}

/// Replays records under a candidate.
pub struct Replay<'a> {
    set: &'a PolicySet,
    sandbox: Option<&'a str>,
    /// Tunnels (`run`, `conn_id`) whose requests the proxy read (they have `https` records).
    terminated: HashSet<(String, u64)>,
    /// Decisions already made, by what decides them ([`memo_key`]).
    memo: std::collections::HashMap<String, Replayed>,
    /// Each sandbox's flow labels as the candidate's rules arm them, record by record.
    labels: std::collections::HashMap<String, Labels>,
    /// The result so far.
    pub out: Simulation,
}

/// The verdict a record shows for what the policy judges (`true`: allowed), or why it shows
/// none. A refusal by what comes after the policy allowed (the destination, the tunnel's bytes,
/// the decider, quotas) shows the policy's allow.
fn recorded(decision: &str, reason: &str) -> Result<bool, &'static str> {
    match reason {
        "grant_matched" => {
            Err("allowed by a grant when recorded (grants are not part of a candidate)")
        }
        "no_rule_matched"
        | "denied_by_rule"
        | "deny_all_mode"
        | "port_not_allowed"
        | "process_not_allowed"
        | "outside_ceiling"
        | "destination_ip_prohibited"
        | "proxy_loop"
        | "http_not_allowed"
        | "mcp_not_allowed"
        | "jsonrpc_not_allowed"
        | "graphql_not_allowed"
        | "websocket_not_allowed"
        | "inference_not_allowed"
        | "flow_refused"
        | "git_not_allowed" => Ok(decision == "allow"),
        "auth_required"
        | "auth_failed"
        | "unknown_sandbox"
        | "rate_limited"
        | "connection_limit"
        | "invalid_target"
        | "dns_error"
        | "dns_timeout"
        | "destination_not_found"
        | "malformed_request"
        | "proxy_endpoint" => Err(""),
        _ => Ok(true),
    }
}

/// A string field of a record ("" when absent).
fn s<'v>(v: &'v Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("")
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The process a record names, as the candidate's scopes would see it (`None`: unknown).
fn process_of(v: &Value) -> Option<Process> {
    let p = &v["process"];
    asked_process(
        p["exe"].as_str(),
        &strs(&p["ancestors"]),
        p["exec"].as_str(),
    )
}

/// One line for an example: sandbox, mode, target (and request), time, recorded reason.
fn example(v: &Value, now: &str) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("-").to_string();
    let request = match (v["method"].as_str(), v["path"].as_str()) {
        (Some(m), Some(p)) => format!(" {m} {p}"),
        _ => String::new(),
    };
    let call = v["call"]
        .as_str()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    format!(
        "{} {} {}:{}{request}{call} at {}: recorded {} ({}), now {now}",
        s("sandbox"),
        s("mode"),
        s("target_host"),
        v["target_port"],
        s("ts"),
        s("decision"),
        s("reason")
    )
}

impl<'a> Replay<'a> {
    /// A replay under `set`, of `sandbox`'s records only when one is named.
    pub fn new(set: &'a PolicySet, sandbox: Option<&'a str>) -> Self {
        Replay {
            set,
            sandbox,
            terminated: HashSet::new(),
            memo: std::collections::HashMap::new(),
            labels: std::collections::HashMap::new(),
            out: Simulation::default(),
        }
    }

    fn skip(&mut self, why: &str) {
        *self.out.skipped.entry(why.to_string()).or_default() += 1;
    }

    /// Replay one line of a trail.
    pub fn line(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        self.out.records += 1;
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            self.out.unreadable += 1;
            return;
        };
        self.record(&v);
    }

    /// Replay one record.
    pub fn record(&mut self, v: &Value) {
        let Some(sandbox) = v["sandbox"].as_str() else {
            return self.skip("no sandbox (identity refused or not an exchange)");
        };
        if v["event"] != "end" {
            return self.skip("not an exchange's end record");
        }
        if self.sandbox.is_some_and(|s| s != sandbox) {
            return self.skip("another sandbox");
        }
        let mode = v["mode"].as_str().unwrap_or("");
        if mode == "dns" {
            return self.skip("dns (a name's answer follows the connection decisions)");
        }
        let Some(sb) = self.set.get(sandbox).cloned() else {
            return self.cannot(v, "the sandbox is not in the candidate".into());
        };
        let reason = v["reason"].as_str().unwrap_or("");
        let old = match recorded(v["decision"].as_str().unwrap_or(""), reason) {
            Ok(old) => old,
            Err("") => return self.skip(&format!("decided by no policy: {reason}")),
            Err(why) => return self.cannot(v, why.into()),
        };
        let conn = v["run"].as_str().zip(v["conn_id"].as_u64());
        if let (Some((run, id)), "https") = (conn, mode) {
            self.terminated.insert((run.to_string(), id));
        }
        let Some(target) = target_of(v) else {
            return self.skip("no target");
        };
        // A trail repeats itself: the same exchange, decided once.
        let read = match (conn, mode) {
            (Some(_), "https") => true,
            // A tunnel's record comes after its requests': it is the last to ask.
            (Some((r, c)), _) => self.terminated.remove(&(r.to_string(), c)),
            (None, _) => false,
        };
        let key = memo_key(v, read);
        let judged = match self.memo.get(&key) {
            Some(j) => j.clone(),
            None => {
                let process = process_of(v);
                let j = match mode {
                    "https" => self.request(v, &sb, process.as_ref()),
                    _ => self.connection(v, &sb, process.as_ref(), (&target, read)),
                };
                if self.memo.len() >= MEMO {
                    self.memo.clear();
                }
                self.memo.insert(key, j.clone());
                j
            }
        };
        self.out.replayed += 1;
        let judged = match (judged, reason) {
            // Refused before the rules were read (a header, a body on a GET, a path that is
            // not canonical): what refused it is not in the record.
            (Replayed::Verdict(true, _), "http_not_allowed")
                if !old && !s(v, "detail").starts_with("no network.http rule") =>
            {
                Replayed::CannotTell("refused when recorded for what the trail does not keep (a header, a body on a bodiless method, a path that is not canonical)".into())
            }
            (j, _) => j,
        };
        let judged = self.flow(v, &sb, judged, read);
        self.settle(v, old, judged);
    }

    /// The candidate's flow rules over the trail in order: what the candidate allows is
    /// judged with the labels the sandbox's earlier exchanges armed, then arms its own. A
    /// request is a write by its method (the trail keeps no body or query); a tunnel whose
    /// requests were not read is a write; one whose requests were read is judged by them.
    fn flow(
        &mut self,
        v: &Value,
        sb: &crate::sandboxes::set::Sandbox,
        judged: Replayed,
        read: bool,
    ) -> Replayed {
        let Some(flows) = sb.binding.network.flows.as_deref() else {
            return judged;
        };
        let method = v["method"].as_str();
        if !matches!(judged, Replayed::Verdict(true, _)) || (method.is_none() && read) {
            return judged;
        }
        let host = s(v, "target_host");
        let path = s(v, "path");
        let port = v["target_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok());
        let dest = Dest {
            host,
            port,
            request: method.map(|m| (m, path)),
        };
        let act = match method {
            Some(m) => Act::of_request(m, false, (path, None), flows.bounds),
            None => Act::Write,
        };
        let labels = self.labels.entry(sb.binding.id.to_string()).or_default();
        if let Err(r) = labels.judge(flows, &dest, act, 0) {
            return Replayed::Verdict(
                false,
                format!("flow_refused: flow rule {} (label {})", r.rule, r.label),
            );
        }
        let by = match method {
            Some(m) => format!("{m} {host}{path}"),
            None => format!("tunnel {host}:{}", port.unwrap_or(0)),
        };
        let conn = v["conn_id"].as_u64().unwrap_or(0);
        labels.arm(flows, flows.arms(&dest), &by, conn, s(v, "ts"));
        judged
    }

    /// A record the candidate cannot judge: counted under `why`.
    fn cannot(&mut self, v: &Value, why: String) {
        let g = self.out.cannot_tell.entry(why).or_default();
        g.add(|| example(v, "-"));
    }

    /// Count what the candidate made of a replayed record.
    fn settle(&mut self, v: &Value, old: bool, judged: Replayed) {
        match judged {
            Replayed::CannotTell(why) => self.cannot(v, why),
            Replayed::Verdict(new, why) => self.compare(v, old, new, why),
        }
    }

    /// Whether the candidate lets the record's sandbox reach its destination at all: `Ok`
    /// with what allows it, or the verdict (a refusal, or what the record lacks to tell).
    fn reach(
        &self,
        v: &Value,
        sb: &crate::sandboxes::set::Sandbox,
        process: Option<&Process>,
        target: &Target,
    ) -> Result<String, Replayed> {
        let first = self.set.decide_for(sb, process, target, None);
        let addrs: Vec<IpAddr> = strs(&v["resolved"])
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        let outcome = if first.decision.verdict == Verdict::Deny && !first.needs_addresses {
            first
        } else if !addrs.is_empty() {
            self.set.decide_for(sb, process, target, Some(&addrs))
        } else if first.decision.verdict == Verdict::Deny {
            return Err(Replayed::CannotTell(
                "the candidate's address rules need the name's addresses, which the record does not carry".into(),
            ));
        } else {
            first
        };
        let d = &outcome.decision;
        let why = match &d.rule {
            Some(r) => format!("{} `{}` ({})", d.reason, r.text, r.source),
            None => d.reason.to_string(),
        };
        match d.verdict == Verdict::Allow {
            true => Ok(why),
            false => Err(Replayed::Verdict(false, why)),
        }
    }

    /// A connection (or a forwarded request) under the candidate.
    fn connection(
        &self,
        v: &Value,
        sb: &crate::sandboxes::set::Sandbox,
        process: Option<&Process>,
        (target, read): (&Target, bool),
    ) -> Replayed {
        let why = match self.reach(v, sb, process, target) {
            Ok(why) => why,
            Err(judged) => return judged,
        };
        // The candidate judges this host's requests: are they in the trail?
        let host = v["target_host"].as_str().unwrap_or("");
        let rules = HostRules::of(&sb.binding, host, process);
        let read = read || v["method"].is_string();
        match (rules.is_empty(), v["method"].as_str(), read) {
            (true, _, _) => Replayed::Verdict(true, why),
            (false, Some(_), _) => self.judge_request(v, &rules, why),
            (false, None, true) => Replayed::Verdict(true, why),
            (false, None, false) => Replayed::CannotTell(format!(
                "the candidate judges the requests on {host} by network.http rules; the proxy did not read this tunnel's requests when it was recorded"
            )),
        }
    }

    /// A request's method and path through `rules`.
    fn judge_request(&self, v: &Value, rules: &HostRules, allowed_by: String) -> Replayed {
        let (Some(method), Some(path)) = (v["method"].as_str(), v["path"].as_str()) else {
            return Replayed::CannotTell("the record carries no method and path".into());
        };
        let (Ok(m), Ok(uri)) = (method.parse::<http::Method>(), path.parse::<http::Uri>()) else {
            return Replayed::CannotTell("the recorded method or path does not parse".into());
        };
        // A WebSocket upgrade is recorded as its request with `call: websocket`: replayed
        // as the upgrade it was (a GET, or HTTP/2's extended CONNECT).
        let upgrade = v["call"] == "websocket";
        let mut headers = http::HeaderMap::new();
        if upgrade && m == http::Method::GET {
            headers.insert(
                http::header::UPGRADE,
                http::HeaderValue::from_static("websocket"),
            );
            headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("upgrade"),
            );
        }
        let head = Head {
            method: &m,
            uri: &uri,
            headers: &headers,
            has_body: false,
            upgrade,
            extended: upgrade && m == http::Method::CONNECT,
        };
        let host = v["target_host"].as_str().unwrap_or("");
        match rules.judge(host, head) {
            HeadVerdict::Allowed(_) | HeadVerdict::Socket(_) => Replayed::Verdict(true, allowed_by),
            HeadVerdict::Refused(r) => Replayed::Verdict(false, format!("{}: {}", r.reason, r.detail)),
            HeadVerdict::Judge(p) => Replayed::CannotTell(format!(
                "the candidate reads this request's body ({}); the trail keeps the call's summary, not the body",
                p.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// A request inside a terminated tunnel: refused with its host when the candidate
    /// refuses the host outright (whatever the request or its body), else the candidate's
    /// `network.http` rules.
    fn request(
        &self,
        v: &Value,
        sb: &crate::sandboxes::set::Sandbox,
        process: Option<&Process>,
    ) -> Replayed {
        if let Some(target) = target_of(v) {
            if let Err(refused @ Replayed::Verdict(false, _)) = self.reach(v, sb, process, &target)
            {
                return refused;
            }
        }
        let host = v["target_host"].as_str().unwrap_or("");
        let rules = HostRules::of(&sb.binding, host, process);
        match rules.is_empty() {
            true => Replayed::Verdict(true, "no network.http rule for the host".into()),
            false => self.judge_request(v, &rules, "allowed by network.http".into()),
        }
    }

    fn compare(&mut self, v: &Value, old: bool, new: bool, why: String) {
        match (old, new) {
            (a, b) if a == b => self.out.unchanged += 1,
            (true, false) => {
                let g = self.out.newly_refused.entry(why).or_default();
                g.add(|| example(v, "refused"));
            }
            _ => {
                let g = self.out.newly_allowed.entry(why).or_default();
                g.add(|| example(v, "allowed"));
            }
        }
    }
}

/// Decisions remembered at most (the memo starts over when full).
const MEMO: usize = 65_536;

/// What decides a record under a candidate: its sandbox, kind, target, recorded addresses,
/// process, request, and whether its tunnel's requests were read.
fn memo_key(v: &Value, read: bool) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("");
    format!(
        "{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}\0{read}",
        s("sandbox"),
        s("mode") == "https",
        s("target_host"),
        v["target_port"],
        v["resolved"],
        v["process"],
        s("method"),
        s("path"),
        s("call") == "websocket",
    )
}

/// What the candidate made of one exchange.
#[derive(Clone)]
enum Replayed {
    /// Allowed or not, and by what.
    Verdict(bool, String),
    /// The record lacks what the candidate needs.
    CannotTell(String),
}

/// The record's target (`target_host`, `target_port`).
fn target_of(v: &Value) -> Option<Target> {
    let host = v["target_host"].as_str()?;
    let port = u16::try_from(v["target_port"].as_u64()?).ok()?;
    let text = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    Target::parse(&text, None).ok()
}

/// The report as text: totals, then each group with its count and examples.
pub fn render(s: &Simulation) -> String {
    let mut out = String::new();
    if !s.beyond_ceiling.is_empty() {
        out.push_str(&format!(
            "{} member entries reach beyond the candidate's ceilings (`run` refuses this configuration until they are narrowed; below, they are refused outside_ceiling):\n",
            s.beyond_ceiling.len()
        ));
        for e in &s.beyond_ceiling {
            out.push_str(&format!("  {e}\n"));
        }
        out.push('\n');
    }
    out += &format!(
        "{} records read, {} exchanges replayed: {} unchanged, {} changed ({} newly refused, {} newly allowed), {} cannot tell\n",
        s.records,
        s.replayed,
        s.unchanged,
        s.changed(),
        s.newly_refused.values().map(|g| g.count).sum::<u64>(),
        s.widened(),
        s.cannot_tell.values().map(|g| g.count).sum::<u64>(),
    );
    let sections = [
        ("newly refused", &s.newly_refused),
        ("newly allowed", &s.newly_allowed),
        ("cannot tell", &s.cannot_tell),
    ];
    for (title, groups) in sections {
        if groups.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{title}:\n"));
        for (key, g) in groups {
            out.push_str(&format!("  {} × {}\n", g.count, key));
            for e in &g.examples {
                out.push_str(&format!("      {e}\n"));
            }
        }
    }
    if !s.skipped.is_empty() {
        out.push_str("\nnot replayed:\n");
        for (why, n) in &s.skipped {
            out.push_str(&format!("  {n} × {why}\n"));
        }
    }
    if s.unreadable > 0 {
        out.push_str(&format!("\n{} lines are not JSON records\n", s.unreadable));
    }
    out
}
