//! What the grants' and the layers' loops share ([`super::grants`], [`super::layers`]): wait
//! until the registrations' session has connected, list a prefix and watch it from the next
//! revision, and start over a second after any failure (a list again takes in what was
//! missed meanwhile).

use crate::policy::cause::{self as cause};
use std::future::Future;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, WatchOptions, WatchStream};

use super::ControlPlane;
use crate::control::error::{etcd, ControlError};

/// How often a replica not yet connected looks again.
const WAIT: Duration = Duration::from_millis(20);

/// Run `session` whenever the replica is connected, until the task is aborted; `what` names
/// it in the warning an interrupted session logs.
pub(super) async fn keep_watching<F, Fut>(cp: &ControlPlane, what: &'static str, mut session: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), ControlError>>,
{
    loop {
        // Until the registrations' session is up (it connects), look often: the prefix is
        // listed within [`WAIT`] of the replica becoming ready.
        if !cp.connected() {
            tokio::time::sleep(WAIT).await;
            continue;
        }
        if let Err(e) = session().await {
            tracing::warn!(error = %e, what, "control plane: watch interrupted; retrying");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What `prefix` holds now, and a watch of it from the next revision.
pub(super) async fn list_then_watch(
    cp: &ControlPlane,
    prefix: &str,
) -> Result<(Vec<KeyValue>, WatchStream), ControlError> {
    let Some(client) = cp.client.load_full() else {
        return Err(etcd("not connected yet"));
    };
    let mut client = (*client).clone();
    let listed = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| etcd(cause::of(e)))?;
    let revision = listed.header().map(|h| h.revision()).unwrap_or(0);
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let stream = client
        .watch(prefix, Some(opts))
        .await
        .map_err(|e| etcd(cause::of(e)))?;
    Ok((listed.kvs().to_vec(), stream))
}

/// The next changes a watch of a prefix reports, each a key and its value (`None`: deleted);
/// `Ok(None)` when etcd closed the watch; `Err` when it was cancelled or compacted (the
/// session starts over and lists again).
pub(super) async fn changes(
    stream: &mut WatchStream,
) -> Result<Option<Vec<Changed>>, ControlError> {
    let Some(resp) = stream.message().await.map_err(|e| etcd(cause::of(e)))? else {
        return Ok(None);
    };
    if resp.canceled() || resp.compact_revision() > 0 {
        return Err(etcd("the watch was cancelled or compacted"));
    }
    let put = etcd_client::EventType::Put;
    Ok(Some(
        resp.events()
            .iter()
            .filter_map(|ev| {
                let kv = ev.kv()?;
                Some((
                    kv.key().to_vec(),
                    (ev.event_type() == put).then(|| kv.value().to_vec()),
                ))
            })
            .collect(),
    ))
}

/// A key and its new value (`None`: deleted).
pub(super) type Changed = (Vec<u8>, Option<Vec<u8>>);
