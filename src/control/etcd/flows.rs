//! Flow labels shared through etcd (issue 93): a sandbox cannot launder a label by
//! reconnecting to another replica. Each change a replica makes is written under the prefix,
//! one key per label so that no write overwrites another replica's:
//!
//! - `{prefix}flows/{sandbox}/armed/{label}`: the arming (the request, when, its `conn_id`);
//!   deleted by a reset;
//! - `{prefix}flows/{sandbox}/waiver/{label}`: a waiver in force; deleted when spent or reset;
//! - the whole `{prefix}flows/{sandbox}/` deleted when the sandbox is removed.
//!
//! An arming is written before the request that armed it is sent (bounded by the etcd
//! request timeout; on failure it holds on this replica and is logged). Every replica lists
//! the prefix and watches it, and applies what it finds ([`Ledger::adopt`]): the delay
//! between an arming on one replica and its force on another is etcd's write and watch
//! latency (docs/flows.md has the measured figure).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use etcd_client::DeleteOptions;

use super::ControlPlane;
use crate::control::error::{etcd, ControlError};
use crate::pipeline::flow::{Change, Ledger, Share};

/// Writes this replica's label changes to etcd.
pub struct EtcdFlows {
    cp: Arc<ControlPlane>,
}

impl EtcdFlows {
    /// Share through `cp`.
    pub fn new(cp: Arc<ControlPlane>) -> Arc<Self> {
        Arc::new(EtcdFlows { cp })
    }
}

impl Share for EtcdFlows {
    fn send(&self, id: &str, change: Change) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let base = format!("{}flows/{id}/", self.cp.cfg.prefix);
        let client = self.cp.client.load_full().map(|c| (*c).clone());
        let timeout = self.cp.cfg.request_timeout;
        let sandbox = id.to_string();
        Box::pin(async move {
            let Some(mut client) = client else {
                tracing::warn!(
                    sandbox,
                    "etcd not connected: a flow label change holds on this replica only"
                );
                return;
            };
            let write = async {
                match change {
                    Change::Armed(a) => {
                        let value = serde_json::to_vec(&a).unwrap_or_default();
                        client
                            .put(format!("{base}armed/{}", a.label), value, None)
                            .await
                            .map(|_| ())
                    }
                    Change::Waived(w) => {
                        let value = serde_json::to_vec(&w).unwrap_or_default();
                        client
                            .put(format!("{base}waiver/{}", w.label), value, None)
                            .await
                            .map(|_| ())
                    }
                    Change::Disarmed(label) => client
                        .delete(format!("{base}armed/{label}"), None)
                        .await
                        .map(|_| ()),
                    Change::Unwaived(label) => client
                        .delete(format!("{base}waiver/{label}"), None)
                        .await
                        .map(|_| ()),
                    Change::Forgotten => {
                        let all = Some(DeleteOptions::new().with_prefix());
                        client.delete(base.clone(), all).await.map(|_| ())
                    }
                }
            };
            match tokio::time::timeout(timeout, write).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(sandbox, error = %e, "cannot share a flow label change through etcd")
                }
                Err(_) => tracing::warn!(sandbox, "etcd did not take a flow label change in time"),
            }
        })
    }
}

/// Keep `ledger` in step with the labels under the prefix until the task is aborted.
pub async fn run(cp: Arc<ControlPlane>, ledger: Arc<Ledger>) {
    super::watched::keep_watching(&cp, "flows", || session(&cp, &ledger)).await
}

async fn session(cp: &ControlPlane, ledger: &Ledger) -> Result<(), ControlError> {
    let prefix = format!("{}flows/", cp.cfg.prefix);
    let (listed, mut stream) = super::watched::list_then_watch(cp, &prefix).await?;
    for kv in &listed {
        if let Some((id, change)) = change_of(&prefix, kv.key(), Some(kv.value())) {
            ledger.adopt(&id, change).await;
        }
    }
    while let Some(changed) = super::watched::changes(&mut stream).await? {
        for (key, value) in changed {
            if let Some((id, change)) = change_of(&prefix, &key, value.as_deref()) {
                ledger.adopt(&id, change).await;
            }
        }
    }
    Err(etcd("etcd closed the watch"))
}

/// The change a key (put with `value`, or deleted) stands for.
fn change_of(prefix: &str, key: &[u8], value: Option<&[u8]>) -> Option<(String, Change)> {
    let key = std::str::from_utf8(key).ok()?.strip_prefix(prefix)?;
    let (id, rest) = key.split_once('/')?;
    let (kind, label) = rest.split_once('/')?;
    let change = match (kind, value) {
        ("armed", Some(v)) => Change::Armed(serde_json::from_slice(v).ok()?),
        ("armed", None) => Change::Disarmed(label.to_string()),
        ("waiver", Some(v)) => Change::Waived(serde_json::from_slice(v).ok()?),
        ("waiver", None) => Change::Unwaived(label.to_string()),
        _ => return None,
    };
    Some((id.to_string(), change))
}
