//! `egress-proxy audit verify FILE... [--public-key F] [--open-run] [--checkpoints F]`: check
//! the hash chain of audit files given oldest first and report the first line that was
//! deleted, altered, reordered or truncated — and, with the public key, hold the trail to
//! what the proxy signed.
//!
//! Without a key: a removed line (a gap in `seq`, or a `run_start` whose `prev_chain` is not
//! the chain before it), an edited line (its chain does not follow from the line before), two
//! lines swapped (`seq` out of order), a line cut short. A forger who recomputes the chain
//! after an edit passes this.
//!
//! With `--public-key` the check fails closed: every `run_start` must be signed (it names the
//! chain it continues, the checkpoint interval and the key); no more lines than the signed
//! interval's records, and no line later than its seconds (plus [`CLOCK_SLACK`]), may follow
//! a signed line without a checkpoint; every run must end with its signed `final`
//! checkpoint, unless the next signed `run_start` names it as unclosed (a crash); and an empty
//! trail is not intact. So an edit needs a signature the forger cannot make: after any
//! recomputed stretch the next signed line no longer verifies, and dropping the signed lines
//! after it breaks the interval or the final checkpoint. `--open-run` accepts a live file's
//! last run without its final checkpoint (saying how many lines are only chained) as long as
//! its last signed line is younger, by the verifier's clock, than the signed interval (plus
//! [`CLOCK_SLACK`]): a live run signs a checkpoint at least that often even when idle, so a
//! file cut at an earlier checkpoint, or a tail appended to a stopped run, fails once the
//! interval has passed. Nothing may follow a run's final checkpoint but the next `run_start`. What a local file alone cannot show is a cut that ends
//! exactly at a final checkpoint (whole runs removed from the end): `--checkpoints` holds the
//! log against `audit.checkpoint_file`, a second copy of every signed line kept elsewhere.

use std::collections::HashSet;
use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ed25519_dalek::VerifyingKey;
use serde_json::Value;

use super::chain::{key_id, link, run_of, signed_message, split};

mod keys;
mod line;
use keys::read_text;
pub use keys::{read_public_key, read_signing_key, KeyFileError};
use line::*;

/// Leeway of the interval's time rule: timestamps are written to the millisecond, and the
/// writer's clock may be stepped a little. A wall clock stepped forward by more than this
/// while a run was writing is reported as a missing checkpoint.
pub const CLOCK_SLACK: Duration = Duration::from_secs(2);

/// How to verify.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// Check signatures, and fail closed (see the module doc).
    pub key: Option<&'a VerifyingKey>,
    /// The newest file is still being written: its last run may lack its final checkpoint.
    pub open_run: bool,
    /// `audit.checkpoint_file`: every signed line the proxy wrote, kept elsewhere.
    pub checkpoints: Option<&'a Path>,
    /// The time an open run's unsigned tail is judged against.
    pub now: SystemTime,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            key: None,
            open_run: false,
            checkpoints: None,
            now: SystemTime::now(),
        }
    }
}

/// What went wrong, where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file the problem is in.
    pub file: PathBuf,
    /// 1-based line number in `file`.
    pub line: usize,
    /// The seq of the record at that line, when it could be read.
    pub seq: Option<u64>,
    /// What is wrong.
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if let Some(s) = self.seq {
            write!(f, " (seq {s})")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// The outcome of a verification.
#[derive(Debug, Default)]
pub struct Report {
    /// Records read.
    pub records: u64,
    /// Runs read.
    pub runs: u64,
    /// Checkpoints read.
    pub checkpoints: u64,
    /// Signatures checked.
    pub signatures_checked: u64,
    /// The first problem found (verification stops there).
    pub problem: Option<Problem>,
    /// Things worth knowing that are not tampering.
    pub notes: Vec<String>,
    /// With `--open-run`: lines after the open run's last signed line (only chained).
    pub only_chained: u64,
    /// With `--checkpoints`: signed lines of the checkpoint file found in the log.
    pub anchored: u64,
    /// Records the trail says were lost (a run's `lost_before`, the checkpoint file's
    /// `audit_loss` lines): the trail is incomplete, not intact.
    pub lost: Vec<String>,
}

impl Report {
    /// The verdict, for the exit status: intact, incomplete (it says records were lost) or
    /// tampered.
    pub fn verdict(&self) -> Verdict {
        match (&self.problem, self.lost.is_empty()) {
            (Some(_), _) => Verdict::Tampered,
            (None, false) => Verdict::Incomplete,
            (None, true) => Verdict::Intact,
        }
    }
}

/// What a verification concludes (`audit verify` exits 0, 3 and 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every record the proxy wrote is there, unaltered.
    Intact,
    /// Unaltered, but the trail itself says that records were lost (a stop while the audit
    /// volume was full and the spill could not be written).
    Incomplete,
    /// Altered, cut, reordered or otherwise not what the proxy wrote.
    Tampered,
}

/// Where the verifier is in the chain.
struct State {
    /// The previous line's chain (`None` before the first line).
    prev: Option<[u8; 32]>,
    /// The seq the next record must have.
    next_seq: u64,
    run: Option<String>,
    /// A partial line was seen: only a `run_start` saying so may follow.
    partial_at: Option<(PathBuf, usize)>,
    /// The current run's last line was a final checkpoint.
    ended_signed: bool,
    saw_key: bool,
    /// The current run's signed interval: (records, seconds).
    interval: Option<(u64, u64)>,
    /// The last signed line (`run_start` or checkpoint): where, and its time (ms).
    last_signed: Option<(PathBuf, usize, Option<i64>)>,
    /// Lines since the last signed line.
    unsigned: u64,
    /// The last line read: its run, seq and place.
    last: Option<(String, u64, PathBuf, usize)>,
    /// Every signed line read (for `--checkpoints`).
    signed_lines: HashSet<String>,
}

impl State {
    /// Signed line `v` (at `file:at`) verified: the interval it signs, and the time and count
    /// of unsigned lines, hold from here.
    fn signed(&mut self, v: &Value, file: &Path, at: usize) {
        self.interval = interval_of(v);
        self.last_signed = Some((file.to_path_buf(), at, time_ms(v)));
        self.unsigned = 0;
    }
}

/// Verify `files` (oldest first) without a key (see [`verify_with`]).
pub fn verify(files: &[PathBuf], key: Option<&VerifyingKey>) -> Result<Report, KeyFileError> {
    verify_with(
        files,
        &Options {
            key,
            ..Options::default()
        },
    )
}

/// Check every line of one `file` against the run state; `Some` with the first problem,
/// which ends the verification. `live`: the newest file of an open run, whose last line may
/// still be being written.
fn check_file(
    st: &mut State,
    report: &mut Report,
    key: Option<&VerifyingKey>,
    file: &PathBuf,
    live: bool,
) -> Result<Option<Problem>, KeyFileError> {
    let read_err = |source| KeyFileError::Read {
        path: file.clone(),
        source,
    };
    // Line by line: memory stays one line's, whatever the trail's size (the console's Audit
    // page verifies inside the proxy).
    let mut reader =
        std::io::BufReader::with_capacity(1 << 16, File::open(file).map_err(read_err)?);
    let mut next = next_line(&mut reader).map_err(read_err)?;
    let mut at = 0;
    while let Some((line, complete)) = next.take() {
        at += 1;
        next = next_line(&mut reader).map_err(read_err)?;
        let last_line = next.is_none();
        let line = line.as_str();
        if line.is_empty() {
            continue;
        }
        if last_line && !complete && live {
            // A live file read while the writer is in the middle of a line.
            report.notes.push(format!(
                "{}:{at}: the last line is still being written; not checked",
                file.display()
            ));
            break;
        }
        if let Err(p) = check_line(st, report, key, file, at, line) {
            if last_line && !complete {
                return Ok(Some(problem(
                    file,
                    at,
                    None,
                    "truncated: the file ends in the middle of this line",
                )));
            }
            // A line cut short by a crash is closed with a newline at the next start,
            // which says so: anything else that does not parse is tampering.
            if st.partial_at.is_none() && p.what.starts_with("not a chained record") {
                st.partial_at = Some((file.clone(), at));
                continue;
            }
            let rest = next.take().map(|(l, _)| l).into_iter();
            let rest = rest.chain(std::iter::from_fn(|| {
                next_line(&mut reader).ok().flatten().map(|(l, _)| l)
            }));
            return Ok(Some(reordered(p, rest, at, st.next_seq)));
        }
        if last_line && !complete {
            return Ok(Some(Problem {
                file: file.clone(),
                line: at,
                seq: None,
                what: "truncated: the file ends in the middle of this line".into(),
            }));
        }
    }
    Ok(None)
}

/// The next line of `reader` without its line end (`\n` or `\r\n`), read as UTF-8 with
/// invalid bytes replaced, and whether it ended with `\n` (only a file's last line may not).
fn next_line(reader: &mut impl BufRead) -> std::io::Result<Option<(String, bool)>> {
    let mut bytes = Vec::new();
    if reader.read_until(b'\n', &mut bytes)? == 0 {
        return Ok(None);
    }
    let complete = bytes.last() == Some(&b'\n');
    if complete {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    Ok(Some((
        String::from_utf8_lossy(&bytes).into_owned(),
        complete,
    )))
}

/// What the trail as a whole shows once every line was read: a last line that is not a chained
/// record with no later `run_start` to explain it (cut or altered), or no line at all.
fn cut_or_empty(st: &mut State, files: &[PathBuf]) -> Option<Problem> {
    if let Some((file, line)) = st.partial_at.take() {
        return Some(Problem {
            file,
            line,
            seq: None,
            what: "truncated or altered: not a chained record, and no later run_start says a crash cut it".into(),
        });
    }
    st.last.is_none().then(|| Problem {
        file: files.last().cloned().unwrap_or_default(),
        line: 0,
        seq: None,
        what: "empty: no audit line at all, while a proxy starts every trail with a run_start (emptied, or not an audit file)".into(),
    })
}

/// Verify `files` (oldest first). `Err` only when a file cannot be read.
pub fn verify_with(files: &[PathBuf], opts: &Options<'_>) -> Result<Report, KeyFileError> {
    let mut report = Report::default();
    let mut st = State {
        prev: None,
        next_seq: 1,
        run: None,
        partial_at: None,
        ended_signed: false,
        saw_key: false,
        interval: None,
        last_signed: None,
        unsigned: 0,
        last: None,
        signed_lines: HashSet::new(),
    };
    // The checkpoint file is read first: the proxy writes a signed line to the log before it
    // copies it there, so what this read holds is already in the log read after it.
    let anchor = match opts.checkpoints {
        Some(path) => Some((path, read_text(path)?)),
        None => None,
    };
    let key = opts.key;
    let count = files.len();
    for (n, file) in files.iter().enumerate() {
        let live = opts.open_run && n + 1 == count;
        if let Some(p) = check_file(&mut st, &mut report, key, file, live)? {
            report.problem = Some(p);
            return Ok(report);
        }
    }
    if let Some(p) = cut_or_empty(&mut st, files) {
        report.problem = Some(p);
        return Ok(report);
    }
    // A run the checkpoint file says lost its last records ends without its final
    // checkpoint for that reason: incomplete (said below), not cut.
    let lost_runs: HashSet<String> = anchor
        .as_ref()
        .map(|(_, text)| text.lines().filter_map(loss_run).collect())
        .unwrap_or_default();
    let lost_at_end = st
        .last
        .as_ref()
        .is_some_and(|(run, ..)| lost_runs.contains(run));
    if key.is_some() && !lost_at_end {
        if let Some(p) = run_end(&st, &mut report, opts) {
            report.problem = Some(p);
            return Ok(report);
        }
    } else if st.saw_key && !st.ended_signed {
        report.notes.push(
            "the last run does not end with its final checkpoint: it is still running, it crashed, or its end was cut off (--public-key fails on this)"
                .into(),
        );
    }
    if key.is_none() && report.checkpoints > 0 {
        report
            .notes
            .push("checkpoint signatures were not checked (no --public-key)".into());
    }
    if let Some((path, text)) = anchor {
        if let Some(p) = check_anchor(&st, &mut report, key, path, &text) {
            report.problem = Some(p);
        }
    }
    Ok(report)
}

/// With a key: the last run must end with its signed final checkpoint — or, with
/// `--open-run`, have its next checkpoint not yet overdue.
fn run_end(st: &State, report: &mut Report, opts: &Options<'_>) -> Option<Problem> {
    if st.ended_signed {
        return None;
    }
    let (run, seq, file, line) = st.last.as_ref()?;
    let signed_at = match &st.last_signed {
        Some((f, l, _)) => format!("{}:{l}", f.display()),
        None => "none in these files".into(),
    };
    if !opts.open_run {
        return Some(problem(
            file,
            *line,
            Some(*seq),
            format!(
                "run {run} ends here without its signed final checkpoint (last signed line: {signed_at}): its end was cut or replaced; a live file is checked with --open-run, and a crashed run is named by the next run_start"
            ),
        ));
    }
    report.only_chained = st.unsigned;
    // A live run signs at least every `every` seconds, idle or not: its last signed line is
    // measured against the verifier's clock — never against the unsigned tail's own
    // timestamps, which whoever appended it chose.
    let every = st.interval.map(|(_, s)| s)?;
    let signed_ms = st.last_signed.as_ref().and_then(|(_, _, t)| *t)?;
    let due = signed_ms.saturating_add(every as i64 * 1000);
    let now = ms_since_epoch(opts.now);
    if now > due.saturating_add(CLOCK_SLACK.as_millis() as i64) {
        return Some(problem(
            file,
            *line,
            Some(*seq),
            format!(
                "run {run}: {} line(s) after the last signed line ({signed_at}) and no checkpoint for {} s, while a live run signs every {every} s (idle or not): the writer stopped, or the file was cut or appended to",
                st.unsigned,
                (now - signed_ms) / 1000
            ),
        ));
    }
    if st.unsigned > 0 {
        report.notes.push(format!(
            "run {run} is open: {} line(s) after its last signed line ({signed_at}) are only chained until its next checkpoint",
            st.unsigned
        ));
    }
    None
}

/// The run an `audit_loss` line of the checkpoint file names.
fn loss_run(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    (v["event"] == "audit_loss").then(|| v["run"].as_str().map(str::to_string))?
}

/// An `audit_loss` line of the checkpoint file: what it says was lost.
fn loss_line(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    (v["event"] == "audit_loss").then(|| {
        format!(
            "run {} lost {} record(s) at its stop (the writer could neither write nor keep them)",
            v["run"].as_str().unwrap_or("?"),
            v["records"].as_u64().unwrap_or(1)
        )
    })
}

/// `--checkpoints`: every signed line of the checkpoint file from the first one the log holds
/// on must be in the log, byte for byte; the lines before it belong to older files.
fn check_anchor(
    st: &State,
    report: &mut Report,
    key: Option<&VerifyingKey>,
    path: &Path,
    text: &str,
) -> Option<Problem> {
    let mut skipped = 0u64;
    for (i, line) in text.lines().enumerate() {
        let at = i + 1;
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(loss) = loss_line(line) {
            report.lost.push(format!("{}:{at}: {loss}", path.display()));
            continue;
        }
        let parsed = split(line).and_then(|(canonical, _)| {
            let v: Value = serde_json::from_str(&canonical).ok()?;
            let seq = v["seq"].as_u64()?;
            signed_message(&v, seq).map(|_| (v, seq))
        });
        let Some((v, seq)) = parsed else {
            return Some(problem(
                path,
                at,
                None,
                "not a signed run_start or checkpoint line: the checkpoint file was altered",
            ));
        };
        if let Some(k) = key {
            if let Err(why) = check_signature(k, &v, seq) {
                return Some(problem(
                    path,
                    at,
                    Some(seq),
                    format!("checkpoint file: {why}"),
                ));
            }
        }
        if st.signed_lines.contains(line) {
            report.anchored += 1;
            continue;
        }
        if report.anchored == 0 {
            skipped += 1;
            continue;
        }
        return Some(problem(
            path,
            at,
            Some(seq),
            format!(
                "the log lacks this signed {} of run {} (seq {seq}) that the checkpoint file holds: the log's end was cut or replaced after its last matching signed line",
                v["event"].as_str().unwrap_or("line"),
                run_of(&v).unwrap_or("?")
            ),
        ));
    }
    if report.anchored == 0 && skipped > 0 {
        return Some(problem(
            path,
            0,
            None,
            format!("none of its {skipped} signed lines is in the log: the log was replaced, or these are not its files"),
        ));
    }
    if skipped > 0 {
        report.notes.push(format!(
            "{}: its first {skipped} signed line(s) belong to files not given",
            path.display()
        ));
    }
    None
}
