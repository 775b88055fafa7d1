//! The pool's rules for a connection several exchanges share (an HTTP/2 one): taken by each,
//! kept once, never closed for idleness or when the pool lets go of it while an exchange still
//! holds it, and still reset when the policy stops allowing it.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Kept, UpstreamPool};
use crate::config::{load_str, ForwardKeepalive};
use crate::egress::abortable::Cut;
use crate::egress::clearance::Clearance;
use crate::egress::identity::Proof;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::Target;
use crate::sandboxes::set::PolicySet;

const PORT: u16 = 8443;
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A connection as the pool sees it: `shares` like an HTTP/2 one.
struct Fake {
    cut: Arc<Cut>,
    /// Subscribed from the start (a cut fired with no subscriber keeps no value).
    fired: tokio::sync::watch::Receiver<bool>,
    closed: Arc<AtomicBool>,
    users: Arc<()>,
    shares: bool,
}

impl Fake {
    fn new(shares: bool) -> Fake {
        let cut = Cut::new();
        Fake {
            fired: cut.subscribe(),
            cut,
            closed: Arc::new(AtomicBool::new(false)),
            users: Arc::new(()),
            shares,
        }
    }

    /// Whether the pool ended it.
    fn ended(&self) -> bool {
        *self.fired.borrow()
    }
}

impl Kept for Fake {
    fn ready(&mut self) -> bool {
        !self.closed()
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn cut(&self) -> &Arc<Cut> {
        &self.cut
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::new(LOOPBACK, PORT)
    }

    fn taken(&mut self) {}

    fn share(&mut self) -> Option<Self> {
        self.shares.then(|| Fake {
            cut: self.cut.clone(),
            fired: self.fired.clone(),
            closed: self.closed.clone(),
            users: self.users.clone(),
            shares: true,
        })
    }

    fn in_use(&self) -> bool {
        Arc::strong_count(&self.users) > 1
    }
}

/// Sandbox `a` allowed to reach the origin, or (`allowed: false`) allowed nothing.
fn set(allowed: bool) -> PolicySet {
    let egress = match allowed {
        true => format!("[\"127.0.0.1:{PORT}\"]"),
        false => "[]".to_string(),
    };
    let text = format!(
        "defaults: {{ guard_allow_ranges: [127.0.0.1/32] }}\nsandboxes:\n  - {{ id: a, sources: [127.0.0.0/8], policy: {{ provider: local, config: {{}}, network: {{ egress: {egress} }} }} }}\n"
    );
    let c = load_str(&text, "t", Path::new("."), None).expect("config");
    PolicySet::compile(&c, &[], vec![]).expect("set")
}

fn clearance() -> Clearance {
    Clearance {
        sandbox: SandboxId::new("a").expect("id"),
        proof: Proof::Source(LOOPBACK),
        target: Target::parse(&format!("127.0.0.1:{PORT}"), None).expect("target"),
        dialed: LOOPBACK,
        generation: 0,
        granted_by: None,
        process: None,
    }
}

/// A pool keeping connections idle for `idle`.
fn pool(idle: Duration) -> UpstreamPool<Fake> {
    UpstreamPool::new(ForwardKeepalive {
        idle,
        max_idle_per_origin: 4,
        max_idle: 16,
    })
}

/// Idle too long as soon as it is kept.
const AT_ONCE: Duration = Duration::from_nanos(1);
const A_MINUTE: Duration = Duration::from_secs(60);

fn take(pool: &UpstreamPool<Fake>) -> Option<Fake> {
    let sandbox = SandboxId::new("a").expect("id");
    pool.take(&sandbox, "origin", &[LOOPBACK], PORT)
}

#[test]
fn a_shared_connection_serves_each_taker_and_is_kept_once() {
    let pool = pool(A_MINUTE);
    let c = clearance();
    pool.keep(&c, "origin".into(), Fake::new(true));
    let first = take(&pool).expect("shared");
    let second = take(&pool).expect("shared again: in use, so not idle");
    assert_eq!(pool.idle_count(), 1);
    pool.keep(&c, "origin".into(), first);
    pool.keep(&c, "origin".into(), second);
    assert_eq!(pool.idle_count(), 1, "handed back, not kept twice");
}

#[test]
fn a_shared_connection_in_use_is_not_ended_by_idleness_nor_when_it_closes() {
    let (pool, set) = (pool(AT_ONCE), set(true));
    // Kept while a tunnel still holds it (given back by another of its tunnels).
    let mut kept = Fake::new(true);
    let held = kept.share().expect("a handle");
    pool.keep(&clearance(), "origin".into(), kept);
    assert_eq!(pool.sweep(&set), 0, "idle too long, but in use");
    assert!(!held.ended());
    let _taken = take(&pool).expect("in use: taken however long it was idle");
    // The origin is closing it (a GOAWAY): the pool lets go of it, its user finishes.
    held.closed.store(true, Ordering::SeqCst);
    assert!(take(&pool).is_none());
    assert_eq!(pool.idle_count(), 0);
    assert!(!held.ended(), "not cut under the exchange still using it");
    // The same, through the sweep.
    let mut other = Fake::new(true);
    let held = other.share().expect("a handle");
    pool.keep(&clearance(), "origin".into(), other);
    held.closed.store(true, Ordering::SeqCst);
    assert_eq!(pool.sweep(&set), 1);
    assert!(!held.ended());
}

#[test]
fn an_unshared_connection_is_ended_when_idle_too_long() {
    let (pool, set) = (pool(AT_ONCE), set(true));
    let c = Fake::new(false);
    let fired = c.fired.clone();
    pool.keep(&clearance(), "origin".into(), c);
    assert_eq!(pool.sweep(&set), 1);
    assert!(*fired.borrow());
}

#[test]
fn a_revoking_sweep_resets_a_shared_connection_in_use() {
    let pool = pool(A_MINUTE);
    pool.keep(&clearance(), "origin".into(), Fake::new(true));
    let held = take(&pool).expect("shared");
    assert_eq!(pool.sweep(&set(false)), 1);
    assert!(held.ended(), "revoked, in use or not");
}
