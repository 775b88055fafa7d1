//! Grants shared through etcd (issue 41): every approval a replica gives is written under
//! `{prefix}grants/{sandbox}/{id}` (with a lease that ends shortly after the grant, so etcd
//! forgets it too), and every replica watches that prefix and takes what it finds
//! ([`Desk::adopt`]); a deleted key — a lease that ran out, a `once` grant another replica
//! spent — is forgotten ([`Desk::forget`]). Each replica also expires grants by their own
//! time, so a replica cut off from etcd never keeps one past its expiry.
//!
//! A session lists the prefix, then watches from the next revision; a failure waits a second
//! and starts over (a list again adopts what was missed; a deletion missed meanwhile is made
//! good by the grant's own expiry).

use crate::policy::cause::{self as cause};
use std::sync::Arc;
use std::time::SystemTime;

use etcd_client::{Client, EventType, PutOptions};

use super::ControlPlane;
use crate::approvals::stored::StoredGrant;
use crate::approvals::{Desk, Remote};
use crate::control::error::{etcd, ControlError};

/// How long after its expiry a grant's key outlives it (etcd leases are coarse).
const LEASE_SLACK_S: i64 = 5;

/// Writes grants to etcd for [`Desk`] (each write a task of its own: the desk never waits).
pub struct EtcdGrants {
    cp: Arc<ControlPlane>,
    /// The requests' steps and claims ([`super::requests`]).
    requests: super::requests::EtcdRequests,
    /// The runtime the writes run on (the desk calls in from its expiry thread too).
    runtime: tokio::runtime::Handle,
}

impl EtcdGrants {
    /// Made on the runtime (its handle is kept).
    pub fn new(cp: Arc<ControlPlane>) -> Arc<Self> {
        Arc::new(EtcdGrants {
            requests: super::requests::EtcdRequests::new(cp.clone()),
            cp,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    fn key(&self, sandbox: &str, id: &str) -> String {
        format!("{}grants/{sandbox}/{id}", self.cp.cfg.prefix)
    }

    fn client(&self) -> Option<Client> {
        self.cp.client.load_full().map(|c| (*c).clone())
    }
}

impl Remote for EtcdGrants {
    fn put(&self, grant: StoredGrant) {
        let Some(mut client) = self.client() else {
            tracing::warn!(grant = %grant.id, "etcd not connected: the grant holds on this replica only");
            return;
        };
        let key = self.key(&grant.sandbox, &grant.id);
        let timeout = self.cp.cfg.request_timeout;
        self.runtime.spawn(async move {
            let write = async {
                let mut opts = PutOptions::new();
                if let Some(ms) = grant.expires_ms {
                    let left =
                        ms.saturating_sub(crate::approvals::stored::millis(SystemTime::now()));
                    let ttl = (left / 1000) as i64 + LEASE_SLACK_S;
                    let lease = client.lease_grant(ttl, None).await?.id();
                    opts = opts.with_lease(lease);
                }
                let value = serde_json::to_vec(&grant).unwrap_or_default();
                client.put(key, value, Some(opts)).await.map(|_| ())
            };
            match tokio::time::timeout(timeout, write).await {
                Ok(Ok(())) => tracing::info!(grant = %grant.id, "control plane: grant written to etcd"),
                Ok(Err(e)) => {
                    tracing::warn!(grant = %grant.id, error = %e, "cannot share a grant through etcd")
                }
                Err(_) => tracing::warn!(grant = %grant.id, "etcd did not take a grant in time"),
            }
        });
    }

    fn put_request(&self, request: crate::approvals::shared::StoredRequest) {
        self.requests.put(request);
    }

    fn claim(&self, id: &str) -> crate::approvals::shared::Claim {
        self.requests.claim(id)
    }

    fn unclaim(&self, id: &str) {
        self.requests.unclaim(id);
    }

    fn delete(&self, sandbox: &str, id: &str) {
        let Some(mut client) = self.client() else {
            return;
        };
        let key = self.key(sandbox, id);
        let timeout = self.cp.cfg.request_timeout;
        self.runtime.spawn(async move {
            let _ = tokio::time::timeout(timeout, client.delete(key, None)).await;
        });
    }
}

/// Keep `desk` in step with the grants under the prefix until the task is aborted.
pub async fn run(cp: Arc<ControlPlane>, desk: Arc<Desk>) {
    super::watched::keep_watching(&cp, "grants", || session(&cp, &desk)).await
}

async fn session(cp: &ControlPlane, desk: &Arc<Desk>) -> Result<(), ControlError> {
    let prefix = format!("{}grants/", cp.cfg.prefix);
    let (listed, mut stream) = super::watched::list_then_watch(cp, &prefix).await?;
    let grants: Vec<StoredGrant> = listed
        .iter()
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect();
    adopt(desk, grants).await;
    while let Some(resp) = stream.message().await.map_err(|e| etcd(cause::of(e)))? {
        if resp.canceled() || resp.compact_revision() > 0 {
            return Err(etcd("the watch was cancelled or compacted"));
        }
        let mut put = Vec::new();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            match ev.event_type() {
                EventType::Put => {
                    put.extend(serde_json::from_slice::<StoredGrant>(kv.value()).ok())
                }
                EventType::Delete => {
                    let key = String::from_utf8_lossy(kv.key()).to_string();
                    if let Some((sandbox, id)) =
                        key.strip_prefix(&prefix).and_then(|k| k.split_once('/'))
                    {
                        let (sandbox, id) = (sandbox.to_string(), id.to_string());
                        forget(desk, sandbox, id).await;
                    }
                }
            }
        }
        adopt(desk, put).await;
    }
    Err(etcd("etcd closed the watch"))
}

/// The desk publishes through the controller's lock: off the reactor.
async fn adopt(desk: &Arc<Desk>, grants: Vec<StoredGrant>) {
    if grants.is_empty() {
        return;
    }
    let desk = desk.clone();
    if let Ok(n) = tokio::task::spawn_blocking(move || desk.adopt(grants)).await {
        if n > 0 {
            tracing::info!(grants = n, "control plane: grants adopted from etcd");
        }
    }
}

async fn forget(desk: &Arc<Desk>, sandbox: String, id: String) {
    let desk = desk.clone();
    let _ = tokio::task::spawn_blocking(move || desk.forget(&sandbox, &id)).await;
}
