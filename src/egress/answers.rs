//! Answers the DNS listener gave, remembered per sandbox as address → names until the
//! answer's TTL plus a grace period (`dns.answer_grace_s`): a transparent connection that carries no name (SSH,
//! Postgres — mode `tcp`) to an address the sandbox obtained for `github.com` is then decided
//! as `github.com:port` by name rules.
//!
//! Only what the proxy itself answered is here, so a sandbox cannot plant a mapping: it can
//! only ask for names its policy already lets it resolve. Bounded, and accounted per sandbox:
//! one sandbox holds at most [`PER_SANDBOX`] addresses (past that its own expired entries are
//! swept, at most once a second, and then its new answers are not remembered — a connection
//! without a remembered name falls back to address rules: closed, not open), so one sandbox
//! flooding the listener never evicts another's answers or slows its queries; all together
//! hold at most [`MAX_ENTRIES`], and when that is full the sandbox holding the most gives up
//! its soonest-expiring entry to one holding less. [`DnsMemory::sweep`] (every few seconds)
//! drops what expired and gives the memory back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::policy::sandbox_id::SandboxId;

/// Addresses remembered across all sandboxes.
pub const MAX_ENTRIES: usize = 262_144;
/// Addresses remembered for one sandbox.
pub const PER_SANDBOX: usize = 16_384;
/// Names remembered for one address of one sandbox (CDN addresses serve many names).
pub const NAMES_PER_ADDRESS: usize = 8;
/// The least time between two sweeps of a full sandbox's answers on the query path.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The names one sandbox was given for one address, each with when it expires.
type Names = Vec<(Arc<str>, Instant)>;

/// One sandbox's remembered answers.
#[derive(Debug)]
struct Share {
    map: HashMap<IpAddr, Names>,
    swept: Instant,
}

impl Share {
    /// Drop what expired; the number of addresses dropped.
    fn sweep(&mut self, now: Instant) -> usize {
        let before = self.map.len();
        self.map.retain(|_, names| {
            names.retain(|(_, t)| *t > now);
            !names.is_empty()
        });
        if self.map.capacity() > 64 && self.map.capacity() > 4 * self.map.len() {
            self.map.shrink_to_fit();
        }
        self.swept = now;
        before - self.map.len()
    }

    /// Give up the entry that expires first.
    fn evict_one(&mut self) -> bool {
        let oldest = self
            .map
            .iter()
            .min_by_key(|(_, names)| names.iter().map(|(_, t)| *t).max())
            .map(|(ip, _)| *ip);
        oldest.is_some_and(|ip| self.map.remove(&ip).is_some())
    }
}

#[derive(Debug, Default)]
struct Inner {
    shares: HashMap<SandboxId, Share>,
    /// Addresses remembered in all shares.
    total: usize,
}

/// The remembered answers.
#[derive(Debug, Default)]
pub struct DnsMemory {
    inner: Mutex<Inner>,
}

impl DnsMemory {
    /// Remember that `sandbox` was told `name` has `addrs`, for `keep` (the answer's TTL plus
    /// the grace).
    pub fn remember(&self, sandbox: &SandboxId, name: &str, addrs: &[IpAddr], keep: Duration) {
        if addrs.is_empty() {
            return;
        }
        let now = Instant::now();
        let until = now + keep;
        let name: Arc<str> = name.into();
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let inner = &mut *inner;
        for ip in addrs {
            let ip = ip.to_canonical();
            let known = inner
                .shares
                .get(sandbox)
                .is_some_and(|s| s.map.contains_key(&ip));
            if !known && !inner.room_for(sandbox, now) {
                continue;
            }
            let share = inner
                .shares
                .entry(sandbox.clone())
                .or_insert_with(|| Share {
                    map: HashMap::new(),
                    swept: now,
                });
            let names = share.map.entry(ip).or_default();
            if names.is_empty() {
                inner.total += 1;
            }
            names.retain(|(n, t)| *t > now && *n != name);
            if names.len() >= NAMES_PER_ADDRESS {
                // Drop the one that expires first.
                if let Some(i) = (0..names.len()).min_by_key(|i| names[*i].1) {
                    names.swap_remove(i);
                }
            }
            names.push((name.clone(), until));
        }
    }

    /// The names `sandbox` was given for `ip` that have not expired, newest first.
    pub fn names(&self, sandbox: &SandboxId, ip: IpAddr) -> Vec<Arc<str>> {
        let now = Instant::now();
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        let mut found: Names = inner
            .shares
            .get(sandbox)
            .and_then(|s| s.map.get(&ip.to_canonical()))
            .map(|v| v.iter().filter(|(_, t)| *t > now).cloned().collect())
            .unwrap_or_default();
        found.sort_by_key(|e| std::cmp::Reverse(e.1));
        found.into_iter().map(|(n, _)| n).collect()
    }

    /// Drop every expired answer (run every few seconds); how many addresses were dropped.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let Ok(mut inner) = self.inner.lock() else {
            return 0;
        };
        let inner = &mut *inner;
        let mut dropped = 0;
        for share in inner.shares.values_mut() {
            dropped += share.sweep(now);
        }
        inner.total -= dropped.min(inner.total);
        inner.shares.retain(|_, s| !s.map.is_empty());
        if inner.shares.capacity() > 64 && inner.shares.capacity() > 4 * inner.shares.len() {
            inner.shares.shrink_to_fit();
        }
        dropped
    }

    /// Addresses remembered (in all sandboxes, and for `sandbox`).
    pub fn len(&self, sandbox: &SandboxId) -> (usize, usize) {
        self.inner.lock().map_or((0, 0), |i| {
            (i.total, i.shares.get(sandbox).map_or(0, |s| s.map.len()))
        })
    }
}

impl DnsMemory {
    /// Addresses remembered per sandbox (for the metrics).
    pub fn shares(&self) -> Vec<(SandboxId, usize)> {
        self.inner.lock().map_or_else(
            |_| Vec::new(),
            |i| {
                i.shares
                    .iter()
                    .map(|(id, s)| (id.clone(), s.map.len()))
                    .collect()
            },
        )
    }
}

impl Inner {
    /// Whether `sandbox` may remember one more address: its share has room (after sweeping
    /// its expired ones, at most once a second), and so does the whole (else the sandbox
    /// holding the most gives up one entry, when it holds more than this one).
    fn room_for(&mut self, sandbox: &SandboxId, now: Instant) -> bool {
        let mine = self.shares.get(sandbox).map_or(0, |s| s.map.len());
        if mine >= PER_SANDBOX {
            let Some(share) = self.shares.get_mut(sandbox) else {
                return false;
            };
            if now.duration_since(share.swept) < SWEEP_EVERY {
                return false;
            }
            let dropped = share.sweep(now);
            self.total -= dropped.min(self.total);
            if share.map.len() >= PER_SANDBOX {
                return false;
            }
        }
        if self.total < MAX_ENTRIES {
            return true;
        }
        let mine = self.shares.get(sandbox).map_or(0, |s| s.map.len());
        let heaviest = self
            .shares
            .iter_mut()
            .max_by_key(|(_, s)| s.map.len())
            .filter(|(_, s)| s.map.len() > mine + 1);
        let evicted = heaviest.is_some_and(|(_, share)| share.evict_one());
        if evicted {
            self.total -= 1;
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        SandboxId::new(s).unwrap()
    }

    #[test]
    fn per_sandbox_and_per_address() {
        let m = DnsMemory::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        m.remember(&id("s1"), "github.com", &[a], Duration::from_secs(30));
        assert_eq!(m.names(&id("s1"), a), vec![Arc::<str>::from("github.com")]);
        assert!(
            m.names(&id("s2"), a).is_empty(),
            "another sandbox was not told"
        );
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(
            m.names(&id("s1"), mapped).len(),
            1,
            "mapped form is the same"
        );
        // A second name for the same address is kept too; repeating one does not duplicate.
        m.remember(&id("s1"), "gist.github.com", &[a], Duration::from_secs(30));
        m.remember(&id("s1"), "github.com", &[a], Duration::from_secs(30));
        assert_eq!(m.names(&id("s1"), a).len(), 2);
    }

    #[test]
    fn bounded_names_per_address() {
        let m = DnsMemory::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        for i in 0..(NAMES_PER_ADDRESS + 5) {
            m.remember(
                &id("s"),
                &format!("n{i}.test"),
                &[a],
                Duration::from_secs(i as u64),
            );
        }
        let names = m.names(&id("s"), a);
        assert_eq!(names.len(), NAMES_PER_ADDRESS);
        assert_eq!(&*names[0], &format!("n{}.test", NAMES_PER_ADDRESS + 4));
    }

    /// One sandbox flooding the listener fills its own share only: another sandbox's new
    /// answers are still remembered, and once the answers expire a sweep gives the memory
    /// back. (Before, one pool of 262,144 addresses was shared: a flood filled it, and every
    /// query then walked it.)
    #[test]
    fn one_sandbox_cannot_crowd_out_another_and_memory_comes_back() {
        let m = DnsMemory::default();
        let flood = id("flood");
        for i in 0..(PER_SANDBOX as u32 + 1000) {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            m.remember(&flood, &format!("n{i}.test"), &[ip], Duration::ZERO);
        }
        assert_eq!(m.len(&flood).1, PER_SANDBOX);
        let other = id("other");
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        m.remember(&other, "github.com", &[a], Duration::from_secs(30));
        assert_eq!(m.names(&other, a), vec![Arc::<str>::from("github.com")]);
        // Expired: swept, and the memory is given back.
        {
            let mut inner = m.inner.lock().unwrap();
            let past = Instant::now() - Duration::from_secs(1);
            for names in inner.shares.get_mut(&flood).unwrap().map.values_mut() {
                for (_, t) in names.iter_mut() {
                    *t = past;
                }
            }
        }
        m.sweep();
        assert_eq!(m.len(&flood), (1, 0));
        assert!(!m.inner.lock().unwrap().shares.contains_key(&flood));
        assert_eq!(m.names(&other, a).len(), 1);
    }
}
