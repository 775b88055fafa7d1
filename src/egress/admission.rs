//! Limits that apply before a sandbox is known, keyed by the client's source address
//! (`admission:`): how many connections one address may hold while unidentified, how fast it
//! may open them, and how many failed authentications it may make. A client that connects
//! and says nothing, or guesses tokens, exhausts its own allowance — never the slots of
//! identified connections (those count under the global `max_connections`, which an
//! unidentified connection never holds).
//!
//! State per address lives in one bounded table: entries with nothing in flight and full
//! buckets are forgotten first, so a scan from many addresses cannot grow it without limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Admission;
use crate::egress::limits::{Admit, TokenBucket};

/// Most addresses tracked at once; beyond it new addresses are refused until entries expire.
const MAX_TRACKED: usize = 65_536;

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

#[derive(Debug)]
struct Table {
    by_source: HashMap<IpAddr, Source>,
    unidentified_total: u32,
}

/// Per-address admission state.
#[derive(Debug)]
pub struct Admissions {
    cfg: Admission,
    origin: Instant,
    table: Mutex<Table>,
}

/// One unidentified connection's place; given back when dropped (identified or closed).
#[derive(Debug)]
pub struct UnidentifiedSlot {
    owner: Arc<Admissions>,
    source: IpAddr,
}

impl Drop for UnidentifiedSlot {
    fn drop(&mut self) {
        if let Ok(mut t) = self.owner.table.lock() {
            t.unidentified_total = t.unidentified_total.saturating_sub(1);
            if let Some(s) = t.by_source.get_mut(&self.source) {
                s.unidentified = s.unidentified.saturating_sub(1);
            }
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
        if t.unidentified_total >= cfg.unidentified_total {
            return Err(Refusal::Unidentified);
        }
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
        s.unidentified += 1;
        t.unidentified_total += 1;
        Ok(UnidentifiedSlot {
            owner: self.clone(),
            source,
        })
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
        let held: Vec<_> = (0..3).map(|_| a.accept(x).unwrap()).collect();
        assert_eq!(a.accept(x).unwrap_err(), Refusal::Unidentified);
        let y1 = a.accept(y).unwrap();
        let _y2 = a.accept(y).unwrap();
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
}
