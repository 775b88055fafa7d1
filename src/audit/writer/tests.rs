//! Tests of [`super`] (writer).

use super::*;
use crate::audit::record::{Close, Mode, Record};
use crate::config::audit::Format;
use std::time::SystemTime;

fn entry(i: u64, event: Event) -> Entry {
    Entry {
        event,
        at: SystemTime::now(),
        record: Record::new(i, "127.0.0.1:1".parse().unwrap(), Mode::Connect, "v".into()),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        close: (event == Event::End).then_some(Close::Eof),
    }
}

#[test]
fn every_entry_reaches_the_file_before_close_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(Some(&path), 10_000).unwrap();
    for i in 0..1000 {
        log.write(entry(i, Event::End));
    }
    assert_eq!(log.close(Duration::from_secs(10)), 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1000);
    assert_eq!(lines[999]["conn_id"], 999);
    assert_eq!(lines[0]["close"], "eof");
}

#[test]
fn an_open_record_is_written_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(Some(&path), 10).unwrap();
    log.write(entry(1, Event::Open));
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(&path)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    log.close(Duration::from_secs(1));
}

/// A sink that never accepts a byte: the queue saturates at `queue_max`, and close gives
/// up at its deadline (and the spill's), saying how many records were lost.
#[test]
fn a_stuck_sink_saturates_the_queue_and_close_keeps_its_deadline() {
    let (reader, writer) = std::io::pipe().unwrap();
    // Fill the pipe so that every further write blocks.
    let mut w = writer.try_clone().unwrap();
    let fill = std::thread::spawn(move || {
        let chunk = vec![b'x'; 65536];
        while w.write_all(&chunk).is_ok() {}
    });
    std::thread::sleep(Duration::from_millis(200));
    let inner = Inner::new(OnFailure::Refuse, 50);
    let i = inner.clone();
    let w = Writer::new(
        Output::other(Box::new(writer)),
        None,
        None,
        Format::Json,
        None,
    );
    std::thread::spawn(move || write_loop(&i, w));
    let log = AuditLog { inner };
    for i in 0..100 {
        log.write(entry(i, Event::End));
    }
    assert_eq!(log.unavailable(), Some(Unavailable::Saturated));
    let started = Instant::now();
    let lost = log.close(Duration::from_millis(300));
    // Bounded: the writer is stuck in a write, so even the spill cannot happen.
    assert!(started.elapsed() < Duration::from_millis(300) + SPILL_WAIT + Duration::from_secs(3));
    assert_eq!(lost, 100);
    drop(reader);
    let _ = fill.join();
}

/// A stream that can be made to fail: while `broken`, it takes 7 bytes once (half a
/// line), then fails with ENOSPC.
struct Flaky {
    broken: Arc<AtomicBool>,
    took_partial: bool,
    got: Arc<Mutex<Vec<u8>>>,
}

impl Write for Flaky {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.broken.load(Ordering::SeqCst) {
            if !self.took_partial && b.len() > 7 {
                self.took_partial = true;
                self.got.lock().unwrap().extend_from_slice(&b[..7]);
                return Ok(7);
            }
            return Err(std::io::Error::from_raw_os_error(28));
        }
        self.took_partial = false;
        self.got.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn flaky_log(on_failure: OnFailure) -> (AuditLog, Arc<AtomicBool>, Arc<Mutex<Vec<u8>>>) {
    let broken = Arc::new(AtomicBool::new(false));
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = Flaky {
        broken: broken.clone(),
        took_partial: false,
        got: got.clone(),
    };
    let inner = Inner::new(on_failure, 1000);
    let i = inner.clone();
    let w = Writer::new(
        Output::other(Box::new(sink)),
        None,
        None,
        Format::Json,
        None,
    );
    std::thread::spawn(move || write_loop(&i, w));
    (AuditLog { inner }, broken, got)
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn conn_ids(got: &Mutex<Vec<u8>>) -> Vec<u64> {
    let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| {
                panic!("not a complete record: {l:?}: {e}");
            });
            v["conn_id"].as_u64().unwrap()
        })
        .collect()
}

/// `refuse`: a failed write loses nothing. The sink is unavailable while it fails, the
/// half-written line is completed, and every record arrives once, in order.
#[test]
fn a_failing_sink_keeps_every_record_and_refuses_meanwhile() {
    let (log, broken, got) = flaky_log(OnFailure::Refuse);
    log.write(entry(0, Event::End));
    wait_until("the first record", || !got.lock().unwrap().is_empty());
    broken.store(true, Ordering::SeqCst);
    for i in 1..=50 {
        log.write(entry(i, Event::End));
    }
    wait_until("the failure", || log.unavailable().is_some());
    assert_eq!(log.unavailable(), Some(Unavailable::Failing));
    let st = log.health().status();
    assert!(st.failing_for.is_some());
    assert_eq!(st.dropped, 0);
    // Records of connections already open still arrive while it fails.
    for i in 51..=60 {
        log.write(entry(i, Event::End));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(log.unavailable(), Some(Unavailable::Failing));
    broken.store(false, Ordering::SeqCst);
    wait_until("the recovery", || log.unavailable().is_none());
    assert_eq!(log.close(Duration::from_secs(5)), 0);
    assert_eq!(conn_ids(&got), (0..=60).collect::<Vec<_>>());
    assert_eq!(log.health().status().dropped, 0);
}

/// `continue`: the sink stays available; what could not be written is counted, and
/// the stream's half line is ended so that every later line parses.
#[test]
fn continue_drops_and_counts_what_it_cannot_write() {
    let (log, broken, got) = flaky_log(OnFailure::Continue);
    log.write(entry(0, Event::End));
    wait_until("the first record", || !got.lock().unwrap().is_empty());
    broken.store(true, Ordering::SeqCst);
    for i in 1..=20 {
        log.write(entry(i, Event::End));
    }
    wait_until("the drops", || log.health().status().dropped == 20);
    assert_eq!(log.unavailable(), None);
    broken.store(false, Ordering::SeqCst);
    for i in 21..=30 {
        log.write(entry(i, Event::End));
    }
    assert_eq!(log.close(Duration::from_secs(5)), 0);
    let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The first record, the broken half line, then 21..=30.
    assert_eq!(lines.len(), 12, "{text}");
    assert!(serde_json::from_str::<serde_json::Value>(lines[1]).is_err());
    let after: Vec<u64> = lines[2..]
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["conn_id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(after, (21..=30).collect::<Vec<_>>());
    assert_eq!(log.health().status().dropped, 20);
    assert!(!log.health().failing());
}
