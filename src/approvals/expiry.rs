//! The desk's expiry: [`Desk::tick`] ends requests and grants that are due, and says whether
//! anything is left with a deadline. The thread that calls it ([`crate::server::desk`])
//! sleeps while nothing is: every lock of the desk wakes it first, so a request or grant
//! added while it sleeps is ticked for, and dropping the desk wakes it to end.

use std::time::SystemTime;

use super::{Desk, Inner, Request, State};
use crate::policy::granted::GrantKind;

impl Desk {
    /// The thread that runs [`Desk::tick`] (once, at start): every later lock of the desk
    /// wakes it, so a request or grant added while it sleeps is ticked for.
    pub fn set_ticker(&self, t: std::thread::Thread) {
        let _ = self.ticker.set(t);
    }

    /// The desk's state, waking the expiry thread first. Whatever is added under this lock
    /// is seen by a tick that starts after the wake: a wake before the thread sleeps makes
    /// its sleep return at once (`Thread::unpark` keeps one token).
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        if let Some(t) = self.ticker.get() {
            t.unpark();
        }
        self.lock_quiet()
    }

    /// The desk's state, waking no one (the expiry thread's own tick).
    fn lock_quiet(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Expire what is due: pending requests past `approvals.pending_ttl_s`, grants past their
    /// expiry (published away: the exchanges they allowed are cut). Called every tick.
    /// Returns whether a later tick has anything to do: a request or grant with a deadline, or
    /// a `once` grant whose spending etcd has not been told of (spent outside this lock). When
    /// none is left the expiry thread sleeps until the desk is next locked.
    pub fn tick(&self) -> bool {
        let now = SystemTime::now();
        let mut inner = self.lock_quiet();
        let mut ended: Vec<Request> = Vec::new();
        let Inner {
            requests, adopted, ..
        } = &mut *inner;
        for r in requests.values_mut() {
            let due = r.deadline.is_some_and(|d| d <= now);
            if due && matches!(r.state, State::Pending | State::Approved) {
                r.state = State::Expired;
                // Another replica's request: that replica records and shares its expiry.
                if !adopted.contains(&r.id) {
                    ended.push(r.clone());
                }
            }
        }
        let mut touched = Vec::new();
        for (sid, list) in inner.grants.iter_mut() {
            let before = list.len();
            list.retain(|g| g.expires.is_none_or(|e| e > now));
            if list.len() != before {
                touched.push(sid.clone());
            }
        }
        inner.grants.retain(|_, l| !l.is_empty());
        self.share_spent(&mut inner);
        for sid in &touched {
            self.publish(&inner, sid);
        }
        if !touched.is_empty() {
            self.save(&inner);
        }
        drop(inner);
        for r in &ended {
            self.record(r, "expired", &"expiry".into(), None);
            self.share_request(r, None);
        }
        if !ended.is_empty() {
            self.changed.send_modify(|n| *n += 1);
        }
        self.anything_due()
    }

    /// Whether a tick may find work that no lock of the desk announces (see [`Desk::tick`]).
    fn anything_due(&self) -> bool {
        let inner = self.lock_quiet();
        let open = |r: &Request| {
            r.deadline.is_some() && matches!(r.state, State::Pending | State::Approved)
        };
        let sharing = self.remote.get().is_some();
        inner.requests.values().any(open)
            || inner.grants.values().flatten().any(|g| {
                g.expires.is_some()
                    || (sharing && g.kind == GrantKind::Once && !inner.spent.contains(&g.id))
            })
    }
}

impl Drop for Desk {
    /// Wake the expiry thread, which finds the desk gone and ends.
    fn drop(&mut self) {
        if let Some(t) = self.ticker.get() {
            t.unpark();
        }
    }
}
