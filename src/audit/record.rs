//! The audit record (DESIGN §7) as typed values, and its JSON encoding. The data plane fills a
//! [`Record`] with what it already has — enums, addresses, `Arc`s — and never formats a
//! string for it; [`Entry::encode`] turns it into one JSON line on the writer thread. The JSON
//! field names and value spellings are the contract.

use std::borrow::Cow;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub use crate::audit::outcome::{Close, Mode};
use crate::egress::identity::Method;
use crate::policy::guard::GuardVerdict;
use crate::policy::reason::Reason;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::Target;
use crate::policy::{Rule, Verdict};

/// `open` (a tunnel or forwarded exchange began) or `end` (the one final record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    Open,
    End,
}

/// Everything a connection's record says, as typed values.
#[derive(Debug, Clone)]
pub struct Record {
    pub conn_id: u64,
    pub sandbox: Option<SandboxId>,
    pub identity: Method,
    pub client: SocketAddr,
    pub mode: Mode,
    pub target: Option<Target>,
    pub sni: Option<Box<str>>,
    pub original_dst: Option<SocketAddr>,
    /// Transparent mode: whether `original_dst` was among the resolved addresses.
    pub dst_in_resolved: Option<bool>,
    /// Transparent TLS: ALPN protocols offered, and whether the hello carried ECH.
    pub alpn: Option<Vec<String>>,
    pub ech: Option<bool>,
    pub resolved: Vec<IpAddr>,
    /// Addresses the guard kept the proxy from dialling (DESIGN §3), allowed or not.
    pub guard_refused: Vec<(IpAddr, GuardVerdict)>,
    pub dialed: Option<SocketAddr>,
    pub verdict: Verdict,
    pub reason: Reason,
    pub rule: Option<Arc<Rule>>,
    pub policy_version: Arc<str>,
    /// A short human-readable detail (never a secret).
    pub detail: Option<Cow<'static, str>>,
    /// A DNS listener query: what was asked and answered.
    pub dns: Option<Box<DnsFacts>>,
    /// A request inside a terminated tunnel (`mode: "https"`).
    pub http: Option<Box<HttpFacts>>,
    /// An access request's step (`mode: "approval"`).
    pub approval: Option<Box<ApprovalFacts>>,
    /// What the decider said (`allow`, `deny 403: …`, `unavailable: …`), and what the body
    /// scanner found (`dlp: rule, …`).
    pub decider: Option<Box<str>>,
    pub dlp: Option<Box<str>>,
}

/// What an approval record adds: the request, the step, who took it and the grant.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalFacts {
    /// The request's id (`r-…`), also the grant's name.
    pub request: Box<str>,
    /// `requested`, `approved`, `denied`, `expired`, `revoked`.
    pub step: &'static str,
    /// Who: `sandbox`, `admin`, `webhook`, `auto`, `expiry`.
    pub by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// The agent's reason or the approver's note (length-limited at the door).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<Box<str>>,
    /// The auto-approval checks that passed or stopped it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<String>,
}

/// What a record of a request inside a terminated tunnel adds.
#[derive(Debug, Clone)]
pub struct HttpFacts {
    pub method: Box<str>,
    /// Without the query (which may carry secrets).
    pub path: Box<str>,
    /// The response status (0: none, the request was refused before it was sent).
    pub status: u16,
    /// The credential put on the request, by name (never its value).
    pub credential: Option<Box<str>>,
    /// Credentials whose secret the response carried (replaced by the placeholder).
    pub secret_reflected: Option<Box<str>>,
    /// What the request called in a protocol a rule named: `tools/call search` (MCP),
    /// `mutation createGist` (GraphQL), `eth_call` (JSON-RPC), `git fetch`, `lfs upload`.
    pub call: Option<Box<str>>,
}

/// What a DNS listener record says beyond a connection's fields.
#[derive(Debug, Clone, Default)]
pub struct DnsFacts {
    /// The name asked for (normalised when it could be; as received otherwise).
    pub name: Box<str>,
    /// The record type, by name (`A`, `TXT`, `TYPE65280`).
    pub qtype: Box<str>,
    /// The response code sent (`NOERROR`, `NXDOMAIN`, `REFUSED`, `SERVFAIL`, `FORMERR`).
    pub rcode: &'static str,
    /// Addresses given to the client (after policy and guard filtering).
    pub answers: Vec<IpAddr>,
    /// Records of a passed type given (`dns.pass_types`), counted.
    pub passed: usize,
    /// The TTL of the answer, in seconds.
    pub ttl: Option<u32>,
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// A record that sums an unidentified source's refused queries: how many, and the first
    /// and last (RFC 3339).
    pub summed: Option<Summed>,
}

/// The refused queries of one unidentified source over one period.
#[derive(Debug, Clone, Default)]
pub struct Summed {
    pub count: u64,
    /// Of those, dropped unanswered (over the per-source rate).
    pub dropped: u64,
    pub first: Box<str>,
    pub last: Box<str>,
}

impl Record {
    /// A record for a connection that has been accepted and nothing else: denied
    /// `invalid_target` until a stage says otherwise.
    pub fn new(conn_id: u64, client: SocketAddr, mode: Mode, policy_version: Arc<str>) -> Self {
        Record {
            conn_id,
            sandbox: None,
            identity: Method::None,
            client,
            mode,
            target: None,
            sni: None,
            original_dst: None,
            dst_in_resolved: None,
            alpn: None,
            ech: None,
            resolved: Vec::new(),
            guard_refused: Vec::new(),
            dialed: None,
            verdict: Verdict::Deny,
            reason: Reason::InvalidTarget,
            rule: None,
            policy_version,
            detail: None,
            dns: None,
            http: None,
            approval: None,
            decider: None,
            dlp: None,
        }
    }
}

/// One line for the writer: a record, when it was produced, and the end-of-connection facts.
#[derive(Debug)]
pub struct Entry {
    pub event: Event,
    pub at: SystemTime,
    pub record: Record,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// `None` on `open` entries.
    pub close: Option<Close>,
}

/// This process's run: `PID-STARTMS` (process id, start time in Unix milliseconds, hex). An
/// `open` record whose `end` never came belongs to a run that was killed; a reader tells runs
/// apart by this field.
static RUN: OnceLock<String> = OnceLock::new();

/// This process's run id (empty before [`set_run_id`]).
pub fn run_id() -> &'static str {
    RUN.get().map(String::as_str).unwrap_or("")
}

/// Name this process's run (once, at start).
pub fn set_run_id() {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let _ = RUN.set(format!("{}-{ms:x}", std::process::id()));
}

/// The JSON shape of an entry (field order and names are the contract).
#[derive(Serialize)]
struct Json<'a> {
    ts: Shown<Rfc3339>,
    event: Event,
    conn_id: u64,
    sandbox: Option<&'a str>,
    identity: &'static str,
    client: Shown<&'a SocketAddr>,
    mode: Mode,
    target_host: Option<Shown<&'a dyn Display>>,
    target_port: Option<u16>,
    sni: Option<&'a str>,
    original_dst: Option<Shown<&'a SocketAddr>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dst_in_resolved: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    alpn: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ech: Option<bool>,
    resolved: Listed<'a>,
    dialed: Option<Shown<&'a SocketAddr>>,
    decision: Verdict,
    reason: Reason,
    rule: Option<&'a str>,
    rule_source: Option<Shown<&'a dyn Display>>,
    policy_version: &'a str,
    bytes_up: u64,
    bytes_down: u64,
    duration_ms: u64,
    close: Option<Close>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    qtype: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rcode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    answers: Option<Listed<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    passed_records: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dropped: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_ts: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_ts: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transport: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    credential: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_reflected: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    call: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decider: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dlp: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<&'a ApprovalFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<&'static str>,
}

impl Entry {
    /// Append this entry as one JSON line (with the newline) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let r = &self.record;
        let dns = r.dns.as_deref();
        let json = Json {
            ts: Shown(Rfc3339(self.at)),
            event: self.event,
            conn_id: r.conn_id,
            sandbox: r.sandbox.as_ref().map(SandboxId::as_str),
            identity: r.identity.as_str(),
            client: Shown(&r.client),
            mode: r.mode,
            target_host: r
                .target
                .as_ref()
                .map(|t| Shown(&t.host as &dyn Display))
                .or_else(|| dns.map(|d| Shown(&d.name as &dyn Display))),
            target_port: r.target.as_ref().map(|t| t.port),
            sni: r.sni.as_deref(),
            original_dst: r.original_dst.as_ref().map(Shown),
            dst_in_resolved: r.dst_in_resolved,
            alpn: r.alpn.as_deref(),
            ech: r.ech,
            resolved: Listed(&r.resolved),
            dialed: r.dialed.as_ref().map(Shown),
            decision: r.verdict,
            reason: r.reason,
            rule: r.rule.as_ref().map(|x| x.text.as_str()),
            rule_source: r.rule.as_ref().map(|x| Shown(&x.source as &dyn Display)),
            policy_version: &r.policy_version,
            bytes_up: self.bytes_up,
            bytes_down: self.bytes_down,
            duration_ms: self.duration_ms,
            close: self.close,
            detail: detail(r),
            qtype: dns.map(|d| &*d.qtype),
            rcode: dns.map(|d| d.rcode),
            answers: dns.map(|d| Listed(&d.answers)),
            passed_records: dns.map(|d| d.passed).filter(|n| *n > 0),
            count: dns.and_then(|d| d.summed.as_ref()).map(|s| s.count),
            dropped: dns.and_then(|d| d.summed.as_ref()).map(|s| s.dropped),
            first_ts: dns.and_then(|d| d.summed.as_ref()).map(|s| &*s.first),
            last_ts: dns.and_then(|d| d.summed.as_ref()).map(|s| &*s.last),
            ttl: dns.and_then(|d| d.ttl),
            transport: dns.map(|d| d.transport),
            method: r.http.as_ref().map(|h| &*h.method),
            path: r.http.as_ref().map(|h| &*h.path),
            status: r.http.as_ref().map(|h| h.status),
            credential: r.http.as_ref().and_then(|h| h.credential.as_deref()),
            secret_reflected: r.http.as_ref().and_then(|h| h.secret_reflected.as_deref()),
            call: r.http.as_ref().and_then(|h| h.call.as_deref()),
            decider: r.decider.as_deref(),
            dlp: r.dlp.as_deref(),
            approval: r.approval.as_deref(),
            run: RUN.get().map(String::as_str),
        };
        serde_json::to_writer(&mut *out, &json)?;
        out.push(b'\n');
        Ok(())
    }
}

/// The record's `detail`: the stage's own words, then what the guard refused.
fn detail(r: &Record) -> Option<Cow<'_, str>> {
    if r.guard_refused.is_empty() {
        return r.detail.as_deref().map(Cow::Borrowed);
    }
    let list: Vec<String> = r
        .guard_refused
        .iter()
        .map(|(ip, v)| match v {
            GuardVerdict::Prohibited(range) => format!("{ip} ({range})"),
            GuardVerdict::Loop => format!("{ip} (this proxy)"),
            GuardVerdict::Permit => ip.to_string(),
        })
        .collect();
    let guard = format!("guard refused {}", list.join(", "));
    Some(Cow::Owned(match &r.detail {
        Some(d) => format!("{d}; {guard}"),
        None => guard,
    }))
}

/// RFC 3339 UTC timestamp with milliseconds.
pub fn rfc3339(at: SystemTime) -> String {
    Rfc3339(at).to_string()
}

/// A time shown as an RFC 3339 UTC timestamp with milliseconds (written straight into the
/// record's line, no string of its own).
struct Rfc3339(SystemTime);

impl Display for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = d.as_secs() as i64;
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
            d.subsec_millis()
        )
    }
}

/// A value serialized as its `Display` text, written (escaped) straight into the line: no
/// `String` per address, name or timestamp on the writer thread.
struct Shown<T>(T);

impl<T: Display> Serialize for Shown<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// Addresses serialized as a list of their texts.
struct Listed<'a>(&'a [IpAddr]);

impl Serialize for Listed<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Shown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_345_423_882);
        assert_eq!(rfc3339(at), "2026-11-22T11:03:43.882Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn encodes_every_contract_field_with_its_spelling() {
        let mut r = Record::new(
            7,
            "127.0.0.1:5000".parse().unwrap(),
            Mode::Connect,
            "abc".into(),
        );
        r.sandbox = SandboxId::new("demo").ok();
        r.identity = Method::Source;
        r.target = Target::parse("[2001:db8::1]:443", None).ok();
        r.resolved = vec!["10.0.0.1".parse().unwrap()];
        r.guard_refused = vec![(
            "10.0.0.1".parse().unwrap(),
            GuardVerdict::Prohibited("10.0.0.0/8"),
        )];
        r.detail = Some("upstream said no".into());
        let e = Entry {
            event: Event::End,
            at: UNIX_EPOCH,
            record: r,
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
            close: Some(Close::Revoked),
        };
        let mut out = Vec::new();
        e.encode(&mut out).unwrap();
        assert_eq!(out.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["event"], "end");
        assert_eq!(v["sandbox"], "demo");
        assert_eq!(v["identity"], "source");
        assert_eq!(v["mode"], "connect");
        assert_eq!(v["target_host"], "[2001:db8::1]");
        assert_eq!(v["target_port"], 443);
        assert_eq!(v["decision"], "deny");
        assert_eq!(v["reason"], "invalid_target");
        assert_eq!(v["close"], "revoked");
        assert_eq!(v["resolved"], serde_json::json!(["10.0.0.1"]));
        assert_eq!(
            v["detail"],
            "upstream said no; guard refused 10.0.0.1 (10.0.0.0/8)"
        );
        for key in [
            "ts",
            "conn_id",
            "client",
            "sni",
            "original_dst",
            "dialed",
            "rule",
            "rule_source",
            "policy_version",
            "bytes_up",
            "bytes_down",
            "duration_ms",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(v.get("alpn").is_none() && v.get("ech").is_none());
    }
}
