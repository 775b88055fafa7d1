//! Per-sandbox limits (proxy-side `limits:` of a binding, defaults under `defaults.limits`):
//! concurrent connections, new-connection rate (token bucket with burst), and bandwidth in each
//! direction (the same bucket, spent by bytes: shaping delays, never drops or corrupts).
//!
//! The bucket is a pure function of time: `check(now, n)` with `now` in nanoseconds since any
//! fixed origin, so tests pass timestamps instead of sleeping. A clock that goes backwards is
//! treated as no time passing. Each sandbox's state is its own, so one sandbox at its limit
//! never slows another; the state survives reloads (only the numbers change).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::config::{DestinationQuota, Limits};
use crate::egress::quota::per_process::ProcessMeters;
use crate::egress::quota::{destination_meters, DayCount, Meter, Spent};
use crate::policy::process::Process as Proc;

pub use super::token_bucket::{Admit, TokenBucket};

/// Which limit refused a connection (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// `max_connections` reached.
    Connections,
    /// `connections_per_second` / `burst` exceeded; retry after the delay.
    Rate(Duration),
    /// A daily quota is spent (until midnight UTC).
    Quota(Spent),
}

impl Exceeded {
    /// The metric label of the refusal.
    pub fn label(self) -> &'static str {
        match self {
            Exceeded::Connections => "connections",
            Exceeded::Rate(_) => "rate",
            Exceeded::Quota(_) => "quota",
        }
    }
}

/// Bandwidth buckets hold this much time's worth of bytes (and at least 16 KiB).
const BANDWIDTH_BURST_SECONDS: f64 = 0.1;

/// One sandbox's live limiter state.
#[derive(Debug)]
pub struct SandboxLimiter {
    /// The registry's clock origin (shaping asks for "now" without a caller-supplied time).
    origin: Instant,
    limits: Mutex<Limits>,
    active: AtomicU32,
    rate: Mutex<TokenBucket>,
    /// `dns_queries_per_second`, with one second's worth of burst.
    dns: Mutex<TokenBucket>,
    up: Mutex<Option<TokenBucket>>,
    down: Mutex<Option<TokenBucket>>,
    /// The daily quotas' counts.
    meter: Arc<Meter>,
    /// The `per_destination` entries and their counts.
    destinations: Mutex<Vec<(DestinationQuota, Arc<Meter>)>>,
    /// Whether `destinations` has any (read without the lock on every exchange).
    has_destinations: std::sync::atomic::AtomicBool,
    /// `per_process`: a meter per process of the sandbox.
    pub(crate) processes: ProcessMeters,
}

fn bandwidth_bucket(bps: Option<u64>, now: u64) -> Option<TokenBucket> {
    bps.map(|b| {
        let rate = b as f64;
        TokenBucket::new(rate, (rate * BANDWIDTH_BURST_SECONDS).max(16_384.0), now)
    })
}

fn dns_bucket(qps: f64, now: u64) -> TokenBucket {
    TokenBucket::new(qps, qps.max(1.0), now)
}

impl SandboxLimiter {
    fn new(limits: &Limits, origin: Instant, now: u64) -> Self {
        SandboxLimiter {
            origin,
            rate: Mutex::new(TokenBucket::new(
                limits.connections_per_second,
                f64::from(limits.burst),
                now,
            )),
            dns: Mutex::new(dns_bucket(limits.dns_queries_per_second, now)),
            up: Mutex::new(bandwidth_bucket(limits.bandwidth_up_bps, now)),
            down: Mutex::new(bandwidth_bucket(limits.bandwidth_down_bps, now)),
            limits: Mutex::new(limits.clone()),
            active: AtomicU32::new(0),
            meter: {
                let m = Meter::default();
                m.configure(limits.bytes_per_day, limits.requests_per_day);
                m.budget(limits.tokens_per_day, limits.cost_per_day);
                Arc::new(m)
            },
            destinations: Mutex::new(destination_meters(&limits.per_destination, &[])),
            has_destinations: (!limits.per_destination.is_empty()).into(),
            processes: ProcessMeters::new(limits.per_process),
        }
    }

    /// Whether the sandbox has any daily quota (most have none: their exchanges skip all this).
    pub fn has_quotas(&self) -> bool {
        self.meter.metered()
            || self.meter.budgeted()
            || self.has_destination_quotas()
            || self.processes.configured()
    }

    /// Whether any `per_destination` quota is set.
    pub fn has_destination_quotas(&self) -> bool {
        self.has_destinations.load(Ordering::Relaxed)
    }

    /// The meters an exchange of `process` with `host` counts into: the sandbox's (when it
    /// has a quota), those of the `per_destination` entries that match, and its process's.
    pub fn meters_for(&self, host: &str, process: Option<&Proc>) -> Vec<Arc<Meter>> {
        let mut out: Vec<Arc<Meter>> = self.processes.meters(process);
        if self.meter.metered() || self.meter.budgeted() {
            out.push(self.meter.clone());
        }
        if let Ok(d) = self.destinations.lock() {
            out.extend(
                d.iter()
                    .filter(|(q, _)| q.matches(host))
                    .map(|(_, m)| m.clone()),
            );
        }
        out
    }

    /// The `per_destination` meter whose quota refuses an exchange with `host`, if one does.
    pub fn destination_spent(&self, host: &str) -> Option<(Arc<Meter>, Spent)> {
        let d = self.destinations.lock().ok()?;
        d.iter()
            .filter(|(q, _)| q.matches(host))
            .find_map(|(_, m)| m.spent().map(|s| (m.clone(), s)))
    }

    /// Every meter with its key: the sandbox id, or `id@host` for a `per_destination` one.
    fn keyed_meters(&self, id: &str) -> Vec<(String, Arc<Meter>)> {
        let mut out = vec![(id.to_string(), self.meter.clone())];
        if let Ok(d) = self.destinations.lock() {
            out.extend(
                d.iter()
                    .map(|(q, m)| (format!("{id}@{}", q.host), m.clone())),
            );
        }
        let keyed = self.processes.keyed();
        out.extend(keyed.map(|(k, m)| (format!("{id}~{k}"), m)));
        out
    }

    /// The sandbox's daily counts (the relays count into it; admission reads it).
    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    fn reconfigure(&self, limits: &Limits, now: u64) {
        let Ok(mut current) = self.limits.lock() else {
            return;
        };
        if *current == *limits {
            return;
        }
        self.meter
            .configure(limits.bytes_per_day, limits.requests_per_day);
        self.meter
            .budget(limits.tokens_per_day, limits.cost_per_day);
        if let Ok(mut d) = self.destinations.lock() {
            let next = destination_meters(&limits.per_destination, &d);
            *d = next;
        }
        self.has_destinations
            .store(!limits.per_destination.is_empty(), Ordering::Relaxed);
        self.processes.configure(limits.per_process);
        if let Ok(mut r) = self.rate.lock() {
            r.reconfigure(limits.connections_per_second, f64::from(limits.burst));
        }
        if let Ok(mut d) = self.dns.lock() {
            let qps = limits.dns_queries_per_second;
            d.reconfigure(qps, qps.max(1.0));
        }
        for (slot, bps, old) in [
            (&self.up, limits.bandwidth_up_bps, current.bandwidth_up_bps),
            (
                &self.down,
                limits.bandwidth_down_bps,
                current.bandwidth_down_bps,
            ),
        ] {
            if bps != old {
                if let Ok(mut b) = slot.lock() {
                    *b = bandwidth_bucket(bps, now);
                }
            }
        }
        *current = limits.clone();
    }

    /// Admit a new connection at `now`: a slot under `max_connections` and a rate token.
    pub fn take_slot(self: &Arc<Self>, now: u64) -> Result<ConnectionSlot, Exceeded> {
        if let Some(spent) = self.meter.spent() {
            return Err(Exceeded::Quota(spent));
        }
        let max = self.limits.lock().map(|l| l.max_connections).unwrap_or(0);
        let prev = self.active.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return Err(Exceeded::Connections);
        }
        let verdict = self
            .rate
            .lock()
            .map(|mut b| b.check(now, 1.0))
            .unwrap_or(Admit::DelayFor(Duration::from_secs(1)));
        if let Admit::DelayFor(d) = verdict {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return Err(Exceeded::Rate(d));
        }
        Ok(ConnectionSlot(self.clone(), None))
    }

    /// Take a DNS query token at `now`, or say how long until one is there.
    pub fn admit_query(&self, now: u64) -> Result<(), Duration> {
        match self.dns.lock() {
            Ok(mut b) => match b.check(now, 1.0) {
                Admit::Admit => Ok(()),
                Admit::DelayFor(d) => Err(d),
            },
            Err(_) => Err(Duration::from_secs(1)),
        }
    }

    /// Open connections of this sandbox.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    /// Shaping delay for `n` bytes in a direction (zero when unlimited).
    pub fn shape(&self, up: bool, now: u64, n: usize) -> Duration {
        let slot = if up { &self.up } else { &self.down };
        match slot.lock() {
            Ok(mut b) => b
                .as_mut()
                .map(|b| b.reserve(now, n as f64))
                .unwrap_or(Duration::ZERO),
            Err(_) => Duration::ZERO,
        }
    }

    /// Shaping delay for `n` bytes, now.
    pub fn shape_now(&self, up: bool, n: usize) -> Duration {
        self.shape(up, self.origin.elapsed().as_nanos() as u64, n)
    }

    /// Whether any bandwidth limit is set (tunnels without one skip the shaping path).
    pub fn shapes(&self) -> bool {
        self.limits
            .lock()
            .map(|l| l.bandwidth_up_bps.is_some() || l.bandwidth_down_bps.is_some())
            .unwrap_or(false)
    }
}

/// A connection's place under its sandbox's `max_connections`; released on drop.
#[derive(Debug)]
pub struct ConnectionSlot(
    Arc<SandboxLimiter>,
    /// A place under the global `max_connections` this exchange holds too (an HTTP/2
    /// stream's: its connection holds one of its own).
    Option<tokio::sync::OwnedSemaphorePermit>,
);

impl ConnectionSlot {
    /// The sandbox's limiter.
    pub fn limiter(&self) -> &Arc<SandboxLimiter> {
        &self.0
    }

    /// Hold `place` (under the global cap) as long as this slot.
    pub fn hold(&mut self, place: tokio::sync::OwnedSemaphorePermit) {
        self.1 = Some(place);
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every sandbox's limiter, by id; survives policy reloads.
#[derive(Debug)]
pub struct Limiters {
    origin: Instant,
    by_id: RwLock<HashMap<String, Arc<SandboxLimiter>>>,
    /// Daily counts persisted before a restart, for sandboxes not seen since.
    restored: Mutex<HashMap<String, DayCount>>,
}

impl Default for Limiters {
    fn default() -> Self {
        Limiters {
            origin: Instant::now(),
            by_id: RwLock::new(HashMap::new()),
            restored: Mutex::new(HashMap::new()),
        }
    }
}

impl Limiters {
    /// Nanoseconds since this registry was made (the limiter clock).
    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// The limiter of sandbox `id` with `limits` in force (created, or updated after a reload).
    pub fn get(&self, id: &str, limits: &Limits) -> Arc<SandboxLimiter> {
        let now = self.now();
        if let Ok(map) = self.by_id.read() {
            if let Some(l) = map.get(id) {
                l.reconfigure(limits, now);
                return l.clone();
            }
        }
        match self.by_id.write() {
            Ok(mut map) => map
                .entry(id.to_string())
                .or_insert_with(|| {
                    let l = SandboxLimiter::new(limits, self.origin, now);
                    if let Ok(mut r) = self.restored.lock() {
                        for (key, m) in l.keyed_meters(id) {
                            if let Some(c) = r.remove(&key) {
                                m.restore(c);
                            }
                        }
                    }
                    Arc::new(l)
                })
                .clone(),
            Err(_) => Arc::new(SandboxLimiter::new(limits, self.origin, now)),
        }
    }

    /// Counts persisted before a restart: given to each sandbox's meter when it is first seen.
    pub fn restore(&self, counts: HashMap<String, DayCount>) {
        let Ok(map) = self.by_id.read() else { return };
        let mut rest = HashMap::new();
        for (key, c) in counts {
            match self.keyed(&map, &key) {
                Some(m) => m.restore(c),
                None => {
                    rest.insert(key, c);
                }
            }
        }
        if let Ok(mut r) = self.restored.lock() {
            r.extend(rest);
        }
    }

    /// Every meter that counted anything today, by key (the sandbox id, or `id@host` for a
    /// `per_destination` entry).
    pub fn counts(&self) -> Vec<(String, Arc<Meter>)> {
        let Ok(map) = self.by_id.read() else {
            return Vec::new();
        };
        map.iter()
            .flat_map(|(id, l)| l.keyed_meters(id))
            .filter(|(_, m)| {
                let c = m.mine();
                c.bytes != 0 || c.requests != 0 || c.tokens != 0 || c.cost != 0
            })
            .collect()
    }

    /// Every meter whose requests quota is served from a fleet share, by key (see
    /// [`Limiters::counts`]).
    pub fn shared_meters(&self) -> Vec<(String, Arc<Meter>)> {
        let Ok(map) = self.by_id.read() else {
            return Vec::new();
        };
        map.iter()
            .flat_map(|(id, l)| l.keyed_meters(id))
            .filter(|(_, m)| m.shared())
            .collect()
    }

    /// The meter of `key` (see [`Limiters::counts`]) of a sandbox seen since the start.
    pub fn meter_of(&self, key: &str) -> Option<Arc<Meter>> {
        let map = self.by_id.read().ok()?;
        self.keyed(&map, key)
    }

    fn keyed(&self, map: &HashMap<String, Arc<SandboxLimiter>>, key: &str) -> Option<Arc<Meter>> {
        if let Some((id, process)) = key.split_once('~') {
            return map.get(id)?.processes.by_key(process);
        }
        let (id, host) = match key.split_once('@') {
            Some((id, host)) => (id, Some(host)),
            None => (key, None),
        };
        let l = map.get(id)?;
        match host {
            None => Some(l.meter.clone()),
            Some(h) => l
                .destinations
                .lock()
                .ok()?
                .iter()
                .find(|(q, _)| q.host == h)
                .map(|(_, m)| m.clone()),
        }
    }

    /// Counts restored and not yet given to a meter (kept when persisting again).
    pub fn pending(&self) -> HashMap<String, DayCount> {
        self.restored.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn limits(max: u32, rate: f64, burst: u32) -> Limits {
        Limits {
            max_connections: max,
            connections_per_second: rate,
            burst,
            socket_buffer_bytes: None,
            ..crate::config::defaults::LIMITS
        }
    }

    #[test]
    fn burst_then_refill() {
        let mut b = TokenBucket::new(5.0, 5.0, 0);
        for _ in 0..5 {
            assert_eq!(b.check(0, 1.0), Admit::Admit);
        }
        assert_eq!(b.check(0, 1.0), Admit::DelayFor(Duration::from_millis(200)));
        // 100 ms later half a token is there: still 100 ms to wait.
        assert_eq!(
            b.check(S / 10, 1.0),
            Admit::DelayFor(Duration::from_millis(100))
        );
        assert_eq!(b.check(S / 5, 1.0), Admit::Admit);
    }

    #[test]
    fn long_idle_caps_at_burst() {
        let mut b = TokenBucket::new(5.0, 5.0, 0);
        for _ in 0..5 {
            b.check(0, 1.0);
        }
        let later = 3600 * S;
        for _ in 0..5 {
            assert_eq!(b.check(later, 1.0), Admit::Admit);
        }
        assert!(matches!(b.check(later, 1.0), Admit::DelayFor(_)));
    }

    #[test]
    fn clock_going_backwards_adds_nothing() {
        let mut b = TokenBucket::new(1.0, 1.0, 10 * S);
        assert_eq!(b.check(10 * S, 1.0), Admit::Admit);
        assert!(matches!(b.check(5 * S, 1.0), Admit::DelayFor(_)));
        // And the bucket did not move its clock back: one second after 10 s refills it.
        assert_eq!(b.check(11 * S, 1.0), Admit::Admit);
    }

    #[test]
    fn reserve_shapes_by_debt() {
        let mut b = TokenBucket::new(1000.0, 100.0, 0);
        assert_eq!(b.reserve(0, 100.0), Duration::ZERO);
        assert_eq!(b.reserve(0, 500.0), Duration::from_millis(500));
        // The debt is paid by time: after 500 ms the next 100 bytes wait another 100 ms.
        assert_eq!(b.reserve(S / 2, 100.0), Duration::from_millis(100));
    }

    #[test]
    fn connections_are_counted_and_released() {
        let reg = Limiters::default();
        let l = reg.get("a", &limits(2, 1000.0, 1000));
        let a = l.take_slot(0).unwrap();
        let _b = l.take_slot(0).unwrap();
        assert_eq!(l.take_slot(0).unwrap_err(), Exceeded::Connections);
        drop(a);
        let c = l.take_slot(0).unwrap();
        assert_eq!(l.active(), 2);
        drop(c);
        assert_eq!(l.active(), 1);
    }

    #[test]
    fn rate_refusals_and_isolation() {
        let reg = Limiters::default();
        let a = reg.get("a", &limits(100, 5.0, 5));
        let b = reg.get("b", &limits(100, 5.0, 5));
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(a.take_slot(0).unwrap());
        }
        assert!(matches!(a.take_slot(0), Err(Exceeded::Rate(_))));
        assert!(b.take_slot(0).is_ok(), "another sandbox is not affected");
        // Reconfiguring keeps the same state object and the open connections.
        let a2 = reg.get("a", &limits(3, 5.0, 5));
        assert!(Arc::ptr_eq(&a, &a2));
        assert_eq!(a2.active(), 5);
        assert_eq!(a2.take_slot(10 * S).unwrap_err(), Exceeded::Connections);
    }
}
