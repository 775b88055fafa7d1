//! Tests of [`super`] (audit).

use super::*;
use crate::policy::reason::Reason;

#[test]
fn dropping_the_guard_writes_one_end_record_with_the_time_since_accept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl");
    let sink = Sink {
        log: Arc::new(AuditLog::open(Some(&path), 1000).unwrap()),
        metrics: Arc::new(Metrics::new().unwrap()),
        denials: Default::default(),
        usage: Default::default(),
    };
    let accepted = Accepted {
        conn_id: 9,
        client: "127.0.0.1:4".parse().unwrap(),
        started: Instant::now() - std::time::Duration::from_millis(25),
    };
    {
        let mut g = AuditGuard::new(sink.clone(), &accepted, Mode::Connect, "v1".into());
        g.decision(&Decision::deny(Reason::AuthRequired, None));
        g.open();
    }
    sink.log.close(std::time::Duration::from_secs(5));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["event"], "open");
    assert_eq!(lines[1]["event"], "end");
    assert_eq!(lines[1]["reason"], "auth_required");
    assert_eq!(lines[1]["close"], "eof");
    assert!(lines[1]["duration_ms"].as_u64().unwrap() >= 25);
    assert!(sink
        .metrics
        .render()
        .contains("egress_connections_total{decision=\"deny\",mode=\"connect\",reason=\"auth_required\",sandbox=\"-\"} 1"));
}
