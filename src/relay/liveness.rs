//! Is this exchange still alive? One tracker for every relay — CONNECT and transparent
//! tunnels, forwarded HTTP, terminated (brokered) tunnels, DNS over TCP: bytes moved in each
//! direction (into the record's [`Counters`]) and when anything last moved. [`Liveness::run`]
//! races a piece of work against the idle deadline and a stop future (revocation, shutdown:
//! [`crate::relay::watch::Watch::stopped`]), so no relay can forget either.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

use crate::audit::outcome::Close;
use crate::audit::Counters;
use crate::egress::limits::SandboxLimiter;
use crate::egress::quota::{share, Meter, Spent};
use crate::relay::tunnel::Relayed;

/// Bytes moved and the idle deadline of one exchange.
#[derive(Debug)]
pub struct Liveness {
    origin: Instant,
    idle: Duration,
    counters: Arc<Counters>,
    /// Nanoseconds after `origin` until which the exchange counts as active.
    active_until: AtomicU64,
    /// The daily quotas the exchange counts into (the sandbox's, its destination's; none for
    /// most): bytes count into each, and the exchange is cut (`Close::Limit`) when one's day
    /// reaches its quota.
    meters: Box<[Arc<Meter>]>,
    /// Set when this exchange's bytes carried the day's count to the quota.
    cut: std::sync::atomic::AtomicBool,
    /// The `once` grant that allowed the exchange: it allows one request, wherever the proxy
    /// frames requests (the first is reserved at admission, every later one is refused).
    once: Option<Arc<str>>,
    /// Requests reserved so far.
    requests: std::sync::atomic::AtomicU32,
}

impl Liveness {
    /// An exchange that ends after `idle` with nothing moving.
    pub fn new(idle: Duration) -> Self {
        Liveness {
            origin: Instant::now(),
            idle,
            counters: Arc::new(Counters::default()),
            active_until: AtomicU64::new(0),
            meters: Box::new([]),
            cut: std::sync::atomic::AtomicBool::new(false),
            once: None,
            requests: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The exchange was allowed by `once` grant (its id): one request, not one per request
    /// the connection carries.
    pub fn once(mut self, grant: Option<Arc<str>>) -> Self {
        self.once = grant;
        self
    }

    /// Count into `limiter`'s daily quotas that apply to an exchange of `process` with `host`
    /// (nothing to do when the sandbox has none).
    pub fn metered(
        mut self,
        limiter: &SandboxLimiter,
        host: &dyn std::fmt::Display,
        process: Option<&crate::policy::process::Process>,
    ) -> Self {
        if limiter.has_quotas() {
            let meters = limiter.meters_for(&host.to_string(), process);
            self.meters = meters.into_boxed_slice();
        }
        self
    }

    /// Reserve one request against every daily quota of the exchange (the sandbox's and its
    /// destination's), checked and counted at once — the one place a request is counted
    /// against a quota — and against the `once` grant that allowed the exchange, if one did
    /// (its second request is refused). `Err` with the refusal when one refuses (nothing
    /// counted).
    pub fn reserve(&self) -> Result<(), crate::pipeline::Refusal> {
        self.try_reserve().map_err(|(r, _)| r)
    }

    /// [`Liveness::reserve`], waiting (up to [`share::LEASE_WAIT`]) while this replica leases
    /// a share of a fleet's quota ([`crate::egress::quota::share`]) instead of refusing.
    pub async fn reserve_waiting(&self) -> Result<(), crate::pipeline::Refusal> {
        let deadline = tokio::time::Instant::now() + share::LEASE_WAIT;
        loop {
            let (refusal, meter) = match self.try_reserve() {
                Ok(()) => return Ok(()),
                Err((r, None)) => return Err(r),
                Err((r, Some(i))) => (r, &self.meters[i]),
            };
            if !share::wait_grown(meter, deadline).await {
                return Err(refusal);
            }
        }
    }

    /// `Err` with the refusal and, when a meter only waits for its fleet share, its index.
    fn try_reserve(&self) -> Result<(), (crate::pipeline::Refusal, Option<usize>)> {
        if let Some(id) = &self.once {
            if self.requests.fetch_add(1, Ordering::AcqRel) >= 1 {
                let r = crate::pipeline::Refusal::new(
                    crate::policy::reason::Reason::NoRuleMatched,
                    format!("grant {id} was for one request, and it was used"),
                );
                return Err((r, None));
            }
        }
        for (i, m) in self.meters.iter().enumerate() {
            if let Err(spent) = m.reserve() {
                for done in &self.meters[..i] {
                    done.release();
                }
                if self.once.is_some() {
                    // Not sent: the `once` grant stays for the request tried again.
                    self.requests.fetch_sub(1, Ordering::AcqRel);
                }
                let r = crate::pipeline::Refusal::new(
                    crate::policy::reason::Reason::QuotaExceeded,
                    m.describe(spent),
                );
                return Err((r, matches!(spent, Spent::Leasing(_)).then_some(i)));
            }
        }
        Ok(())
    }

    /// Whether a token or cost budget applies to this exchange.
    pub fn budgeted(&self) -> bool {
        self.meters.iter().any(|m| m.budgeted())
    }

    /// Reserve one inference call's `tokens` and `cost` (nano-dollars; `None`: the model
    /// has no price) against every token and cost budget of the exchange, all or none
    /// ([`crate::egress::quota::Reservation`]); `Err` with the refusal (`budget_exceeded`).
    pub fn reserve_budget(
        &self,
        tokens: u64,
        cost: Option<u64>,
    ) -> Result<crate::egress::quota::Reservation, crate::pipeline::Refusal> {
        crate::egress::quota::Reservation::take(&self.meters, tokens, cost).map_err(|why| {
            crate::pipeline::Refusal::new(crate::policy::reason::Reason::BudgetExceeded, why.0)
        })
    }

    /// [`Liveness::reserve_budget`], only when the whole reservation fits in what every
    /// budget has left; `Err` says why, and which meter's fleet share it may wait for.
    pub fn reserve_budget_within(
        &self,
        tokens: u64,
        cost: Option<u64>,
    ) -> Result<crate::egress::quota::Reservation, crate::egress::quota::OverBudget> {
        crate::egress::quota::Reservation::take_within(&self.meters, tokens, cost)
    }

    /// What is left today of the exchange's token and cost budgets (the least of its meters).
    pub fn budget_left(&self) -> (Option<u64>, Option<u64>) {
        crate::egress::quota::Reservation::left(&self.meters)
    }

    /// `n` bytes reached the socket in a direction: counted like [`Liveness::moved`], and an
    /// error once they carried one of the exchange's daily quotas to its end — for a path
    /// that counts after it writes (a WebSocket message); the byte pumps take before they
    /// write ([`Liveness::allow`]), so the cut comes at the chunk that would cross.
    pub fn delivered(&self, up: bool, n: usize) -> std::io::Result<()> {
        self.moved(up, n);
        self.cut_error()
    }

    /// Whether the exchange ended because the quota was reached ([`Liveness::delivered`]).
    pub fn quota_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Resolves when the bytes of one of its quotas reach it (never when it has none).
    pub async fn quota_spent(&self) {
        match &*self.meters {
            [] => std::future::pending().await,
            [m] => m.exceeded().await,
            many => {
                futures_util::future::select_all(many.iter().map(|m| Box::pin(m.exceeded()))).await;
            }
        }
    }

    /// Why a new request is refused now, if a daily quota refuses it.
    pub fn spent(&self) -> Option<String> {
        self.meters
            .iter()
            .find_map(|m| m.spent().map(|s| m.describe(s)))
    }

    /// The byte counters, for the record ([`crate::audit::AuditGuard::count`]).
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// `n` bytes are about to be delivered (`up`: client → destination): how many of them
    /// every daily byte quota of the exchange still lets through, counted now. Fewer than `n`
    /// means a quota is spent: the rest must not be delivered, and the exchange is cut (the
    /// overshoot is none, not a buffer — review 7b: a forwarded download under load delivered
    /// 1.78 MB against 1 MB) — unless the second value says more may come (a fleet's share
    /// is being leased: try again). (A pump that can await uses [`Liveness::allow`].)
    pub fn take_some(&self, up: bool, n: usize) -> (usize, bool) {
        if self.meters.is_empty() {
            self.moved(up, n);
            return (n, false);
        }
        let granted = self.take_meters(n);
        self.sent(up, granted);
        let wait = granted < n && self.meters.iter().any(|m| m.bytes_leasing());
        self.mark_cut(granted < n && !wait);
        (granted, wait)
    }

    /// Cut the exchange now: bytes waited for a fleet's share in vain.
    pub fn cut_now(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    /// Take `n` bytes from every byte quota (the least any grants; the others give back the
    /// rest).
    fn take_meters(&self, n: usize) -> usize {
        let mut granted = n as u64;
        for (i, m) in self.meters.iter().enumerate() {
            let g = m.take(granted);
            if g < granted {
                for earlier in &self.meters[..i] {
                    earlier.untake(granted - g);
                }
                granted = g;
            }
        }
        granted as usize
    }

    /// Cut the exchange when bytes were refused (`short`) or a byte quota is now at its end.
    fn mark_cut(&self, short: bool) {
        if short || self.meters.iter().any(|m| m.spent() == Some(Spent::Bytes)) {
            self.cut.store(true, Ordering::Relaxed);
        }
    }

    /// Before a relay writes `n` bytes it read (`up`: client → destination): how many of them
    /// the daily byte quotas let through, taken from them now; on a fleet, waiting (up to
    /// [`share::LEASE_WAIT`]) while this replica leases the next share rather than cutting.
    /// Fewer than `n`: write those, then end with [`Liveness::cut_error`]. The relay counts
    /// what it wrote with [`Liveness::sent`].
    pub async fn allow(&self, n: usize) -> usize {
        if self.meters.is_empty() {
            return n;
        }
        let got = self.take_meters(n);
        if got == n || !self.meters.iter().any(|m| m.bytes_leasing()) {
            self.mark_cut(got < n);
            return got;
        }
        // Boxed: only a relay that waits for a fleet's share holds the wait's state; every
        // idle tunnel's pumps would otherwise keep room for it.
        Box::pin(self.allow_waiting(n, got)).await
    }

    /// [`Liveness::allow`] once `got` of `n` were granted and a fleet's share is being
    /// leased: take the rest as shares come, up to [`share::LEASE_WAIT`].
    async fn allow_waiting(&self, n: usize, mut got: usize) -> usize {
        let until = tokio::time::Instant::now() + share::LEASE_WAIT;
        while got < n {
            let Some(m) = self.meters.iter().find(|m| m.bytes_leasing()) else {
                break;
            };
            if !share::wait_grown(m, until).await {
                break;
            }
            got += self.take_meters(n - got);
        }
        self.mark_cut(got < n);
        got
    }

    /// `n` bytes reached the socket (taken from the quotas before): counted for the record,
    /// and as activity.
    pub fn sent(&self, up: bool, n: usize) {
        let counter = if up {
            &self.counters.up
        } else {
            &self.counters.down
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        self.touch();
    }

    /// The error a relay ends with once its exchange is cut by a byte quota
    /// ([`Liveness::allow`]).
    pub fn cut_error(&self) -> std::io::Result<()> {
        match self.cut.load(Ordering::Relaxed) {
            true => Err(std::io::Error::other(
                "the sandbox's bytes_per_day quota was reached",
            )),
            false => Ok(()),
        }
    }

    pub fn moved(&self, up: bool, n: usize) {
        let counter = if up {
            &self.counters.up
        } else {
            &self.counters.down
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        for m in self.meters.iter() {
            if m.moved(n as u64) {
                self.cut.store(true, Ordering::Relaxed);
            }
        }
        self.touch();
    }

    /// Something happened that counts as activity (a request, a response head).
    pub fn touch(&self) {
        self.active(Instant::now());
    }

    /// The exchange counts as active until `until` (reading, or waiting for bandwidth).
    pub fn active(&self, until: Instant) {
        self.active_until
            .fetch_max(self.nanos(until), Ordering::Relaxed);
    }

    fn deadline(&self) -> Instant {
        self.origin + Duration::from_nanos(self.active_until.load(Ordering::Relaxed)) + self.idle
    }

    /// Resolves once nothing has moved for the idle timeout.
    pub async fn idle(&self) {
        let mut sleep = std::pin::pin!(sleep_until(self.deadline()));
        std::future::poll_fn(|cx| self.poll_idle(sleep.as_mut(), cx)).await
    }

    /// Ready once `sleep` (set to an earlier deadline) ends with nothing moved since; while
    /// something moves, it is set again to the new deadline.
    fn poll_idle(&self, mut sleep: Pin<&mut Sleep>, cx: &mut Context<'_>) -> Poll<()> {
        while sleep.as_mut().poll(cx).is_ready() {
            let deadline = self.deadline();
            if deadline <= Instant::now() {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(deadline);
        }
        Poll::Pending
    }

    /// Client → destination and destination → client bytes so far.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.counters.up.load(Ordering::Relaxed),
            self.counters.down.load(Ordering::Relaxed),
        )
    }

    /// What the relay reports when it ends with `close`.
    pub fn relayed(&self, close: Close) -> Relayed {
        let (up, down) = self.totals();
        let cut = (close == Close::Limit).then(|| self.cut_by()).flatten();
        Relayed {
            up,
            down,
            close,
            cut,
        }
    }

    /// The quota that cut this exchange (`cut at the sandbox's bytes_per_day quota (50000)`),
    /// if one of its meters' byte quotas is reached.
    pub fn cut_by(&self) -> Option<String> {
        self.meters.iter().find_map(|m| m.cut_by())
    }

    /// Run `work` until it ends (`Ok`), nothing moves for the idle timeout
    /// (`Err(Close::Idle)`), `stop` resolves (`Err` with its close), or a daily quota is spent
    /// (`Err(Close::Limit)`). A future of its own, not an `async fn`: `work` and `stop` are held
    /// once, where an `async fn` keeps its arguments *and* the `select!` that moved them.
    pub fn run<W, S>(&self, work: W, stop: S) -> Run<'_, W, S>
    where
        W: Future,
        S: Future<Output = Close>,
    {
        let quota: Option<Pin<Box<dyn Future<Output = ()> + Send + '_>>> =
            match self.meters.is_empty() {
                true => None,
                false => Some(Box::pin(self.quota_spent())),
            };
        Run {
            live: self,
            work,
            stop,
            idle: sleep_until(self.deadline()),
            quota,
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Liveness::run`]'s future: what an idle relay's task holds is this, the two pumps and
    /// little else (docs/performance-history.md, idle memory).
    pub struct Run<'a, W, S> {
        live: &'a Liveness,
        #[pin]
        work: W,
        #[pin]
        stop: S,
        #[pin]
        idle: Sleep,
        // Only for an exchange under a daily quota.
        quota: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    }
}

impl<W: Future, S: Future<Output = Close>> Future for Run<'_, W, S> {
    type Output = Result<W::Output, Close>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(close) = this.stop.poll(cx) {
            return Poll::Ready(Err(close));
        }
        if let Some(q) = this.quota.as_mut() {
            if q.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Close::Limit));
            }
        }
        if let Poll::Ready(out) = this.work.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match this.live.poll_idle(this.idle, cx) {
            Poll::Ready(()) => Poll::Ready(Err(Close::Idle)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl From<Duration> for Liveness {
    /// An unmetered exchange that ends after `idle` with nothing moving.
    fn from(idle: Duration) -> Self {
        Liveness::new(idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn silent_work_ends_idle_and_activity_extends_it() {
        let live = Liveness::new(Duration::from_secs(5));
        let r = live
            .run(std::future::pending::<()>(), std::future::pending())
            .await;
        assert_eq!(r, Err(Close::Idle));
        assert!(Instant::now() - live.origin >= Duration::from_secs(5));

        let live = Arc::new(Liveness::new(Duration::from_secs(5)));
        let feeder = {
            let live = live.clone();
            async move {
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    live.moved(true, 10);
                }
                std::future::pending::<()>().await
            }
        };
        let r = live.run(feeder, std::future::pending()).await;
        assert_eq!(r, Err(Close::Idle));
        // Active until 12 s, idle 5 s later.
        assert!(Instant::now() - live.origin >= Duration::from_secs(17));
        assert_eq!(live.totals(), (40, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn stop_wins_over_work() {
        let live = Liveness::new(Duration::from_secs(60));
        let stop = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Close::Revoked
        };
        let r = live.run(std::future::pending::<()>(), stop).await;
        assert_eq!(r, Err(Close::Revoked));
        let r = live.run(async { 7 }, std::future::pending()).await;
        assert_eq!(r, Ok(7));
    }
}
