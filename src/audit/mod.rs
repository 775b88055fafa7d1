//! The audit trail (DESIGN §7): exactly one `end` record per connection (per forwarded request
//! in HTTP mode), plus an `open` record when a tunnel or forwarded exchange begins.
//!
//! Every connection owns one [`AuditGuard`], created the moment it is accepted. The pipeline
//! stages return typed values; the listener hands them to the guard (`identified`, `decided`,
//! `dialed`, …); the guard's `Drop` writes the `end` record and counts the connection — once,
//! whatever path the connection took: an early refusal, an error, a revocation or shutdown.
//! Nothing is formatted on the data plane: [`record::Entry`] is encoded to JSON on the writer
//! thread ([`writer`]). Nothing in a record is a secret: no token, no Authorization header.

pub(crate) mod accept;
mod batch;
pub mod chain;
pub mod denials;
mod facts;
pub mod health;
mod json_line;
pub mod loss;
pub(crate) mod metrics;
mod ocsf;
pub(crate) mod outcome;
mod output;
pub use output::rotated_name;
pub mod process_facts;
pub mod provenance;
pub mod record;
#[cfg(test)]
mod record_golden;
pub mod suggest;
pub mod suggest_http;
pub mod suggest_scoped;
pub mod timestamp;
pub mod usage;
pub mod verify;
mod writer;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

pub use record::{Close, Mode, Record};
pub use writer::AuditLog;

use crate::audit::accept::Accepted;
use crate::audit::metrics::{Metrics, SandboxStats};
use crate::audit::outcome::Relayed;
use crate::audit::record::Method;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::{AddrText, Target};
use crate::policy::Decision;
use record::{Entry, Event};

/// Where guards write and count.
#[derive(Clone)]
pub struct Sink {
    /// The audit log every record goes to.
    pub log: Arc<AuditLog>,
    /// The metrics every record counts into.
    pub metrics: Arc<Metrics>,
    /// Each sandbox's latest refusals (`GET /v1/denials` in the sandbox).
    pub denials: Arc<denials::Denials>,
    /// Connections, requests and bytes per sandbox × destination × decision.
    pub usage: Arc<usage::Ledger>,
}

impl Sink {
    /// `Some` when the trail cannot take a record now ([`AuditLog::unavailable`]): the
    /// caller refuses unrecorded, and the refusal is counted here
    /// (`egress_audit_backpressure_total`) — one place for every listener.
    pub fn refuse_unrecorded(&self) -> Option<health::Unavailable> {
        let why = self.log.unavailable();
        if why.is_some() {
            self.metrics.audit_backpressure();
        }
        why
    }
}

/// What a guard records: how it is counted, and whether it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// A connection or a forwarded request: counted in `egress_connections_total`, its bytes
    /// in the sandbox's counters.
    Connection,
    /// A request inside a terminated tunnel (`mode: "https"`): counted like a connection; its
    /// bytes are the tunnel's too, so they are not counted for the sandbox again.
    Request,
    /// A query to the DNS listener: counted in `egress_dns_queries_total`; an allowed query
    /// is written only when `write_allowed` (`audit.dns: all`); an aggregated one (an
    /// unidentified client's refusal, summed per source) never on its own.
    /// A summary record (the sums of an unidentified source) is written but not counted
    /// again.
    Query {
        write_allowed: bool,
        aggregated: bool,
        summary: bool,
    },
    /// A step of an access request (`mode: "approval"`): written, counted nowhere.
    Event,
}

/// The one record of one connection, forwarded request, request in a terminated tunnel or
/// DNS query — written when dropped. Every `end` record is written here.
pub struct AuditGuard {
    sink: Sink,
    variant: Variant,
    pub(crate) record: Record,
    /// `duration_ms` is measured from here (the accept, for a connection's first request).
    started: Instant,
    /// The identified sandbox's byte counters.
    stats: Option<Arc<SandboxStats>>,
    up: u64,
    down: u64,
    /// Live byte counts, read when the guard drops (forwarded bodies count into them).
    counters: Option<Arc<Counters>>,
    /// `None`: nothing said how it ended — `eof`.
    close: Option<Close>,
}

/// Bytes counted while an exchange runs (client → destination is `up`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes client → destination.
    pub up: AtomicU64,
    /// Bytes destination → client.
    pub down: AtomicU64,
}

impl AuditGuard {
    /// A guard for `accepted`, denied `invalid_target` with `close: eof` until told otherwise.
    pub fn new(sink: Sink, accepted: &Accepted, mode: Mode, policy_version: Arc<str>) -> Self {
        let record = Record::new(accepted.conn_id, accepted.client, mode, policy_version);
        Self::of(sink, Variant::Connection, record, accepted.started)
    }

    /// A guard for an event that is not a connection (an access request's step).
    pub fn event(sink: Sink, record: Record) -> Self {
        Self::of(sink, Variant::Event, record, Instant::now())
    }

    #[inline]
    fn of(sink: Sink, variant: Variant, record: Record, started: Instant) -> Self {
        AuditGuard {
            sink,
            variant,
            record,
            started,
            stats: None,
            up: 0,
            down: 0,
            counters: None,
            close: None,
        }
    }

    /// A guard for one query to the DNS listener (`record` says who asked), with its facts.
    /// Inlined, so that the record is built where the guard keeps it (called, it was copied
    /// four times on the way in).
    #[inline]
    pub fn query(sink: Sink, record: Record, facts: record::DnsFacts, write_allowed: bool) -> Self {
        let mut record = record;
        record.dns = Some(Box::new(facts));
        Self::of(
            sink,
            Variant::Query {
                write_allowed,
                aggregated: false,
                summary: false,
            },
            record,
            Instant::now(),
        )
    }

    /// This query is summed into its source's periodic record
    /// ([`crate::dns::strangers`]): counted, never written on its own.
    pub fn aggregated(&mut self) {
        if let Variant::Query { aggregated, .. } = &mut self.variant {
            *aggregated = true;
        }
    }

    /// This guard writes the sums of many queries already counted one by one: written, not
    /// counted again.
    pub fn summary(&mut self) {
        if let Variant::Query { summary, .. } = &mut self.variant {
            *summary = true;
        }
    }

    /// The DNS facts of a query guard.
    pub fn dns(&mut self) -> &mut record::DnsFacts {
        self.record.dns.get_or_insert_with(Default::default)
    }

    /// The verdict and reason alone (no rule): a request refused or reported in a tunnel.
    pub fn verdict(
        &mut self,
        verdict: crate::policy::Verdict,
        reason: crate::policy::reason::Reason,
    ) {
        self.record.verdict = verdict;
        self.record.reason = reason;
    }

    /// The process inside the sandbox the exchange is attributed to.
    pub fn process(&mut self, process: std::sync::Arc<crate::policy::process::Process>) {
        self.record.process = Some(process);
    }

    /// The process the exchange was attributed to, if any.
    pub fn attributed(&self) -> Option<std::sync::Arc<crate::policy::process::Process>> {
        self.record.process.clone()
    }

    /// The response carried the secret of credential `name` (it was replaced): noted in the
    /// request's record and counted.
    pub fn secret_reflected(&mut self, name: &str) {
        if let Some(sb) = &self.record.sandbox {
            self.sink.metrics.secret_reflected(sb.as_str(), name);
        }
        if let Some(h) = self.record.http.as_mut() {
            h.secret_reflected = Some(match h.secret_reflected.take() {
                Some(prev) if prev.split(',').any(|n| n == name) => prev,
                Some(prev) => format!("{prev},{name}").into(),
                None => name.into(),
            });
        }
    }

    /// Bytes moved, when known only at the end.
    pub fn bytes(&mut self, up: u64, down: u64) {
        self.up = up;
        self.down = down;
    }

    /// How the connection came.
    pub fn mode(&mut self, mode: Mode) {
        self.record.mode = mode;
    }

    /// What it asked for.
    pub fn target(&mut self, target: &Target) {
        self.record.target = Some(target.clone());
    }

    /// Transparent mode: the destination the client dialled.
    pub fn original_dst(&mut self, addr: SocketAddr) {
        self.record.original_dst = Some(addr);
    }

    /// Transparent TLS: what the ClientHello said.
    pub fn client_hello(&mut self, sni: Option<&str>, alpn: &[String], ech: bool) {
        self.record.sni = sni.map(Into::into);
        self.record.alpn = (!alpn.is_empty()).then(|| alpn.into());
        self.record.ech = Some(ech);
    }

    /// The sandbox was identified; `stats` are its byte counters.
    pub fn identified(&mut self, sandbox: SandboxId, method: Method, stats: Arc<SandboxStats>) {
        self.asked_by(sandbox, method);
        self.stats = Some(stats);
    }

    /// The sandbox that asked, and how it was identified (a DNS query: no connection, no
    /// byte counters).
    pub fn asked_by(&mut self, sandbox: SandboxId, method: Method) {
        self.record.identity = method;
        self.record.sandbox = Some(sandbox);
    }

    /// The verdict recorded so far.
    pub fn verdict_so_far(&self) -> crate::policy::Verdict {
        self.record.verdict
    }

    /// Whether a detail was recorded.
    pub fn has_detail(&self) -> bool {
        self.record.detail.is_some()
    }

    /// Identification failed with a credential of this kind.
    pub fn identity_refused(&mut self, method: Method) {
        self.record.identity = method;
    }

    /// What a stream's first bytes carried that its decision did not allow: refused, or in
    /// report mode (`report`) reported when the reason may be. Returns whether the connection
    /// must be refused.
    pub fn mismatch(&mut self, m: crate::policy::refusal::Refusal, report: bool) -> bool {
        let reported = report && m.reason.reportable();
        self.detail(m.detail);
        self.decision(&Decision {
            verdict: match reported {
                true => crate::policy::Verdict::Report,
                false => crate::policy::Verdict::Deny,
            },
            reason: m.reason,
            rule: None,
        });
        !reported
    }

    /// The policy decision (allowed or not).
    pub fn decision(&mut self, d: &Decision) {
        self.record.verdict = d.verdict;
        self.record.reason = d.reason;
        self.record.rule = d.rule.clone();
    }

    /// A tunnel refused after it was allowed, for what it carried.
    pub fn refused_in_tunnel(
        &mut self,
        reason: crate::policy::reason::Reason,
        detail: impl Into<Cow<'static, str>>,
    ) {
        self.record.verdict = crate::policy::Verdict::Deny;
        self.record.reason = reason;
        self.record.detail = Some(detail.into());
    }

    /// What the name resolved to, the addresses the guard refused, and (transparent mode)
    /// whether the original destination was among the resolved addresses.
    pub fn looked_up(
        &mut self,
        resolved: &[std::net::IpAddr],
        guard_refused: &[(std::net::IpAddr, crate::policy::guard::GuardVerdict)],
        dst_in_resolved: Option<bool>,
    ) {
        self.record.resolved = (!resolved.is_empty()).then(|| resolved.into());
        self.record.guard_refused = guard_refused.to_vec();
        self.record.dst_in_resolved = dst_in_resolved;
    }

    /// The address dialled.
    pub fn dialed(&mut self, addr: SocketAddr) {
        self.record.dialed = Some(addr);
    }

    /// One sentence on why (a refusal's explanation, a failure).
    pub fn detail(&mut self, detail: impl Into<Cow<'static, str>>) {
        self.record.detail = Some(detail.into());
    }

    /// How the connection ended (`eof` unless told).
    pub fn close(&mut self, close: Close) {
        self.close = Some(close);
    }

    /// How it ended, unless something already said.
    pub fn close_if_unset(&mut self, close: Close) {
        self.close.get_or_insert(close);
    }

    /// Take the byte counts from `counters` when the record is written.
    pub fn count(&mut self, counters: Arc<Counters>) {
        self.counters = Some(counters);
    }

    /// The relay's result: bytes and close.
    pub fn relayed(&mut self, r: Relayed) {
        self.up = r.up;
        self.down = r.down;
        self.relayed_until(r.close);
        // A quota's cut replaces the generic text; any other cut keeps a detail already given
        // (a parent proxy's, for one).
        if let Some(cut) = r.cut {
            if r.close == Close::Limit || self.record.detail.is_none() {
                self.record.detail = Some(cut.into());
            }
        }
    }

    /// How a relay ended; a relay cut by its sandbox's daily quota (`Close::Limit`) is
    /// recorded as refused for it.
    pub fn relayed_until(&mut self, close: Close) {
        if close == Close::Limit {
            self.refused_in_tunnel(
                crate::policy::reason::Reason::QuotaExceeded,
                "cut: a bytes_per_day quota of the sandbox (its own or a per_destination one) was reached",
            );
        }
        self.close = Some(close);
    }

    /// What writes the records of the requests inside this (terminated) tunnel.
    pub fn recorder(&self) -> Recorder {
        Recorder {
            sink: self.sink.clone(),
            record: self.record.clone(),
            mode: Mode::Https,
        }
    }

    /// Count this record in the usage ledger (an identified sandbox's only).
    fn ledger(&self, mut t: usage::Tally) {
        let r = &self.record;
        let Some(sb) = &r.sandbox else { return };
        // A name is counted as it is written, an address as its text on the stack (no copy,
        // no formatter: every request's record).
        let host = r.target.as_ref().map(|t| t.host.text());
        let dst = r.original_dst.map(|a| AddrText::of(a.ip(), false));
        let mut dest: Cow<'_, str> = match (&host, &dst) {
            (Some(h), _) => Cow::Borrowed(h.as_str()),
            (None, Some(a)) => Cow::Borrowed(a.as_str()),
            (None, None) => Cow::Borrowed("-"),
        };
        if let Some(tk) = &r.tokens {
            t.tokens = usage::Tokens::of(tk);
            dest = Cow::Owned(usage::with_model(&dest, tk.model.as_deref()));
        }
        self.sink
            .usage
            .note(sb.as_str(), &dest, r.verdict.as_str(), t);
    }

    /// Write the `open` record (a tunnel or exchange begins), with what is known now.
    pub fn open(&self) {
        self.sink.log.write(Entry {
            event: Event::Open,
            at: SystemTime::now(),
            record: self.record.clone(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: self.started.elapsed().as_millis() as u64,
            close: None,
        });
    }
}

/// Makes the guard of each request inside a terminated tunnel: the tunnel's record with
/// `mode: "https"` (`"http"` for plain HTTP judged inside a tunnel), the request's facts and
/// its own decision.
#[derive(Clone)]
pub struct Recorder {
    sink: Sink,
    record: Record,
    mode: Mode,
}

impl Recorder {
    /// Requests recorded `mode: "http"`: plain HTTP, judged inside a tunnel.
    pub fn in_clear(mut self) -> Self {
        self.mode = Mode::Http;
        self
    }

    /// `Some` when the trail cannot take this request's record now ([`AuditLog::unavailable`]);
    /// the refusal is counted.
    pub fn unavailable(&self) -> Option<health::Unavailable> {
        self.sink.refuse_unrecorded()
    }

    /// The guard of a request that begins now (allowed, `close: eof`, until told otherwise).
    pub fn guard(&self) -> AuditGuard {
        let mut record = self.record.clone();
        record.mode = self.mode;
        record.verdict = crate::policy::Verdict::Allow;
        record.reason = crate::policy::reason::Reason::RuleMatched;
        // What the decider said of the connection is the connection's; the request's own
        // answer (if it is asked about) is written by the request's decider phase.
        record.decider = None;
        AuditGuard::of(self.sink.clone(), Variant::Request, record, Instant::now())
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        if let Some(c) = &self.counters {
            self.up = c.up.load(Ordering::Relaxed);
            self.down = c.down.load(Ordering::Relaxed);
        }
        let r = &self.record;
        let sandbox = r.sandbox.as_ref().map(|s| s.as_str());
        let metrics = &self.sink.metrics;
        match self.variant {
            Variant::Connection => {
                metrics.connection_finished(sandbox, r.mode, r.verdict, r.reason);
                if let Some(stats) = &self.stats {
                    stats.relayed(self.up, self.down);
                }
                self.ledger(usage::Tally {
                    connections: 1,
                    requests: u64::from(r.mode == Mode::Http),
                    bytes_up: self.up,
                    bytes_down: self.down,
                    ..Default::default()
                });
            }
            Variant::Request => {
                metrics.connection_finished(sandbox, r.mode, r.verdict, r.reason);
                self.ledger(usage::Tally {
                    requests: 1,
                    ..Default::default()
                });
            }
            Variant::Event => {}
            Variant::Query {
                write_allowed,
                aggregated,
                summary,
            } => {
                if !summary {
                    metrics.dns_query(sandbox, r.verdict);
                }
                if aggregated || (!write_allowed && r.verdict == crate::policy::Verdict::Allow) {
                    return;
                }
            }
        }
        // Connections' and requests' refusals only: a DNS refusal names no port to ask for,
        // and the refused-query path stays free of the lock and the formatting.
        if r.verdict == crate::policy::Verdict::Deny
            && matches!(self.variant, Variant::Connection | Variant::Request)
        {
            self.sink.denials.note(r);
        }
        let close = match self.variant {
            Variant::Query { .. } | Variant::Event => None,
            _ => Some(self.close.unwrap_or(Close::Eof)),
        };
        let placeholder = Record::new(r.conn_id, r.client, r.mode, r.policy_version.clone());
        let record = std::mem::replace(&mut self.record, placeholder);
        self.sink.log.write(Entry {
            event: Event::End,
            at: SystemTime::now(),
            record,
            bytes_up: self.up,
            bytes_down: self.down,
            duration_ms: self.started.elapsed().as_millis() as u64,
            close,
        });
    }
}

#[cfg(test)]
mod tests;
