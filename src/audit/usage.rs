//! The usage ledger: per sandbox × destination × decision and per UTC hour, how many
//! connections and requests there were and how many bytes went each way — fed by the same
//! `end` records the audit trail writes ([`super::AuditGuard`]'s drop), so its sums are the
//! records' sums by construction:
//! - a connection record (a tunnel, a transparent connection, a forwarded request) counts one
//!   connection and its bytes; a forwarded request is also one request;
//! - a request inside a terminated tunnel counts one request and no bytes (they are its
//!   tunnel's, already counted);
//! - DNS queries, access-request steps and unidentified clients are not in the ledger.
//!
//! Bounded: at most [`MAX_PER_SANDBOX`] destinations per sandbox and [`MAX_PAIRS`] in all;
//! past either, a record counts under the destination [`OVERFLOW`]. Hours older than
//! [`RETAIN_HOURS`] are dropped when the ledger is saved. It is kept in memory, saved in the
//! state dir ([`crate::server::usage`]) and read at `GET /v1/usage` and as metrics.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Most destinations one sandbox keeps apart.
pub const MAX_PER_SANDBOX: usize = 1_000;
/// Most sandbox × destination pairs in all.
pub const MAX_PAIRS: usize = 50_000;
/// Where records count past those bounds.
pub const OVERFLOW: &str = "(other)";
/// Hours kept (eight days).
pub const RETAIN_HOURS: u32 = 8 * 24;

/// What one cell counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Connections (or forwarded requests) counted.
    pub connections: u64,
    /// Requests counted (each HTTP request on a connection).
    pub requests: u64,
    /// Bytes client → destination.
    pub bytes_up: u64,
    /// Bytes destination → client.
    pub bytes_down: u64,
    /// Inference calls' tokens and cost (all zero elsewhere).
    #[serde(flatten)]
    pub tokens: Tokens,
}

/// What inference calls used: tokens by kind and cost in nano-dollars (a cell that counts
/// none saves and answers none of these fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// Input tokens not read from or written to a cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_input: u64,
    /// Input tokens read from the cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_cached_input: u64,
    /// Input tokens written to the cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_cache_write: u64,
    /// Output tokens (reasoning included).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_output: u64,
    /// Of the output, reasoning tokens.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_reasoning: u64,
    /// Cost by `defaults.prices`, in nano-dollars.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_nano_usd: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Tokens {
    /// What a record's `tokens` block counts.
    pub fn of(t: &crate::audit::record::TokenFacts) -> Tokens {
        Tokens {
            tokens_input: t.input,
            tokens_cached_input: t.cached_input,
            tokens_cache_write: t.cache_write,
            tokens_output: t.output,
            tokens_reasoning: t.reasoning,
            cost_nano_usd: t
                .cost_usd
                .map(|c| (c * 1e9).round().clamp(0.0, u64::MAX as f64) as u64)
                .unwrap_or(0),
        }
    }

    /// Every token counted.
    pub fn total(&self) -> u64 {
        self.tokens_input
            .saturating_add(self.tokens_cached_input)
            .saturating_add(self.tokens_cache_write)
            .saturating_add(self.tokens_output)
    }

    fn add(&mut self, o: &Tokens) {
        self.tokens_input = self.tokens_input.saturating_add(o.tokens_input);
        self.tokens_cached_input = self
            .tokens_cached_input
            .saturating_add(o.tokens_cached_input);
        self.tokens_cache_write = self.tokens_cache_write.saturating_add(o.tokens_cache_write);
        self.tokens_output = self.tokens_output.saturating_add(o.tokens_output);
        self.tokens_reasoning = self.tokens_reasoning.saturating_add(o.tokens_reasoning);
        self.cost_nano_usd = self.cost_nano_usd.saturating_add(o.cost_nano_usd);
    }
}

/// Between a destination and the model in a ledger key (never in a host name).
const MODEL_SEPARATOR: char = '|';

/// The ledger key of an inference call to `destination` for `model`: its rows are apart
/// from the host's other requests, per model.
pub fn with_model(destination: &str, model: Option<&str>) -> String {
    match model {
        Some(m) => format!("{destination}{MODEL_SEPARATOR}{m}"),
        None => destination.to_string(),
    }
}

/// A ledger key's destination and model.
fn split_model(key: &str) -> (String, Option<String>) {
    match key.split_once(MODEL_SEPARATOR) {
        Some((d, m)) => (d.to_string(), Some(m.to_string())),
        None => (key.to_string(), None),
    }
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.connections += o.connections;
        self.requests += o.requests;
        self.bytes_up += o.bytes_up;
        self.bytes_down += o.bytes_down;
        self.tokens.add(&o.tokens);
    }
}

/// One cell, as saved and answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// Hours since the epoch (UTC).
    pub hour: u32,
    /// The sandbox.
    pub sandbox: String,
    /// The destination host.
    pub destination: String,
    /// The model of an inference call's row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `allow`, `deny` or `report`.
    pub decision: String,
    /// What it used.
    #[serde(flatten)]
    pub tally: Tally,
}

/// Decisions, in cell order.
const DECISIONS: [&str; 3] = ["allow", "deny", "report"];

/// One destination's cells: (hour, decision index) → counts, newest last.
type Hours = Vec<(u32, u8, Tally)>;

#[derive(Debug, Default)]
struct Book {
    by: HashMap<Box<str>, HashMap<Box<str>, Hours>>,
    pairs: usize,
    /// Per sandbox and decision, everything counted since the process started (never
    /// dropped, not restored): the monotonic counters OpenTelemetry exports.
    since_start: HashMap<Box<str>, [Tally; 3]>,
    /// Per sandbox and model, the tokens counted since the process started (at most
    /// [`MAX_PAIRS`] pairs; past it, the model [`OVERFLOW`]).
    tokens_since_start: HashMap<(Box<str>, Box<str>), Tokens>,
}

/// The ledger (one per process).
#[derive(Debug, Default)]
pub struct Ledger {
    book: Mutex<Book>,
}

/// The current hour (since the epoch, UTC).
pub fn this_hour() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    (secs / 3600) as u32
}

impl Ledger {
    /// Count `t` for `sandbox`'s exchange with `destination`, decided `decision`, now.
    pub fn note(&self, sandbox: &str, destination: &str, decision: &str, t: Tally) {
        let Some(d) = DECISIONS.iter().position(|x| *x == decision) else {
            return;
        };
        self.add(this_hour(), sandbox, destination, d as u8, &t, true);
    }

    /// Per sandbox and decision, what was counted since the process started.
    pub fn since_start(&self) -> Vec<(String, &'static str, Tally)> {
        let Ok(book) = self.book.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (sb, tallies) in &book.since_start {
            for (i, t) in tallies.iter().enumerate() {
                if *t != Tally::default() {
                    out.push((sb.to_string(), DECISIONS[i], *t));
                }
            }
        }
        out
    }

    /// Per sandbox and model, the tokens counted since the process started.
    pub fn tokens_since_start(&self) -> Vec<(String, String, Tokens)> {
        let Ok(book) = self.book.lock() else {
            return Vec::new();
        };
        book.tokens_since_start
            .iter()
            .map(|((s, m), t)| (s.to_string(), m.to_string(), *t))
            .collect()
    }

    /// Count `t` in its cell (and, when `live`, since the start: not for restored cells).
    fn add(
        &self,
        hour: u32,
        sandbox: &str,
        destination: &str,
        decision: u8,
        t: &Tally,
        live: bool,
    ) {
        let Ok(mut book) = self.book.lock() else {
            return;
        };
        let book = &mut *book;
        if let (true, Some((_, model))) = (live, destination.split_once(MODEL_SEPARATOR)) {
            let full = book.tokens_since_start.len() >= MAX_PAIRS;
            let key: (Box<str>, Box<str>) = (sandbox.into(), model.into());
            let key = match full && !book.tokens_since_start.contains_key(&key) {
                true => (sandbox.into(), OVERFLOW.into()),
                false => key,
            };
            book.tokens_since_start
                .entry(key)
                .or_default()
                .add(&t.tokens);
        }
        if live {
            match book.since_start.get_mut(sandbox) {
                Some(s) => s[decision as usize].add(t),
                None => {
                    let mut s = [Tally::default(); 3];
                    s[decision as usize] = *t;
                    book.since_start.insert(sandbox.into(), s);
                }
            }
        }
        if !book.by.contains_key(sandbox) {
            book.by.insert(sandbox.into(), HashMap::new());
        }
        let Some(dests) = book.by.get_mut(sandbox) else {
            return;
        };
        let dest = match dests.contains_key(destination) {
            true => destination,
            false if dests.len() < MAX_PER_SANDBOX && book.pairs < MAX_PAIRS => {
                book.pairs += 1;
                dests.insert(destination.into(), Vec::new());
                destination
            }
            false => {
                if !dests.contains_key(OVERFLOW) {
                    book.pairs += 1;
                    dests.insert(OVERFLOW.into(), Vec::new());
                }
                OVERFLOW
            }
        };
        let Some(hours) = dests.get_mut(dest) else {
            return;
        };
        match hours
            .iter_mut()
            .rev()
            .take(DECISIONS.len())
            .find(|(h, d, _)| *h == hour && *d == decision)
        {
            Some((_, _, cell)) => cell.add(t),
            None => hours.push((hour, decision, *t)),
        }
    }

    /// The cells of `sandbox` (every sandbox when `None`) from hour `since` on, summed over
    /// the hours: one per sandbox × destination × decision.
    pub fn sums(&self, sandbox: Option<&str>, since: u32) -> Vec<Cell> {
        let Ok(book) = self.book.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (sb, dests) in book.by.iter() {
            if sandbox.is_some_and(|s| s != &**sb) {
                continue;
            }
            for (dest, hours) in dests {
                let mut sums = [Tally::default(); 3];
                let mut seen = [false; 3];
                for (_, d, t) in hours.iter().filter(|(h, _, _)| *h >= since) {
                    sums[*d as usize].add(t);
                    seen[*d as usize] = true;
                }
                for (i, t) in sums.iter().enumerate().filter(|(i, _)| seen[*i]) {
                    let (destination, model) = split_model(dest);
                    out.push(Cell {
                        hour: since,
                        sandbox: sb.to_string(),
                        destination,
                        model,
                        decision: DECISIONS[i].to_string(),
                        tally: *t,
                    });
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.sandbox, &a.destination, &a.decision).cmp(&(
                &b.sandbox,
                &b.destination,
                &b.decision,
            ))
        });
        out
    }

    /// Every cell (to save), after dropping the hours past retention.
    pub fn cells(&self) -> Vec<Cell> {
        let oldest = this_hour().saturating_sub(RETAIN_HOURS);
        let Ok(mut book) = self.book.lock() else {
            return Vec::new();
        };
        let book = &mut *book;
        let mut out = Vec::new();
        for (sb, dests) in book.by.iter_mut() {
            dests.retain(|dest, hours| {
                hours.retain(|(h, _, _)| *h >= oldest);
                for (h, d, t) in hours.iter() {
                    let (destination, model) = split_model(dest);
                    out.push(Cell {
                        hour: *h,
                        sandbox: sb.to_string(),
                        destination,
                        model,
                        decision: DECISIONS[*d as usize].to_string(),
                        tally: *t,
                    });
                }
                !hours.is_empty()
            });
        }
        book.by.retain(|_, dests| !dests.is_empty());
        book.pairs = book.by.values().map(|d| d.len()).sum();
        out
    }

    /// Add saved cells (at start); cells past retention or of an unknown decision are skipped.
    pub fn restore(&self, cells: Vec<Cell>) -> usize {
        let oldest = this_hour().saturating_sub(RETAIN_HOURS);
        let mut n = 0;
        for c in cells.into_iter().filter(|c| c.hour >= oldest) {
            if let Some(d) = DECISIONS.iter().position(|x| *x == c.decision) {
                let key = with_model(&c.destination, c.model.as_deref());
                self.add(c.hour, &c.sandbox, &key, d as u8, &c.tally, false);
                n += 1;
            }
        }
        n
    }
}

/// The ledger's counts of the current UTC day as gauges (read at every scrape):
/// `egress_usage_connections`, `egress_usage_requests` and `egress_usage_bytes` (with
/// `direction`), each by sandbox and decision. Destinations are summed: a destination host is
/// never a metric label (DESIGN §8); `GET /v1/usage` has them.
pub struct Gauges {
    ledger: std::sync::Arc<Ledger>,
    descs: Vec<prometheus::core::Desc>,
}

const LABELS: [&str; 2] = ["sandbox", "decision"];

fn gauge(name: &str, help: &str, extra: &[&str]) -> prometheus::Result<prometheus::IntGaugeVec> {
    let labels: Vec<&str> = LABELS.iter().chain(extra).copied().collect();
    prometheus::IntGaugeVec::new(prometheus::Opts::new(name, help), &labels)
}

fn vecs() -> prometheus::Result<[prometheus::IntGaugeVec; 3]> {
    Ok([
        gauge(
            "egress_usage_connections",
            "Connections today (UTC), from the usage ledger",
            &[],
        )?,
        gauge(
            "egress_usage_requests",
            "Requests today (UTC), from the usage ledger",
            &[],
        )?,
        gauge(
            "egress_usage_bytes",
            "Bytes today (UTC), from the usage ledger",
            &["direction"],
        )?,
    ])
}

impl Gauges {
    /// The gauges over `ledger`, registered.
    pub fn new(ledger: std::sync::Arc<Ledger>) -> prometheus::Result<Self> {
        use prometheus::core::Collector;
        let descs = vecs()?
            .iter()
            .flat_map(|v| v.desc().into_iter().cloned())
            .collect();
        Ok(Gauges { ledger, descs })
    }
}

impl prometheus::core::Collector for Gauges {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Ok([conns, reqs, bytes]) = vecs() else {
            return Vec::new();
        };
        let today = this_hour() / 24 * 24;
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut sums: HashMap<(String, String), Tally> = HashMap::new();
        for c in self.ledger.sums(None, today) {
            sums.entry((c.sandbox, c.decision))
                .or_default()
                .add(&c.tally);
        }
        for ((sandbox, decision), t) in &sums {
            let l = [sandbox.as_str(), decision.as_str()];
            conns.with_label_values(&l).set(clamp(t.connections));
            reqs.with_label_values(&l).set(clamp(t.requests));
            bytes
                .with_label_values(&[l[0], l[1], "up"])
                .set(clamp(t.bytes_up));
            bytes
                .with_label_values(&[l[0], l[1], "down"])
                .set(clamp(t.bytes_down));
        }
        [conns, reqs, bytes]
            .iter()
            .flat_map(|v| v.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(bytes_up: u64, bytes_down: u64) -> Tally {
        Tally {
            connections: 1,
            requests: 0,
            bytes_up,
            bytes_down,
            ..Tally::default()
        }
    }

    #[test]
    fn sums_are_per_sandbox_destination_and_decision() {
        let l = Ledger::default();
        l.note("a", "x.example", "allow", t(10, 20));
        l.note("a", "x.example", "allow", t(1, 2));
        l.note("a", "x.example", "deny", t(0, 0));
        l.note("b", "y.example", "allow", t(5, 5));
        l.note("b", "y.example", "maybe", t(5, 5));
        let a = l.sums(Some("a"), 0);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].decision, "allow");
        assert_eq!(a[0].tally.bytes_up, 11);
        assert_eq!(a[0].tally.bytes_down, 22);
        assert_eq!(a[0].tally.connections, 2);
        assert_eq!(a[1].decision, "deny");
        assert_eq!(l.sums(None, 0).len(), 3);
        assert!(l.sums(None, this_hour() + 1).is_empty());
    }

    #[test]
    fn destinations_past_the_bound_count_as_other() {
        let l = Ledger::default();
        for i in 0..MAX_PER_SANDBOX + 50 {
            l.note("a", &format!("h{i}.example"), "allow", t(1, 1));
        }
        let sums = l.sums(Some("a"), 0);
        assert_eq!(sums.len(), MAX_PER_SANDBOX + 1);
        let other = sums
            .iter()
            .find(|c| c.destination == OVERFLOW)
            .expect("an overflow cell");
        assert_eq!(other.tally.connections, 50);
        let total: u64 = sums.iter().map(|c| c.tally.bytes_up).sum();
        assert_eq!(total, (MAX_PER_SANDBOX + 50) as u64);
    }

    #[test]
    fn saved_cells_restore_and_old_hours_are_dropped() {
        let l = Ledger::default();
        l.note("a", "x.example", "allow", t(10, 20));
        l.add(1, "a", "old.example", 0, &t(1, 1), true);
        let cells = l.cells();
        assert_eq!(cells.len(), 1, "the hour past retention is dropped");
        let m = Ledger::default();
        assert_eq!(m.restore(cells.clone()), 1);
        assert_eq!(m.cells(), cells);
    }
}
