//! TLS session resumption toward origins, one session store per sandbox binding and host. A
//! terminated tunnel with no kept connection to take ([`super::kept`]) still opens TLS to the
//! origin; when this sandbox's last session with the host left a ticket, the handshake
//! resumes it — no certificate chain sent, verified or signed for — and is otherwise the same
//! (a fresh key exchange; the name was verified when the ticket's session was opened, under
//! the same roots; no early data).
//!
//! Tickets never cross a sandbox: each (binding, host) has its own store ([`PerBinding`]),
//! so another sandbox, or a sandbox registered again under the same name, opens a session of
//! its own with a full handshake, and an origin cannot tie one sandbox's connections to
//! another's by their tickets. A tunnel whose sandbox has no binding any more resumes nothing.

use std::sync::Arc;

use rustls::client::{ClientSessionMemoryCache, Resumption};
use rustls::ClientConfig;

use super::per_binding::PerBinding;
use crate::config::Binding;

/// Tickets kept per (binding, host) store: what rustls keeps for one server.
const TICKETS: usize = 8;

/// The upstream TLS configurations, one per ALPN offer, of one binding and host: one store.
type Offers = Arc<[Arc<ClientConfig>; 4]>;

/// The upstream TLS configurations with their session stores.
pub struct Resuming {
    /// One per ALPN offer (none, `http/1.1`, `h2`, both), resuming nothing.
    base: [Arc<ClientConfig>; 4],
    stores: PerBinding<Offers>,
}

impl std::fmt::Debug for Resuming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resuming")
            .field("stores", &self.stores.len())
            .finish()
    }
}

impl Resuming {
    /// Over `base`, one configuration per ALPN offer (its own resumption is replaced).
    pub fn new(base: [ClientConfig; 4]) -> Self {
        Resuming {
            base: base.map(|mut c| {
                c.resumption = Resumption::disabled();
                Arc::new(c)
            }),
            stores: PerBinding::default(),
        }
    }

    /// The configuration for offer `offer` toward `host`, resuming `binding`'s sessions with
    /// it (none without a binding).
    pub fn config(
        &self,
        binding: Option<&Arc<Binding>>,
        host: &str,
        offer: usize,
    ) -> Arc<ClientConfig> {
        let offer = offer.min(3);
        let Some(binding) = binding else {
            return self.base[offer].clone();
        };
        let offers = self.stores.get_or_build(binding, host, || {
            let store = Arc::new(ClientSessionMemoryCache::new(TICKETS));
            Arc::new(self.base.clone().map(|c| {
                let mut c = (*c).clone();
                c.resumption = Resumption::store(store.clone());
                Arc::new(c)
            }))
        });
        offers[offer].clone()
    }

    /// Drop the stores of bindings no longer held. How many were dropped.
    pub fn prune(&self) -> usize {
        self.stores.prune()
    }
}
