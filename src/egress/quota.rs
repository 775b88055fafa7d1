//! Daily quotas of one sandbox (`limits.bytes_per_day`, `limits.requests_per_day`): a
//! [`Meter`] per sandbox, kept with its other limits (so it survives reloads), counts the bytes
//! its exchanges move in both directions and the requests it makes in the current UTC day.
//!
//! - New exchanges are refused at admission (`quota_exceeded`) while either count is at its
//!   quota, until the day rolls over (`Retry-After`: the seconds until midnight UTC).
//! - A live exchange is cut the moment its bytes reach the quota: every relay takes what it
//!   read from the meter before writing it ([`Meter::take`], through
//!   [`crate::relay::liveness::Liveness`], which holds the meter and races [`Meter::exceeded`]
//!   against the relay), so the bytes that would cross are never written.
//! - Requests: a tunnel the proxy does not see into counts one; a forwarded request, and each
//!   request inside a terminated tunnel, counts one. A request is *reserved*
//!   ([`Meter::reserve`], through [`crate::relay::liveness::Liveness::reserve`]): checked and
//!   counted in one atomic step, so parallel requests cannot all pass a quota one of them
//!   fills.
//!
//! On a fleet (etcd) every quota is served from this replica's leased share of the fleet's
//! counter ([`share`]); other replicas' reported counts (`others`, [`crate::server::usage`])
//! are only shown then. Without a fleet's shares (no etcd) the quota is on this replica's own
//! count.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

mod budget;
pub mod per_process;
pub mod share;
pub use budget::{OverBudget, Reservation};

/// Woken whenever a request is reserved against a daily quota or a byte count reaches one:
/// the usage keeper ([`crate::server::usage`]) saves soon after, so a kill loses at most what
/// was counted in the moments before it. One for the process (every meter pokes it).
pub fn counted_signal() -> &'static Notify {
    static SIGNAL: std::sync::OnceLock<Notify> = std::sync::OnceLock::new();
    SIGNAL.get_or_init(Notify::new)
}

/// Which quota a sandbox is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// The bytes quota.
    Bytes,
    /// The requests quota.
    Requests,
    /// The tokens budget (`tokens_per_day`).
    Tokens,
    /// The cost budget (`cost_per_day`).
    Cost,
    /// This replica's share of the fleet's quota of a kind is too small and no new one came
    /// in time ([`share`]).
    Leasing(share::Kind),
}

impl Spent {
    /// The configuration key, for the refusal's detail.
    pub fn key(self) -> &'static str {
        match self {
            Spent::Bytes => "bytes_per_day",
            Spent::Requests => "requests_per_day",
            Spent::Tokens => "tokens_per_day",
            Spent::Cost => "cost_per_day",
            Spent::Leasing(kind) => kind.spent().key(),
        }
    }
}

/// [`Meter`]'s day while a new day's counts are being zeroed (no real day: 11 million years).
const ROLLING: u32 = u32::MAX;

/// Nano-dollars (10⁻⁹ USD) in a dollar: costs are counted in whole nano-dollars.
pub const NANO_USD: f64 = 1e9;

/// The current UTC day (days since the epoch).
pub fn today() -> u32 {
    (unix_now().as_secs() / 86_400) as u32
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Time until the current UTC day ends (at least one second).
pub fn until_tomorrow() -> Duration {
    let secs = unix_now().as_secs();
    Duration::from_secs((86_400 - secs % 86_400).max(1))
}

/// One sandbox's counts for the current day, against its quotas (0: none) — all of its
/// exchanges, or (`scope`) those with the hosts of one `per_destination` entry.
#[derive(Debug, Default)]
pub struct Meter {
    /// The `per_destination` host pattern; empty for the sandbox-wide meter.
    scope: Box<str>,
    bytes_quota: AtomicU64,
    requests_quota: AtomicU64,
    day: AtomicU32,
    bytes: AtomicU64,
    requests: AtomicU64,
    /// What the other replicas counted today (etcd).
    others_bytes: AtomicU64,
    others_requests: AtomicU64,
    /// Set when a count reached its quota today; cleared when the day rolls.
    over: AtomicBool,
    cut: Notify,
    /// The token and cost budgets (0: none) and what was reserved or settled against them
    /// today (cost in nano-dollars), with the other replicas' counts.
    tokens_quota: AtomicU64,
    cost_quota: AtomicU64,
    tokens: AtomicU64,
    cost: AtomicU64,
    others_tokens: AtomicU64,
    others_cost: AtomicU64,
    /// This replica's share of the fleet's requests quota ([`share`]).
    share: share::Share,
}

/// One day's counts, as persisted and shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DayCount {
    /// The day (days since the Unix epoch, UTC).
    pub day: u32,
    /// Bytes counted on that day.
    pub bytes: u64,
    /// Requests counted on that day.
    pub requests: u64,
    /// Tokens reserved or settled on that day.
    pub tokens: u64,
    /// Cost reserved or settled on that day, in nano-dollars.
    pub cost: u64,
}

impl Meter {
    /// The meter of one `per_destination` entry.
    pub fn scoped(host: &str) -> Meter {
        Meter {
            scope: host.into(),
            ..Meter::default()
        }
    }

    /// The `per_destination` host pattern, if this meter is one's.
    pub fn scope(&self) -> Option<&str> {
        (!self.scope.is_empty()).then_some(&*self.scope)
    }

    /// What a refusal for `spent` says: which quota, and its value.
    pub fn describe(&self, spent: Spent) -> String {
        match spent {
            Spent::Leasing(_) => format!(
                "{}: this replica could not lease a share of it from the fleet (etcd) in time",
                self.named(spent)
            ),
            _ => format!("{} is spent until midnight UTC", self.named(spent)),
        }
    }

    /// What the record of an exchange cut at its byte quota says, if that quota is reached.
    pub fn cut_by(&self) -> Option<String> {
        (self.spent() == Some(Spent::Bytes)).then(|| format!("cut at {}", self.named(Spent::Bytes)))
    }

    /// `the sandbox's bytes_per_day quota (50000)`, or the `per_destination` one's.
    fn named(&self, spent: Spent) -> String {
        let spent = match spent {
            Spent::Leasing(kind) => kind.spent(),
            other => other,
        };
        let value = match spent {
            Spent::Bytes => self.bytes_quota.load(Ordering::Relaxed).to_string(),
            Spent::Requests | Spent::Leasing(_) => {
                self.requests_quota.load(Ordering::Relaxed).to_string()
            }
            Spent::Tokens => self.tokens_quota.load(Ordering::Relaxed).to_string(),
            Spent::Cost => format!(
                "${}",
                self.cost_quota.load(Ordering::Relaxed) as f64 / NANO_USD
            ),
        };
        match self.scope() {
            None => format!("the sandbox's {} quota ({value})", spent.key()),
            Some(p) if p.strip_prefix('~') == Some(per_process::TOTAL) => format!(
                "the {} total ({value}) of all the sandbox's processes together (limits.per_process × processes)",
                spent.key()
            ),
            Some(p) if p.starts_with('~') => format!(
                "the {} quota ({value}) of process {} (limits.per_process)",
                spent.key(),
                &p[1..]
            ),
            Some(host) => format!(
                "the {} quota ({value}) on {host} (limits.per_destination)",
                spent.key()
            ),
        }
    }

    /// Set the quotas (`None`: unlimited); a raised quota lifts the refusal at once.
    pub fn configure(&self, bytes: Option<u64>, requests: Option<u64>) {
        self.bytes_quota
            .store(bytes.unwrap_or(0), Ordering::Relaxed);
        self.requests_quota
            .store(requests.unwrap_or(0), Ordering::Relaxed);
        self.share.reopen();
        self.recheck();
    }

    /// Whether either quota is set (an unmetered sandbox's relays skip the meter).
    pub fn metered(&self) -> bool {
        self.bytes_quota.load(Ordering::Relaxed) != 0
            || self.requests_quota.load(Ordering::Relaxed) != 0
    }

    /// Start a new day when the UTC day changed since the last count; the day counted in.
    ///
    /// The day is set to [`ROLLING`] while the counts are zeroed and to the new day only
    /// after: a count made at that moment lands in the old day (before the zeroing) or in the
    /// new one (after it), and no count that saw the new day can be zeroed away — before, a
    /// reservation made between the new day being set and the zeroing was wiped, and calls
    /// made at once could pass a budget.
    fn roll(&self) -> u32 {
        let now = today();
        loop {
            let day = self.day.load(Ordering::Acquire);
            if day == now {
                return now;
            }
            if day == ROLLING {
                // Another thread is zeroing the counts: a handful of stores.
                std::thread::yield_now();
                continue;
            }
            if self
                .day
                .compare_exchange(day, ROLLING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for c in [
                    &self.bytes,
                    &self.requests,
                    &self.others_bytes,
                    &self.others_requests,
                    &self.tokens,
                    &self.cost,
                    &self.others_tokens,
                    &self.others_cost,
                ] {
                    c.store(0, Ordering::Relaxed);
                }
                self.share.zero();
                self.over.store(false, Ordering::Release);
                self.day.store(now, Ordering::Release);
                return now;
            }
        }
    }

    /// `n` bytes moved (either direction); `true` when the day's bytes reached the quota.
    pub fn moved(&self, n: u64) -> bool {
        self.roll();
        if self.shared_as(share::Kind::Bytes) {
            return self.moved_shared_bytes(n);
        }
        let total = self.bytes.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        let quota = self.bytes_quota.load(Ordering::Relaxed);
        let others = self.others_bytes.load(Ordering::Relaxed);
        let reached = quota != 0 && total.saturating_add(others) >= quota;
        if reached {
            self.trip();
        }
        reached
    }

    /// Take up to `n` bytes from the day's byte quota: how many fit (all of them without a
    /// quota), counted at once — so the bytes that cross the quota are never delivered, by
    /// this exchange or by one running beside it. Reaching the quota trips the meter.
    pub fn take(&self, n: u64) -> u64 {
        let quota = self.bytes_quota.load(Ordering::Relaxed);
        if quota == 0 {
            self.moved(n);
            return n;
        }
        self.roll();
        if self.shared_as(share::Kind::Bytes) {
            return self.take_shared_bytes(n);
        }
        let others = self.others_bytes.load(Ordering::Relaxed);
        let mut granted = 0;
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |b| {
                granted = quota.saturating_sub(b.saturating_add(others)).min(n);
                Some(b.saturating_add(granted))
            });
        let total = self.bytes.load(Ordering::Relaxed).saturating_add(others);
        if total >= quota {
            self.trip();
        }
        granted
    }

    /// Give back `n` bytes taken with [`Meter::take`] that were not delivered after all.
    pub fn untake(&self, n: u64) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(n))
            });
    }

    /// Reserve one request: counted now if neither quota is spent, else refused with the
    /// quota that is — the check and the count are one atomic step, so requests made at once
    /// cannot all pass a check that only one of them may pass.
    pub fn reserve(&self) -> Result<(), Spent> {
        if !self.metered() {
            return Ok(());
        }
        self.roll();
        if self.bytes_spent() {
            return Err(Spent::Bytes);
        }
        let quota = self.requests_quota.load(Ordering::Relaxed);
        let others = self.others_requests.load(Ordering::Relaxed);
        let reserved = match self.shared_as(share::Kind::Requests) {
            true => {
                return self
                    .reserve_shared(share::Kind::Requests, 1, true)
                    .map(|_| counted_signal().notify_one())
            }
            false => self
                .requests
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                    (quota == 0 || n.saturating_add(others) < quota).then_some(n.saturating_add(1))
                }),
        };
        match reserved {
            Ok(n) => {
                if quota != 0 && n.saturating_add(1).saturating_add(others) >= quota {
                    self.over.store(true, Ordering::Release);
                }
                counted_signal().notify_one();
                Ok(())
            }
            Err(_) => Err(Spent::Requests),
        }
    }

    /// Give back a request reserved by [`Meter::reserve`] (another meter refused it).
    pub fn release(&self) {
        let _ = self
            .requests
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1));
        self.recheck();
    }

    pub(super) fn trip(&self) {
        if !self.over.swap(true, Ordering::AcqRel) {
            self.cut.notify_waiters();
            counted_signal().notify_one();
        }
    }

    /// Which quota refuses a new exchange now, if one does.
    pub fn spent(&self) -> Option<Spent> {
        if !self.metered() {
            return None;
        }
        self.roll();
        let at = |count: &AtomicU64, others: &AtomicU64, quota: &AtomicU64| {
            let q = quota.load(Ordering::Relaxed);
            q != 0
                && count
                    .load(Ordering::Relaxed)
                    .saturating_add(others.load(Ordering::Relaxed))
                    >= q
        };
        let requests = match self.shared_as(share::Kind::Requests) {
            true => self.share_spent(share::Kind::Requests),
            false => at(&self.requests, &self.others_requests, &self.requests_quota),
        };
        let bytes = self.bytes_spent();
        if bytes {
            Some(Spent::Bytes)
        } else if requests {
            Some(Spent::Requests)
        } else {
            None
        }
    }

    /// Whether the day's bytes are at their quota: this replica's and the others' reported
    /// counts, or on a fleet this replica's share with none left to lease.
    fn bytes_spent(&self) -> bool {
        if self.shared_as(share::Kind::Bytes) {
            return self.bytes_spent_shared();
        }
        let quota = self.bytes_quota.load(Ordering::Relaxed);
        let used = (self.bytes.load(Ordering::Relaxed))
            .saturating_add(self.others_bytes.load(Ordering::Relaxed));
        quota != 0 && used >= quota
    }

    /// Re-evaluate `over` after the quotas or the others' counts changed.
    fn recheck(&self) {
        match self.spent() {
            Some(Spent::Bytes) => self.trip(),
            Some(Spent::Requests | Spent::Tokens | Spent::Cost | Spent::Leasing(_)) => {
                self.over.store(true, Ordering::Release)
            }
            None => self.over.store(false, Ordering::Release),
        }
    }

    /// Resolves when this sandbox's bytes reach their quota (at once if they have).
    pub async fn exceeded(&self) {
        loop {
            let notified = self.cut.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.spent() == Some(Spent::Bytes) {
                return;
            }
            notified.await;
        }
    }

    /// This replica's counts today.
    pub fn mine(&self) -> DayCount {
        DayCount {
            day: self.roll(),
            bytes: self.bytes.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            cost: self.cost.load(Ordering::Relaxed),
        }
    }

    /// This replica's counts today, and the other replicas'.
    pub fn today(&self) -> (DayCount, DayCount) {
        let mine = self.mine();
        let others = DayCount {
            day: mine.day,
            bytes: self.others_bytes.load(Ordering::Relaxed),
            requests: self.others_requests.load(Ordering::Relaxed),
            tokens: self.others_tokens.load(Ordering::Relaxed),
            cost: self.others_cost.load(Ordering::Relaxed),
        };
        (mine, others)
    }

    /// Start from counts persisted before a restart (ignored unless they are today's).
    pub fn restore(&self, c: DayCount) {
        if c.day == self.roll() {
            self.bytes.fetch_add(c.bytes, Ordering::Relaxed);
            self.requests.fetch_add(c.requests, Ordering::Relaxed);
            self.tokens.fetch_add(c.tokens, Ordering::Relaxed);
            self.cost.fetch_add(c.cost, Ordering::Relaxed);
            self.recheck();
        }
    }

    /// What the other replicas counted today (ignored unless it is for today).
    pub fn others(&self, c: DayCount) {
        if c.day == self.roll() {
            self.others_bytes.store(c.bytes, Ordering::Relaxed);
            self.others_requests.store(c.requests, Ordering::Relaxed);
            self.others_tokens.store(c.tokens, Ordering::Relaxed);
            self.others_cost.store(c.cost, Ordering::Relaxed);
            self.recheck();
        }
    }
}

/// The meters of `quotas`, reusing those of `old` with the same host (their counts go on).
pub(crate) fn destination_meters(
    quotas: &[crate::config::DestinationQuota],
    old: &[(crate::config::DestinationQuota, std::sync::Arc<Meter>)],
) -> Vec<(crate::config::DestinationQuota, std::sync::Arc<Meter>)> {
    quotas
        .iter()
        .map(|q| {
            let meter = old
                .iter()
                .find(|(o, _)| o.host == q.host)
                .map(|(_, m)| m.clone())
                .unwrap_or_else(|| std::sync::Arc::new(Meter::scoped(&q.host)));
            meter.configure(q.bytes_per_day, q.requests_per_day);
            meter.budget(q.tokens_per_day, q.cost_per_day);
            (q.clone(), meter)
        })
        .collect()
}

/// The verdict point's stage for `limits.per_destination` and `limits.per_process`: an
/// exchange with a host, or of a process, whose daily quota is spent is refused
/// (`quota_exceeded`) before the decider is asked or anything dialled. (The sandbox-wide
/// quotas refuse earlier, with its other limits.)
pub struct DestinationQuotaStage;

impl crate::egress::verdict::Stage for DestinationQuotaStage {
    fn name(&self) -> &'static str {
        "per_destination quota"
    }

    fn judge(&self, at: &crate::egress::verdict::Point<'_>) -> crate::egress::verdict::Judgement {
        use crate::egress::verdict::Judgement;
        let meters = at.limiter.processes.meters(at.process);
        let process = meters.into_iter().find_map(|m| m.spent().map(|s| (m, s)));
        if !at.limiter.has_destination_quotas() && process.is_none() {
            return Judgement::Pass;
        }
        let host = at.target.host.to_string();
        match process.or_else(|| at.limiter.destination_spent(&host)) {
            None => Judgement::Pass,
            Some((meter, spent)) => Judgement::Refuse(crate::policy::refusal::Refusal::new(
                crate::policy::reason::Reason::QuotaExceeded,
                meter.describe(spent),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
