//! Policy layers shared through etcd: every runtime layer is the JSON of its body under
//! `{prefix}layers/{id}`, and every replica lists and watches that prefix and applies the
//! whole map ([`Controller::apply_layers`]) on each change — so replicas agree on the layers
//! as they agree on the registrations. A write through any replica's API is checked first
//! (400/409 as without etcd), written, then applied on that replica before the answer
//! (read-your-write); the watch delivers the same value again and changes nothing. A map a
//! replica cannot apply (a layer written to etcd directly with a missing parent) is logged
//! and the layers in force stay: never fewer layers, never open.

use std::collections::BTreeMap;
use std::sync::Arc;

use etcd_client::{DeleteOptions, PutOptions};

use super::ControlPlane;
use crate::config::layers::RawLayer;
use crate::control::error::{etcd, ControlError};
use crate::control::ChangeError;
use crate::policy::cause::{caused, of};

impl ControlPlane {
    fn layer_key(&self, id: &str) -> String {
        format!("{}layers/{id}", self.cfg.prefix)
    }

    /// `PUT` (`Some`) or `DELETE` (`None`) of runtime layer `id` through etcd.
    pub async fn set_layer(&self, id: &str, layer: Option<RawLayer>) -> Result<bool, ChangeError> {
        let mut client = self.writer()?;
        let (control, check_id, check) = (self.control.clone(), id.to_string(), layer.clone());
        tokio::task::spawn_blocking(move || control.check_layer(&check_id, check.as_ref()))
            .await
            .map_err(|e| ChangeError::Failed(caused("control task", e)))??;
        let key = self.layer_key(id);
        let created = match &layer {
            Some(l) => {
                let text = serde_json::to_string(l).map_err(|e| ChangeError::Failed(of(e)))?;
                let opts = PutOptions::new().with_prev_key();
                let resp = self.write(client.put(key, text, Some(opts))).await?;
                resp.prev_key().is_none()
            }
            None => {
                let opts = DeleteOptions::new().with_prev_key();
                let resp = self.write(client.delete(key, Some(opts))).await?;
                if resp.deleted() == 0 {
                    return Err(ChangeError::NotFound);
                }
                false
            }
        };
        // Applied here before the answer (the watch brings the same value again).
        let (control, id) = (self.control.clone(), id.to_string());
        let applied = tokio::task::spawn_blocking(move || control.set_layer(&id, layer))
            .await
            .map_err(|e| ChangeError::Failed(caused("control task", e)))?;
        match applied {
            Ok(_) | Err(ChangeError::NotFound) => Ok(created),
            Err(e) => Err(e),
        }
    }
}

/// Keep this replica's runtime layers in step with etcd until the task is aborted.
pub async fn run(cp: Arc<ControlPlane>) {
    super::watched::keep_watching(&cp, "layers", || session(&cp)).await
}

async fn session(cp: &ControlPlane) -> Result<(), ControlError> {
    let prefix = format!("{}layers/", cp.cfg.prefix);
    let (listed, mut stream) = super::watched::list_then_watch(cp, &prefix).await?;
    let mut layers: BTreeMap<String, RawLayer> = BTreeMap::new();
    for kv in &listed {
        take(&mut layers, &prefix, kv.key(), Some(kv.value()));
    }
    apply(cp, layers.clone()).await;
    while let Some(changed) = super::watched::changes(&mut stream).await? {
        for (key, value) in changed {
            take(&mut layers, &prefix, &key, value.as_deref());
        }
        apply(cp, layers.clone()).await;
    }
    Err(etcd("etcd closed the watch"))
}

/// One key's value into `layers` (`None`: deleted). A value that is not a layer is skipped,
/// with a warning.
fn take(layers: &mut BTreeMap<String, RawLayer>, prefix: &str, key: &[u8], value: Option<&[u8]>) {
    let key = String::from_utf8_lossy(key);
    let Some(id) = key.strip_prefix(prefix) else {
        return;
    };
    match value.map(serde_json::from_slice::<RawLayer>) {
        None => {
            layers.remove(id);
        }
        Some(Ok(l)) if l.id == id => {
            layers.insert(id.to_string(), l);
        }
        Some(_) => tracing::warn!(
            layer = id,
            "control plane: a value under layers/ is not a layer; skipped"
        ),
    }
}

/// Apply the map off the reactor (the controller compiles under its lock).
async fn apply(cp: &ControlPlane, layers: BTreeMap<String, RawLayer>) {
    let control = cp.control.clone();
    match tokio::task::spawn_blocking(move || control.apply_layers(layers)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::error!(error = %e, "control plane: the layers in etcd cannot be applied; the layers in force stay")
        }
        Err(e) => tracing::error!(error = %e, "control plane: applying layers failed"),
    }
}
