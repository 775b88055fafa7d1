//! The runtime handles of a compiled sandbox — its limiter state (which outlives any one
//! policy version) and its metric handles — kept in the sandbox's opaque `runtime` slot
//! ([`crate::sandboxes::set::Sandbox::runtime`]), so they are found once per policy version
//! instead of once per connection, while `policy` stays free of runtime state.

use std::sync::{Arc, OnceLock};

use crate::audit::metrics::{Metrics, SandboxStats};
use crate::egress::layer_limits::bounded;
use crate::egress::limits::{Limiters, SandboxLimiter};
use crate::sandboxes::set::Sandbox;

/// A sandbox's runtime handles.
pub trait Handles {
    /// Its limiter, reconfigured to this binding's limits (capped by its layers') on first
    /// use.
    fn limiter(&self, limiters: &Limiters) -> Arc<SandboxLimiter>;
    /// Its per-connection metric handles.
    fn stats(&self, metrics: &Metrics) -> Arc<SandboxStats>;
}

/// What the slot holds.
#[derive(Default)]
struct Cached {
    limiter: OnceLock<Arc<SandboxLimiter>>,
    stats: OnceLock<Arc<SandboxStats>>,
}

fn cached(sb: &Sandbox) -> Option<&Cached> {
    sb.runtime
        .get_or_init(|| Arc::new(Cached::default()))
        .downcast_ref::<Cached>()
}

impl Handles for Sandbox {
    fn limiter(&self, limiters: &Limiters) -> Arc<SandboxLimiter> {
        let b = &self.binding;
        let get = || limiters.get(&b.id, &bounded(&b.limits, &b.network.layers));
        match cached(self) {
            Some(c) => c.limiter.get_or_init(get).clone(),
            // Only this module fills the slot; were it anything else, look it up each time.
            None => get(),
        }
    }

    fn stats(&self, metrics: &Metrics) -> Arc<SandboxStats> {
        let get = || Arc::new(metrics.sandbox(&self.binding.id));
        match cached(self) {
            Some(c) => c.stats.get_or_init(get).clone(),
            None => get(),
        }
    }
}
