//! Unit tests of [`super`].

use super::*;
use std::sync::mpsc;
use std::time::Duration;

const BODY: &str =
    r#"{"policy": {"provider": "local", "config": {}, "network": {"egress": ["api.test"]}}}"#;

fn controller(dir: &std::path::Path) -> Arc<Controller> {
    let yaml = format!(
            "audit: {{ path: {} }}\nsandboxes:\n  - id: file\n    policy: {{ provider: local, config: {{}}, network: {{ egress: [\"x.test\"] }} }}\n",
            dir.join("audit.jsonl").display()
        );
    let config = crate::config::load_str(&yaml, "test.yaml", dir, None).unwrap();
    let shared = crate::server::start_shared(&config, vec![]).unwrap();
    Arc::new(Controller::new(shared, None, config, vec![]))
}

/// Readers never wait for the controller's lock: while a change holds it (a slow
/// `state_dir` fsync, a large batch from etcd), `GET /v1/sandboxes[/{id}]` — called on a
/// runtime worker — and the etcd write checks still answer, from the published view.
/// A PUT waits for the lock only to apply, and then applies. (The timeout detects a
/// reader stuck on the lock; it is not a speed limit.)
#[test]
fn reads_and_write_checks_answer_while_the_lock_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let c = controller(dir.path());
    assert!(c.put("a", BODY).unwrap());
    let held = c.state.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = c.clone();
    std::thread::spawn(move || {
        let listed = reader.list();
        let one = reader.get("a");
        let prepared = reader.prepare_put("b", BODY).map(|p| p.seen_revision);
        let refused = reader.prepare_delete("file").map_err(|e| e.status());
        let skipped = reader.has_skipped();
        let _ = tx.send((listed, one, prepared.ok(), refused.err(), skipped));
    });
    let (listed, one, prepared, refused, skipped) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a reader waited for the controller's lock");
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(one.unwrap()["origin"], "api");
    assert_eq!(prepared, Some(0));
    assert_eq!(refused, Some(409));
    assert!(!skipped);
    // A PUT started now applies once the lock is released.
    let writer = c.clone();
    let put = std::thread::spawn(move || writer.put("b", BODY));
    drop(held);
    assert!(put.join().unwrap().unwrap());
    assert_eq!(c.list()["sandboxes"].as_array().unwrap().len(), 3);
    assert_eq!(c.get("b").unwrap()["origin"], "api");
}

/// Every kind of change — a PUT, an etcd batch with a value skipped, a DELETE — publishes
/// the view that the lock-free readers answer from.
#[test]
fn every_change_publishes_the_view_readers_see() {
    let dir = tempfile::tempdir().unwrap();
    let c = controller(dir.path());
    assert!(c.get("a").is_none());
    c.put("a", BODY).unwrap();
    assert_eq!(c.view.load().runtime.len(), 1);
    assert!(c.get("a").is_some());
    c.apply_remote(
        vec![RemoteChange::Put {
            id: "r".into(),
            text: "{not json".into(),
            revision: 7,
        }],
        false,
    );
    assert!(c.has_skipped());
    assert!(c.skipped_at("r", 7).is_some());
    c.delete("a").unwrap();
    assert!(c.get("a").is_none());
    assert_eq!(c.list()["sandboxes"].as_array().unwrap().len(), 1);
}
