//! How fast the console lets anyone try to sign in: wrong tokens per client address (a burst
//! of [`FAILURES_BURST`], then one a second) and sign-ins per user (a burst of
//! [`SIGN_INS_BURST`], then one every [`SIGN_IN_EVERY_S`] seconds). Past either, the sign-in is
//! refused `429` with `Retry-After` before any credential is compared, as the proxy's own
//! authentication is (`admission.auth_failures_per_second_per_source`). Both tables are
//! bounded: entries whose bucket is full again are forgotten first, and past
//! [`MAX_TRACKED`] an unknown key is refused (a scan from many addresses cannot grow it).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::egress::limits::{Admit, TokenBucket};

/// Wrong tokens one address may send at once.
pub const FAILURES_BURST: f64 = 10.0;
/// Wrong tokens per second one address may send after its burst.
pub const FAILURES_PER_SECOND: f64 = 1.0;
/// Sign-ins one user may make at once.
pub const SIGN_INS_BURST: f64 = 20.0;
/// Seconds between sign-ins of one user after the burst.
pub const SIGN_IN_EVERY_S: f64 = 10.0;
/// Keys each table keeps at most.
pub const MAX_TRACKED: usize = 4096;

/// A table of buckets by key.
struct Buckets<K> {
    rate: f64,
    burst: f64,
    start: Instant,
    map: Mutex<HashMap<K, TokenBucket>>,
}

impl<K: Eq + Hash + Clone> Buckets<K> {
    fn new(rate: f64, burst: f64) -> Self {
        Buckets {
            rate,
            burst,
            start: Instant::now(),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// `Err(wait)` when `key` has nothing left, taking nothing.
    fn left(&self, key: &K) -> Result<(), Duration> {
        let now = self.now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = map.get_mut(key) {
            return b.has(now, 1.0);
        }
        if map.len() >= MAX_TRACKED {
            map.retain(|_, b| !b.is_full_at(now));
        }
        if map.len() >= MAX_TRACKED {
            return Err(Duration::from_secs(1));
        }
        Ok(())
    }

    /// Take one from `key`'s bucket.
    fn spend(&self, key: &K) {
        let now = self.now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(key) && map.len() >= MAX_TRACKED {
            map.retain(|_, b| !b.is_full_at(now));
        }
        if map.len() < MAX_TRACKED || map.contains_key(key) {
            let b = map
                .entry(key.clone())
                .or_insert_with(|| TokenBucket::new(self.rate, self.burst, now));
            // An empty bucket stays empty: `left` refuses until it refills.
            let _: Admit = b.check(now, 1.0);
        }
    }
}

/// The console's sign-in limits.
pub struct SignInLimits {
    failures: Buckets<IpAddr>,
    sign_ins: Buckets<String>,
}

impl Default for SignInLimits {
    fn default() -> Self {
        SignInLimits {
            failures: Buckets::new(FAILURES_PER_SECOND, FAILURES_BURST),
            sign_ins: Buckets::new(1.0 / SIGN_IN_EVERY_S, SIGN_INS_BURST),
        }
    }
}

impl SignInLimits {
    /// `Err(wait)` when `from` has sent too many wrong tokens lately.
    pub fn may_try(&self, from: IpAddr) -> Result<(), Duration> {
        self.failures.left(&from)
    }

    /// `from` sent a wrong token.
    pub fn failed(&self, from: IpAddr) {
        self.failures.spend(&from);
    }

    /// Take a sign-in of `user`: `Err(wait)` when the user has signed in too often lately.
    pub fn sign_in(&self, user: &str) -> Result<(), Duration> {
        let key = user.to_string();
        self.sign_ins.left(&key)?;
        self.sign_ins.spend(&key);
        Ok(())
    }
}

/// `Retry-After`'s whole seconds for `wait` (at least 1).
pub fn retry_after(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eleventh_wrong_token_of_an_address_waits_and_others_do_not() {
        let l = SignInLimits::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        for _ in 0..10 {
            assert!(l.may_try(a).is_ok());
            l.failed(a);
        }
        let wait = l.may_try(a).unwrap_err();
        assert!(retry_after(wait) >= 1);
        assert!(l.may_try(b).is_ok(), "another address is not held up");
    }

    #[test]
    fn a_users_sign_ins_are_bounded_and_others_are_not() {
        let l = SignInLimits::default();
        for _ in 0..20 {
            assert!(l.sign_in("vera").is_ok());
        }
        assert!(l.sign_in("vera").is_err());
        assert!(l.sign_in("alice").is_ok());
    }

    #[test]
    fn the_table_is_bounded() {
        let l = SignInLimits::default();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(i));
            l.failed(ip);
        }
        assert!(l.failures.map.lock().unwrap().len() <= MAX_TRACKED);
    }
}
