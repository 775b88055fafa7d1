//! A meter's share of a fleet's `requests_per_day` (replicas on one etcd): the replica serves
//! a sandbox's requests only from what it leased from the fleet's counter
//! ([`crate::control::etcd::quota_lease`]), so the replicas together never serve more than the
//! quota — the bound is the quota itself, not a sync interval.
//!
//! A request that finds this replica's share used up while the fleet has some left is not
//! refused: [`Meter::reserve`] answers [`Spent::Leasing`], the leaser is woken
//! ([`wanted`]), and the request waits ([`Meter::share_grew`]) for the next chunk, up to
//! [`LEASE_WAIT`]. Only when a lease found nothing left (`out`) is a request refused
//! `quota_exceeded`. Per-process meters (`limits.per_process`) are not shared: their keys name
//! this replica's processes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Meter, Spent};

/// The longest a request waits for its replica to lease a share.
pub const LEASE_WAIT: Duration = Duration::from_secs(3);

/// Whether this process is a replica of a fleet (set once, at start, when etcd is configured).
static FLEET: AtomicBool = AtomicBool::new(false);

/// Serve requests quotas from leased shares from now on.
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

/// What this replica leased of one meter's requests quota today.
#[derive(Debug, Default)]
pub struct Share {
    /// Requests this replica may count today (everything it leased, less what it gave back).
    leased: AtomicU64,
    /// The fleet had nothing left at the last lease.
    out: AtomicBool,
    /// A request waits for a share.
    want: AtomicBool,
    /// Woken when the share grew or the fleet ran out.
    grew: Notify,
}

impl Share {
    pub(super) fn zero(&self) {
        self.leased.store(0, Ordering::Relaxed);
        self.reopen();
    }

    /// Look at the fleet again at the next request (the quota changed).
    pub(super) fn reopen(&self) {
        self.out.store(false, Ordering::Release);
    }
}

impl Meter {
    /// Whether this meter's requests quota is served from a leased share.
    pub fn shared(&self) -> bool {
        in_fleet() && !self.scope.starts_with('~') && self.requests_quota_of() != 0
    }

    /// The requests quota (0: none).
    pub fn requests_quota_of(&self) -> u64 {
        self.requests_quota.load(Ordering::Relaxed)
    }

    /// The requests counted today and the share leased for them.
    pub fn share_state(&self) -> (u64, u64) {
        self.roll();
        (
            self.requests.load(Ordering::Relaxed),
            self.share.leased.load(Ordering::Relaxed),
        )
    }

    /// Whether a request waits for a share.
    pub fn share_wanted(&self) -> bool {
        self.share.want.load(Ordering::Acquire)
    }

    /// `n` more requests leased (`out`: the fleet had no more than that).
    pub fn share_leased(&self, n: u64, out: bool) {
        self.roll();
        self.share.leased.fetch_add(n, Ordering::AcqRel);
        self.share.out.store(out, Ordering::Release);
        self.share.want.store(false, Ordering::Release);
        self.share.grew.notify_waiters();
    }

    /// Give back up to `n` unused requests of the share: how many were taken off (never
    /// below what was counted, so a request reserved meanwhile keeps its unit).
    pub fn share_give_back(&self, n: u64) -> u64 {
        let counted = self.requests.load(Ordering::Acquire);
        let mut given = 0;
        let _ = self
            .share
            .leased
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                given = l.saturating_sub(counted.max(l.saturating_sub(n)));
                Some(l - given)
            });
        // A request reserved between the load and the update may now stand above the share:
        // take back what it needs (the unit stays counted in the fleet).
        let now = self.requests.load(Ordering::Acquire);
        let over = now.saturating_sub(self.share.leased.load(Ordering::Acquire));
        if over > 0 {
            self.share.leased.fetch_add(over, Ordering::AcqRel);
            given = given.saturating_sub(over);
        }
        given
    }

    /// Count one request against the share: `Leasing` when the share is used up and the
    /// fleet may have more, `Requests` when it has none.
    pub(super) fn reserve_shared(&self) -> Result<u64, Spent> {
        let reserved = self
            .requests
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.share.leased.load(Ordering::Acquire)).then_some(n.saturating_add(1))
            });
        match reserved {
            Ok(n) => Ok(n),
            Err(_) if self.share.out.load(Ordering::Acquire) => {
                // Another replica may have given some back: the leaser looks (once a second).
                self.share.want.store(true, Ordering::Release);
                wanted().notify_one();
                Err(Spent::Requests)
            }
            Err(_) => {
                self.share.want.store(true, Ordering::Release);
                wanted().notify_one();
                Err(Spent::Leasing)
            }
        }
    }

    /// Whether new requests are refused: the share is used up and the fleet has none left.
    pub(super) fn share_spent(&self) -> bool {
        self.share.out.load(Ordering::Acquire)
            && self.requests.load(Ordering::Relaxed) >= self.share.leased.load(Ordering::Relaxed)
    }

    /// Resolves when the share grows or the fleet runs out (registered before the caller
    /// tries again, so a change in between is not missed).
    pub fn share_grew(&self) -> tokio::sync::futures::Notified<'_> {
        self.share.grew.notified()
    }
}
