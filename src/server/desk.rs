//! Assembling the approvals desk ([`crate::approvals`]) at start: the controller publishes
//! its grants, `state_dir` restores them (without etcd; with etcd the control plane does),
//! and a thread expires what is due every [`TICK`] (and sleeps while nothing is due).

use std::sync::Arc;
use std::time::Duration;

use crate::approvals::Desk;
use crate::config::Config;
use crate::control::Controller;
use crate::runtime::Shared;

/// How often due requests and grants are expired (a grant refuses new exchanges at its
/// expiry exactly; its open tunnels are cut within one tick).
pub const TICK: Duration = Duration::from_millis(200);

/// Build the desk, put it in `shared`, and start its expiry thread.
pub fn start(config: &Config, shared: &Arc<Shared>, control: &Arc<Controller>) -> Arc<Desk> {
    let state_dir = config
        .state_dir
        .as_deref()
        .filter(|_| config.etcd.is_none());
    let desk = Desk::new(
        config.approvals.clone(),
        shared.sink.clone(),
        shared.policy.subscribe(),
        state_dir,
    );
    let publisher = control.clone();
    desk.set_publisher(Box::new(move |id, granted| {
        publisher.publish_grants(id, granted)
    }));
    match desk.restore() {
        Ok(0) => {}
        Ok(n) => tracing::info!(grants = n, "grants restored from state_dir"),
        Err(e) => tracing::warn!(error = %e, "cannot restore grants from state_dir"),
    }
    let _ = shared.desk.set(desk.clone());
    let ticking = Arc::downgrade(&desk);
    let spawned = std::thread::Builder::new()
        .name("approvals-expiry".into())
        .spawn(move || expire(ticking));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the approvals expiry thread: grants refuse new exchanges at their expiry, but open tunnels are not cut");
    }
    desk
}

/// The expiry thread: a tick every [`TICK`] while something has a deadline (or a spent
/// `once` grant may need sharing); with nothing due it sleeps until the desk is next locked
/// (an idle proxy's thread makes no wake-ups). It ends when the desk is dropped, which
/// wakes it.
fn expire(ticking: std::sync::Weak<Desk>) {
    // Named before the first tick: what is added before this is seen by that tick, what is
    // added after wakes this thread.
    if let Some(desk) = ticking.upgrade() {
        desk.set_ticker(std::thread::current());
    }
    while let Some(desk) = ticking.upgrade() {
        // A tick that panicked is logged and the next one comes: expiry never stops.
        let due = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| desk.tick()));
        if due.is_err() {
            tracing::error!("approvals expiry tick failed; trying again");
        }
        drop(desk);
        match due {
            Ok(false) => std::thread::park(),
            _ => std::thread::sleep(TICK),
        }
    }
}
