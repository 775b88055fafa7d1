//! Live exchanges watch their policy (the linkerd2-proxy way): every allowed tunnel or
//! forwarded request holds a [`Watch`] of what it was allowed to do — its [`Clearance`] — and of
//! the process [`Phase`]. [`Watch::stopped`] resolves when the exchange must end: when a newly
//! published policy set no longer allows the clearance (`revoked`), or when shutdown reaches the
//! stopping phase (`shutdown`). There is no registry of exchanges and no lock held across
//! decisions: each exchange re-decides itself.
//!
//! An exchange remembers the policy generation it was decided under. If a reload or a DELETE
//! was published while it was resolving, dialling or peeking, the first poll of `stopped`
//! sees the newer generation and re-decides at once — a change can never slip between the
//! decision and the start of the relay.

use std::sync::Arc;

use tokio::sync::watch;

use crate::audit::outcome::Close;
pub use crate::egress::clearance::Clearance;
use crate::sandboxes::set::PolicySet;

/// Where the process is in its life; relays and HTTP connections watch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// Shutdown began: HTTP connections finish their request and close; tunnels go on.
    Draining,
    /// The grace period is over: every exchange stops now.
    Stopping,
}

/// A clearance, watching the policy and the process phase.
#[derive(Debug, Clone)]
pub struct Watch {
    clearance: Arc<Clearance>,
    /// Set-wide publications, and the newest set.
    policy: watch::Receiver<Arc<PolicySet>>,
    /// Publications that concern this clearance's sandbox only.
    mine: watch::Receiver<()>,
    phase: watch::Receiver<Phase>,
}

impl Watch {
    pub fn new(
        clearance: Clearance,
        policy: watch::Receiver<Arc<PolicySet>>,
        mine: watch::Receiver<()>,
        phase: watch::Receiver<Phase>,
    ) -> Self {
        Watch {
            clearance: Arc::new(clearance),
            policy,
            mine,
            phase,
        }
    }

    /// The grant that allowed the watched exchange, if one did.
    pub fn granted_by(&self) -> Option<Arc<str>> {
        self.clearance.granted_by.clone()
    }

    /// What the record of an exchange a watch cut says (`close` as [`Watch::stopped`]
    /// returned it; `granted_by` its [`Watch::granted_by`]): the grant that ended, or the
    /// policy that no longer allows it.
    pub fn cut_detail(close: Close, granted_by: Option<&str>) -> Option<String> {
        match (close, granted_by) {
            (Close::Revoked, Some(id)) => {
                Some(format!("cut: grant {id} ended (expired or revoked)"))
            }
            (Close::Revoked, None) => Some(
                "cut: the policy no longer allows it (a reload, a registration or a grant's end)"
                    .into(),
            ),
            (Close::Shutdown, _) => Some("cut: the proxy is shutting down".into()),
            _ => None,
        }
    }

    /// Re-decide under the newest set; `false` when it no longer allows the clearance.
    fn still_allowed(&mut self) -> bool {
        // Clone the Arc so no lock is held while deciding.
        let set = self.policy.borrow_and_update().clone();
        self.clearance.allowed_by(&set)
    }

    /// Resolves when the exchange must stop, with the `close` to record. Never resolves while
    /// the clearance stays allowed and the process keeps serving. Cancel-safe in the sense that
    /// matters: create it once and poll it from a `select!` loop.
    pub async fn stopped(mut self) -> Close {
        let current = self.policy.borrow().generation();
        if current > self.clearance.generation && !self.still_allowed() {
            return Close::Revoked;
        }
        if *self.phase.borrow_and_update() == Phase::Stopping {
            return Close::Shutdown;
        }
        let mut mine_open = true;
        loop {
            tokio::select! {
                changed = self.policy.changed() => match changed {
                    Ok(()) if !self.still_allowed() => return Close::Revoked,
                    Ok(()) => {}
                    // The publisher is gone: the process is going away.
                    Err(_) => return Close::Shutdown,
                },
                changed = self.mine.changed(), if mine_open => match changed {
                    Ok(()) if !self.still_allowed() => return Close::Revoked,
                    Ok(()) => {}
                    // Its channel was dropped; set-wide publications still reach us.
                    Err(_) => mine_open = false,
                },
                changed = self.phase.changed() => match changed {
                    Ok(()) if *self.phase.borrow_and_update() == Phase::Stopping => {
                        return Close::Shutdown
                    }
                    Ok(()) => {}
                    Err(_) => return Close::Shutdown,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use crate::egress::identity::Proof;
    use crate::policy::sandbox_id::SandboxId;
    use crate::policy::target::Target;
    use crate::sandboxes::set::{LivePolicy, Scope};
    use std::path::Path;
    use std::time::Duration;

    fn set(egress: &[&str]) -> PolicySet {
        let egress = egress
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "sandboxes:\n  - {{ id: a, policy: {{ provider: local, config: {{}}, network: {{ egress: [{egress}] }} }} }}\n"
        );
        let c = load_str(&text, "t", Path::new("."), None).unwrap();
        PolicySet::compile(&c, &[], vec![]).unwrap()
    }

    fn clearance(generation: u64) -> Clearance {
        Clearance {
            sandbox: SandboxId::new("a").unwrap(),
            proof: Proof::Default("10.0.0.1".parse().unwrap()),
            target: Target::parse("x.example.com:443", None).unwrap(),
            dialed: "93.184.216.34".parse().unwrap(),
            generation,
            granted_by: None,
            process: None,
        }
    }

    fn mine(live: &LivePolicy) -> watch::Receiver<()> {
        live.subscribe_sandbox(&SandboxId::new("a").unwrap())
    }

    async fn not_yet(f: &mut std::pin::Pin<&mut impl std::future::Future<Output = Close>>) {
        let r = tokio::time::timeout(Duration::from_millis(50), f.as_mut()).await;
        assert!(r.is_err(), "stopped early: {r:?}");
    }

    #[tokio::test]
    async fn a_change_that_keeps_the_grant_does_not_stop_and_one_that_removes_it_does() {
        let live = LivePolicy::new(set(&["x.example.com"]));
        let (_phase_tx, phase) = watch::channel(Phase::Serving);
        let g = clearance(live.load().generation());
        let stopped = Watch::new(g, live.subscribe(), mine(&live), phase).stopped();
        tokio::pin!(stopped);
        not_yet(&mut stopped).await;
        live.publish(set(&["x.example.com", "y.example.com"]), Scope::All);
        not_yet(&mut stopped).await;
        live.publish(set(&["y.example.com"]), Scope::All);
        assert_eq!(stopped.await, Close::Revoked);
    }

    #[tokio::test]
    async fn a_change_published_before_the_watch_began_is_seen_at_once() {
        let live = LivePolicy::new(set(&["x.example.com"]));
        let decided_under = live.load().generation();
        // The reload lands between the decision and the relay.
        live.publish(set(&["y.example.com"]), Scope::All);
        let (_phase_tx, phase) = watch::channel(Phase::Serving);
        let w = Watch::new(
            clearance(decided_under),
            live.subscribe(),
            mine(&live),
            phase,
        );
        assert_eq!(w.stopped().await, Close::Revoked);
    }

    #[tokio::test]
    async fn stopping_phase_ends_it_and_draining_does_not() {
        let live = LivePolicy::new(set(&["x.example.com"]));
        let (phase_tx, phase) = watch::channel(Phase::Serving);
        let stopped = Watch::new(
            clearance(live.load().generation()),
            live.subscribe(),
            mine(&live),
            phase,
        )
        .stopped();
        tokio::pin!(stopped);
        phase_tx.send_replace(Phase::Draining);
        not_yet(&mut stopped).await;
        phase_tx.send_replace(Phase::Stopping);
        assert_eq!(stopped.await, Close::Shutdown);
    }

    #[tokio::test]
    async fn a_change_to_one_sandbox_wakes_only_its_exchanges() {
        let live = LivePolicy::new(set(&["x.example.com"]));
        let everyone = live.subscribe();
        let mut of_b = live.subscribe_sandbox(&SandboxId::new("b").unwrap());
        let (_phase_tx, phase) = watch::channel(Phase::Serving);
        let stopped = Watch::new(
            clearance(live.load().generation()),
            live.subscribe(),
            mine(&live),
            phase,
        )
        .stopped();
        tokio::pin!(stopped);
        not_yet(&mut stopped).await;
        // A publication about sandbox b (say, a registration) reaches neither a's exchange
        // nor the set-wide channel — but it is the newest set all the same.
        live.publish(
            set(&["x.example.com"]),
            Scope::Sandboxes(&[SandboxId::new("b").unwrap()]),
        );
        assert!(!everyone.has_changed().unwrap());
        assert!(of_b.has_changed().unwrap());
        assert_eq!(everyone.borrow().generation(), live.load().generation());
        not_yet(&mut stopped).await;
        // One about a reaches a's exchange, which re-decides.
        live.publish(
            set(&["y.example.com"]),
            Scope::Sandboxes(&[SandboxId::new("a").unwrap()]),
        );
        assert_eq!(stopped.await, Close::Revoked);
        assert!(!everyone.has_changed().unwrap());
        let _ = of_b.borrow_and_update();
    }
}
