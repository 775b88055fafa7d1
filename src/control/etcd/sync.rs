//! Keeping a replica in step with etcd: list the prefix (in pages, at one revision), apply it
//! as a whole, then watch from the next revision and apply each batch of events in order.
//! A compacted start revision lists again (the diff removes what disappeared meanwhile); a
//! failure waits with backoff and starts over. Readiness (`/readyz`) waits for the first list
//! and the watch after it (only then are writes taken).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};

use super::{connect::connect, Backoff, ControlPlane};
use crate::control::RemoteChange;

/// Keys per page when listing.
const PAGE: i64 = 1_000;
/// Largest message accepted from etcd (a page of large bindings, a burst of events).
const MAX_MESSAGE: usize = 256 << 20;

/// Why a session ended.
enum Interrupt {
    /// The watch start revision was compacted away: list again at once.
    Compacted(i64),
    /// A reload may have made skipped values valid: list again at once.
    Reloaded,
    /// Something failed (`kind` labels the error counter): wait, reconnect, list again.
    Failed(&'static str, String),
}

fn failed(kind: &'static str) -> impl Fn(etcd_client::Error) -> Interrupt {
    move |e| Interrupt::Failed(kind, e.to_string())
}

/// Run sessions until aborted.
pub(super) async fn run(cp: Arc<ControlPlane>) {
    let mut backoff = Backoff::new();
    loop {
        match session(&cp, &mut backoff).await {
            Interrupt::Reloaded => {
                tracing::info!(
                    "control plane: configuration reloaded; checking skipped values again"
                );
            }
            Interrupt::Compacted(rev) => {
                cp.shared.metrics().control_plane_error("compacted", 1);
                tracing::warn!(
                    compact_revision = rev,
                    "control plane: watch revision compacted; listing again"
                );
            }
            Interrupt::Failed(kind, why) => {
                cp.set_connected(false);
                cp.shared.metrics().control_plane_error(kind, 1);
                // A new client next time (new connections, a re-read password).
                cp.client.store(None);
                let wait = backoff.next();
                tracing::warn!(
                    kind,
                    error = %why,
                    retry_in_ms = wait.as_millis() as u64,
                    revision = cp.revision(),
                    "control plane unreachable; enforcing the registrations applied so far"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// One session: connect, list, watch. Returns only when it ends.
async fn session(cp: &ControlPlane, backoff: &mut Backoff) -> Interrupt {
    let client = match cp.client.load_full() {
        Some(c) => (*c).clone(),
        None => match connect(&cp.cfg).await {
            Ok(c) => {
                cp.client.store(Some(Arc::new(c.clone())));
                c
            }
            Err(e) => return Interrupt::Failed("connect", e.to_string()),
        },
    };
    let revision = match list(cp, &client).await {
        Ok(r) => r,
        Err(i) => return i,
    };
    let prefix = cp.cfg.sandboxes_prefix();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let mut watch = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
    let mut stream = match watch.watch(prefix.clone(), Some(opts)).await {
        Ok(s) => s,
        Err(e) => return failed("watch")(e),
    };
    cp.set_connected(true);
    backoff.reset();
    tracing::info!(revision, "control plane: watching etcd");
    // Ready once registrations are loaded *and* writes can be taken: a runtime that writes
    // as soon as `/readyz` says 200 must not get a 503.
    if !cp.shared.ready.swap(true, Ordering::AcqRel) {
        tracing::info!(revision, "control plane: ready");
    }
    let mut reloads = cp.control.subscribe_reloads();
    reloads.borrow_and_update();
    loop {
        let message = tokio::select! {
            m = stream.message() => m,
            changed = reloads.changed() => {
                if changed.is_ok() && cp.control.has_skipped() {
                    return Interrupt::Reloaded;
                }
                continue;
            }
        };
        let resp = match message {
            Ok(Some(r)) => r,
            Ok(None) => return Interrupt::Failed("watch", "etcd closed the watch".into()),
            Err(e) => return failed("watch")(e),
        };
        if resp.compact_revision() > 0 {
            return Interrupt::Compacted(resp.compact_revision());
        }
        if resp.canceled() {
            return Interrupt::Failed(
                "watch",
                format!("etcd cancelled the watch: {}", resp.cancel_reason()),
            );
        }
        let (changes, last) = changes_of(&prefix, resp.events());
        if !changes.is_empty() {
            apply(cp, changes, false).await;
        }
        if last > 0 {
            cp.set_applied(last);
        }
    }
}

/// The registrations a batch of watch events changes, and the last revision among them.
fn changes_of(prefix: &str, events: &[etcd_client::Event]) -> (Vec<RemoteChange>, i64) {
    let mut changes = Vec::with_capacity(events.len());
    let mut last = 0;
    for ev in events {
        let Some(kv) = ev.kv() else { continue };
        last = last.max(kv.mod_revision());
        let Some(id) = id_of(prefix, kv) else {
            continue;
        };
        changes.push(match ev.event_type() {
            EventType::Put => put(id, kv),
            EventType::Delete => RemoteChange::Delete { id },
        });
    }
    (changes, last)
}

/// List the prefix at one revision, in pages, and apply it as the whole set. Returns the
/// revision listed.
async fn list(cp: &ControlPlane, client: &Client) -> Result<i64, Interrupt> {
    let prefix = cp.cfg.sandboxes_prefix();
    let end = prefix_end(prefix.as_bytes());
    let mut kv_client = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut entries: Vec<(i64, RemoteChange)> = Vec::new();
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if revision > 0 {
            opts = opts.with_revision(revision);
        }
        let resp = tokio::time::timeout(
            cp.cfg.request_timeout,
            kv_client.get(from.clone(), Some(opts)),
        )
        .await
        .map_err(|_| Interrupt::Failed("list", "etcd did not answer the list in time".into()))?
        .map_err(failed("list"))?;
        if revision == 0 {
            revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in resp.kvs() {
            if let Some(id) = id_of(&prefix, kv) {
                entries.push((kv.mod_revision(), put(id, kv)));
            }
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    // Revision order, as the watch would have delivered them: every replica resolves a
    // clash (two sandboxes claiming the same sources) the same way.
    entries.sort_by_key(|(rev, _)| *rev);
    let count = entries.len();
    apply(cp, entries.into_iter().map(|(_, c)| c).collect(), true).await;
    cp.set_applied(revision);
    tracing::info!(
        revision,
        sandboxes = count,
        "control plane: registrations loaded"
    );
    Ok(revision)
}

/// Apply changes on the blocking pool (compiling is CPU work, under the controller's lock).
async fn apply(cp: &ControlPlane, changes: Vec<RemoteChange>, full: bool) {
    let control = cp.control.clone();
    match tokio::task::spawn_blocking(move || control.apply_remote(changes, full)).await {
        Ok(applied) => {
            if applied.skipped > 0 {
                cp.shared
                    .metrics()
                    .control_plane_error("invalid_value", applied.skipped as u64);
            }
        }
        Err(e) => tracing::error!(error = %e, "control plane: applying changes failed"),
    }
}

/// The sandbox id a key names (`None` for keys outside `{prefix}sandboxes/`).
fn id_of(prefix: &str, kv: &KeyValue) -> Option<String> {
    let key = std::str::from_utf8(kv.key()).ok()?;
    key.strip_prefix(prefix).map(str::to_string)
}

fn put(id: String, kv: &KeyValue) -> RemoteChange {
    RemoteChange::Put {
        id,
        text: String::from_utf8_lossy(kv.value()).into_owned(),
        revision: kv.mod_revision(),
    }
}

/// The smallest key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(
            prefix_end(b"/egress-proxy/sandboxes/"),
            b"/egress-proxy/sandboxes0"
        );
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
