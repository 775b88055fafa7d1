//! Exact fleet quotas by reservation: the replicas of a fleet lease shares of each sandbox's
//! `requests_per_day`, `tokens_per_day` and `cost_per_day` (and each `per_destination`
//! entry's) from one counter in etcd, `{prefix}quota/{day}/{key}` — what the whole fleet
//! leased today, per kind —, changed only by a transaction that fails when another replica
//! changed it first. A replica serves a sandbox's requests and calls from its own shares
//! ([`crate::egress::quota::share`]); so the fleet never counts more than a quota, whatever
//! the rate and however many replicas. The bound is not a sync interval: for requests the
//! overshoot is zero; for budgets it is what providers report beyond the calls' reservations
//! (a call's output is bounded to what it reserved, so only its input estimate can be short).
//!
//! - **Chunks adapt to the rate**: a share is leased when a request (or call) finds too little
//!   left (it waits), or ahead of need when what is left falls under half a chunk while
//!   requests come; topped up to one chunk, or to what the waiting call needs, so a replica
//!   holds little unused. A chunk starts at 1/64 of the quota (at least one unit), doubles when
//!   the previous one lasted under a second and halves when it lasted over ten, up to 1/8 of
//!   the quota: a quiet sandbox pays one etcd write per chunk, a busy one one write per second
//!   or less and its requests do not wait for etcd.
//! - **What is not used goes back**: a share untouched for [`GIVE_BACK_AFTER`] is returned to
//!   the counter, so is what a settled call left beyond a chunk, and every share at a graceful
//!   stop ([`give_back_all`]). Until then a request on another replica may be refused while
//!   this one holds up to a chunk its clients no longer ask for. A replica that dies keeps
//!   what it held: the fleet serves at most that much less that day (never more).
//! - **etcd unreachable**: a replica serves what its shares hold; a request that needs more
//!   waits [`crate::egress::quota::share::LEASE_WAIT`] and is refused (`quota_exceeded`,
//!   `budget_exceeded`) saying so (closed, never open).
//! - Counts made beyond a share (restored from `state_dir`, or a call that used more than it
//!   reserved) are added to the counter at the next lease: stricter, never looser.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::ControlPlane;
use crate::egress::quota::share::{self, Kind};
use crate::egress::quota::{today, Meter};

/// How long a share may sit unused before it is given back.
pub const GIVE_BACK_AFTER: Duration = Duration::from_secs(10);
/// How often shares are looked at when no request asks.
const TICK: Duration = Duration::from_millis(250);
/// Transactions tried per lease before the round gives up (the next round tries again).
const ATTEMPTS: usize = 8;
/// The lease of a day's counters (two days: etcd forgets old days by itself).
const LEASE_S: i64 = 2 * 86_400;

/// The counter's value: what the fleet leased today, per kind (cost in nano-dollars).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Counter {
    #[serde(default)]
    requests: u64,
    #[serde(default)]
    bytes: u64,
    #[serde(default)]
    tokens: u64,
    #[serde(default)]
    cost: u64,
}

impl Counter {
    /// A value that does not parse: everything leased (never nothing).
    fn full() -> Counter {
        Counter {
            requests: u64::MAX,
            bytes: u64::MAX,
            tokens: u64::MAX,
            cost: u64::MAX,
        }
    }

    fn of(&mut self, kind: Kind) -> &mut u64 {
        match kind {
            Kind::Requests => &mut self.requests,
            Kind::Bytes => &mut self.bytes,
            Kind::Tokens => &mut self.tokens,
            Kind::Cost => &mut self.cost,
        }
    }
}

/// What this replica remembers of one meter's quota of one kind between rounds.
struct Held {
    chunk: u64,
    /// When the last chunk was leased.
    leased_at: Option<Instant>,
    /// The count at the last round, and when it last changed.
    count: u64,
    moved_at: Instant,
    /// When the fleet was last found out (looked at again at most once a second).
    out_at: Option<Instant>,
}

/// Lease and give back shares until the task is aborted.
/// ([`share::join_fleet`] is called by whoever spawns it, before the listeners accept.)
pub async fn run(cp: Arc<ControlPlane>) {
    let mut held: HashMap<(String, Kind), Held> = HashMap::new();
    let mut lease: Option<(u32, i64)> = None;
    loop {
        tokio::select! {
            _ = share::wanted().notified() => {}
            _ = tokio::time::sleep(TICK) => {}
        }
        let Some(client) = cp.client.load_full().filter(|_| cp.connected()) else {
            continue;
        };
        let mut client = (*client).clone();
        if let Err(e) = round(&cp, &mut client, &mut held, &mut lease).await {
            cp.shared.metrics().control_plane_error("quota", 1);
            tracing::warn!(error = %e, "control plane: leasing quota shares");
        }
    }
}

async fn round(
    cp: &ControlPlane,
    client: &mut Client,
    held: &mut HashMap<(String, Kind), Held>,
    lease: &mut Option<(u32, i64)>,
) -> Result<(), etcd_client::Error> {
    let day = today();
    let meters = cp.shared.limiters.shared_meters();
    held.retain(|(k, kind), _| meters.iter().any(|(m, mt)| m == k && mt.shared_as(*kind)));
    for (key, meter) in meters {
        let counter = format!("{}quota/{day}/{key}", cp.cfg.prefix);
        for kind in Kind::ALL.into_iter().filter(|k| meter.shared_as(*k)) {
            let count = meter.share_state(kind).0;
            let h = held.entry((key.clone(), kind)).or_insert_with(|| Held {
                chunk: (meter.quota_of(kind) / 64).max(1),
                leased_at: None,
                count,
                moved_at: Instant::now(),
                out_at: None,
            });
            let place = Place {
                key: &counter,
                meter: &meter,
                kind,
            };
            tend(client, lease, day, place, h).await?;
        }
    }
    Ok(())
}

/// One meter's quota of one kind, in etcd and here.
#[derive(Clone, Copy)]
struct Place<'a> {
    key: &'a str,
    meter: &'a Meter,
    kind: Kind,
}

/// One round for one share: lease when a request waits, when a busy share runs low or when
/// counts went past it (a call that used more than it reserved); give back what sat unused
/// for [`GIVE_BACK_AFTER`], or what a settled call left beyond a chunk.
async fn tend(
    client: &mut Client,
    lease: &mut Option<(u32, i64)>,
    day: u32,
    at: Place<'_>,
    h: &mut Held,
) -> Result<(), etcd_client::Error> {
    let (count, leased) = at.meter.share_state(at.kind);
    if count != h.count {
        h.count = count;
        h.moved_at = Instant::now();
    }
    let room = leased.saturating_sub(count);
    let need = at.meter.share_wanted(at.kind);
    let debt = count > leased;
    let busy = h.moved_at.elapsed() < Duration::from_secs(1);
    if need != 0 || debt || (busy && room < h.chunk.div_ceil(2)) {
        let recent = h
            .out_at
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1));
        if recent && !debt {
            return Ok(());
        }
        h.chunk = next_chunk(h, at.meter.quota_of(at.kind));
        let id = day_lease(client, lease, day).await?;
        // Topped up to one chunk (or what a waiting call needs): a replica never holds more
        // than that unused.
        let top_up = h.chunk.saturating_sub(room).max(need).max(1);
        let out = take(client, at, id, top_up).await?;
        h.leased_at = Some(Instant::now());
        h.out_at = out.then(Instant::now);
        return Ok(());
    }
    let idle = h.moved_at.elapsed() >= GIVE_BACK_AFTER;
    let spare = match idle {
        true => room,
        false => room.saturating_sub(h.chunk),
    };
    if spare > 0 {
        let n = at.meter.share_give_back(at.kind, spare);
        if n > 0 {
            give_back(client, at.key, at.kind, n).await?;
            h.out_at = None;
        }
    }
    Ok(())
}

/// At a graceful stop, once no request is left: give every unused share back, so a rolling
/// restart of the fleet costs it nothing (a kill still loses at most a chunk per replica).
/// Bounded by `request_timeout` per share; what cannot be given back is lost, never counted
/// twice.
pub async fn give_back_all(cp: &ControlPlane) {
    let Some(client) = cp.client.load_full() else {
        return;
    };
    let mut client = (*client).clone();
    let day = today();
    for (key, meter) in cp.shared.limiters.shared_meters() {
        let counter = format!("{}quota/{day}/{key}", cp.cfg.prefix);
        for kind in Kind::ALL.into_iter().filter(|k| meter.shared_as(*k)) {
            let (count, leased) = meter.share_state(kind);
            let n = meter.share_give_back(kind, leased.saturating_sub(count));
            if n == 0 {
                continue;
            }
            let back = give_back(&mut client, &counter, kind, n);
            match tokio::time::timeout(cp.cfg.request_timeout, back).await {
                Ok(Ok(())) => {
                    tracing::info!(sandbox = %key, kind = kind.field(), n, "quota share given back to the fleet")
                }
                _ => {
                    tracing::warn!(sandbox = %key, kind = kind.field(), n, "could not give a quota share back at stop")
                }
            }
        }
    }
}

/// The next chunk of a meter: doubled when the last lasted under a second, halved when it
/// lasted over ten, between 1/64 and 1/8 of the quota (at least one request).
fn next_chunk(h: &Held, quota: u64) -> u64 {
    let (least, most) = ((quota / 64).max(1), (quota / 8).max(1));
    let chunk = match h.leased_at.map(|t| t.elapsed()) {
        Some(d) if d < Duration::from_secs(1) => h.chunk.saturating_mul(2),
        Some(d) if d > Duration::from_secs(10) => h.chunk / 2,
        _ => h.chunk,
    };
    chunk.clamp(least, most)
}

async fn day_lease(
    client: &mut Client,
    lease: &mut Option<(u32, i64)>,
    day: u32,
) -> Result<i64, etcd_client::Error> {
    match *lease {
        Some((d, id)) if d == day => Ok(id),
        _ => {
            let id = client.lease_grant(LEASE_S, None).await?.id();
            *lease = Some((day, id));
            Ok(id)
        }
    }
}

/// The counter's value and the revision to compare against (0: absent).
async fn read(client: &mut Client, key: &str) -> Result<(Counter, i64), etcd_client::Error> {
    let got = client.get(key, None).await?;
    Ok(match got.kvs().first() {
        Some(kv) => (
            serde_json::from_slice(kv.value()).unwrap_or_else(|_| Counter::full()),
            kv.mod_revision(),
        ),
        None => (Counter::default(), 0),
    })
}

/// Write `value` in place of the counter read at `revision` (0: absent): whether nobody
/// changed it meanwhile (else nothing is written).
async fn replace(
    client: &mut Client,
    key: &str,
    revision: i64,
    value: &Counter,
    opts: PutOptions,
) -> Result<bool, etcd_client::Error> {
    let unchanged = match revision {
        0 => Compare::create_revision(key, CompareOp::Equal, 0),
        r => Compare::mod_revision(key, CompareOp::Equal, r),
    };
    let body = serde_json::to_vec(value).unwrap_or_default();
    let txn = Txn::new()
        .when([unchanged])
        .and_then([TxnOp::put(key, body, Some(opts))]);
    Ok(client.txn(txn).await?.succeeded())
}

/// Lease up to `chunk` (and what this replica counted beyond its share: restored counts, a
/// call that used more than it reserved) for one share; whether the fleet has nothing left
/// after it.
async fn take(
    client: &mut Client,
    at: Place<'_>,
    lease: i64,
    chunk: u64,
) -> Result<bool, etcd_client::Error> {
    for _ in 0..ATTEMPTS {
        let (mut counter, revision) = read(client, at.key).await?;
        let (count, leased) = at.meter.share_state(at.kind);
        let debt = count.saturating_sub(leased);
        let quota = at.meter.quota_of(at.kind);
        let taken = counter.of(at.kind).saturating_add(debt);
        let grant = chunk.min(quota.saturating_sub(taken));
        let left = quota.saturating_sub(taken.saturating_add(grant));
        if grant == 0 && debt == 0 {
            at.meter.share_leased(at.kind, 0, left);
            return Ok(left == 0);
        }
        *counter.of(at.kind) = taken.saturating_add(grant);
        let opts = PutOptions::new().with_lease(lease);
        if replace(client, at.key, revision, &counter, opts).await? {
            at.meter
                .share_leased(at.kind, debt.saturating_add(grant), left);
            return Ok(left == 0);
        }
    }
    Ok(false)
}

/// Return `n` unused of `kind` to the counter (lost, never double-counted, when it cannot).
async fn give_back(
    client: &mut Client,
    key: &str,
    kind: Kind,
    n: u64,
) -> Result<(), etcd_client::Error> {
    for _ in 0..ATTEMPTS {
        let (mut counter, revision) = read(client, key).await?;
        if revision == 0 {
            return Ok(());
        }
        let v = counter.of(kind);
        *v = v.saturating_sub(n);
        // Kept on the key's lease: only its value changes.
        let opts = PutOptions::new().with_ignore_lease();
        if replace(client, key, revision, &counter, opts).await? {
            return Ok(());
        }
    }
    Ok(())
}
