//! `GET /v1/observe`: the decisions as they happen — every audit record (`open` and `end`)
//! written from the moment of the call, as JSON lines on a response that does not end,
//! filtered by `sandbox`, `decision`, `reason` and `host` (query parameters, each optional,
//! all must match). Follows reloads (the stream comes from the audit writer, not from a
//! policy). A slow observer never slows the proxy: it falls behind in its own bounded buffer,
//! loses the oldest lines and gets `{"event":"observe_dropped","count":N}` saying how many.
//! The admin token is required (decisions name sandboxes and destinations).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};

/// Lines waiting for an observer's connection to take them, at most.
const WAITING: usize = 256;

/// What an observer wants to see.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Filter {
    sandbox: Option<String>,
    decision: Option<String>,
    reason: Option<String>,
    host: Option<String>,
}

/// Why a query cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum BadQuery {
    /// An unknown query parameter.
    #[error("unknown or repeated query parameter `{0}` (sandbox, decision, reason, host)")]
    Parameter(String),
    /// A `decision` that is not allow, deny or report.
    #[error("decision `{0}` is none of allow, deny, report: nothing would ever match")]
    Decision(String),
    /// A `reason` that is not one of the closed list.
    #[error("reason `{0}` is not a reason code (e.g. no_rule_matched, denied_by_rule): nothing would ever match")]
    Reason(String),
}

/// The decisions a record can carry.
pub const DECISIONS: [&str; 3] = ["allow", "deny", "report"];

impl Filter {
    /// Read `sandbox=…&decision=…&reason=…&host=…`.
    pub fn parse(query: Option<&str>) -> Result<Filter, BadQuery> {
        let mut f = Filter::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            let slot = match k {
                "sandbox" => &mut f.sandbox,
                "decision" => &mut f.decision,
                "reason" => &mut f.reason,
                "host" => &mut f.host,
                _ => return Err(BadQuery::Parameter(k.to_string())),
            };
            if slot.replace(v).is_some() {
                return Err(BadQuery::Parameter(k.to_string()));
            }
        }
        // A value no record can carry would match nothing, silently, for ever.
        if let Some(d) = f.decision.as_deref().filter(|d| !DECISIONS.contains(d)) {
            return Err(BadQuery::Decision(d.to_string()));
        }
        let known = |r: &str| {
            crate::policy::reason::Reason::ALL
                .iter()
                .any(|k| k.code() == r)
        };
        if let Some(r) = f.reason.as_deref().filter(|r| !known(r)) {
            return Err(BadQuery::Reason(r.to_string()));
        }
        Ok(f)
    }

    /// Whether a record's JSON line passes.
    pub fn matches(&self, line: &[u8]) -> bool {
        #[derive(Deserialize)]
        struct Fields<'a> {
            #[serde(borrow)]
            sandbox: Option<&'a str>,
            #[serde(borrow)]
            decision: Option<&'a str>,
            #[serde(borrow)]
            reason: Option<&'a str>,
            #[serde(borrow)]
            target_host: Option<&'a str>,
        }
        let Ok(r) = serde_json::from_slice::<Fields<'_>>(line) else {
            return false;
        };
        let is = |want: &Option<String>, got: Option<&str>| match want {
            None => true,
            Some(w) => got == Some(w.as_str()),
        };
        is(&self.sandbox, r.sandbox)
            && is(&self.decision, r.decision)
            && is(&self.reason, r.reason)
            && is(&self.host, r.target_host)
    }
}

/// `%XX` decoded (a `+` is a space), invalid escapes kept as they are.
fn percent_decode(s: &str) -> String {
    String::from_utf8_lossy(&crate::policy::http_rules::percent_decode(s)).into_owned()
}

/// The observer's response body: the lines its forwarder passes on.
pub struct Lines {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for Lines {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|l| l.map(|b| Ok(Frame::data(b))))
    }
}

/// Start forwarding the records from `records` that pass `filter`; the body ends only when
/// the audit log closes, and the forwarder ends when the observer goes away.
pub fn stream(mut records: broadcast::Receiver<Bytes>, filter: Filter) -> Lines {
    let (tx, rx) = mpsc::channel::<Bytes>(WAITING);
    tokio::spawn(async move {
        loop {
            let line = match records.recv().await {
                Ok(line) => line,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // The observer is too slow: the oldest lines were dropped, and it is told.
                    let notice = format!("{{\"event\":\"observe_dropped\",\"count\":{n}}}\n");
                    Bytes::from(notice)
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let notice = line.starts_with(b"{\"event\":\"observe_dropped\"");
            if (notice || filter.matches(&line)) && tx.send(line).await.is_err() {
                return;
            }
        }
    });
    Lines { rx }
}

/// One line for a person: time, decision, sandbox, mode, destination, reason (and rule or
/// detail), and for an `end` how it closed; `colour` wraps the decision in ANSI colour.
pub fn human_line(r: &serde_json::Value, colour: bool) -> String {
    let s = |k: &str| r[k].as_str().unwrap_or("");
    if s("event") == "observe_dropped" {
        return format!(
            "({} records dropped: this observer fell behind)",
            r["count"].as_u64().unwrap_or(0)
        );
    }
    let time = s("ts").split_once('T').map(|(_, t)| t).unwrap_or("");
    let decision = s("decision").to_ascii_uppercase();
    let paint = match (colour, decision.as_str()) {
        (false, _) => "",
        (true, "ALLOW") => "\x1b[32m",
        (true, "DENY") => "\x1b[31m",
        (true, _) => "\x1b[33m",
    };
    let reset = if paint.is_empty() { "" } else { "\x1b[0m" };
    let target = match (r["target_host"].as_str(), r["target_port"].as_u64()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => r["original_dst"].as_str().unwrap_or("-").to_string(),
    };
    let mut line = format!(
        "{time} {paint}{decision:<6}{reset} {} {} {target} {}",
        r["sandbox"].as_str().unwrap_or("-"),
        s("mode"),
        s("reason"),
    );
    if let Some(rule) = r["rule"].as_str() {
        line.push_str(&format!(" (rule {rule})"));
    }
    if let Some(d) = r["decider"].as_str() {
        line.push_str(&format!(" decider {d}"));
    }
    if let Some(d) = r["dlp"].as_str() {
        line.push_str(&format!(" dlp {d}"));
    }
    if let Some(c) = r["call"].as_str() {
        line.push_str(&format!(" call {c}"));
    }
    if let Some(t) = r["tokens"].as_object() {
        line.push_str(&tokens_shown(t));
    }
    line.push_str(&process_shown(&r["process"]));
    if let Some(d) = r["detail"].as_str() {
        line.push_str(&format!(" - {}", super::shown::for_person(d)));
    }
    if let Some(a) = r["approval"].as_object() {
        line.push_str(&approval_shown(a));
        return line;
    }
    match s("event") {
        "open" => line.push_str(" [open]"),
        _ => {
            if let Some(c) = r["close"].as_str() {
                line.push_str(&format!(
                    " [{c}, up {} down {}]",
                    r["bytes_up"].as_u64().unwrap_or(0),
                    r["bytes_down"].as_u64().unwrap_or(0)
                ));
            }
        }
    }
    line
}

/// An access request's step on a line: ` [request ID approved by alice, once grant: why]`.
fn approval_shown(a: &serde_json::Map<String, serde_json::Value>) -> String {
    let f = |k: &str| a.get(k).and_then(|v| v.as_str()).unwrap_or("");
    let mut shown = format!(" [request {} {} by {}", f("request"), f("step"), f("by"));
    if !f("grant").is_empty() {
        shown.push_str(&format!(", {} grant", f("grant")));
    }
    if !f("text").is_empty() {
        shown.push_str(&format!(": {}", super::shown::for_person(f("text"))));
    }
    shown.push(']');
    shown
}

/// The process on a line: ` by exec call_1.fetch /usr/bin/curl[1234]`, or why it is unknown.
fn process_shown(p: &serde_json::Value) -> String {
    let mut out = String::new();
    if let Some(exec) = p["exec"].as_str() {
        out.push_str(&format!(" by exec {}", super::shown::for_person(exec)));
    }
    match (p["exe"].as_str(), p["unknown"].as_str()) {
        (Some(exe), _) => {
            let by = if out.is_empty() { " by" } else { "" };
            let pid = p["pid"].as_u64().unwrap_or(0);
            out.push_str(&format!("{by} {}[{pid}]", super::shown::for_person(exe)));
        }
        (None, Some(why)) => out.push_str(&format!(" process unknown ({why})")),
        _ => {}
    }
    out
}

/// An inference call's tokens on its line: ` tokens 17 (in 10 cached 2 out 5) $0.000005`.
fn tokens_shown(t: &serde_json::Map<String, serde_json::Value>) -> String {
    let n = |k: &str| t.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (total, input, cached, output) = (n("total"), n("input"), n("cached_input"), n("output"));
    let mut out = format!(" tokens {total} (in {input} cached {cached} out {output})");
    if let Some(c) = t.get("cost_usd").and_then(|v| v.as_f64()) {
        out.push_str(&format!(" ${c:.6}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_read_the_query_and_match_records() {
        let f = Filter::parse(Some("sandbox=agent-1&decision=deny&host=evil.example")).unwrap();
        let deny = br#"{"event":"end","sandbox":"agent-1","decision":"deny","reason":"no_rule_matched","target_host":"evil.example"}"#;
        let allow = br#"{"event":"end","sandbox":"agent-1","decision":"allow","reason":"rule_matched","target_host":"evil.example"}"#;
        let other = br#"{"event":"end","sandbox":"agent-2","decision":"deny","reason":"no_rule_matched","target_host":"evil.example"}"#;
        assert!(f.matches(deny));
        assert!(!f.matches(allow));
        assert!(!f.matches(other));
        assert!(!f.matches(b"not json"));
        assert!(Filter::parse(None).unwrap().matches(allow));
        assert_eq!(
            Filter::parse(Some("reason=no%5Frule_matched"))
                .unwrap()
                .reason,
            Some("no_rule_matched".into())
        );
        assert!(Filter::parse(Some("token=x")).is_err());
        assert!(Filter::parse(Some("sandbox=a&sandbox=b")).is_err());
        // Values no record carries are refused, not followed silently for ever.
        for bad in [
            "decision=DENY",
            "decision=blocked",
            "reason=nope",
            "reason=Denied",
        ] {
            assert!(Filter::parse(Some(bad)).is_err(), "{bad}");
        }
        assert!(Filter::parse(Some("decision=report&reason=denied_by_rule")).is_ok());
        assert_eq!(percent_decode("a%2"), "a%2");
        let r: serde_json::Value = serde_json::from_slice(deny).unwrap();
        assert_eq!(
            human_line(&r, false),
            " DENY   agent-1  evil.example no_rule_matched"
        );
        assert!(human_line(&r, true).contains("\x1b[31mDENY  \x1b[0m"));
        assert_eq!(percent_decode("%zz+x"), "%zz x");
    }

    #[test]
    fn an_approval_step_reads_as_one_line() {
        let r: serde_json::Value = serde_json::from_str(
            r#"{"ts":"2026-11-26T10:00:00.000Z","event":"end","sandbox":"agent-1","mode":"approval","decision":"allow","reason":"grant_matched","target_host":"docs.rs","target_port":443,"rule":"docs.rs:443","approval":{"request":"r-0123456789ab","step":"approved","by":"admin","grant":"ttl","text":"ok"}}"#,
        )
        .unwrap();
        assert_eq!(
            human_line(&r, false),
            "10:00:00.000Z ALLOW  agent-1 approval docs.rs:443 grant_matched (rule docs.rs:443) [request r-0123456789ab approved by admin, ttl grant: ok]"
        );
    }

    #[test]
    fn an_inference_call_shows_its_tokens_and_cost() {
        let r: serde_json::Value = serde_json::from_str(
            r#"{"event":"end","sandbox":"a","mode":"https","decision":"allow","reason":"rule_matched","target_host":"api.openai.com","target_port":443,"call":"gpt-4o-mini","tokens":{"provider":"openai","model":"gpt-4o-mini","input":10,"cached_input":2,"cache_write":0,"output":5,"reasoning":1,"total":17,"cost_usd":0.00000465,"counted":"reported"}}"#,
        )
        .unwrap();
        let line = human_line(&r, false);
        assert!(
            line.ends_with("call gpt-4o-mini tokens 17 (in 10 cached 2 out 5) $0.000005"),
            "{line}"
        );
    }
}
