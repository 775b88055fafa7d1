//! One line of an audit file, checked against the state of its run: its chain and `seq`,
//! a run's start, its checkpoints and signatures, and the signed interval between them.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde_json::Value;

use super::*;

/// Milliseconds since the epoch.
pub(super) fn ms_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A line's time in ms since the epoch: `ts` (RFC 3339), or OCSF's `time`.
pub(super) fn time_ms(v: &Value) -> Option<i64> {
    if let Some(ts) = v.get("ts").and_then(Value::as_str) {
        let t =
            time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
        return i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok();
    }
    v.get("time").and_then(Value::as_i64)
}

/// Why a line's signature does not hold.
#[derive(Debug, thiserror::Error)]
pub(super) enum BadSignature {
    #[error("the {0} is unsigned: with --public-key every run starts with a signed run_start (a forger cannot sign; a proxy without audit.signing_key_file does not)")]
    Unsigned(String),
    #[error("{event} signature does not verify with the given key (key id {key}; the line names {named})")]
    Mismatch {
        event: String,
        key: String,
        named: String,
    },
}

/// Check a signed line's signature.
pub(super) fn check_signature(key: &VerifyingKey, v: &Value, seq: u64) -> Result<(), BadSignature> {
    let event = v["event"].as_str().unwrap_or("line");
    let Some(sig) = v.get("signature") else {
        return Err(BadSignature::Unsigned(event.to_string()));
    };
    let sig = sig
        .as_str()
        .and_then(|s| hex::decode(s).ok())
        .and_then(|b| <[u8; 64]>::try_from(b.as_slice()).ok())
        .map(|b| Signature::from_bytes(&b));
    let ok = match (sig, signed_message(v, seq)) {
        (Some(s), Some(msg)) => key.verify(&msg, &s).is_ok(),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(BadSignature::Mismatch {
        event: event.to_string(),
        key: key_id(&key.to_bytes()),
        named: v["key_id"].as_str().unwrap_or("none").to_string(),
    })
}

/// The signed interval a `run_start` or checkpoint carries: (records, seconds).
pub(super) fn interval_of(v: &Value) -> Option<(u64, u64)> {
    Some((
        v.get("checkpoint_every_records")?.as_u64()?,
        v.get("checkpoint_every_s")?.as_u64()?,
    ))
}

/// A gap in `seq` whose missing record comes later in the file is a reordering, not a
/// deletion: say so, naming both lines.
pub(super) fn reordered(
    p: Problem,
    rest: impl Iterator<Item = String>,
    at: usize,
    missing: u64,
) -> Problem {
    if !p.what.starts_with("record(s) deleted") {
        return p;
    }
    // Within the same run only (seq starts again at each run_start).
    let mut later = None;
    for (j, l) in rest.enumerate() {
        let Some(v) =
            split(&l).and_then(|(c, _)| serde_json::from_str::<serde_json::Value>(&c).ok())
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

pub(super) fn problem(
    file: &Path,
    line: usize,
    seq: Option<u64>,
    what: impl Into<String>,
) -> Problem {
    Problem {
        file: file.to_path_buf(),
        line,
        seq,
        what: what.into(),
    }
}

pub(super) fn check_line(
    st: &mut State,
    report: &mut Report,
    key: Option<&VerifyingKey>,
    file: &Path,
    at: usize,
    line: &str,
) -> Result<(), Problem> {
    let (canonical, v, seq, chain) = parse_chained(line, file, at)?;
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
    if st.ended_signed && event != "run_start" && key.is_some() {
        // A final checkpoint ends its run: whatever follows in the same run was appended
        // after the run ended (only the next run's signed run_start may follow).
        return Err(problem(
            file,
            at,
            Some(seq),
            format!(
                "a line after run {}'s signed final checkpoint: appended after the run ended",
                st.run.as_deref().unwrap_or("?")
            ),
        ));
    }
    let prev_for_link = if event == "run_start" {
        Some(run_start(st, report, key, file, at, seq, &v)?)
    } else {
        in_sequence(st, report, (file, at), seq, &v)?
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
        checkpoint(st, report, key, file, at, seq, &v)?;
    } else if event != "run_start" {
        st.ended_signed = false;
        report.records += 1;
        if key.is_some() {
            within_interval(st, file, at, seq, &v)?;
        }
    }
    if matches!(event, "run_start" | "checkpoint") {
        st.signed_lines.insert(line.trim_end().to_string());
    }
    st.prev = Some(chain);
    st.next_seq = seq + 1;
    st.last = Some((
        st.run.clone().unwrap_or_default(),
        seq,
        file.to_path_buf(),
        at,
    ));
    Ok(())
}

/// A chained line taken apart: its canonical record (the line without its chain), the record,
/// its `seq` and its chain value.
fn parse_chained(
    line: &str,
    file: &Path,
    at: usize,
) -> Result<(String, Value, u64, [u8; 32]), Problem> {
    let Some((canonical, chain_hex)) = split(line) else {
        return Err(problem(
            file,
            at,
            None,
            "not a chained record (altered, cut short, or written without audit.chain)",
        ));
    };
    let v: Value = serde_json::from_str(&canonical).map_err(|_| {
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
    Ok((canonical, v, seq, chain))
}

/// A record inside a run: its `seq` must be the next one (a gap is a deletion, a step back a
/// reorder). Files that start after a `run_start` not given are checked from their first
/// record. The chain the record must follow from, if known.
fn in_sequence(
    st: &mut State,
    report: &mut Report,
    (file, at): (&Path, usize),
    seq: u64,
    v: &Value,
) -> Result<Option<[u8; 32]>, Problem> {
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
        st.run = run_of(v).map(str::to_string);
    }
    Ok(st.prev)
}

/// A `run_start`: it continues the chain before it, has seq 1 and, with a key, is signed and
/// names the run before it if that one ended without its final checkpoint. Returns the chain
/// it links to.
pub(super) fn run_start(
    st: &mut State,
    report: &mut Report,
    key: Option<&VerifyingKey>,
    file: &Path,
    at: usize,
    seq: u64,
    v: &Value,
) -> Result<[u8; 32], Problem> {
    let bad = |what: &str| problem(file, at, Some(seq), what);
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
            return Err(bad("a run_start that starts a new chain in the middle of the files: lines before it belong to another trail, or were replaced"))
        }
        _ => {}
    }
    if seq != 1 {
        return Err(bad("a run_start whose seq is not 1"));
    }
    if let Some(k) = key {
        check_signature(k, v, seq).map_err(|why| bad(&why.to_string()))?;
        if let (Some((prun, pseq, ..)), false) = (&st.last, st.ended_signed) {
            let unclosed = &v["unclosed_run"];
            if unclosed["run"].as_str() != Some(prun.as_str())
                || unclosed["last_seq"].as_u64() != Some(*pseq)
            {
                return Err(problem(
                    file,
                    at,
                    Some(seq),
                    format!(
                        "run {prun} ends at seq {pseq} without its signed final checkpoint, and this run_start does not name it as unclosed: that run's end was cut or replaced"
                    ),
                ));
            }
            report.notes.push(format!(
                "{}:{at}: run {prun} ended without its final checkpoint (a crash or a kill), as this run_start says; its last {} line(s) are only chained",
                file.display(),
                st.unsigned
            ));
        }
        st.signed(v, file, at);
    }
    let lost = &v["lost_before"];
    if lost.is_object() {
        report.lost.push(format!(
            "{}:{at}: run {} lost {} record(s) at its stop, as this run_start says (the writer could neither write nor keep them)",
            file.display(),
            lost["run"].as_str().unwrap_or("?"),
            lost["records"].as_u64().unwrap_or(1)
        ));
    }
    report.runs += 1;
    st.run = run_of(v).map(str::to_string);
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
        hex::decode_to_slice(n, &mut p).map_err(|_| bad("prev_chain is not hex"))?;
    }
    Ok(p)
}

/// A `checkpoint`: it signs the chain head of the line before it, with the given key.
pub(super) fn checkpoint(
    st: &mut State,
    report: &mut Report,
    key: Option<&VerifyingKey>,
    file: &Path,
    at: usize,
    seq: u64,
    v: &Value,
) -> Result<(), Problem> {
    let bad = |what: &str| problem(file, at, Some(seq), what);
    report.checkpoints += 1;
    st.saw_key = true;
    let head = v["chain_head"].as_str().unwrap_or("");
    if let Some(p) = st.prev {
        if head != hex::encode(p) {
            return Err(bad(
                "checkpoint signs a chain head that is not the line before",
            ));
        }
    }
    if let Some(k) = key {
        check_signature(k, v, seq).map_err(|why| bad(&why.to_string()))?;
        report.signatures_checked += 1;
        st.signed(v, file, at);
    }
    st.ended_signed = v["final"] == true;
    Ok(())
}

/// With a key: a line after a signed line must keep within the run's signed interval — no
/// more lines than its records, and (after the first) none later than its seconds.
pub(super) fn within_interval(
    st: &mut State,
    file: &Path,
    at: usize,
    seq: u64,
    v: &Value,
) -> Result<(), Problem> {
    st.unsigned += 1;
    let t = time_ms(v);
    let Some((records, every)) = st.interval else {
        // The files start inside a run whose interval was in a file not given.
        return Ok(());
    };
    let signed_at = match &st.last_signed {
        Some((f, l, _)) => format!("{}:{l}", f.display()),
        None => "?".into(),
    };
    if st.unsigned > records {
        return Err(problem(
            file,
            at,
            Some(seq),
            format!(
                "{} lines since the last signed line ({signed_at}), while this run signs every {records}: checkpoints were removed",
                st.unsigned
            ),
        ));
    }
    let signed_ms = st.last_signed.as_ref().and_then(|(_, _, t)| *t);
    if let (true, Some(t), Some(s)) = (st.unsigned >= 2, t, signed_ms) {
        let limit = s
            .saturating_add(every as i64 * 1000)
            .saturating_add(CLOCK_SLACK.as_millis() as i64);
        if t > limit {
            return Err(problem(
                file,
                at,
                Some(seq),
                format!(
                    "written {} s after the last signed line ({signed_at}) with no checkpoint between, while this run signs every {every} s: checkpoints were removed",
                    (t - s) / 1000
                ),
            ));
        }
    }
    Ok(())
}
