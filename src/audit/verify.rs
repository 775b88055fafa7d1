//! `egress-proxy audit verify FILE... [--public-key F]`: check the hash chain (and, with a
//! public key, the checkpoint signatures) of audit files given oldest first, and report the
//! first line that was deleted, altered, reordered or truncated.
//!
//! What it can tell: within the files given, a removed line (a gap in `seq`, or a `run_start`
//! whose `prev_chain` is not the chain before it), an edited line (its chain does not follow
//! from the line before), two lines swapped (`seq` out of order), a line cut short. What it
//! cannot: lines removed from the very end of the newest file, or a file rewritten from some
//! point on with a recomputed chain — unless checkpoints were signed, and then only up to the
//! last checkpoint (whoever edits cannot sign). Ship the files (or the checkpoints) elsewhere
//! to anchor the end.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Verifier, VerifyingKey};

use super::chain::{checkpoint_message, key_id, link, split};

/// What went wrong, where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    /// 1-based line number in `file`.
    pub line: usize,
    /// The seq of the record at that line, when it could be read.
    pub seq: Option<u64>,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)?;
        if let Some(s) = self.seq {
            write!(f, " (seq {s})")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// The outcome of a verification.
#[derive(Debug, Default)]
pub struct Report {
    pub records: u64,
    pub runs: u64,
    pub checkpoints: u64,
    pub signatures_checked: u64,
    /// The first problem found (verification stops there).
    pub problem: Option<Problem>,
    /// Things worth knowing that are not tampering.
    pub notes: Vec<String>,
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
}

/// A file the verifier (or the proxy, for its signing key) cannot use.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not an Ed25519 {what} in PEM", path.display())]
    NotAKey { path: PathBuf, what: &'static str },
}

fn read_text(path: &Path) -> Result<String, KeyFileError> {
    std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Verify `files` (oldest first). `Err` only when a file cannot be read.
pub fn verify(files: &[PathBuf], key: Option<&VerifyingKey>) -> Result<Report, KeyFileError> {
    let mut report = Report::default();
    let mut st = State {
        prev: None,
        next_seq: 1,
        run: None,
        partial_at: None,
        ended_signed: false,
        saw_key: false,
    };
    for file in files {
        let bytes = std::fs::read(file).map_err(|source| KeyFileError::Read {
            path: file.clone(),
            source,
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let complete = text.ends_with('\n') || text.is_empty();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let at = i + 1;
            let last_line = i + 1 == lines.len();
            if line.is_empty() {
                continue;
            }
            if let Err(p) = check_line(&mut st, &mut report, key, file, at, line) {
                if last_line && !complete {
                    report.problem = Some(problem(
                        file,
                        at,
                        None,
                        "truncated: the file ends in the middle of this line",
                    ));
                    return Ok(report);
                }
                // A line cut short by a crash is closed with a newline at the next start,
                // which says so: anything else that does not parse is tampering.
                if st.partial_at.is_none() && p.what.starts_with("not a chained record") {
                    st.partial_at = Some((file.clone(), at));
                    continue;
                }
                report.problem = Some(reordered(p, &lines[i + 1..], at, st.next_seq));
                return Ok(report);
            }
            if last_line && !complete {
                report.problem = Some(Problem {
                    file: file.clone(),
                    line: at,
                    seq: None,
                    what: "truncated: the file ends in the middle of this line".into(),
                });
                return Ok(report);
            }
        }
    }
    if let Some((file, line)) = st.partial_at {
        report.problem = Some(Problem {
            file,
            line,
            seq: None,
            what: "truncated or altered: not a chained record, and no later run_start says a crash cut it".into(),
        });
        return Ok(report);
    }
    if st.saw_key && !st.ended_signed {
        report.notes.push(
            "the last run does not end with its final checkpoint: it is still running, it crashed, or its end was cut off"
                .into(),
        );
    }
    if key.is_none() && report.checkpoints > 0 {
        report
            .notes
            .push("checkpoint signatures were not checked (no --public-key)".into());
    }
    Ok(report)
}

/// A gap in `seq` whose missing record comes later in the file is a reordering, not a
/// deletion: say so, naming both lines.
fn reordered(p: Problem, rest: &[&str], at: usize, missing: u64) -> Problem {
    if !p.what.starts_with("record(s) deleted") {
        return p;
    }
    // Within the same run only (seq starts again at each run_start).
    let mut later = None;
    for (j, l) in rest.iter().enumerate() {
        let Some(v) =
            split(l).and_then(|(c, _)| serde_json::from_str::<serde_json::Value>(&c).ok())
        else {
            continue;
        };
        if v["event"] == "run_start" {
            break;
        }
        if v["seq"].as_u64() == Some(missing) {
            later = Some(j);
            break;
        }
    }
    match later {
        Some(j) => Problem {
            what: format!(
                "records reordered: seq {} comes before seq {missing} (line {})",
                p.seq.unwrap_or(0),
                at + 1 + j
            ),
            ..p
        },
        None => p,
    }
}

fn problem(file: &Path, line: usize, seq: Option<u64>, what: impl Into<String>) -> Problem {
    Problem {
        file: file.to_path_buf(),
        line,
        seq,
        what: what.into(),
    }
}

fn check_line(
    st: &mut State,
    report: &mut Report,
    key: Option<&VerifyingKey>,
    file: &Path,
    at: usize,
    line: &str,
) -> Result<(), Problem> {
    let Some((canonical, chain_hex)) = split(line) else {
        return Err(problem(
            file,
            at,
            None,
            "not a chained record (altered, cut short, or written without audit.chain)",
        ));
    };
    let v: serde_json::Value = serde_json::from_str(&canonical).map_err(|_| {
        problem(
            file,
            at,
            None,
            "not a chained record (not JSON once the chain is removed)",
        )
    })?;
    let seq = v["seq"]
        .as_u64()
        .ok_or_else(|| problem(file, at, None, "not a chained record (no seq)"))?;
    let mut chain = [0u8; 32];
    hex::decode_to_slice(chain_hex, &mut chain)
        .map_err(|_| problem(file, at, Some(seq), "chain is not hex"))?;
    let event = v["event"].as_str().unwrap_or("");
    if let Some((pfile, pline)) = st.partial_at.take() {
        if !(event == "run_start" && v["partial_tail"] == true) {
            return Err(problem(
                &pfile,
                pline,
                None,
                "not a chained record (altered, or a line cut short)",
            ));
        }
        report.notes.push(format!(
            "{}:{pline}: a line cut short by a crash (the next run says so)",
            pfile.display()
        ));
    }
    let prev_for_link = if event == "run_start" {
        let named = v["prev_chain"].as_str();
        match (named, st.prev) {
            (Some(n), Some(p)) if n != hex::encode(p) => {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    format!(
                        "records deleted before this run_start: it continues chain {n}, the line before ends chain {}",
                        hex::encode(p)
                    ),
                ))
            }
            (None, Some(_)) => {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    "a run_start that starts a new chain in the middle of the files: lines before it belong to another trail, or were replaced",
                ))
            }
            _ => {}
        }
        if seq != 1 {
            return Err(problem(
                file,
                at,
                Some(seq),
                "a run_start whose seq is not 1",
            ));
        }
        report.runs += 1;
        st.run = v["run"].as_str().map(str::to_string);
        st.ended_signed = false;
        if v["key_id"].is_string() {
            st.saw_key = true;
        }
        let mut p = [0u8; 32];
        if let Some(n) = named {
            if st.prev.is_none() {
                report.notes.push(format!(
                    "{}:{at}: the first run continues chain {n} from files not given",
                    file.display()
                ));
            }
            hex::decode_to_slice(n, &mut p)
                .map_err(|_| problem(file, at, Some(seq), "prev_chain is not hex"))?;
        }
        Some(p)
    } else {
        if st.prev.is_some() {
            if seq > st.next_seq {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    format!(
                        "record(s) deleted: expected seq {}, found {seq}",
                        st.next_seq
                    ),
                ));
            }
            if seq < st.next_seq {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    format!(
                        "records reordered or repeated: seq {seq} after seq {}",
                        st.next_seq - 1
                    ),
                ));
            }
        } else {
            report.notes.push(format!(
                "{}:{at}: the files start at seq {seq}, after a run_start not given; the chain is checked from here",
                file.display()
            ));
            st.run = v["run"].as_str().map(str::to_string);
        }
        st.prev
    };
    if let Some(prev) = prev_for_link {
        if link(&prev, canonical.as_bytes()) != chain {
            return Err(problem(
                file,
                at,
                Some(seq),
                "record altered: its chain does not follow from the line before",
            ));
        }
    }
    if event == "checkpoint" {
        report.checkpoints += 1;
        st.saw_key = true;
        let head = v["chain_head"].as_str().unwrap_or("");
        if let Some(p) = st.prev {
            if head != hex::encode(p) {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    "checkpoint signs a chain head that is not the line before",
                ));
            }
        }
        if let Some(k) = key {
            let run = v["run"].as_str().unwrap_or("");
            let sig = v["signature"]
                .as_str()
                .and_then(|s| hex::decode(s).ok())
                .and_then(|b| <[u8; 64]>::try_from(b.as_slice()).ok())
                .map(|b| Signature::from_bytes(&b));
            let ok = sig.is_some_and(|s| k.verify(&checkpoint_message(run, seq, head), &s).is_ok());
            if !ok {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    format!(
                        "checkpoint signature does not verify with the given key (key id {}; the checkpoint names {})",
                        key_id(&k.to_bytes()),
                        v["key_id"].as_str().unwrap_or("none")
                    ),
                ));
            }
            report.signatures_checked += 1;
        }
        st.ended_signed = v["final"] == true;
    } else if event != "run_start" {
        st.ended_signed = false;
        report.records += 1;
    }
    st.prev = Some(chain);
    st.next_seq = seq + 1;
    Ok(())
}

/// Read an Ed25519 public key (SPKI PEM, as `openssl pkey -pubout` writes it).
pub fn read_public_key(path: &Path) -> Result<VerifyingKey, KeyFileError> {
    use ed25519_dalek::pkcs8::DecodePublicKey;
    VerifyingKey::from_public_key_pem(&read_text(path)?).map_err(|_| KeyFileError::NotAKey {
        path: path.to_path_buf(),
        what: "public key (SPKI)",
    })
}

/// Read an Ed25519 private key (PKCS#8 PEM, as `openssl genpkey -algorithm ed25519` writes
/// it).
pub fn read_signing_key(path: &Path) -> Result<ed25519_dalek::SigningKey, KeyFileError> {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    ed25519_dalek::SigningKey::from_pkcs8_pem(&read_text(path)?).map_err(|_| {
        KeyFileError::NotAKey {
            path: path.to_path_buf(),
            what: "private key (PKCS#8)",
        }
    })
}
