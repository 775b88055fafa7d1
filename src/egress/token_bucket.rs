//! A token bucket: `rate` tokens per second, at most `burst` stored — the shape of every
//! rate in the proxy (new connections, DNS queries, bandwidth, a source's accepts, the
//! console's throttle). A pure function of time: `check(now, n)` takes `now` in nanoseconds
//! since any fixed origin, so tests pass timestamps instead of sleeping; a clock that goes
//! backwards is treated as no time passing.

use std::time::Duration;

/// The verdict of a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admit {
    /// Now.
    Admit,
    /// Not now: this much later.
    DelayFor(Duration),
}

/// A token bucket: `rate` tokens per second, at most `burst` stored.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    /// Nanoseconds of the last refill.
    last: u64,
}

impl TokenBucket {
    /// A full bucket at time `now`.
    pub fn new(rate: f64, burst: f64, now: u64) -> Self {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Change the numbers, keeping the current level (capped at the new burst).
    pub fn reconfigure(&mut self, rate: f64, burst: f64) {
        self.rate = rate;
        self.burst = burst;
        self.tokens = self.tokens.min(burst);
    }

    fn refill(&mut self, now: u64) {
        if now > self.last {
            let elapsed = (now - self.last) as f64 / 1e9;
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
            self.last = now;
        }
    }

    /// Take `n` tokens if there are that many; otherwise say how long until there would be.
    pub fn check(&mut self, now: u64, n: f64) -> Admit {
        self.refill(now);
        if self.tokens >= n {
            self.tokens -= n;
            return Admit::Admit;
        }
        Admit::DelayFor(self.wait_for(n - self.tokens))
    }

    /// Whether `n` tokens are there at `now`, taking none; otherwise how long until they are.
    pub fn has(&mut self, now: u64, n: f64) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= n {
            Ok(())
        } else {
            Err(self.wait_for(n - self.tokens))
        }
    }

    /// Whether the bucket is (or will have refilled to) full at `now`.
    pub fn is_full_at(&self, now: u64) -> bool {
        let elapsed = now.saturating_sub(self.last) as f64 / 1e9;
        self.tokens + elapsed * self.rate >= self.burst
    }

    /// Take `n` tokens now, going into debt if needed, and return how long the caller must
    /// wait before using them (shaping: every byte is delivered, later).
    pub fn reserve(&mut self, now: u64, n: f64) -> Duration {
        self.refill(now);
        self.tokens -= n;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            self.wait_for(-self.tokens)
        }
    }

    fn wait_for(&self, missing: f64) -> Duration {
        if self.rate <= 0.0 || !self.rate.is_finite() {
            return Duration::from_secs(3600);
        }
        Duration::from_secs_f64((missing / self.rate).min(3600.0))
    }
}
