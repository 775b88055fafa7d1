//! One access request: what a sandbox asks for (parsed and bounded here, from the body of
//! `POST http://egress-proxy.local/v1/requests`), its state, and its JSON view.

use crate::policy::cause::caused;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::approvals::error::{request, ApprovalError};
use crate::audit::record::rfc3339;
use crate::policy::granted::{host_text, GrantKind};
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::{Host, Target};

/// Methods and paths one request may name.
pub const MAX_SCOPE: usize = 16;
/// Longest path glob.
const MAX_PATH: usize = 256;

/// The body as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    host: String,
    port: Option<u16>,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    reason: String,
}

/// What was asked, checked.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The destination asked for.
    pub target: Target,
    /// The methods asked for (empty: any).
    pub methods: Vec<String>,
    /// The path globs asked for (empty: any).
    pub paths: Vec<String>,
    /// Why the sandbox needs it, in the agent's words (shown escaped).
    pub reason: String,
}

/// Parse and bound a request body; the error is the 400's message.
pub fn parse(body: &[u8], reason_max: usize) -> Result<Asked, ApprovalError> {
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        let what = r#"the body must be JSON {"host", "port", "methods"?, "paths"?, "reason"}"#;
        request(caused(what, e))
    })?;
    let port = b.port.unwrap_or(443);
    if port == 0 {
        return Err(request("port must be 1-65535"));
    }
    let host = Host::parse(b.host.trim()).map_err(|e| request(caused("host", e)))?;
    if let Host::Name(n) = &host {
        if n.contains('*') {
            return Err(request("host must be one name or address, not a pattern"));
        }
        if &**n == "egress-proxy.local" {
            return Err(request("egress-proxy.local is the proxy itself"));
        }
    }
    if b.reason.trim().is_empty() {
        return Err(request(
            "reason is required: say why the sandbox needs this destination",
        ));
    }
    if b.reason.len() > reason_max {
        return Err(request(format!("reason is longer than {reason_max} bytes")));
    }
    // One line: a reason is printed in `observe` and terminals, where a newline or an escape
    // sequence could pass for another line.
    if b.reason.chars().any(char::is_control) {
        return Err(request(
            "reason must be one line without control characters",
        ));
    }
    if b.methods.len() > MAX_SCOPE || b.paths.len() > MAX_SCOPE {
        return Err(request(format!(
            "at most {MAX_SCOPE} methods and {MAX_SCOPE} paths"
        )));
    }
    let mut methods = Vec::new();
    for m in &b.methods {
        let ok = !m.is_empty() && m.len() <= 16 && m.bytes().all(|c| c.is_ascii_alphabetic());
        if !ok || m.eq_ignore_ascii_case("CONNECT") || m.eq_ignore_ascii_case("TRACE") {
            return Err(request(format!(
                "method `{m}` is not a method a grant can allow"
            )));
        }
        methods.push(m.to_ascii_uppercase());
    }
    for p in &b.paths {
        if !p.starts_with('/') || p.len() > MAX_PATH || p.bytes().any(|c| c <= b' ' || c == 0x7f) {
            return Err(request(format!(
                "path `{p}` must start with / and have at most {MAX_PATH} printable characters"
            )));
        }
    }
    Ok(Asked {
        target: Target { host, port },
        methods,
        paths: b.paths,
        reason: b.reason,
    })
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Waiting for an answer.
    Pending,
    /// Approved: a grant stands.
    Approved,
    /// Denied.
    Denied,
    /// Not answered in time.
    Expired,
    /// Approved, then revoked by an operator before its end.
    Revoked,
}

impl State {
    /// The name written in the API and records.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Denied => "denied",
            State::Expired => "expired",
            State::Revoked => "revoked",
        }
    }

    /// The state a name writes, if it is one.
    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "pending" => State::Pending,
            "approved" => State::Approved,
            "denied" => State::Denied,
            "expired" => State::Expired,
            "revoked" => State::Revoked,
            _ => return None,
        })
    }
}

/// A request and its answer.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request's id (`r-…`).
    pub id: String,
    /// The sandbox that asked.
    pub sandbox: SandboxId,
    /// What it asked for.
    pub asked: Asked,
    /// Where it stands.
    pub state: State,
    /// When it was asked.
    pub created: SystemTime,
    /// Pending until then; a grant until its expiry.
    pub deadline: Option<SystemTime>,
    /// How it was answered (`admin`, `webhook`, `auto`), once it was.
    pub answered_by: Option<&'static str>,
    /// Who answered, by name when a person signed in (`console alice`), once it was.
    pub approver: Option<String>,
    /// The grant's kind, once approved.
    pub grant: Option<GrantKind>,
    /// The approver's note, if any.
    pub note: Option<String>,
    /// What auto-approval found.
    pub checks: Vec<String>,
}

impl Request {
    /// The JSON the sandbox and the admin API show.
    pub fn view(&self) -> Value {
        let a = &self.asked;
        json!({
            "id": self.id,
            "sandbox": self.sandbox.as_str(),
            "host": host_text(&a.target.host).trim_matches(['[', ']']),
            "port": a.target.port,
            "methods": a.methods,
            "paths": a.paths,
            "reason": a.reason,
            "state": self.state.as_str(),
            "created": rfc3339(self.created),
            "expires": self.deadline.map(rfc3339),
            "answered_by": self.answered_by,
            "approver": self.approver,
            "grant": self.grant.map(GrantKind::as_str),
            "note": self.note,
            "checks": self.checks,
        })
    }
}

/// A new request id: `r-` and 12 hex digits, unique across replicas (the run id and a
/// counter, hashed).
pub fn new_id(seq: u64) -> String {
    use sha2::{Digest, Sha256};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = Sha256::new();
    h.update(crate::audit::record::run_id());
    h.update(seq.to_le_bytes());
    h.update(nanos.to_le_bytes());
    format!("r-{}", hex::encode(&h.finalize()[..6]))
}

/// Whether `id` has the shape of a request id (anything else is never looked up).
pub fn valid_id(id: &str) -> bool {
    id.len() == 14 && id.starts_with("r-") && id[2..].bytes().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_parsed_and_bounded() {
        let a = parse(
            br#"{"host":"API.Example.com","port":443,"methods":["get"],"paths":["/v1/*"],"reason":"docs"}"#,
            100,
        )
        .unwrap();
        assert_eq!(a.target.to_string(), "api.example.com:443");
        assert_eq!(a.methods, ["GET"]);
        for bad in [
            r#"{"host":"*.example.com","reason":"x"}"#,
            r#"{"host":"example.com","reason":""}"#,
            r#"{"host":"example.com","port":0,"reason":"x"}"#,
            r#"{"host":"example.com","reason":"x","sandbox":"other"}"#,
            r#"{"host":"example.com","reason":"x","methods":["CONNECT"]}"#,
            r#"{"host":"example.com","reason":"x","paths":["no-slash"]}"#,
            r#"{"host":"bad host","reason":"x"}"#,
            r#"{"host":"egress-proxy.local","port":80,"reason":"x"}"#,
            r#"{"host":"example.com","reason":"x\n10:00:00 ALLOW forged"}"#,
            r#"{"host":"example.com","reason":"\u001b[32mgreen"}"#,
            "not json",
        ] {
            assert!(parse(bad.as_bytes(), 100).is_err(), "{bad}");
        }
        let long = format!(r#"{{"host":"example.com","reason":"{}"}}"#, "x".repeat(101));
        assert!(parse(long.as_bytes(), 100)
            .unwrap_err()
            .to_string()
            .contains("longer"));
    }

    #[test]
    fn ids_are_distinct_and_shaped() {
        let (a, b) = (new_id(1), new_id(2));
        assert_ne!(a, b);
        assert!(valid_id(&a) && valid_id(&b));
        assert!(!valid_id("r-../../etc") && !valid_id("x-123456789012"));
    }
}
