//! The *Audit* page's facts about the trail: whether its files verify (the hash chain, and the
//! signatures with the public half of `audit.signing_key_file`, the live file's last run
//! allowed to be open — `egress-proxy audit verify --open-run`), and the last checkpoint; with
//! `audit.chain: false`, only that there is no chain to verify.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::{json, Value};

use crate::audit::verify;
use crate::config::Config;

/// How far back from the end of the live file the last checkpoint is looked for.
const TAIL: u64 = 512 * 1024;

/// Verify the trail of `config` (blocking: it reads every file).
pub fn verify_trail(config: &Config) -> Value {
    let files = match crate::control::simulate::trail_files(config) {
        Ok(f) => f,
        Err(e) => return json!({ "verified": false, "error": e.to_string() }),
    };
    if !config.audit_trail.chain {
        // Nothing links one record to the next: there is no chain to verify, which is not a
        // chain that fails to verify.
        return json!({
            "chain": false,
            "verified": false,
            "files": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        });
    }
    let key = match &config.audit_trail.signing_key_file {
        Some(f) => match verify::read_signing_key(f) {
            Ok(k) => Some(k.verifying_key()),
            Err(e) => return json!({ "verified": false, "error": e.to_string() }),
        },
        None => None,
    };
    let opts = verify::Options {
        key: key.as_ref(),
        open_run: true,
        ..verify::Options::default()
    };
    let report = match verify::verify_with(&files, &opts) {
        Ok(r) => r,
        Err(e) => return json!({ "verified": false, "error": e.to_string() }),
    };
    json!({
        "chain": true,
        "verified": report.problem.is_none() && report.records > 0,
        "signed": key.is_some(),
        "files": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "records": report.records,
        "runs": report.runs,
        "checkpoints": report.checkpoints,
        "signatures_checked": report.signatures_checked,
        "only_chained": report.only_chained,
        "problem": report.problem.as_ref().map(|p| p.to_string()),
        "notes": report.notes,
        "last_checkpoint": files.last().and_then(|f| last_checkpoint(f)),
    })
}

/// The last `checkpoint` line near the end of `path`: its time, seq and whether it was final.
fn last_checkpoint(path: &Path) -> Option<Value> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut tail = Vec::new();
    f.take(TAIL).read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    text.lines().rev().find_map(|l| {
        let v: Value = serde_json::from_str(l).ok()?;
        (v["event"] == "checkpoint").then(
            || json!({ "ts": v["ts"], "seq": v["seq"], "final": v["final"], "run": v["run"] }),
        )
    })
}
