//! Access requests shared through etcd ([`crate::approvals::shared`]): each step of a request
//! is written under `{prefix}requests/{id}` — in the order the desk took them, by one writer
//! task, so a later step is never overwritten by an earlier one — with a lease that ends an
//! hour after the request's deadline (etcd forgets old requests by itself); an answer claims
//! `{prefix}answers/{id}` first (created only if absent); and every replica watches the
//! requests' prefix and adopts what it finds.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::sync::mpsc;

use super::ControlPlane;
use crate::approvals::shared::{Claim, StoredRequest};
use crate::approvals::{Desk, DeskError};
use crate::control::error::{etcd, ControlError};

/// How long a request's key outlives its deadline (or its last step, without one).
const KEEP_S: i64 = 3600;

/// The fleet's side of the desk's requests: the ordered writer and the claims.
pub struct EtcdRequests {
    cp: Arc<ControlPlane>,
    steps: mpsc::UnboundedSender<StoredRequest>,
}

impl EtcdRequests {
    /// Made on the runtime: its writer task runs until the control plane is dropped.
    pub fn new(cp: Arc<ControlPlane>) -> Self {
        let (steps, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_steps(cp.clone(), rx));
        EtcdRequests { cp, steps }
    }

    /// Write a request's step (in order with the others).
    pub fn put(&self, r: StoredRequest) {
        let _ = self.steps.send(r);
    }

    /// Claim request `id` for an answer.
    pub fn claim(&self, id: &str) -> Claim {
        let (cp, key) = (
            self.cp.clone(),
            format!("{}answers/{id}", self.cp.cfg.prefix),
        );
        Box::pin(async move {
            let unavailable = |e: String| {
                DeskError {
                status: 503,
                message: format!("the fleet's desk (etcd) cannot be reached, so the answer could not be claimed: {e}"),
            }
            };
            let Some(client) = cp.client.load_full().filter(|_| cp.connected()) else {
                return Err(unavailable("not connected".into()));
            };
            let mut client = (*client).clone();
            let claim = async {
                let lease = client.lease_grant(KEEP_S, None).await?.id();
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        "claimed",
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                client.txn(txn).await.map(|r| r.succeeded())
            };
            match tokio::time::timeout(cp.cfg.request_timeout, claim).await {
                Ok(Ok(won)) => Ok(won),
                Ok(Err(e)) => Err(unavailable(e.to_string())),
                Err(_) => Err(unavailable("etcd did not answer in time".into())),
            }
        })
    }

    /// Give back the claim of an answer the desk refused.
    pub fn unclaim(&self, id: &str) {
        let Some(client) = self.cp.client.load_full() else {
            return;
        };
        let mut client = (*client).clone();
        let key = format!("{}answers/{id}", self.cp.cfg.prefix);
        let timeout = self.cp.cfg.request_timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, client.delete(key, None)).await;
        });
    }
}

/// Write each step as the desk took it, until the desk is gone.
async fn write_steps(cp: Arc<ControlPlane>, mut rx: mpsc::UnboundedReceiver<StoredRequest>) {
    while let Some(r) = rx.recv().await {
        let Some(client) = cp.client.load_full() else {
            tracing::warn!(request = %r.id(), "etcd not connected: the request stays on this replica");
            continue;
        };
        let mut client = (*client).clone();
        let key = format!("{}requests/{}", cp.cfg.prefix, r.id());
        let write = put(&mut client, key, &r);
        match tokio::time::timeout(cp.cfg.request_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(request = %r.id(), error = %e, "cannot share a request through etcd")
            }
            Err(_) => tracing::warn!(request = %r.id(), "etcd did not take a request in time"),
        }
    }
}

async fn put(
    client: &mut Client,
    key: String,
    r: &StoredRequest,
) -> Result<(), etcd_client::Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let left = r.deadline_ms().map_or(0, |d| d.saturating_sub(now) / 1000);
    let ttl = i64::try_from(left).unwrap_or(i64::MAX / 2) + KEEP_S;
    let lease = client.lease_grant(ttl, None).await?.id();
    let value = serde_json::to_vec(r).unwrap_or_default();
    let opts = PutOptions::new().with_lease(lease);
    client.put(key, value, Some(opts)).await.map(|_| ())
}

/// Keep `desk` in step with the requests under the prefix until the task is aborted.
pub async fn run(cp: Arc<ControlPlane>, desk: Arc<Desk>) {
    super::watched::keep_watching(&cp, "requests", || session(&cp, &desk)).await
}

async fn session(cp: &ControlPlane, desk: &Arc<Desk>) -> Result<(), ControlError> {
    let prefix = format!("{}requests/", cp.cfg.prefix);
    let (listed, mut stream) = super::watched::list_then_watch(cp, &prefix).await?;
    let found: Vec<StoredRequest> = listed
        .iter()
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect();
    adopt(desk, found).await;
    while let Some(changed) = super::watched::changes(&mut stream).await? {
        // A deleted key is a lease that ran out: the request's own deadline ends it here.
        let put = (changed.iter())
            .filter_map(|(_, value)| serde_json::from_slice(value.as_deref()?).ok())
            .collect();
        adopt(desk, put).await;
    }
    Err(etcd("etcd closed the watch"))
}

/// The desk publishes through the controller's lock: off the reactor.
async fn adopt(desk: &Arc<Desk>, found: Vec<StoredRequest>) {
    if found.is_empty() {
        return;
    }
    let desk = desk.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for r in found {
            desk.adopt_request(r);
        }
    })
    .await;
}
