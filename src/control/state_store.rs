//! Persistence of API registrations: an append-only log, `state_dir/registrations.jsonl`, one
//! JSON line per change — `{"op":"put","id":…,"binding":{…}}` or `{"op":"delete","id":…}` —
//! replayed at start and rewritten (compacted) when superseded lines outnumber live ones.
//!
//! One append per change, instead of a file per sandbox (create, write, rename, and two
//! fsyncs): a file system's metadata operations, not the proxy, set the registration rate then.
//! How durable a `PUT` is before it answers is `runtime.state_sync_ms`:
//! - `0` (the default): the line is on disk (`fdatasync`) before the call returns; a crash of
//!   the process or of the machine loses no acknowledged registration.
//! - `N > 0`: a background thread syncs the log at most every N ms while lines are pending,
//!   and at shutdown. A crash of the *process* loses nothing (the kernel holds the data); a
//!   power loss or kernel crash can lose the registrations of the last N ms. A lost `PUT`
//!   fails closed (the sandbox is unknown after the restart: 407) and the runtime registers
//!   it again.
//! - A `DELETE` is synced before it answers in both modes: a revoked sandbox must not come back
//!   after a power loss.
//!
//! A crash in the middle of an append leaves a partial last line: it is ignored (that change
//! was never acknowledged) and the log is rewritten. Sandboxes persisted by earlier versions
//! as `<id>.json` files are read once, folded into the log and their files removed.

use crate::policy::cause::caused;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::control::error::{store, ControlError};
use serde_json::Value;

/// The log's file name in `state_dir`.
pub const LOG_FILE: &str = "registrations.jsonl";

/// What the log held at start: id → binding body (JSON text), and what could not be read.
#[derive(Default)]
pub struct Restored {
    pub entries: BTreeMap<String, String>,
    pub problems: Vec<String>,
}

/// The open log.
pub struct StateStore {
    dir: PathBuf,
    log: Arc<File>,
    /// Lines in the log, and live entries: compaction is due when superseded lines dominate.
    lines: usize,
    live: usize,
    batch: Option<Arc<Batch>>,
}

/// The pending sync of the batched mode.
struct Batch {
    interval: Duration,
    /// The log written since the last sync (`None`: nothing pending).
    pending: Mutex<Option<Arc<File>>>,
    wake: Condvar,
}

fn put_line(id: &str, json: &str) -> String {
    // `json` is the canonical JSON of the binding, one line already; anything else is
    // re-serialised so that a line is always one change. The id is quoted by serde.
    let json = if json.contains(['\n', '\r']) {
        serde_json::from_str::<Value>(json)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| Value::from(json).to_string())
    } else {
        json.to_string()
    };
    format!(
        "{{\"op\":\"put\",\"id\":{},\"binding\":{json}}}\n",
        Value::from(id)
    )
}

fn delete_line(id: &str) -> String {
    format!("{{\"op\":\"delete\",\"id\":{}}}\n", Value::from(id))
}

impl StateStore {
    /// Open (creating) `dir`, replay its log and any legacy `<id>.json` files, and start the
    /// flusher when `sync` is not zero.
    pub fn open(dir: &Path, sync: Duration) -> std::io::Result<(Self, Restored)> {
        std::fs::create_dir_all(dir)?;
        let mut restored = Restored::default();
        let path = dir.join(LOG_FILE);
        let mut lines = 0usize;
        let mut rewrite = false;
        match std::fs::read(&path) {
            Ok(bytes) => {
                let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                if complete < bytes.len() {
                    restored.problems.push(format!(
                        "{}: ignored a partial last line ({} bytes; a write interrupted by a crash, never acknowledged)",
                        path.display(),
                        bytes.len() - complete
                    ));
                    rewrite = true;
                }
                for (n, line) in bytes[..complete].split(|b| *b == b'\n').enumerate() {
                    if line.is_empty() {
                        continue;
                    }
                    lines += 1;
                    if let Err(why) = replay(line, &mut restored.entries) {
                        restored.problems.push(format!(
                            "{}:{}: skipped: {why}",
                            path.display(),
                            n + 1
                        ));
                        rewrite = true;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let legacy = read_legacy(dir, &mut restored);
        let mut store = StateStore {
            dir: dir.to_path_buf(),
            log: Arc::new(open_append(&path)?),
            lines,
            live: restored.entries.len(),
            batch: None,
        };
        if rewrite || !legacy.is_empty() || store.due() {
            store.compact(
                restored
                    .entries
                    .iter()
                    .map(|(id, json)| (id.as_str(), json.as_str())),
            )?;
            for f in legacy {
                let _ = std::fs::remove_file(f);
            }
        }
        store.batch = Batch::start(sync);
        Ok((store, restored))
    }

    /// Record a registration (new or replaced).
    pub fn put(&mut self, id: &str, json: &str, created: bool) -> std::io::Result<()> {
        self.append(&put_line(id, json), false)?;
        if created {
            self.live += 1;
        }
        Ok(())
    }

    /// Record a removal; synced before it returns, in both modes.
    pub fn delete(&mut self, id: &str) -> std::io::Result<()> {
        self.append(&delete_line(id), true)?;
        self.live = self.live.saturating_sub(1);
        Ok(())
    }

    /// Superseded lines outnumber live ones (and there are enough to bother): rewrite.
    pub fn due(&self) -> bool {
        self.lines > 2 * self.live + 1024
    }

    /// Rewrite the log with `live` only: temp file, fsync, rename, fsync of the directory.
    /// Linear in the live entries; [`Self::due`] keeps it amortised O(1) per change.
    pub fn compact<'a>(
        &mut self,
        live: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(".{LOG_FILE}.tmp"));
        let path = self.dir.join(LOG_FILE);
        let mut count = 0usize;
        {
            let mut w = std::io::BufWriter::new(File::create(&tmp)?);
            for (id, json) in live {
                w.write_all(put_line(id, json).as_bytes())?;
                count += 1;
            }
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        File::open(&self.dir)?.sync_all()?;
        self.log = Arc::new(open_append(&path)?);
        self.lines = count;
        self.live = count;
        Ok(())
    }

    /// Sync what is pending now (at shutdown, in the batched mode).
    pub fn flush(&self) {
        if let Some(b) = &self.batch {
            b.sync_now();
        }
    }

    fn append(&mut self, line: &str, always_sync: bool) -> std::io::Result<()> {
        // One write(2) of the whole line on an O_APPEND descriptor.
        (&*self.log).write_all(line.as_bytes())?;
        self.lines += 1;
        match &self.batch {
            Some(b) if !always_sync => b.mark(&self.log),
            _ => self.log.sync_data()?,
        }
        Ok(())
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Apply one log line to `entries`.
fn replay(line: &[u8], entries: &mut BTreeMap<String, String>) -> Result<(), ControlError> {
    let v: Value = serde_json::from_slice(line).map_err(|e| store(caused("not JSON", e)))?;
    let id = v["id"]
        .as_str()
        .ok_or_else(|| store("no \"id\""))?
        .to_string();
    match v["op"].as_str() {
        Some("put") if v["binding"].is_object() => {
            entries.insert(id, v["binding"].to_string());
        }
        Some("delete") => {
            entries.remove(&id);
        }
        _ => return Err(store("neither a put with a binding nor a delete")),
    }
    Ok(())
}

/// `<id>.json` files of earlier versions: added to `restored` (the log, newer, wins); those
/// folded in are returned, to be removed once the log holds them.
fn read_legacy(dir: &Path, restored: &mut Restored) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    let mut folded = Vec::new();
    for p in &files {
        let id = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = match std::fs::read_to_string(p) {
            Ok(text) => text,
            Err(e) => {
                restored.problems.push(format!("{}: {e}", p.display()));
                continue;
            }
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(v) if v.is_object() => {
                restored.entries.entry(id).or_insert_with(|| v.to_string());
                folded.push(p.clone());
            }
            _ => restored.problems.push(format!(
                "{}: skipped: not a JSON object (left in place)",
                p.display()
            )),
        }
    }
    folded
}

impl Batch {
    fn start(interval: Duration) -> Option<Arc<Batch>> {
        if interval.is_zero() {
            return None;
        }
        let batch = Arc::new(Batch {
            interval,
            pending: Mutex::new(None),
            wake: Condvar::new(),
        });
        let flusher = batch.clone();
        let spawned = std::thread::Builder::new()
            .name("state-sync".into())
            .spawn(move || flusher.run());
        match spawned {
            Ok(_) => Some(batch),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the state_dir flusher: syncing every write");
                None
            }
        }
    }

    fn mark(&self, log: &Arc<File>) {
        if let Ok(mut p) = self.pending.lock() {
            if p.is_none() {
                *p = Some(log.clone());
                self.wake.notify_one();
            }
        }
    }

    fn sync_now(&self) {
        let log = self.pending.lock().ok().and_then(|mut p| p.take());
        if let Some(log) = log {
            if let Err(e) = log.sync_data() {
                tracing::error!(error = %e, "cannot sync the state_dir log");
            }
        }
    }

    /// The flusher: wait for a write, then sync at most once per interval.
    fn run(&self) {
        let mut last = Instant::now();
        loop {
            let Ok(mut pending) = self.pending.lock() else {
                return;
            };
            while pending.is_none() {
                pending = match self.wake.wait(pending) {
                    Ok(p) => p,
                    Err(_) => return,
                };
            }
            drop(pending);
            if let Some(wait) = (last + self.interval).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            self.sync_now();
            last = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reopen(dir: &Path) -> (StateStore, Restored) {
        StateStore::open(dir, Duration::ZERO).unwrap()
    }

    #[test]
    fn replays_puts_and_deletes_in_order() {
        for sync in [Duration::ZERO, Duration::from_millis(5)] {
            let dir = tempfile::tempdir().unwrap();
            let (mut s, r) = StateStore::open(dir.path(), sync).unwrap();
            assert!(r.entries.is_empty() && r.problems.is_empty());
            s.put("a", r#"{"v":1}"#, true).unwrap();
            s.put("b", r#"{"v":2}"#, true).unwrap();
            s.put("a", r#"{"v":3}"#, false).unwrap();
            s.delete("b").unwrap();
            s.flush();
            drop(s);
            let (_, r) = reopen(dir.path());
            assert_eq!(r.problems, Vec::<String>::new());
            assert_eq!(
                r.entries.into_iter().collect::<Vec<_>>(),
                vec![("a".to_string(), r#"{"v":3}"#.to_string())]
            );
        }
    }

    #[test]
    fn a_torn_last_line_is_ignored_and_the_log_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = reopen(dir.path());
        s.put("a", r#"{"v":1}"#, true).unwrap();
        drop(s);
        let path = dir.path().join(LOG_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"op":"put","id":"b","bind"#).unwrap();
        let (mut s, r) = reopen(dir.path());
        assert_eq!(r.entries.keys().collect::<Vec<_>>(), vec!["a"]);
        assert!(
            r.problems[0].contains("partial last line"),
            "{:?}",
            r.problems
        );
        // Rewritten: the next append starts on a line of its own.
        s.put("c", r#"{"v":2}"#, true).unwrap();
        drop(s);
        let (_, r) = reopen(dir.path());
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.entries.keys().collect::<Vec<_>>(), vec!["a", "c"]);
    }

    #[test]
    fn a_corrupt_line_is_reported_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(LOG_FILE),
            "{\"op\":\"put\",\"id\":\"a\",\"binding\":{}}\n{ not json\n{\"op\":\"put\",\"id\":\"b\",\"binding\":{}}\n",
        )
        .unwrap();
        let (_, r) = reopen(dir.path());
        assert_eq!(r.entries.len(), 2);
        assert_eq!(r.problems.len(), 1);
        assert!(r.problems[0].contains(":2: skipped"), "{:?}", r.problems);
    }

    #[test]
    fn legacy_files_are_folded_into_the_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old.json"), r#"{"v":1}"#).unwrap();
        let (_, r) = reopen(dir.path());
        assert_eq!(r.entries["old"], r#"{"v":1}"#);
        assert!(!dir.path().join("old.json").exists());
        let (_, r) = reopen(dir.path());
        assert_eq!(r.entries["old"], r#"{"v":1}"#);
    }

    #[test]
    fn superseded_lines_are_compacted_away() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = reopen(dir.path());
        for i in 0..3000 {
            s.put("same", &format!("{{\"v\":{i}}}"), i == 0).unwrap();
        }
        assert!(s.due());
        s.compact([("same", r#"{"v":2999}"#)].into_iter()).unwrap();
        assert!(!s.due());
        drop(s);
        let text = std::fs::read_to_string(dir.path().join(LOG_FILE)).unwrap();
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn the_flusher_syncs_what_is_pending() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = StateStore::open(dir.path(), Duration::from_millis(1)).unwrap();
        s.put("a", "{}", true).unwrap();
        let batch = s.batch.clone().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while batch.pending.lock().unwrap().is_some() {
            assert!(Instant::now() < deadline, "the flusher never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
