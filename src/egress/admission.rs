//! Limits that apply before a sandbox is known, keyed by the client's source address
//! (`admission:`): how many connections one address may hold while unidentified, how fast it
//! may open them, and how many failed authentications it may make. A client that connects
//! and says nothing, or guesses tokens, exhausts its own allowance — never the slots of
//! identified connections (those count under the global `max_connections`, which an
//! unidentified connection never holds).
//!
//! The pool of unidentified connections cannot be captured: when it is full, the oldest
//! connection that has sent nothing is closed to admit the new one (a slowloris from many
//! addresses only cycles its own connections), and a share of the pool
//! (`admission.identified_share`) is kept for addresses that identified a sandbox in the last
//! ten minutes, so connections that do send bytes but never identify cannot fill it either.
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
pub enum Refusal {
    /// The address opens connections faster than `accepts_per_second_per_source`.
    Rate(Duration),
    /// The address (or everyone together) holds too many unidentified connections.
    Unidentified,
}

impl Refusal {
    /// The metric label: `rate` or `unidentified`.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Rate(_) => "rate",
            Refusal::Unidentified => "unidentified",
        }
    }
}

#[derive(Debug)]
struct Source {
    unidentified: u32,
    accepts: TokenBucket,
    auth_failures: TokenBucket,
}

/// What an unidentified connection and the table share: how to close it to make room, and
/// whether its place was already given back (then its drop gives back nothing).
#[derive(Debug, Default)]
struct SlotState {
    evict: tokio::sync::Notify,
    released: AtomicBool,
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
}

impl Table {
    /// Give back the place of connection `seq` from `source` (once).
    fn release(&mut self, seq: u64, source: IpAddr, state: &SlotState) {
        self.silent.remove(&seq);
        if state.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.unidentified_total = self.unidentified_total.saturating_sub(1);
        if let Some(s) = self.by_source.get_mut(&source) {
            s.unidentified = s.unidentified.saturating_sub(1);
        }
    }

    /// Close the oldest connection that has sent nothing; whether there was one.
    fn evict_oldest_silent(&mut self) -> bool {
        let Some((&seq, _)) = self.silent.iter().next() else {
            return false;
        };
        let Some((source, state)) = self.silent.remove(&seq) else {
            return false;
        };
        self.release(seq, source, &state);
        state.evict.notify_one();
        true
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
    pub fn accept(self: &Arc<Self>, source: IpAddr) -> Result<UnidentifiedSlot, Refusal> {
        let now = self.now();
        let cfg = self.cfg;
        let Ok(mut t) = self.table.lock() else {
            return Err(Refusal::Unidentified);
        };
        // Addresses that identified lately may use the reserved share too.
        let recent = t
            .recent
            .get(&source)
            .is_some_and(|at| at.elapsed() < RECENT);
        let reserved = (f64::from(cfg.unidentified_total) * cfg.identified_share) as u32;
        let limit = if recent {
            cfg.unidentified_total
        } else {
            cfg.unidentified_total.saturating_sub(reserved).max(1)
        };
        let full = t.unidentified_total >= limit;
        let entry = match t.by_source.get_mut(&source) {
            Some(_) => t.by_source.get_mut(&source),
            None => {
                if t.by_source.len() >= MAX_TRACKED {
                    forget_idle(&mut t.by_source, now);
                }
                if t.by_source.len() >= MAX_TRACKED {
                    return Err(Refusal::Unidentified);
                }
                t.by_source.insert(source, self.fresh(now));
                t.by_source.get_mut(&source)
            }
        };
        let Some(s) = entry else {
            return Err(Refusal::Unidentified);
        };
        if s.unidentified >= cfg.unidentified_per_source {
            return Err(Refusal::Unidentified);
        }
        if let Admit::DelayFor(d) = s.accepts.check(now, 1.0) {
            return Err(Refusal::Rate(d));
        }
        if full && !t.evict_oldest_silent() {
            return Err(Refusal::Unidentified);
        }
        if let Some(s) = t.by_source.get_mut(&source) {
            s.unidentified += 1;
        }
        t.unidentified_total += 1;
        let seq = t.next_seq;
        t.next_seq += 1;
        let state = Arc::new(SlotState::default());
        t.silent.insert(seq, (source, state.clone()));
        Ok(UnidentifiedSlot {
            owner: self.clone(),
            source,
            seq,
            state,
        })
    }

    /// `source` identified a sandbox: it may use the reserved share of the pool for a while.
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
            unidentified: 0,
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
        s.unidentified > 0 || !s.accepts.is_full_at(now) || !s.auth_failures.is_full_at(now)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Admission {
        Admission {
            unidentified_per_source: 3,
            unidentified_total: 5,
            accepts_per_second_per_source: 1000.0,
            accept_burst_per_source: 1000,
            first_byte: Duration::from_secs(1),
            auth_failures_per_second_per_source: 0.001,
            auth_failure_burst: 2,
            ..crate::config::defaults::ADMISSION
        }
    }

    #[test]
    fn unidentified_connections_are_capped_per_source_and_in_total() {
        let a = Admissions::new(cfg());
        let x: IpAddr = "10.0.0.1".parse().unwrap();
        let y: IpAddr = "10.0.0.2".parse().unwrap();
        // Connections that have sent bytes (silent ones may be closed to make room).
        let talking = |s: UnidentifiedSlot| {
            s.spoke();
            s
        };
        let held: Vec<_> = (0..3).map(|_| talking(a.accept(x).unwrap())).collect();
        assert_eq!(a.accept(x).unwrap_err(), Refusal::Unidentified);
        let y1 = talking(a.accept(y).unwrap());
        let _y2 = talking(a.accept(y).unwrap());
        // 5 in total now.
        assert_eq!(a.accept(y).unwrap_err(), Refusal::Unidentified);
        drop(y1);
        let _y3 = a.accept(y).unwrap();
        drop(held);
        let _x = a.accept(x).unwrap();
    }

    #[test]
    fn accept_rate_is_per_source() {
        let a = Admissions::new(Admission {
            accepts_per_second_per_source: 0.001,
            accept_burst_per_source: 2,
            ..cfg()
        });
        let x: IpAddr = "10.0.0.1".parse().unwrap();
        drop(a.accept(x).unwrap());
        drop(a.accept(x).unwrap());
        assert!(matches!(a.accept(x), Err(Refusal::Rate(_))));
        assert!(a.accept("10.0.0.9".parse().unwrap()).is_ok());
    }

    #[test]
    fn failed_authentications_block_their_source_only() {
        let a = Admissions::new(cfg());
        let x: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(a.auth_blocked(x), None);
        a.auth_failed(x);
        assert_eq!(a.auth_blocked(x), None);
        a.auth_failed(x);
        assert!(a
            .auth_blocked(x)
            .is_some_and(|d| d > Duration::from_secs(100)));
        assert_eq!(a.auth_blocked("10.0.0.2".parse().unwrap()), None);
    }

    #[test]
    fn the_table_forgets_idle_sources() {
        let mut m = HashMap::new();
        let a = Admissions::new(cfg());
        m.insert("10.0.0.1".parse().unwrap(), a.fresh(0));
        let mut busy = a.fresh(0);
        busy.unidentified = 1;
        m.insert("10.0.0.2".parse().unwrap(), busy);
        forget_idle(&mut m, 0);
        assert_eq!(m.len(), 1);
    }

    #[tokio::test]
    async fn a_full_pool_closes_its_oldest_silent_connection_and_keeps_a_share_for_the_identified()
    {
        let a = Admissions::new(Admission {
            unidentified_per_source: 10,
            unidentified_total: 10,
            identified_share: 0.2,
            ..cfg()
        });
        let attacker: IpAddr = "10.0.0.66".parse().unwrap();
        let known: IpAddr = "10.0.0.7".parse().unwrap();
        let stranger: IpAddr = "10.0.0.8".parse().unwrap();
        a.identified(known);
        // Eight silent connections fill what strangers may use (10 minus the reserved 2).
        let mut held: Vec<_> = (0..8).map(|_| a.accept(attacker).unwrap()).collect();
        // A new one closes the oldest silent connection to get in.
        let newcomer = a.accept(stranger).unwrap();
        tokio::time::timeout(Duration::from_secs(1), held[0].evicted())
            .await
            .expect("the oldest silent connection is told to close");
        // Connections that spoke are never closed for room: with every stranger place
        // taken by talkers, a stranger is refused, a recently identified address is not.
        for s in &held {
            s.spoke();
        }
        newcomer.spoke();
        assert_eq!(a.accept(stranger).unwrap_err(), Refusal::Unidentified);
        let k1 = a.accept(known).unwrap();
        let _k2 = a.accept(known).unwrap();
        k1.spoke();
        _k2.spoke();
        assert_eq!(a.accept(known).unwrap_err(), Refusal::Unidentified);
        // Places given back are counted once, evicted or not.
        held.clear();
        drop(newcomer);
        assert!(a.accept(stranger).is_ok());
    }
}
