//! Tests of [`super`] (quota).

use super::*;
use std::sync::Arc;

#[test]
fn requests_reserved_at_once_never_pass_the_quota() {
    let m = Arc::new(Meter::default());
    m.configure(None, Some(3));
    let ok = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..30 {
            s.spawn(|| {
                if m.reserve().is_ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(ok.load(Ordering::Relaxed), 3);
    assert_eq!(m.reserve(), Err(Spent::Requests));
    m.release();
    assert_eq!(m.reserve(), Ok(()));
    let unmetered = Meter::default();
    assert_eq!(unmetered.reserve(), Ok(()));
}

#[test]
fn a_quota_refuses_at_its_count_and_a_raise_lifts_it() {
    let m = Meter::default();
    m.configure(Some(1000), Some(3));
    assert!(m.metered());
    m.moved(999);
    assert_eq!(m.spent(), None);
    m.moved(1);
    assert_eq!(m.spent(), Some(Spent::Bytes));
    m.configure(Some(2000), Some(3));
    assert_eq!(m.spent(), None);
    m.reserve().unwrap();
    m.reserve().unwrap();
    assert_eq!(m.spent(), None);
    m.reserve().unwrap();
    assert_eq!(m.spent(), Some(Spent::Requests));
    m.configure(None, None);
    assert!(!m.metered());
    assert_eq!(m.spent(), None);
}

#[test]
fn others_count_toward_the_quota_and_old_days_are_ignored() {
    let m = Meter::default();
    m.configure(Some(100), None);
    m.others(DayCount {
        day: today(),
        bytes: 90,
        requests: 0,
        ..DayCount::default()
    });
    m.moved(10);
    assert_eq!(m.spent(), Some(Spent::Bytes));
    let m = Meter::default();
    m.configure(Some(100), None);
    m.restore(DayCount {
        day: today() - 1,
        bytes: 500,
        requests: 5,
        ..DayCount::default()
    });
    assert_eq!(m.mine().bytes, 0);
    m.restore(DayCount {
        day: today(),
        bytes: 100,
        requests: 5,
        ..DayCount::default()
    });
    assert_eq!(m.spent(), Some(Spent::Bytes));
}

#[test]
fn per_destination_entries_are_validated_and_match_their_hosts() {
    use crate::config::load_str;
    use std::path::Path;
    let load = |limits: &str| {
        let text = format!(
            "sandboxes:\n  - {{ id: a, limits: {limits}, policy: {{ provider: local, config: {{}}, network: {{ egress: [\"x.test\"] }} }} }}\n"
        );
        load_str(&text, "t", Path::new("."), None).map_err(|e| e.to_string())
    };
    let c = load("{ per_destination: [{ host: API.Example.com., bytes_per_day: 5 }, { host: \"*.s3.test\", requests_per_day: 1 }] }").unwrap();
    let q = &c.bindings[0].limits.per_destination;
    assert_eq!(q[0].host, "api.example.com");
    assert!(q[0].matches("api.example.com") && !q[0].matches("x.api.example.com"));
    assert!(q[1].matches("b.s3.test") && q[1].matches("a.b.s3.test"));
    assert!(!q[1].matches("s3.test") && !q[1].matches("evils3.test"));
    for (bad, says) in [
        (
            "{ per_destination: [{ host: a.test }] }",
            "needs bytes_per_day, requests_per_day, tokens_per_day or cost_per_day",
        ),
        (
            "{ per_destination: [{ host: a.test, bytes_per_day: 0 }] }",
            "positive",
        ),
        (
            "{ per_destination: [{ host: \"a.*.test\", bytes_per_day: 1 }] }",
            "per_destination[0].host",
        ),
        ("{ per_destination: [{ host: a.test, bytes: 1 }] }", "bytes"),
        ("{ bytes_per_day: 0 }", "bytes_per_day"),
        ("{ tokens_per_day: 0 }", "tokens_per_day"),
        ("{ cost_per_day: -1 }", "cost_per_day"),
        ("{ cost_per_day: .nan }", "cost_per_day"),
        (
            "{ per_destination: [{ host: a.test, cost_per_day: 0 }] }",
            "positive",
        ),
    ] {
        let e = load(bad).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[tokio::test]
async fn exceeded_wakes_a_waiting_relay() {
    let m = Arc::new(Meter::default());
    m.configure(Some(10), None);
    let waiter = tokio::spawn({
        let m = m.clone();
        async move { m.exceeded().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    m.moved(10);
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken")
        .expect("joined");
}

/// Counts from etcd are untrusted numbers: `u64::MAX` from another replica refuses,
/// never panics (security review: checked arithmetic on every number from outside).
#[test]
fn counts_from_outside_saturate_instead_of_overflowing() {
    let m = Meter::default();
    m.configure(Some(10), Some(10));
    let day = m.mine().day;
    m.others(DayCount {
        day,
        bytes: u64::MAX,
        requests: u64::MAX,
        ..DayCount::default()
    });
    assert!(m.reserve().is_err());
    assert!(m.moved(u64::MAX));
    assert!(m.spent().is_some());
}
