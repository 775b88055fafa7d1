//! Limits that apply before a sandbox is known, keyed by the client's source address
//! (`admission:`): how many connections one address may hold while unidentified, how fast it
//! may open them, and how many failed authentications it may make. A client that connects
//! and says nothing, or guesses tokens, exhausts its own allowance — never the slots of
//! identified connections (those count under the global `max_connections`, which an
//! unidentified connection never holds).
//!
//! The pool of unidentified connections (`unidentified_total`) cannot be captured. It is for
//! addresses that have not identified a sandbox lately: an address that identified one in the
//! last ten minutes is bounded by its own per-source cap only and takes nothing from it. When
//! the pool is full a newcomer still gets in, and someone else's place is taken instead: the
//! oldest connection that has sent nothing; else the oldest connection of the address holding
//! the most, when that is more than the newcomer would hold (shared fairly); else the oldest
//! connection of any address holding more than the newcomer. A connection that sends one byte
//! and never identifies is closed for room like a silent one — so neither a slowloris from
//! many addresses nor talkers that never identify can lock a new address out.
//! (`admission.identified_share` is accepted and no longer needed.)
//!
//! State per address lives in one bounded table: entries with nothing in flight and full
//! buckets are forgotten first, so a scan from many addresses cannot grow it without limit.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Admission;
use crate::egress::limits::{Admit, TokenBucket};

/// Most addresses tracked at once; beyond it new addresses are refused until entries expire.
const MAX_TRACKED: usize = 65_536;
/// How long an address that identified a sandbox keeps its claim on the reserved share.
const RECENT: Duration = Duration::from_secs(600);

/// Why a connection was refused before identification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capped {
    /// The address opens connections faster than `accepts_per_second_per_source`.
    Rate(Duration),
    /// The address holds `unidentified_per_source` connections that have not identified.
    PerSource,
    /// The pool (`unidentified_total`) is full and no one holds more of it than this address
    /// would (or the table of addresses is full).
    Pool,
}

impl Capped {
    /// The metric label: `rate` or `unidentified`.
    pub fn label(&self) -> &'static str {
        match self {
            Capped::Rate(_) => "rate",
            Capped::PerSource | Capped::Pool => "unidentified",
        }
    }

    /// Which limit was hit, for the refusal's text.
    pub fn explain(&self) -> &'static str {
        match self {
            Capped::Rate(_) => {
                "this address opens connections faster than admission.accepts_per_second_per_source"
            }
            Capped::PerSource => {
                "this address holds admission.unidentified_per_source connections that have not identified a sandbox"
            }
            Capped::Pool => {
                "the pool of connections that have not identified a sandbox (admission.unidentified_total) is full, and no address holds more of it than this one"
            }
        }
    }
}

#[derive(Debug)]
struct Source {
    /// Its connections that have not identified, oldest first (pooled or not).
    slots: BTreeMap<u64, Arc<SlotState>>,
    /// How many of them count in the pool.
    pooled: u32,
    accepts: TokenBucket,
    auth_failures: TokenBucket,
}

/// What an unidentified connection and the table share: how to close it to make room, and
/// whether its place was already given back (then its drop gives back nothing).
#[derive(Debug, Default)]
struct SlotState {
    evict: tokio::sync::Notify,
    released: AtomicBool,
    /// It counts in the pool (its address had not identified lately when it came).
    pooled: bool,
}

#[derive(Debug)]
struct Table {
    by_source: HashMap<IpAddr, Source>,
    unidentified_total: u32,
    /// Connections that have sent nothing yet, oldest first (by admission order).
    silent: BTreeMap<u64, (IpAddr, Arc<SlotState>)>,
    next_seq: u64,
    /// Addresses that identified a sandbox, and when.
    recent: HashMap<IpAddr, Instant>,
    /// Pooled connections, oldest first.
    pooled: BTreeMap<u64, IpAddr>,
    /// (pooled connections, address) of every address holding some: the heaviest last.
    heavy: std::collections::BTreeSet<(u32, IpAddr)>,
}

impl Table {
    /// Give back the place of connection `seq` from `source` (once).
    fn release(&mut self, seq: u64, source: IpAddr, state: &SlotState) {
        self.silent.remove(&seq);
        if state.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(s) = self.by_source.get_mut(&source) else {
            return;
        };
        s.slots.remove(&seq);
        if state.pooled {
            self.unidentified_total = self.unidentified_total.saturating_sub(1);
            self.pooled.remove(&seq);
            self.heavy.remove(&(s.pooled, source));
            s.pooled = s.pooled.saturating_sub(1);
            if s.pooled > 0 {
                self.heavy.insert((s.pooled, source));
            }
        }
    }

    /// Count one more pooled connection for `source`.
    fn pool(&mut self, seq: u64, source: IpAddr) {
        self.unidentified_total += 1;
        self.pooled.insert(seq, source);
        if let Some(s) = self.by_source.get_mut(&source) {
            self.heavy.remove(&(s.pooled, source));
            s.pooled += 1;
            self.heavy.insert((s.pooled, source));
        }
    }

    /// Close connection `seq` of `source` to make room.
    fn evict(&mut self, seq: u64, source: IpAddr) -> bool {
        let Some(state) = self
            .by_source
            .get(&source)
            .and_then(|s| s.slots.get(&seq).cloned())
        else {
            return false;
        };
        self.release(seq, source, &state);
        state.evict.notify_one();
        true
    }

    /// Make room in the full pool for a newcomer from `source`: close the oldest silent
    /// connection; else the oldest of the heaviest address when it holds more than the
    /// newcomer would; else the oldest of any address holding more than the newcomer.
    fn make_room(&mut self, source: IpAddr) -> bool {
        let silent = self.silent.iter().find(|(_, (_, st))| st.pooled);
        if let Some((seq, ip)) = silent.map(|(seq, (ip, _))| (*seq, *ip)) {
            return self.evict(seq, ip);
        }
        let mine = self.by_source.get(&source).map_or(0, |s| s.pooled);
        if let Some(&(most, ip)) = self.heavy.iter().next_back() {
            if most > mine + 1 {
                let oldest = self.by_source.get(&ip).and_then(|s| {
                    s.slots
                        .iter()
                        .find(|(_, st)| st.pooled)
                        .map(|(seq, _)| *seq)
                });
                if let Some(seq) = oldest {
                    return self.evict(seq, ip);
                }
            }
        }
        let victim = self.pooled.iter().find(|(_, ip)| {
            self.by_source
                .get(ip)
                .is_some_and(|s| s.pooled > mine && **ip != source)
        });
        match victim.map(|(seq, ip)| (*seq, *ip)) {
            Some((seq, ip)) => self.evict(seq, ip),
            None => false,
        }
    }
}

/// Per-address admission state.
#[derive(Debug)]
pub struct Admissions {
    cfg: Admission,
    origin: Instant,
    table: Mutex<Table>,
}

/// One unidentified connection's place; given back when dropped (identified or closed), or
/// taken away to make room while it has sent nothing ([`UnidentifiedSlot::evicted`]).
#[derive(Debug)]
pub struct UnidentifiedSlot {
    owner: Arc<Admissions>,
    source: IpAddr,
    seq: u64,
    state: Arc<SlotState>,
}

impl UnidentifiedSlot {
    /// The client sent its first byte: it is no longer a candidate to close for room.
    pub fn spoke(&self) {
        if let Ok(mut t) = self.owner.table.lock() {
            t.silent.remove(&self.seq);
        }
    }

    /// Completes when this connection was closed to make room (it had sent nothing and the
    /// pool was full).
    pub async fn evicted(&self) {
        self.state.evict.notified().await
    }

    /// The address this connection comes from.
    pub fn source(&self) -> IpAddr {
        self.source
    }

    /// A handle that completes when this connection is closed to make room, usable after the
    /// slot itself has moved (a connection that spoke but never identified can be closed
    /// too).
    pub fn eviction(&self) -> Eviction {
        Eviction(self.state.clone())
    }
}

/// See [`UnidentifiedSlot::eviction`].
#[derive(Debug, Clone)]
pub struct Eviction(Arc<SlotState>);

impl Eviction {
    pub async fn wait(&self) {
        self.0.evict.notified().await
    }
}

impl Drop for UnidentifiedSlot {
    fn drop(&mut self) {
        if let Ok(mut t) = self.owner.table.lock() {
            t.release(self.seq, self.source, &self.state);
        }
    }
}

impl Admissions {
    /// The `admission:` settings this table applies.
    pub fn config(&self) -> &Admission {
        &self.cfg
    }

    pub fn new(cfg: Admission) -> Arc<Self> {
        Arc::new(Admissions {
            cfg,
            origin: Instant::now(),
            table: Mutex::new(Table {
                by_source: HashMap::new(),
                unidentified_total: 0,
                silent: BTreeMap::new(),
                next_seq: 0,
                recent: HashMap::new(),
                pooled: BTreeMap::new(),
                heavy: std::collections::BTreeSet::new(),
            }),
        })
    }

    /// How long a new connection may stay silent.
    pub fn first_byte(&self) -> Duration {
        self.cfg.first_byte
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Admit a new, not yet identified connection from `source`.
    pub fn accept(self: &Arc<Self>, source: IpAddr) -> Result<UnidentifiedSlot, Capped> {
        let now = self.now();
        let cfg = self.cfg;
        let Ok(mut t) = self.table.lock() else {
            return Err(Capped::Pool);
        };
        // Addresses that identified lately are bounded by their own cap, not the pool.
        let recent = t
            .recent
            .get(&source)
            .is_some_and(|at| at.elapsed() < RECENT);
        if !t.by_source.contains_key(&source) {
            if t.by_source.len() >= MAX_TRACKED {
                forget_idle(&mut t.by_source, now);
            }
            if t.by_source.len() >= MAX_TRACKED {
                return Err(Capped::Pool);
            }
            let fresh = self.fresh(now);
            t.by_source.insert(source, fresh);
        }
        let Some(s) = t.by_source.get_mut(&source) else {
            return Err(Capped::Pool);
        };
        if s.slots.len() >= cfg.unidentified_per_source as usize {
            return Err(Capped::PerSource);
        }
        if let Admit::DelayFor(d) = s.accepts.check(now, 1.0) {
            return Err(Capped::Rate(d));
        }
        if !recent && t.unidentified_total >= cfg.unidentified_total && !t.make_room(source) {
            return Err(Capped::Pool);
        }
        let seq = t.next_seq;
        t.next_seq += 1;
        let state = Arc::new(SlotState {
            pooled: !recent,
            ..SlotState::default()
        });
        if let Some(s) = t.by_source.get_mut(&source) {
            s.slots.insert(seq, state.clone());
        }
        if !recent {
            t.pool(seq, source);
        }
        t.silent.insert(seq, (source, state.clone()));
        Ok(UnidentifiedSlot {
            owner: self.clone(),
            source,
            seq,
            state,
        })
    }

    /// `source` identified a sandbox: for a while its connections are bounded by its own cap
    /// and take nothing from the pool.
    pub fn identified(&self, source: IpAddr) {
        if let Ok(mut t) = self.table.lock() {
            if t.recent.len() >= MAX_TRACKED && !t.recent.contains_key(&source) {
                t.recent.retain(|_, at| at.elapsed() < RECENT);
            }
            if t.recent.len() < MAX_TRACKED || t.recent.contains_key(&source) {
                t.recent.insert(source, Instant::now());
            }
        }
    }

    /// `Some(wait)` when `source` has used up its failed authentications: refuse the attempt
    /// without checking the credential.
    pub fn auth_blocked(&self, source: IpAddr) -> Option<Duration> {
        let now = self.now();
        let mut t = self.table.lock().ok()?;
        let s = t.by_source.get_mut(&source)?;
        s.auth_failures.has(now, 1.0).err()
    }

    /// `source` presented a wrong credential.
    pub fn auth_failed(&self, source: IpAddr) {
        let now = self.now();
        if let Ok(mut t) = self.table.lock() {
            if !t.by_source.contains_key(&source) && t.by_source.len() < MAX_TRACKED {
                let fresh = self.fresh(now);
                t.by_source.insert(source, fresh);
            }
            if let Some(s) = t.by_source.get_mut(&source) {
                let _ = s.auth_failures.check(now, 1.0);
            }
        }
    }

    fn fresh(&self, now: u64) -> Source {
        let c = self.cfg;
        Source {
            slots: BTreeMap::new(),
            pooled: 0,
            accepts: TokenBucket::new(
                c.accepts_per_second_per_source,
                f64::from(c.accept_burst_per_source),
                now,
            ),
            auth_failures: TokenBucket::new(
                c.auth_failures_per_second_per_source,
                f64::from(c.auth_failure_burst),
                now,
            ),
        }
    }
}

/// Drop the entries that hold nothing: no connection in flight and both buckets full again
/// (forgetting them changes no future answer).
fn forget_idle(by_source: &mut HashMap<IpAddr, Source>, now: u64) {
    by_source.retain(|_, s| {
        !s.slots.is_empty() || !s.accepts.is_full_at(now) || !s.auth_failures.is_full_at(now)
    });
}

#[cfg(test)]
mod tests;
