//! `audit.format: ocsf`: the same records as OCSF 1.8 events, so a SIEM needs no parser.
//!
//! Connections (and forwarded requests) are **Network Activity** (class 4001); queries to
//! the DNS listener are **DNS Activity** (class 4003). The mapping:
//!
//! | proxy record | OCSF |
//! |---|---|
//! | `event: open` / `end` | `activity_id` 1 Open / 2 Close (3 Reset when revoked, 5 Refuse when denied); DNS: 2 Response |
//! | `decision` allow / deny / report | `disposition_id` 1 Allowed / 2 Blocked / 15 Detected, `action_id` 1 Allowed / 2 Denied, `status_id` 1 Success / 2 Failure |
//! | `reason` | `status_detail` (the reason code); `detail` → `message` |
//! | `rule`, `rule_source` | `firewall_rule.name`, `firewall_rule.desc` |
//! | `sandbox` | `device` (`type_id` 6 Virtual, `name` and `uid` = the sandbox id) |
//! | `client` | `src_endpoint.ip` / `port` |
//! | `target_host`, `target_port`, `dialed` | `dst_endpoint.hostname` / `port` / `ip` |
//! | `bytes_up` / `bytes_down` | `traffic.bytes_out` / `bytes_in` (and `bytes`) |
//! | `duration_ms`, `ts` | `duration`, `time` (Unix ms) |
//! | DNS `qtype`, `rcode`, `answers`, `ttl`, `transport` | `query.hostname` / `type`, `rcode` / `rcode_id`, `answers[].rdata` / `type` / `ttl`, `connection_info.protocol_name` |
//! | `conn_id`, `run`, `mode`, `identity`, `sni`, `close`, `policy_version`, … | `metadata.uid` (`run/conn_id`), `unmapped` |
//! | an access request's step (`mode: approval`, `approval`) | Network Activity, `activity_id` 99 Other; `approval` → `unmapped.approval`, the grant's rule → `firewall_rule` |
//!
//! With `audit.chain` the lines also carry `seq` and `chain` at the top level.

use std::net::IpAddr;
use std::time::UNIX_EPOCH;

use serde_json::{json, Map, Value};

use super::record::{run_id, Entry, Event};
use crate::audit::outcome::{Close, Mode};
use crate::policy::Verdict;

/// The OCSF version the records follow.
pub const OCSF_VERSION: &str = "1.8.0";

/// Append `e` as one OCSF JSON line (with the newline) to `out`.
pub fn encode(e: &Entry, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let v = if e.record.mode == Mode::Dns {
        dns_activity(e)
    } else {
        network_activity(e)
    };
    serde_json::to_writer(&mut *out, &v)?;
    out.push(b'\n');
    Ok(())
}

fn common(e: &Entry, class_uid: u32, activity_id: u32, profiles: &[&str]) -> Map<String, Value> {
    let r = &e.record;
    let time =
        e.at.duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
    let (disposition_id, disposition, action_id, action, status_id, status) = match r.verdict {
        Verdict::Allow => (1, "Allowed", 1, "Allowed", 1, "Success"),
        Verdict::Deny => (2, "Blocked", 2, "Denied", 2, "Failure"),
        Verdict::Report => (15, "Detected", 1, "Allowed", 1, "Success"),
    };
    let mut m = Map::new();
    m.insert("class_uid".into(), json!(class_uid));
    m.insert("category_uid".into(), json!(4));
    m.insert("activity_id".into(), json!(activity_id));
    m.insert("type_uid".into(), json!(class_uid * 100 + activity_id));
    m.insert("severity_id".into(), json!(1));
    m.insert("time".into(), json!(time));
    m.insert(
        "metadata".into(),
        json!({
            "version": OCSF_VERSION,
            "uid": format!("{}/{}", run_id(), r.conn_id),
            "log_name": "egress-proxy audit",
            "profiles": profiles,
            "product": {
                "name": "egress-proxy",
                "vendor_name": "egress-proxy",
                "version": env!("CARGO_PKG_VERSION"),
            },
        }),
    );
    m.insert("disposition_id".into(), json!(disposition_id));
    m.insert("disposition".into(), json!(disposition));
    m.insert("action_id".into(), json!(action_id));
    m.insert("action".into(), json!(action));
    m.insert("status_id".into(), json!(status_id));
    m.insert("status".into(), json!(status));
    m.insert("status_detail".into(), json!(r.reason.code()));
    if let Some(d) = &r.detail {
        m.insert("message".into(), json!(d));
    }
    if let Some(rule) = &r.rule {
        m.insert(
            "firewall_rule".into(),
            json!({ "name": rule.text, "desc": rule.source.to_string() }),
        );
    }
    if let Some(sb) = &r.sandbox {
        m.insert(
            "device".into(),
            json!({ "type_id": 6, "type": "Virtual", "name": sb.as_str(), "uid": sb.as_str() }),
        );
    }
    m.insert(
        "src_endpoint".into(),
        json!({ "ip": r.client.ip().to_string(), "port": r.client.port() }),
    );
    if let Some(p) = &r.process {
        m.insert("actor".into(), json!({ "process": actor_process(p) }));
    }
    m.insert("unmapped".into(), unmapped(e));
    m
}

/// OCSF `actor.process`: the observed process (`pid`, `file.path`, `user.uid`, its parent's
/// file, `lineage`), and a vouched exec as its `cmd_line` with its parent's.
fn actor_process(p: &crate::policy::process::Process) -> Value {
    let f = crate::audit::process_facts::ProcessFacts::of(p);
    let mut out = Map::new();
    if let Some(pid) = f.pid {
        out.insert("pid".into(), json!(pid));
    }
    if let Some(exe) = f.exe {
        out.insert("file".into(), json!({ "path": exe, "type_id": 1 }));
        out.insert("lineage".into(), json!(f.ancestors));
    }
    if let Some(parent) = f.ancestors.first() {
        out.insert(
            "parent_process".into(),
            json!({ "file": { "path": parent, "type_id": 1 } }),
        );
    }
    if let Some(uid) = f.uid {
        out.insert("user".into(), json!({ "uid": uid.to_string() }));
    }
    if let Some(exec) = f.exec {
        out.insert("cmd_line".into(), json!(exec));
        if let Some(parent) = f.parent {
            out.insert("parent_process".into(), json!({ "cmd_line": parent }));
        }
    }
    if let Some(cg) = f.cgroup {
        out.insert("container".into(), json!({ "uid": cg }));
    }
    Value::Object(out)
}

fn network_activity(e: &Entry) -> Value {
    let r = &e.record;
    let activity = match (e.event, r.verdict, e.close) {
        _ if r.mode == Mode::Approval => 99,
        (Event::Open, _, _) => 1,
        (_, Verdict::Deny, _) => 5,
        (_, _, Some(Close::Revoked)) => 3,
        _ => 2,
    };
    let mut m = common(e, 4001, activity, &["security_control", "host"]);
    let mut dst = Map::new();
    if let Some(t) = &r.target {
        let host = t.host.to_string();
        match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => dst.insert("ip".into(), json!(ip.to_string())),
            Err(_) => dst.insert("hostname".into(), json!(host)),
        };
        dst.insert("port".into(), json!(t.port));
    }
    if let Some(d) = r.dialed {
        dst.insert("ip".into(), json!(d.ip().to_string()));
        dst.insert("port".into(), json!(d.port()));
    }
    if !dst.is_empty() {
        m.insert("dst_endpoint".into(), Value::Object(dst));
    }
    m.insert(
        "connection_info".into(),
        json!({ "protocol_name": "tcp", "direction_id": 2, "direction": "Outbound" }),
    );
    m.insert(
        "traffic".into(),
        json!({
            "bytes_out": e.bytes_up,
            "bytes_in": e.bytes_down,
            "bytes": e.bytes_up + e.bytes_down,
        }),
    );
    m.insert("duration".into(), json!(e.duration_ms));
    Value::Object(m)
}

/// DNS response codes by name, as OCSF numbers them (the RFC's numbers).
fn rcode_id(name: &str) -> u32 {
    match name {
        "NOERROR" => 0,
        "FORMERR" => 1,
        "SERVFAIL" => 2,
        "NXDOMAIN" => 3,
        "NOTIMP" => 4,
        "REFUSED" => 5,
        _ => 99,
    }
}

fn dns_activity(e: &Entry) -> Value {
    let r = &e.record;
    let mut m = common(e, 4003, 2, &["security_control", "host"]);
    if let Some(d) = r.dns.as_deref() {
        m.insert(
            "query".into(),
            json!({ "hostname": &*d.name, "type": &*d.qtype, "class": "IN" }),
        );
        let answers: Vec<Value> = d
            .answers
            .iter()
            .map(|ip| {
                let t = if ip.is_ipv4() { "A" } else { "AAAA" };
                let mut a = json!({ "rdata": ip.to_string(), "type": t, "class": "IN" });
                if let Some(ttl) = d.ttl {
                    a["ttl"] = json!(ttl);
                }
                a
            })
            .collect();
        if !answers.is_empty() {
            m.insert("answers".into(), json!(answers));
        }
        m.insert("rcode".into(), json!(d.rcode));
        m.insert("rcode_id".into(), json!(rcode_id(d.rcode)));
        m.insert(
            "connection_info".into(),
            json!({ "protocol_name": d.transport, "direction_id": 2, "direction": "Outbound" }),
        );
    }
    Value::Object(m)
}

/// What OCSF has no attribute for, under `unmapped`.
fn unmapped(e: &Entry) -> Value {
    let r = &e.record;
    let mut unmapped = json!({
        "conn_id": r.conn_id,
        "run": run_id(),
        "mode": r.mode,
        "identity": r.identity.as_str(),
        "decision": r.verdict.as_str(),
        "policy_version": &*r.policy_version,
    });
    if let Some(sni) = &r.sni {
        unmapped["sni"] = json!(&**sni);
    }
    if let Some(c) = e.close {
        unmapped["close"] = json!(c);
    }
    if let Some(d) = r.original_dst {
        unmapped["original_dst"] = json!(d.to_string());
    }
    if let Some(a) = &r.approval {
        unmapped["approval"] = json!(a);
    }
    if let Some(d) = r.decider.as_deref() {
        unmapped["decider"] = json!(d);
    }
    if let Some(d) = r.dlp.as_deref() {
        unmapped["dlp"] = json!(d);
    }
    if let Some(c) = r.http.as_ref().and_then(|h| h.call.as_deref()) {
        unmapped["call"] = json!(c);
    }
    unmapped
}
