//! A meter's shares of a fleet's daily quotas (replicas on one etcd): `requests_per_day`,
//! `bytes_per_day`, `tokens_per_day` and `cost_per_day`. The replica serves a sandbox's requests and calls only
//! from what it leased from the fleet's counter ([`crate::control::etcd::quota_lease`]), so
//! the replicas together never count more than the quota — the bound is the quota itself (and,
//! for budgets, what providers report beyond the reservation), not a sync interval.
//!
//! A request (or a call's reservation) that finds this replica's share too small while the
//! fleet may have more is not refused: it answers [`Spent::Leasing`], saying how much it needs,
//! the leaser is woken ([`wanted`]), and the request waits ([`Meter::share_grew`]) for the next
//! chunk, up to [`LEASE_WAIT`]. Only when a lease found nothing left (`out`) is it refused.
//! Bytes are taken before they are written ([`Meter::take_shared_bytes`]: a relay waits for a
//! share as a request does). Per-process meters (`limits.per_process`) are not shared: their
//! keys name this replica's processes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Meter, Spent};

/// The longest a request waits for its replica to lease a share.
pub const LEASE_WAIT: Duration = Duration::from_secs(3);

/// Whether this process is a replica of a fleet (set once, at start, when etcd is configured).
static FLEET: AtomicBool = AtomicBool::new(false);

/// Serve quotas from leased shares from now on.
pub fn join_fleet() {
    FLEET.store(true, Ordering::Release);
}

/// Whether quotas are served from leased shares.
pub fn in_fleet() -> bool {
    FLEET.load(Ordering::Acquire)
}

/// Woken when a meter needs a share (the leaser waits on it).
pub fn wanted() -> &'static Notify {
    static WANTED: std::sync::OnceLock<Notify> = std::sync::OnceLock::new();
    WANTED.get_or_init(Notify::new)
}

/// Wait for `meter`'s share to grow after a request found it too small: `false` once
/// `deadline` passed. Registered before it looks, so a lease in between is not missed; a
/// lease that came before it answers at once.
pub async fn wait_grown(meter: &Meter, deadline: tokio::time::Instant) -> bool {
    if tokio::time::Instant::now() >= deadline {
        return false;
    }
    let grew = meter.share_grew();
    tokio::pin!(grew);
    grew.as_mut().enable();
    if !meter.share_waiting() {
        return true;
    }
    tokio::time::timeout_at(deadline, grew).await.is_ok()
}

/// Which daily quota a share is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `requests_per_day`: requests.
    Requests,
    /// `bytes_per_day`: bytes, both directions.
    Bytes,
    /// `tokens_per_day`: tokens.
    Tokens,
    /// `cost_per_day`: nano-dollars.
    Cost,
}

impl Kind {
    /// Every kind, in the order of [`Share`]'s pools.
    pub const ALL: [Kind; 4] = [Kind::Requests, Kind::Bytes, Kind::Tokens, Kind::Cost];

    /// The counter's field, and the unit in logs.
    pub fn field(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Bytes => "bytes",
            Kind::Tokens => "tokens",
            Kind::Cost => "cost",
        }
    }

    /// What a refusal names when this kind's fleet has nothing left.
    pub(super) fn spent(self) -> Spent {
        match self {
            Kind::Requests => Spent::Requests,
            Kind::Bytes => Spent::Bytes,
            Kind::Tokens => Spent::Tokens,
            Kind::Cost => Spent::Cost,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What this replica leased of one quota today.
#[derive(Debug, Default)]
struct Pool {
    /// What this replica may count today (everything it leased, less what it gave back).
    leased: AtomicU64,
    /// The fleet had nothing left at the last lease.
    out: AtomicBool,
    /// What a waiting request or call needs beyond the share (0: nothing waits).
    want: AtomicU64,
    /// What the fleet had not leased at the last lease, plus what this replica gave back
    /// since (read only once `known`).
    fleet_left: AtomicU64,
    /// `fleet_left` was set by a lease today.
    known: AtomicBool,
}

/// What this replica leased of one meter's quotas today, one pool per [`Kind`].
#[derive(Debug, Default)]
pub struct Share {
    pools: [Pool; 4],
    /// Woken when a share grew or the fleet ran out.
    grew: Notify,
}

impl Pool {
    /// Tell the leaser this share needs `need` more (at least 1); woken only when that is
    /// more than it was already asked for.
    fn ask(&self, need: u64) {
        let need = need.max(1);
        if self.want.fetch_max(need, Ordering::AcqRel) < need {
            wanted().notify_one();
        }
    }
}

impl Share {
    pub(super) fn zero(&self) {
        for p in &self.pools {
            p.leased.store(0, Ordering::Relaxed);
            p.known.store(false, Ordering::Relaxed);
        }
        self.reopen();
    }

    /// Look at the fleet again at the next request (a quota changed).
    pub(super) fn reopen(&self) {
        for p in &self.pools {
            p.out.store(false, Ordering::Release);
        }
    }
}

impl Meter {
    fn pool(&self, kind: Kind) -> &Pool {
        &self.share.pools[kind.index()]
    }

    /// The count of `kind` today.
    pub(super) fn count_of(&self, kind: Kind) -> &AtomicU64 {
        match kind {
            Kind::Requests => &self.requests,
            Kind::Bytes => &self.bytes,
            Kind::Tokens => &self.tokens,
            Kind::Cost => &self.cost,
        }
    }

    /// The quota of `kind` (0: none).
    pub fn quota_of(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Requests => &self.requests_quota,
            Kind::Bytes => &self.bytes_quota,
            Kind::Tokens => &self.tokens_quota,
            Kind::Cost => &self.cost_quota,
        }
        .load(Ordering::Relaxed)
    }

    /// Whether this meter's quota of `kind` is served from a leased share.
    pub fn shared_as(&self, kind: Kind) -> bool {
        in_fleet() && !self.scope.starts_with('~') && self.quota_of(kind) != 0
    }

    /// Whether any of this meter's quotas is served from a leased share.
    pub fn shared(&self) -> bool {
        Kind::ALL.iter().any(|k| self.shared_as(*k))
    }

    /// The count of `kind` today and the share leased for it.
    pub fn share_state(&self, kind: Kind) -> (u64, u64) {
        self.roll();
        (
            self.count_of(kind).load(Ordering::Relaxed),
            self.pool(kind).leased.load(Ordering::Relaxed),
        )
    }

    /// What a waiting request or call needs of `kind` beyond the share (0: nothing waits).
    pub fn share_wanted(&self, kind: Kind) -> u64 {
        self.pool(kind).want.load(Ordering::Acquire)
    }

    /// Whether anything waits for a share of this meter.
    pub fn share_waiting(&self) -> bool {
        Kind::ALL.iter().any(|k| self.share_wanted(*k) != 0)
    }

    /// `n` more of `kind` leased; `fleet_left`: what the fleet has not leased after it
    /// (`out` when it is nothing).
    pub fn share_leased(&self, kind: Kind, n: u64, fleet_left: u64) {
        self.roll();
        let p = self.pool(kind);
        p.leased.fetch_add(n, Ordering::AcqRel);
        p.fleet_left.store(fleet_left, Ordering::Release);
        p.known.store(true, Ordering::Release);
        p.out.store(fleet_left == 0, Ordering::Release);
        p.want.store(0, Ordering::Release);
        self.share.grew.notify_waiters();
    }

    /// Give back up to `n` unused of the share of `kind`: how much was taken off (never below
    /// what was counted, so a request reserved meanwhile keeps its unit).
    pub fn share_give_back(&self, kind: Kind, n: u64) -> u64 {
        let p = self.pool(kind);
        let count = self.count_of(kind);
        let counted = count.load(Ordering::Acquire);
        let mut given = 0;
        let _ = p
            .leased
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                given = l.saturating_sub(counted.max(l.saturating_sub(n)));
                Some(l - given)
            });
        // A request reserved between the load and the update may now stand above the share:
        // take back what it needs (the unit stays counted in the fleet).
        let now = count.load(Ordering::Acquire);
        let over = now.saturating_sub(p.leased.load(Ordering::Acquire));
        if over > 0 {
            p.leased.fetch_add(over, Ordering::AcqRel);
            given = given.saturating_sub(over);
        }
        p.fleet_left.fetch_add(given, Ordering::AcqRel);
        given
    }

    /// Count `n` of `kind` against the share — with `fit`, only when all of it fits in what
    /// is left, else while anything is — : `Leasing` when it does not and the fleet may have
    /// more (the need is posted for the leaser), the kind's own `Spent` when it has none.
    pub(super) fn reserve_shared(&self, kind: Kind, n: u64, fit: bool) -> Result<u64, Spent> {
        let p = self.pool(kind);
        let reserved = self
            .count_of(kind)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                let leased = p.leased.load(Ordering::Acquire);
                let room = match fit {
                    true => c.saturating_add(n) <= leased,
                    false => c < leased,
                };
                room.then_some(c.saturating_add(n))
            });
        let c = match reserved {
            Ok(before) => return Ok(before),
            Err(c) => c,
        };
        p.ask(
            c.saturating_add(n.max(1))
                .saturating_sub(p.leased.load(Ordering::Acquire)),
        );
        match p.out.load(Ordering::Acquire) {
            // Another replica may give some back: the leaser looks (once a second).
            true => Err(kind.spent()),
            false => Err(Spent::Leasing(kind)),
        }
    }

    /// Take up to `n` bytes from the share: how many fit, counted at once. Fewer than `n`
    /// posts the rest for the leaser ([`Meter::bytes_leasing`] says whether more may come);
    /// at the fleet's end the meter trips (the exchanges are cut).
    pub(super) fn take_shared_bytes(&self, n: u64) -> u64 {
        let p = self.pool(Kind::Bytes);
        let mut granted = 0;
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                granted = p.leased.load(Ordering::Acquire).saturating_sub(c).min(n);
                Some(c.saturating_add(granted))
            });
        if granted < n {
            p.ask(n - granted);
        }
        if self.share_spent(Kind::Bytes) {
            self.trip();
        }
        granted
    }

    /// `n` bytes counted after they moved (a path that cannot wait): past the share they are
    /// owed to the fleet (added at the next lease); `true` when the fleet has none left.
    pub(super) fn moved_shared_bytes(&self, n: u64) -> bool {
        let p = self.pool(Kind::Bytes);
        let c = self.bytes.fetch_add(n, Ordering::AcqRel).saturating_add(n);
        if c > p.leased.load(Ordering::Acquire) {
            p.ask(1);
        }
        let spent = self.share_spent(Kind::Bytes);
        if spent {
            self.trip();
        }
        spent
    }

    /// Whether new exchanges are refused by the fleet's byte quota: the share is used up and
    /// the fleet has none left. A share used up while the fleet may have more asks the
    /// leaser for the next (so a replica that has leased nothing learns the fleet is out).
    pub(super) fn bytes_spent_shared(&self) -> bool {
        let p = self.pool(Kind::Bytes);
        let dry = self.bytes.load(Ordering::Acquire) >= p.leased.load(Ordering::Acquire);
        let out = p.out.load(Ordering::Acquire);
        if dry && !out {
            p.ask(1);
        }
        dry && out
    }

    /// Whether bytes this meter could not grant may still come: its byte quota is a fleet
    /// share and the fleet was not out at the last lease.
    pub fn bytes_leasing(&self) -> bool {
        self.shared_as(Kind::Bytes) && !self.pool(Kind::Bytes).out.load(Ordering::Acquire)
    }

    /// Whether new requests are refused: the share is used up and the fleet has none left.
    pub(super) fn share_spent(&self, kind: Kind) -> bool {
        let p = self.pool(kind);
        p.out.load(Ordering::Acquire)
            && self.count_of(kind).load(Ordering::Relaxed) >= p.leased.load(Ordering::Relaxed)
    }

    /// What is left of `kind` for this replica to count: its share's room and what the fleet
    /// had not leased at the last look.
    pub(super) fn share_left(&self, kind: Kind) -> u64 {
        let p = self.pool(kind);
        let count = self.count_of(kind).load(Ordering::Relaxed);
        let leased = p.leased.load(Ordering::Relaxed);
        let fleet = match p.known.load(Ordering::Acquire) {
            true => p.fleet_left.load(Ordering::Relaxed),
            false => self.quota_of(kind).saturating_sub(leased.max(count)),
        };
        leased.saturating_sub(count).saturating_add(fleet)
    }

    /// Resolves when a share grows or the fleet runs out (registered before the caller
    /// tries again, so a change in between is not missed).
    pub fn share_grew(&self) -> tokio::sync::futures::Notified<'_> {
        self.share.grew.notified()
    }
}
