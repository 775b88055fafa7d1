//! The shared control plane (`control_plane.etcd`): registrations live in etcd, and every
//! replica watches them.
//!
//! Keys: `{prefix}sandboxes/{id}` holds the binding body exactly as `PUT /v1/sandboxes/{id}`
//! takes it. A runtime may write etcd directly or call any replica. A write through the API
//! is validated here first (400/409 as without etcd), written in a transaction that fails if
//! the key changed since this replica last saw it, and answered once this replica has applied
//! the write's revision (read-your-write). `?ttl_s=N` attaches a lease; `keepalive` refreshes
//! it; an expired lease deletes the key, which revokes the sandbox everywhere.
//!
//! [`sync`] keeps every replica in step: list the prefix, apply it as a whole, watch from the
//! next revision, apply each batch of events; a compacted revision means list again and diff.
//! When etcd cannot be reached the replica keeps enforcing what it applied last (never an
//! empty set, never open), writes answer 503, and it retries with backoff.

pub(crate) mod apply;
mod connect;
pub mod flows;
pub(crate) mod grants;
pub mod layers;
pub mod quota_lease;
pub mod requests;
mod sync;
pub mod usage;
mod watched;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use etcd_client::{Client, Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};

use crate::config::EtcdConfig;
use crate::control::{ChangeError, Controller};
use crate::policy::cause::caused;
use crate::policy::sandbox_id::SandboxId;
use crate::runtime::Shared;

/// Lease lengths `?ttl_s=` accepts (etcd raises anything below its minimum, about 2 s).
pub const TTL_RANGE: std::ops::RangeInclusive<i64> = 1..=30 * 24 * 3600;

/// How many times a write is retried when the key changed under it.
const WRITE_ATTEMPTS: usize = 3;

/// One replica's link to etcd.
pub struct ControlPlane {
    cfg: EtcdConfig,
    control: Arc<Controller>,
    shared: Arc<Shared>,
    /// The client of the current session (`None` before the first connection).
    client: ArcSwapOption<Client>,
    /// Whether the watch is up (writes are refused otherwise: they could not be read back).
    connected: AtomicBool,
    /// The revision applied so far.
    applied: tokio::sync::watch::Sender<i64>,
}

impl ControlPlane {
    pub fn new(cfg: EtcdConfig, control: Arc<Controller>, shared: Arc<Shared>) -> Arc<Self> {
        Arc::new(ControlPlane {
            cfg,
            control,
            shared,
            client: ArcSwapOption::empty(),
            connected: AtomicBool::new(false),
            applied: tokio::sync::watch::channel(0).0,
        })
    }

    /// Keep this replica in step with etcd until the task is aborted.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(sync::run(self.clone()))
    }

    /// The revision applied so far.
    pub fn revision(&self) -> i64 {
        *self.applied.borrow()
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Release);
        self.shared.metrics().control_plane_connected(up);
    }

    fn set_applied(&self, revision: i64) {
        self.applied.send_if_modified(|r| {
            if revision > *r {
                *r = revision;
                true
            } else {
                false
            }
        });
        self.shared
            .metrics()
            .control_plane_revision(self.revision());
    }

    /// A client to write with, if the watch is up.
    fn writer(&self) -> Result<Client, ChangeError> {
        match (self.connected(), self.client.load_full()) {
            (true, Some(c)) => Ok((*c).clone()),
            _ => Err(ChangeError::Unavailable(
                "the control plane (etcd) is not reachable: registrations cannot be changed now; \
                 the policy in force stays"
                    .into(),
            )),
        }
    }

    /// A call to etcd, bounded by `request_timeout`; a failure is counted under `kind`.
    async fn call<T>(
        &self,
        kind: &str,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, ChangeError> {
        let out = match tokio::time::timeout(self.cfg.request_timeout, fut).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => format!("etcd: {e}"),
            Err(_) => format!(
                "etcd did not answer within {} ms",
                self.cfg.request_timeout.as_millis()
            ),
        };
        self.shared.metrics().control_plane_error(kind, 1);
        tracing::warn!(kind, error = %out, "control plane call failed");
        Err(ChangeError::Unavailable(out.into()))
    }

    /// A write sent to etcd, bounded by `request_timeout`: a failure after sending is an
    /// unknown outcome (504), never a 503 — the transaction may have committed.
    async fn write<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, ChangeError> {
        let before = self.revision();
        self.call("write", fut)
            .await
            .map_err(|e| ChangeError::Outcome {
                detail: format!(
                    "{e}; the write was sent and may have been applied: read the sandbox (or retry the same PUT, which is idempotent) once this replica's revision passes {before}"
                ),
                committed: false,
                revision: before,
            })
    }

    /// Wait until this replica has applied `revision`.
    async fn applied(&self, revision: i64) -> Result<(), ChangeError> {
        let mut rx = self.applied.subscribe();
        let reached = tokio::time::timeout(self.cfg.request_timeout, async {
            rx.wait_for(|r| *r >= revision).await.is_ok()
        })
        .await;
        match reached {
            Ok(true) => Ok(()),
            _ => Err(ChangeError::Outcome {
                detail: format!(
                    "committed to etcd at revision {revision}, but this replica has not applied it within {} ms: every replica enforces it once its revision reaches {revision}",
                    self.cfg.request_timeout.as_millis()
                ),
                committed: true,
                revision,
            }),
        }
    }

    /// `PUT /v1/sandboxes/{id}[?ttl_s=N]`: whether the sandbox is new, and the revision
    /// written (every replica whose `egress_control_plane_revision` reached it enforces it).
    pub async fn put(
        &self,
        id: &str,
        body: &str,
        ttl_s: Option<i64>,
    ) -> Result<(bool, i64), ChangeError> {
        let mut client = self.writer()?;
        let key = self.cfg.sandbox_key(id);
        // Granted after the first validation passed: an invalid body leaves no lease behind.
        let mut lease = None;
        for _ in 0..WRITE_ATTEMPTS {
            let prepared = {
                let (control, id, body) = (self.control.clone(), id.to_string(), body.to_string());
                tokio::task::spawn_blocking(move || control.prepare_put(&id, &body))
                    .await
                    .map_err(|e| ChangeError::Failed(caused("control task", e)))??
            };
            if let (Some(ttl), None) = (ttl_s, lease) {
                lease = Some(
                    self.call("write", client.lease_grant(ttl, None))
                        .await?
                        .id(),
                );
            }
            let mut opts = PutOptions::new().with_prev_key();
            if let Some(l) = lease {
                opts = opts.with_lease(l);
            }
            // Written only if nobody changed the key since this replica validated against it.
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    prepared.seen_revision,
                )])
                .and_then([TxnOp::put(key.clone(), prepared.json, Some(opts))]);
            let resp = self.write(client.txn(txn)).await?;
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            if !resp.succeeded() {
                // Nothing was written: catch up with the newer value, then validate again.
                self.applied(revision).await.map_err(|_| {
                    ChangeError::Unavailable(
                        format!(
                            "sandbox {id} changed in etcd (revision {revision}) and this replica has not caught up; nothing was written"
                        )
                        .into(),
                    )
                })?;
                continue;
            }
            let created = resp.op_responses().into_iter().all(|r| match r {
                etcd_client::TxnOpResponse::Put(p) => p.prev_key().is_none(),
                _ => true,
            });
            return self.in_force(id, revision, created).await;
        }
        Err(ChangeError::Conflict(
            format!("sandbox {id} kept changing in etcd while this call tried to write it; retry")
                .into(),
        ))
    }

    /// After a put at `revision`: once this replica applied it, whether the value is in force
    /// (whether the sandbox is new, and the revision) or was skipped, and why.
    async fn in_force(
        &self,
        id: &str,
        revision: i64,
        created: bool,
    ) -> Result<(bool, i64), ChangeError> {
        self.applied(revision).await?;
        let control = self.control.clone();
        let sid = id.to_string();
        let skipped = tokio::task::spawn_blocking(move || control.skipped_at(&sid, revision))
            .await
            .map_err(|e| ChangeError::Failed(caused("control task", e)))?;
        match skipped {
            None => {
                tracing::info!(
                    sandbox = id,
                    revision,
                    created,
                    "sandbox registered in etcd"
                );
                Ok((created, revision))
            }
            // Only a concurrent change can get here (another sandbox took the same sources in
            // between): every replica skips the value alike.
            Some(why) => Err(ChangeError::Conflict(
                format!("written at revision {revision} but not in force: {why}").into(),
            )),
        }
    }

    /// `DELETE /v1/sandboxes/{id}`: how many exchanges were open here (they are revoked on
    /// every replica as each applies the deletion), and the revision of the deletion.
    pub async fn delete(&self, id: &str) -> Result<(u32, i64), ChangeError> {
        let mut client = self.writer()?;
        let open = {
            let (control, id) = (self.control.clone(), id.to_string());
            tokio::task::spawn_blocking(move || control.prepare_delete(&id))
                .await
                .map_err(|e| ChangeError::Failed(caused("control task", e)))??
        };
        let key = self.cfg.sandbox_key(id);
        let resp = self
            .write(client.delete(key, Some(DeleteOptions::new().with_prev_key())))
            .await?;
        if resp.deleted() == 0 {
            return Err(ChangeError::NotFound);
        }
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.applied(revision).await?;
        tracing::info!(
            sandbox = id,
            revision,
            revoked = open,
            "sandbox removed from etcd"
        );
        Ok((open, revision))
    }

    /// `POST /v1/sandboxes/{id}/keepalive`: refresh the sandbox's lease; returns its TTL.
    pub async fn keepalive(&self, id: &str) -> Result<i64, ChangeError> {
        SandboxId::new(id).map_err(|_| ChangeError::NotFound)?;
        let mut client = self.writer()?;
        let resp = self
            .call("write", client.get(self.cfg.sandbox_key(id), None))
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Err(ChangeError::NotFound);
        };
        let lease = kv.lease();
        if lease == 0 {
            return Err(ChangeError::Conflict(
                format!("sandbox {id} was registered without ttl_s: it has no lease to refresh")
                    .into(),
            ));
        }
        match tokio::time::timeout(self.cfg.request_timeout, client.lease_keep_alive(lease)).await {
            Ok(Ok(_keeper)) => {}
            // The lease expired between the read and the refresh: the key is gone too.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                return Err(ChangeError::NotFound)
            }
            Ok(Err(e)) => {
                self.shared.metrics().control_plane_error("write", 1);
                return Err(ChangeError::Unavailable(caused("etcd", e)));
            }
            Err(_) => {
                self.shared.metrics().control_plane_error("write", 1);
                return Err(ChangeError::Unavailable("etcd did not answer".into()));
            }
        }
        let ttl = self
            .call("write", client.lease_time_to_live(lease, None))
            .await?
            .ttl();
        Ok(ttl)
    }

    /// What `GET /v1/sandboxes` shows about the control plane.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": "etcd",
            "endpoints": self.cfg.endpoints,
            "prefix": self.cfg.prefix,
            "connected": self.connected(),
            "revision": self.revision(),
        })
    }
}

/// Backoff between reconnection attempts: doubling from 100 ms to 5 s, with jitter.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Backoff(Self::FIRST)
    }

    fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    /// The next wait (between half and all of the current step).
    fn next(&mut self) -> Duration {
        let step = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        step / 2 + step.mul_f64(f64::from(nanos % 1000) / 2000.0)
    }
}
