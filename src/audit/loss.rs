//! Records lost at a stop, said where `audit verify` will see them (security review A32: a
//! stop while the audit volume was full lost its queued records, and `verify` still called
//! the trail intact).
//!
//! When the proxy stops and neither the trail nor `audit.spill_file` can take what is still
//! queued, the writer leaves a **loss note** — `{"run", "records"}` — in `SPILL_FILE.lost`
//! (on the spill's volume: `state_dir`'s by default) and appends the same as an `audit_loss`
//! line to `audit.checkpoint_file` when there is one (the place that survives a full state
//! volume). The next start reads the note, or else an `audit_loss` line of the checkpoint file
//! after its last `run_start`, names the loss in its `run_start` (`lost_before`, covered by
//! its signature) and removes the note. `audit verify` reports a trail that says it lost records as
//! **incomplete** (exit 3), apart from intact (0) and tampered (1).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a run lost at its stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loss {
    /// The run that lost them.
    pub run: String,
    /// How many records.
    pub records: u64,
}

/// Where the note for `spill` goes.
pub fn note_path(spill: &Path) -> PathBuf {
    let mut p = spill.as_os_str().to_owned();
    p.push(".lost");
    PathBuf::from(p)
}

/// Leave the note (added to one a run before left, if any): whether it was written.
pub fn leave(spill: &Path, loss: &Loss) -> bool {
    let path = note_path(spill);
    let records = read(spill).map_or(0, |l| l.records);
    let note = Loss {
        run: loss.run.clone(),
        records: records.saturating_add(loss.records),
    };
    let Ok(text) = serde_json::to_vec(&note) else {
        return false;
    };
    let written = std::fs::File::create(&path).and_then(|mut f| {
        f.write_all(&text)?;
        f.sync_all()
    });
    written.is_ok()
}

/// The note a run before left, if any (an unreadable note counts as a loss of unknown size:
/// one record, never none).
pub fn read(spill: &Path) -> Option<Loss> {
    let bytes = std::fs::read(note_path(spill)).ok()?;
    Some(serde_json::from_slice(&bytes).unwrap_or(Loss {
        run: "(unreadable loss note)".into(),
        records: 1,
    }))
}

/// How much of the checkpoint file's end is read for a loss line.
const ANCHOR_TAIL: u64 = 64 * 1024;

/// The loss an `audit_loss` line of the checkpoint file `anchor` says, when no `run_start`
/// follows it (a later run would have named it already). A pipe is not read.
pub fn from_anchor(anchor: &Path) -> Option<Loss> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(anchor).ok()?;
    let len = f.metadata().ok().filter(|m| m.is_file())?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(ANCHOR_TAIL)))
        .ok()?;
    let mut tail = String::new();
    f.take(ANCHOR_TAIL).read_to_string(&mut tail).ok()?;
    let mut found: Option<Loss> = None;
    for line in tail.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match v["event"].as_str() {
            Some("run_start") => found = None,
            Some("audit_loss") => {
                let records = v["records"].as_u64().unwrap_or(1);
                let before = found.as_ref().map_or(0, |l| l.records);
                found = Some(Loss {
                    run: v["run"].as_str().unwrap_or("?").to_string(),
                    records: before.saturating_add(records),
                });
            }
            _ => {}
        }
    }
    found
}

/// The note's line for `audit.checkpoint_file`.
pub fn anchor_line(loss: &Loss) -> Vec<u8> {
    let v = serde_json::json!({
        "ts": super::record::rfc3339(std::time::SystemTime::now()),
        "event": "audit_loss",
        "run": loss.run,
        "records": loss.records,
    });
    let mut line = v.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// The note, once its loss is in the trail.
pub fn clear(spill: &Path) {
    let _ = std::fs::remove_file(note_path(spill));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_add_up_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().join("audit.spill");
        assert_eq!(read(&spill), None);
        let loss = |n| Loss {
            run: "r1".into(),
            records: n,
        };
        assert!(leave(&spill, &loss(3)));
        assert!(leave(&spill, &loss(4)));
        assert_eq!(read(&spill), Some(loss(7)));
        clear(&spill);
        assert_eq!(read(&spill), None);
        std::fs::write(note_path(&spill), "garbage").unwrap();
        assert_eq!(read(&spill).map(|l| l.records), Some(1));
    }

    #[test]
    fn a_loss_line_counts_until_a_run_start_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = dir.path().join("cp.jsonl");
        let loss = Loss {
            run: "r1".into(),
            records: 5,
        };
        let mut text = String::from("{\"event\":\"run_start\",\"run\":\"r1\"}\n");
        text.push_str(&String::from_utf8(anchor_line(&loss)).unwrap());
        std::fs::write(&anchor, &text).unwrap();
        assert_eq!(from_anchor(&anchor), Some(loss));
        text.push_str("{\"event\":\"run_start\",\"run\":\"r2\"}\n");
        std::fs::write(&anchor, &text).unwrap();
        assert_eq!(from_anchor(&anchor), None);
    }
}
