//! The audit sink: entries are appended to an in-memory queue that one writer thread drains
//! every few milliseconds, so the data plane never blocks on disk, never formats JSON, and
//! never wakes the writer per record (a context switch per connection was the largest cost at
//! high connection rates). Shutdown waits for the writer to drain and flush.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::record::Entry;

/// How long the writer sleeps between drains: the most an entry waits before it is written.
const DRAIN_EVERY: Duration = Duration::from_millis(5);

/// Entries waiting for the writer, and whether the log is closing.
#[derive(Default)]
struct Queue {
    entries: Vec<Entry>,
    closing: bool,
}

/// The audit sink.
pub struct AuditLog {
    queue: Arc<Mutex<Queue>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl AuditLog {
    /// Open `path` for appending, or stdout when `None`.
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match path {
            Some(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
            None => Box::new(std::io::stdout()),
        };
        let queue = Arc::new(Mutex::new(Queue::default()));
        let q = queue.clone();
        let writer = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(q, out))?;
        Ok(AuditLog {
            queue,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Queue an entry.
    pub fn write(&self, entry: Entry) {
        match self.queue.lock() {
            Ok(mut q) => q.entries.push(entry),
            Err(_) => tracing::error!("audit queue poisoned; a record was lost"),
        }
    }

    /// Close the log and wait until every queued entry is written and flushed.
    pub fn close(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.closing = true;
        }
        let handle = self.writer.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn write_loop(queue: Arc<Mutex<Queue>>, out: Box<dyn Write + Send>) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    let mut batch: Vec<Entry> = Vec::new();
    let mut line = Vec::with_capacity(1024);
    loop {
        let closing = match queue.lock() {
            Ok(mut q) => {
                std::mem::swap(&mut q.entries, &mut batch);
                q.closing
            }
            Err(_) => true,
        };
        write_batch(&mut out, &mut batch, &mut line);
        if closing {
            // Anything queued after the flag was seen goes out too, then stop.
            if let Ok(mut q) = queue.lock() {
                std::mem::swap(&mut q.entries, &mut batch);
            }
            write_batch(&mut out, &mut batch, &mut line);
            return;
        }
        std::thread::sleep(DRAIN_EVERY);
    }
}

/// Encode, write and flush `batch` (emptying it).
fn write_batch(out: &mut impl Write, batch: &mut Vec<Entry>, line: &mut Vec<u8>) {
    if batch.is_empty() {
        return;
    }
    for e in batch.drain(..) {
        line.clear();
        match e.encode(line) {
            Ok(()) => {
                if let Err(err) = out.write_all(line) {
                    eprintln!("audit: write failed: {err}");
                }
            }
            Err(err) => eprintln!("audit: cannot encode a record: {err}"),
        }
    }
    if let Err(err) = out.flush() {
        eprintln!("audit: flush failed: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::record::{Close, Event, Mode, Record};
    use std::time::SystemTime;

    #[test]
    fn every_entry_reaches_the_file_before_close_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(Some(&path)).unwrap();
        let client = "127.0.0.1:1".parse().unwrap();
        for i in 0..1000 {
            log.write(Entry {
                event: Event::End,
                at: SystemTime::now(),
                record: Record::new(i, client, Mode::Connect, "v".into()),
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
                close: Some(Close::Eof),
            });
        }
        log.close();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[999]["conn_id"], 999);
        assert_eq!(lines[0]["close"], "eof");
    }
}
