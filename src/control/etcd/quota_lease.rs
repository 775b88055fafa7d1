//! Exact fleet quotas by reservation: the replicas of a fleet lease shares of each sandbox's
//! `requests_per_day` (and each `per_destination` entry's) from one counter in etcd,
//! `{prefix}quota/{day}/{key}` — the requests leased by the whole fleet today —, changed only
//! by a transaction that fails when another replica changed it first. A replica serves a
//! sandbox's requests from its own share ([`crate::egress::quota::share`]); so the fleet never
//! serves more than the quota, whatever the rate and however many replicas (the bound is not
//! a sync interval: the overshoot is zero).
//!
//! - **Chunks adapt to the rate**: a share is leased when a request finds none left (it
//!   waits), or ahead of need when what is left falls under half a chunk while requests come;
//!   either way topped up to one chunk, so a replica never holds more than a chunk unused.
//!   A chunk starts at 1/64 of the quota (at least one request), doubles when the previous one
//!   lasted under a second and halves when it lasted over ten, up to 1/8 of the quota: a quiet
//!   sandbox pays one etcd write per chunk, a busy one one write per second or less and its
//!   requests do not wait for etcd.
//! - **What is not used goes back**: a share untouched for [`GIVE_BACK_AFTER`] is returned to
//!   the counter, and every share at a graceful stop ([`give_back_all`]). A replica that dies
//!   keeps what it held: the fleet serves at most one chunk less that day (never more).
//! - **etcd unreachable**: a replica serves what its shares hold; a request that needs more
//!   waits [`crate::egress::quota::share::LEASE_WAIT`] and is refused `quota_exceeded`
//!   saying so (closed, never open).
//! - Counts made before a share covered them (restored from `state_dir`) are added to the
//!   counter at the first lease of the day: stricter, never looser.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::ControlPlane;
use crate::egress::quota::{share, today, Meter};

/// How long a share may sit unused before it is given back.
pub const GIVE_BACK_AFTER: Duration = Duration::from_secs(10);
/// How often shares are looked at when no request asks.
const TICK: Duration = Duration::from_millis(250);
/// Transactions tried per lease before the round gives up (the next round tries again).
const ATTEMPTS: usize = 8;
/// The lease of a day's counters (two days: etcd forgets old days by itself).
const LEASE_S: i64 = 2 * 86_400;

/// The counter's value.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Counter {
    /// Requests leased by the fleet today.
    requests: u64,
}

/// What this replica remembers of one meter between rounds.
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
    let mut held: HashMap<String, Held> = HashMap::new();
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
    held: &mut HashMap<String, Held>,
    lease: &mut Option<(u32, i64)>,
) -> Result<(), etcd_client::Error> {
    let day = today();
    let meters = cp.shared.limiters.shared_meters();
    held.retain(|k, _| meters.iter().any(|(m, _)| m == k));
    for (key, meter) in meters {
        let (count, leased) = meter.share_state();
        let quota = meter.requests_quota_of();
        let h = held.entry(key.clone()).or_insert_with(|| Held {
            chunk: (quota / 64).max(1),
            leased_at: None,
            count,
            moved_at: Instant::now(),
            out_at: None,
        });
        if count != h.count {
            h.count = count;
            h.moved_at = Instant::now();
        }
        let room = leased.saturating_sub(count);
        let busy = h.moved_at.elapsed() < Duration::from_secs(1);
        let want = meter.share_wanted() || (busy && room < h.chunk.div_ceil(2));
        let counter = format!("{}quota/{day}/{key}", cp.cfg.prefix);
        if want {
            if h.out_at
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
            {
                continue;
            }
            h.chunk = next_chunk(h, quota);
            let id = day_lease(client, lease, day).await?;
            // Topped up to one chunk: a replica never holds more than a chunk unused.
            let top_up = h.chunk.saturating_sub(room).max(1);
            let out = take(client, &counter, id, &meter, top_up).await?;
            h.leased_at = Some(Instant::now());
            h.out_at = out.then(Instant::now);
        } else if room > 0 && h.moved_at.elapsed() >= GIVE_BACK_AFTER {
            let n = meter.share_give_back(room);
            if n > 0 {
                give_back(client, &counter, n).await?;
                h.out_at = None;
            }
        }
    }
    Ok(())
}

/// At a graceful stop, once no request is left: give every unused share back, so a rolling
/// restart of the fleet costs it nothing (a kill still loses at most a chunk per replica).
/// Bounded by `request_timeout` per meter; what cannot be given back is lost, never counted
/// twice.
pub async fn give_back_all(cp: &ControlPlane) {
    let Some(client) = cp.client.load_full() else {
        return;
    };
    let mut client = (*client).clone();
    let day = today();
    let mut given = 0u64;
    for (key, meter) in cp.shared.limiters.shared_meters() {
        let (count, leased) = meter.share_state();
        let n = meter.share_give_back(leased.saturating_sub(count));
        if n == 0 {
            continue;
        }
        let counter = format!("{}quota/{day}/{key}", cp.cfg.prefix);
        let back =
            tokio::time::timeout(cp.cfg.request_timeout, give_back(&mut client, &counter, n));
        match back.await {
            Ok(Ok(())) => given += n,
            _ => {
                tracing::warn!(sandbox = %key, requests = n, "could not give a quota share back at stop")
            }
        }
    }
    if given > 0 {
        tracing::info!(requests = given, "quota shares given back to the fleet");
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
        // A value that does not parse counts as all leased (never as none).
        Some(kv) => (
            serde_json::from_slice(kv.value()).unwrap_or(Counter { requests: u64::MAX }),
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

/// Lease up to `chunk` requests (and what this replica counted without a share) for
/// `meter`; whether the fleet has nothing left after it.
async fn take(
    client: &mut Client,
    key: &str,
    lease: i64,
    meter: &Meter,
    chunk: u64,
) -> Result<bool, etcd_client::Error> {
    for _ in 0..ATTEMPTS {
        let (counter, revision) = read(client, key).await?;
        let (count, leased) = meter.share_state();
        let debt = count.saturating_sub(leased);
        let quota = meter.requests_quota_of();
        let taken = counter.requests.saturating_add(debt);
        let grant = chunk.min(quota.saturating_sub(taken));
        let out = taken.saturating_add(grant) >= quota;
        if grant == 0 && debt == 0 {
            meter.share_leased(0, out);
            return Ok(out);
        }
        let value = Counter {
            requests: taken.saturating_add(grant),
        };
        let opts = PutOptions::new().with_lease(lease);
        if replace(client, key, revision, &value, opts).await? {
            meter.share_leased(debt.saturating_add(grant), out);
            return Ok(out);
        }
    }
    Ok(false)
}

/// Return `n` unused requests to the counter (lost, never double-counted, when it cannot).
async fn give_back(client: &mut Client, key: &str, n: u64) -> Result<(), etcd_client::Error> {
    for _ in 0..ATTEMPTS {
        let (counter, revision) = read(client, key).await?;
        if revision == 0 {
            return Ok(());
        }
        let value = Counter {
            requests: counter.requests.saturating_sub(n),
        };
        // Kept on the key's lease: only its value changes.
        let opts = PutOptions::new().with_ignore_lease();
        if replace(client, key, revision, &value, opts).await? {
            return Ok(());
        }
    }
    Ok(())
}
