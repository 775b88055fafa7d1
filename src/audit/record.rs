//! The audit record (DESIGN §7) as typed values, and its JSON encoding. The data plane fills a
//! [`Record`] with what it already has — enums, addresses, `Arc`s — and never formats a
//! string for it; [`Entry::encode`] turns it into one JSON line on the writer thread. The JSON
//! field names and value spellings are the contract.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::audit::json_line::{key, Object, Text};
pub use crate::audit::outcome::{Close, Mode};
pub use crate::audit::timestamp::rfc3339;
use crate::audit::timestamp::rfc3339_into;
use crate::policy::guard::GuardVerdict;
use crate::policy::reason::Reason;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::Target;
use crate::policy::{Rule, Spell, Verdict};

/// How the sandbox was identified (the audit record's `identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A verified client certificate on the TLS proxy listener.
    Certificate,
    /// `Proxy-Authorization` or a SOCKS5 login with the sandbox's token.
    Token,
    /// The source address (`sources:`).
    Source,
    /// The default sandbox (no credential, no source matched).
    Default,
    /// Not identified.
    None,
}

impl Method {
    /// The name written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Certificate => "certificate",
            Method::Token => "token",
            Method::Source => "source",
            Method::Default => "default",
            Method::None => "none",
        }
    }
}

/// `open` (a tunnel or forwarded exchange began) or `end` (the one final record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    /// A connection or request started (audit `open` records).
    Open,
    /// It ended: the record of what happened.
    End,
}

impl Event {
    /// The record's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Open => "open",
            Event::End => "end",
        }
    }
}

/// Everything a connection's record says, as typed values.
#[derive(Debug, Clone)]
pub struct Record {
    /// The connection's id in this run.
    pub conn_id: u64,
    /// The sandbox, once identified.
    pub sandbox: Option<SandboxId>,
    /// How it was identified.
    pub identity: Method,
    /// The client's address.
    pub client: SocketAddr,
    /// How the connection came.
    pub mode: Mode,
    /// What it asked for.
    pub target: Option<Target>,
    /// The TLS ClientHello's server name, when it had one.
    pub sni: Option<Arc<str>>,
    /// Transparent mode: the destination the client dialled.
    pub original_dst: Option<SocketAddr>,
    /// Transparent mode: whether `original_dst` was among the resolved addresses.
    pub dst_in_resolved: Option<bool>,
    /// Transparent TLS: ALPN protocols offered, and whether the hello carried ECH.
    pub alpn: Option<Arc<[String]>>,
    /// Whether the ClientHello offered ECH.
    pub ech: Option<bool>,
    /// What the name resolved to (`None`: nothing; shared by the records of a tunnel's requests).
    pub resolved: Option<Arc<[IpAddr]>>,
    /// Addresses the guard kept the proxy from dialling (DESIGN §3), allowed or not.
    pub guard_refused: Vec<(IpAddr, GuardVerdict)>,
    /// The address dialled.
    pub dialed: Option<SocketAddr>,
    /// Allowed, refused or reported.
    pub verdict: Verdict,
    /// Why.
    pub reason: Reason,
    /// The rule that decided, if one did.
    pub rule: Option<Arc<Rule>>,
    /// The policy version in force.
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
    /// The DLP rules that matched, if any.
    pub dlp: Option<Box<str>>,
    /// Flow rules (`network.flows`): the labels the sandbox carried when this was judged, and
    /// those this armed.
    pub flow: Option<Box<FlowFacts>>,
    /// SHA-256 (hex) of the response body the client was given (terminated and plain-HTTP
    /// requests): what the sandbox read, for provenance.
    pub body_sha256: Option<Box<str>>,
    /// An inference call's tokens (`protocol: openai | anthropic | gemini`).
    pub tokens: Option<Box<TokenFacts>>,
    /// The process inside the sandbox that made it, when attributed (DESIGN §4).
    pub process: Option<Arc<crate::policy::process::Process>>,
}

/// What a record says of flow labels.
#[derive(Debug, Clone, Default)]
pub struct FlowFacts {
    /// The labels armed when it was judged (`private,untrusted`).
    pub labels: Option<Box<str>>,
    /// The labels it armed.
    pub armed: Option<Box<str>>,
}

/// What an inference call used, as the provider reported it (or, when it reported nothing,
/// what was reserved for it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TokenFacts {
    /// `openai`, `anthropic`, `gemini`.
    pub provider: &'static str,
    /// The model the provider says answered (else the one asked for).
    pub model: Option<Box<str>>,
    /// Input tokens not read from or written to a cache.
    pub input: u64,
    /// Input tokens read from the cache.
    pub cached_input: u64,
    /// Input tokens written to the cache.
    pub cache_write: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
    /// Of the output, reasoning tokens.
    pub reasoning: u64,
    /// Every token counted against `tokens_per_day`.
    pub total: u64,
    /// What it cost by `defaults.prices`, in dollars (absent: no price for the model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// `reported` (the provider's usage) or `reserved` (it reported none: the reservation
    /// stands).
    pub counted: &'static str,
}

/// What an approval record adds: the request, the step, who took it and the grant.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalFacts {
    /// The request's id (`r-…`), also the grant's name.
    pub request: Box<str>,
    /// `requested`, `approved`, `denied`, `expired`, `revoked`.
    pub step: &'static str,
    /// Who: `sandbox`, `admin`, `webhook`, `auto`, `expiry`, `deletion`.
    pub by: &'static str,
    /// The credential the answerer used (`token sha256:…`, `certificate …`): never a secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<Box<str>>,
    /// The grant kind, when a grant allowed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<&'static str>,
    /// When that grant ends, if it does.
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
    /// The request's method.
    pub method: http::Method,
    /// Without the query (which may carry secrets).
    pub path: Arc<str>,
    /// The response status (0: none, the request was refused before it was sent).
    pub status: u16,
    /// The credential put on the request, by name (never its value).
    pub credential: Option<Box<str>>,
    /// Credentials whose secret the response carried (replaced by the placeholder).
    pub secret_reflected: Option<Box<str>>,
    /// What the request called in a protocol a rule named: `tools/call search` (MCP),
    /// `mutation createGist` (GraphQL), `eth_call` (JSON-RPC), `git fetch`, `lfs upload`.
    pub call: Option<String>,
}

/// What a DNS listener record says beyond a connection's fields.
#[derive(Debug, Clone, Default)]
pub struct DnsFacts {
    /// The name asked for (normalised when it could be; as received otherwise); shared, so
    /// that a repeat served from the answer cache copies no text.
    pub name: Arc<str>,
    /// The record type, by name (`A`, `TXT`, `TYPE65280`): hickory's static names need no
    /// allocation per query.
    pub qtype: Cow<'static, str>,
    /// The response code sent (`NOERROR`, `NXDOMAIN`, `REFUSED`, `SERVFAIL`, `FORMERR`).
    pub rcode: &'static str,
    /// Addresses given to the client (after policy and guard filtering); shared, as `name`.
    pub answers: Arc<[IpAddr]>,
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
    /// How many records were summed.
    pub count: u64,
    /// Of those, dropped unanswered (over the per-source rate).
    pub dropped: u64,
    /// The first one's time.
    pub first: Box<str>,
    /// The last one's time.
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
            resolved: None,
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
            flow: None,
            body_sha256: None,
            tokens: None,
            process: None,
        }
    }
}

/// One line for the writer: a record, when it was produced, and the end-of-connection facts.
#[derive(Debug)]
pub struct Entry {
    /// Open or end.
    pub event: Event,
    /// When.
    pub at: SystemTime,
    /// The record.
    pub record: Record,
    /// Bytes client → destination.
    pub bytes_up: u64,
    /// Bytes destination → client.
    pub bytes_down: u64,
    /// How long the exchange lasted.
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

/// A rule's source written into the record's JSON ([`crate::policy::RuleSource::spell`]).
impl Spell for Text<'_> {
    fn text(&mut self, s: &str) {
        Text::text(self, s);
    }

    fn number(&mut self, n: u64) {
        Text::number(self, n);
    }
}

impl Entry {
    /// Append this entry as one JSON line (with the newline) to `out`: the fields in the
    /// contract's order, `null` where a connection field has no value, absent where a field
    /// belongs to another kind of record ([`crate::audit::json_line`]).
    pub fn encode(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let r = &self.record;
        let dns = r.dns.as_deref();
        let summed = dns.and_then(|d| d.summed.as_ref());
        let mut o = Object::open(out);
        o.plain(key!("ts"), |out| rfc3339_into(out, self.at));
        o.word(key!("event"), self.event.as_str());
        o.u64(key!("conn_id"), r.conn_id);
        o.str_or_null(key!("sandbox"), r.sandbox.as_ref().map(SandboxId::as_str));
        o.word(key!("identity"), r.identity.as_str());
        o.addr(key!("client"), &r.client);
        o.word(key!("mode"), r.mode.as_str());
        match (&r.target, dns) {
            (Some(t), _) => o.host(key!("target_host"), &t.host),
            // A query's name is text already (no formatter).
            (None, dns) => o.str_or_null(key!("target_host"), dns.map(|d| &*d.name)),
        }
        o.u64_or_null(
            key!("target_port"),
            r.target.as_ref().map(|t| u64::from(t.port)),
        );
        o.str_or_null(key!("sni"), r.sni.as_deref());
        o.addr_or_null(key!("original_dst"), r.original_dst.as_ref());
        o.bool_if(key!("dst_in_resolved"), r.dst_in_resolved);
        if let Some(alpn) = &r.alpn {
            o.list(key!("alpn"), alpn);
        }
        o.bool_if(key!("ech"), r.ech);
        o.ips(key!("resolved"), r.resolved.as_deref().unwrap_or_default());
        o.addr_or_null(key!("dialed"), r.dialed.as_ref());
        o.word(key!("decision"), r.verdict.as_str());
        o.word(key!("reason"), r.reason.code());
        o.str_or_null(key!("rule"), r.rule.as_ref().map(|x| x.text.as_str()));
        match &r.rule {
            Some(rule) => o.composed(key!("rule_source"), |t| rule.source.spell(t)),
            None => o.null(key!("rule_source")),
        }
        o.str(key!("policy_version"), &r.policy_version);
        o.u64(key!("bytes_up"), self.bytes_up);
        o.u64(key!("bytes_down"), self.bytes_down);
        o.u64(key!("duration_ms"), self.duration_ms);
        o.word_or_null(key!("close"), self.close.map(Close::as_str));
        o.str_if(key!("detail"), detail(r).as_deref());
        if let Some(d) = dns {
            o.str(key!("qtype"), &d.qtype);
            o.word(key!("rcode"), d.rcode);
            o.ips(key!("answers"), &d.answers);
            o.u64_if(
                key!("passed_records"),
                Some(d.passed as u64).filter(|n| *n > 0),
            );
        }
        o.u64_if(key!("count"), summed.map(|s| s.count));
        o.u64_if(key!("dropped"), summed.map(|s| s.dropped));
        o.str_if(key!("first_ts"), summed.map(|s| &*s.first));
        o.str_if(key!("last_ts"), summed.map(|s| &*s.last));
        o.u64_if(key!("ttl"), dns.and_then(|d| d.ttl).map(u64::from));
        if let Some(d) = dns {
            o.word(key!("transport"), d.transport);
        }
        request_facts(&mut o, r);
        o.serialized_if(key!("tokens"), r.tokens.as_deref())?;
        let process = r
            .process
            .as_deref()
            .map(super::process_facts::ProcessFacts::of);
        o.serialized_if(key!("process"), process.as_ref())?;
        o.serialized_if(key!("approval"), r.approval.as_deref())?;
        o.str_if(key!("run"), RUN.get().map(String::as_str));
        o.close();
        out.push(b'\n');
        Ok(())
    }
}

/// What a request's record adds (its method, path, status, what it called) and what the
/// phases that read it said (decider, DLP, flow labels).
fn request_facts(o: &mut Object<'_>, r: &Record) {
    if let Some(h) = r.http.as_deref() {
        o.str(key!("method"), h.method.as_str());
        o.str(key!("path"), &h.path);
        o.u64(key!("status"), u64::from(h.status));
        o.str_if(key!("credential"), h.credential.as_deref());
        o.str_if(key!("secret_reflected"), h.secret_reflected.as_deref());
        o.str_if(key!("call"), h.call.as_deref());
    }
    o.str_if(key!("body_sha256"), r.body_sha256.as_deref());
    o.str_if(key!("decider"), r.decider.as_deref());
    o.str_if(key!("dlp"), r.dlp.as_deref());
    if let Some(f) = r.flow.as_deref() {
        o.str_if(key!("labels"), f.labels.as_deref());
        o.str_if(key!("armed"), f.armed.as_deref());
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

#[cfg(test)]
mod tests {
    use super::*;

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
        r.resolved = Some(Arc::new(["10.0.0.1".parse().unwrap()]));
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
