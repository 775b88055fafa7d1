//! The hash chain of the audit trail (`audit.chain: true`).
//!
//! Every line gets `seq` (1, 2, … from the start of this run) and, last, `chain`: the hex
//! SHA-256 of the previous line's chain (32 bytes; zeros before the first) followed by this
//! line's *canonical bytes* — the line as written, without its trailing `,"chain":"…"` and
//! newline. So the canonical form needs no JSON canonicalisation: a verifier cuts the chain
//! field off the line it reads ([`split`]).
//!
//! A run begins with a `run_start` line naming the chain it continues (`prev_chain`: the last
//! chain in the file when the process started, `null` for a new file) and, when the file's
//! last line was not a final checkpoint, the run that ended without one (`unclosed_run`: a
//! crash, a kill, or a run without a signing key). With a signing key the `run_start` is
//! signed, and carries the checkpoint interval and the key id; `checkpoint` lines sign the
//! chain so far before more than `every_records` lines or more than `every_s` seconds go
//! unsigned, and at shutdown (`final: true`). What a signature covers is [`signed_message`],
//! used by the writer and by `egress-proxy audit verify` ([`super::verify`]) alike: whoever
//! rewrites the file cannot re-sign it, re-date it, or declare a cut run finished.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// How often a run signs its chain. Written into the signed `run_start` and every checkpoint,
/// so a verifier knows how long an unsigned stretch may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// At most this many lines between two signed lines.
    pub records: u64,
    /// A line written more than this long after the last signed line is preceded by a
    /// checkpoint (unless it is the first line since).
    pub every: Duration,
}

/// The fields of a `run_start` its signature covers (besides its kind and `seq`).
const RUN_START_SIGNED: &[&str] = &[
    "run",
    "ts",
    "prev_chain",
    "partial_tail",
    "unclosed_run",
    "checkpoint_every_records",
    "checkpoint_every_s",
    "key_id",
    "lost_before",
];

/// Signed fields that are left out of the message when absent (added after trails were
/// signed without them: their old signatures still verify).
const SIGNED_IF_PRESENT: &[&str] = &["lost_before"];

/// The fields of a `checkpoint` its signature covers (besides its kind and `seq`).
const CHECKPOINT_SIGNED: &[&str] = &[
    "run",
    "ts",
    "chain_head",
    "final",
    "checkpoint_every_records",
    "checkpoint_every_s",
    "key_id",
];

/// The bytes a signed line's signature covers: its kind, its `seq`, then each signed field as
/// `name=<JSON>` (a missing field is `null`). `None` for a line that is never signed. The
/// writer builds it from the value it is about to write, the verifier from the line it read:
/// one function, so the two cannot drift.
pub fn signed_message(v: &Value, seq: u64) -> Option<Vec<u8>> {
    let event = v.get("event")?.as_str()?;
    let fields = match event {
        "run_start" => RUN_START_SIGNED,
        "checkpoint" => CHECKPOINT_SIGNED,
        _ => return None,
    };
    let mut m = format!("egress-proxy audit {event} v2\nseq={seq}\n");
    for f in fields {
        if SIGNED_IF_PRESENT.contains(f) && v.get(*f).is_none() {
            continue;
        }
        m.push_str(f);
        m.push('=');
        m.push_str(&v.get(*f).unwrap_or(&Value::Null).to_string());
        m.push('\n');
    }
    Some(m.into_bytes())
}

/// A short id of a public key: the first 16 hex digits of the SHA-256 of its 32 bytes.
pub fn key_id(public: &[u8; 32]) -> String {
    hex::encode(&Sha256::digest(public)[..8])
}

/// The chain's state in the writer.
pub struct Chain {
    prev: [u8; 32],
    seq: u64,
    run: String,
    key: Option<SigningKey>,
    interval: Interval,
    /// Lines since the last signed line.
    since_signed: u64,
    /// When the last signed line was made.
    last_signed: Instant,
}

/// `line` without its `chain` field: (canonical bytes, the chain's hex), or `None` when the
/// line does not end with a chain field.
pub fn split(line: &str) -> Option<(String, &str)> {
    let body = line.strip_suffix("\"}")?;
    let at = body.rfind(",\"chain\":\"")?;
    let hex = &body[at + 10..];
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((format!("{}}}", &body[..at]), hex))
}

/// SHA-256 of `prev` then `canonical`.
pub fn link(prev: &[u8; 32], canonical: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(canonical);
    h.finalize().into()
}

impl Chain {
    /// A new run continuing `prev` (the file's last chain), or a new chain.
    pub fn new(
        run: String,
        prev: Option<[u8; 32]>,
        key: Option<SigningKey>,
        interval: Interval,
    ) -> Chain {
        Chain {
            prev: prev.unwrap_or([0; 32]),
            seq: 0,
            run,
            key,
            interval,
            since_signed: 0,
            last_signed: Instant::now(),
        }
    }

    /// Turn one encoded record (`{...}` plus newline) in `line` into its chained form.
    pub fn seal(&mut self, line: &mut Vec<u8>) {
        while line.last() == Some(&b'\n') {
            line.pop();
        }
        if line.last() != Some(&b'}') {
            return;
        }
        line.pop();
        self.seq += 1;
        self.since_signed += 1;
        line.extend_from_slice(format!(",\"seq\":{}}}", self.seq).as_bytes());
        self.prev = link(&self.prev, line);
        line.pop();
        line.extend_from_slice(b",\"chain\":\"");
        // 32 bytes always fit 64 digits: `encode_to_slice` fails only on a length mismatch.
        let mut hexed = [0u8; 64];
        if hex::encode_to_slice(self.prev, &mut hexed).is_ok() {
            line.extend_from_slice(&hexed);
        }
        line.extend_from_slice(b"\"}\n");
    }

    /// The `run_start` line: which chain this run continues, whether the file ended in a
    /// partial line (a crash mid-write) that was closed with a newline, which run ended
    /// without its final checkpoint, and how many records the last run lost at its stop
    /// (`lost`: its run id and count, from the loss note it left). Signed when the chain has
    /// a key.
    pub fn run_start(&mut self, tail: &Tail, lost: Option<&super::loss::Loss>) -> Vec<u8> {
        let mut v = json!({
            "ts": super::record::rfc3339(SystemTime::now()),
            "event": "run_start",
            "run": self.run,
            "prev_chain": tail.chain,
        });
        if tail.partial {
            v["partial_tail"] = json!(true);
        }
        if let Some(u) = tail.unclosed() {
            v["unclosed_run"] = json!({ "run": u.run, "last_seq": u.seq });
        }
        if let Some(l) = lost {
            v["lost_before"] = json!({ "run": l.run, "records": l.records });
        }
        self.sign(&mut v, 1);
        let line = self.sealed(&v);
        self.since_signed = 0;
        self.last_signed = Instant::now();
        line
    }

    /// Add the interval, the key id and the signature to a line that will get `seq`.
    fn sign(&self, v: &mut Value, seq: u64) {
        let Some(key) = &self.key else {
            return;
        };
        v["checkpoint_every_records"] = json!(self.interval.records);
        v["checkpoint_every_s"] = json!(self.interval.every.as_secs());
        v["key_id"] = json!(key_id(&key.verifying_key().to_bytes()));
        if let Some(msg) = signed_message(v, seq) {
            v["signature"] = json!(hex::encode(key.sign(&msg).to_bytes()));
        }
    }

    /// Whether a checkpoint must be written (before the next line, or now): `records` lines
    /// went unsigned, or `every` has passed since the last signed line — also with no line
    /// since, so that a live run's file is never older than its interval (`audit verify
    /// --open-run` measures its last signed line against the verifier's clock).
    pub fn checkpoint_due(&self) -> bool {
        self.key.is_some()
            && (self.since_signed >= self.interval.records
                || self.last_signed.elapsed() >= self.interval.every)
    }

    /// When the interval's time is up with no new record (`None` without a key): an idle
    /// writer sleeps until then.
    pub fn next_due(&self) -> Option<Instant> {
        self.key.as_ref()?;
        Some(self.last_signed + self.interval.every)
    }

    /// A signed `checkpoint` line over the chain so far (`None` without a key).
    pub fn checkpoint(&mut self, last: bool) -> Option<Vec<u8>> {
        self.key.as_ref()?;
        let head = hex::encode(self.prev);
        let mut v = json!({
            "ts": super::record::rfc3339(SystemTime::now()),
            "event": "checkpoint",
            "run": self.run,
            "chain_head": head,
            "final": last,
        });
        // The checkpoint's own seq: the one `sealed` gives it.
        self.sign(&mut v, self.seq + 1);
        let line = self.sealed(&v);
        self.since_signed = 0;
        self.last_signed = Instant::now();
        Some(line)
    }

    fn sealed(&mut self, v: &Value) -> Vec<u8> {
        let mut line = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
        self.seal(&mut line);
        line
    }
}

/// The last line of a run, as read back from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastLine {
    /// The run the line belongs to.
    pub run: String,
    /// Its sequence number in the run.
    pub seq: u64,
    /// It is a `final: true` checkpoint: the run ended cleanly.
    pub closed: bool,
}

/// What a new run needs to know about the end of the file it appends to.
#[derive(Debug, Clone, Default)]
pub struct Tail {
    /// The last chain written (hex).
    pub chain: Option<String>,
    /// The file ends in a partial line.
    pub partial: bool,
    /// The last chained line.
    pub last: Option<LastLine>,
}

impl Tail {
    /// The run that ended without its final checkpoint, if the last one did.
    pub fn unclosed(&self) -> Option<&LastLine> {
        self.last.as_ref().filter(|l| !l.closed)
    }

    /// The last chain as bytes.
    pub fn chain_bytes(&self) -> Option<[u8; 32]> {
        let mut b = [0u8; 32];
        let h = self.chain.as_deref()?;
        hex::decode_to_slice(h, &mut b).ok().map(|_| b)
    }
}

/// The run a chained line belongs to: `run`, or `unmapped.run` in an OCSF record.
pub fn run_of(v: &Value) -> Option<&str> {
    v.get("run")
        .or_else(|| v.get("unmapped")?.get("run"))?
        .as_str()
}

/// The end of `path` (or, when it is empty or missing, of `path.1`).
pub fn last_chain(path: &Path) -> Tail {
    let tail = tail_of(path);
    if tail.chain.is_some() || tail.partial {
        return tail;
    }
    let rotated = super::output::rotated_name(path, 1);
    Tail {
        partial: false,
        ..tail_of(&rotated)
    }
}

fn tail_of(path: &Path) -> Tail {
    let Ok(mut f) = std::fs::File::open(path) else {
        return Tail::default();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(1 << 20);
    if f.seek(SeekFrom::Start(from)).is_err() {
        return Tail::default();
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return Tail::default();
    }
    let partial = !buf.is_empty() && buf.last() != Some(&b'\n');
    let text = String::from_utf8_lossy(&buf);
    let Some((canonical, chain)) = text.lines().rev().find_map(split) else {
        return Tail {
            partial,
            ..Tail::default()
        };
    };
    let last = serde_json::from_str::<Value>(&canonical)
        .ok()
        .and_then(|v| {
            Some(LastLine {
                run: run_of(&v)?.to_string(),
                seq: v.get("seq")?.as_u64()?,
                closed: v["event"] == "checkpoint" && v["final"] == true,
            })
        });
    Tail {
        chain: Some(chain.to_string()),
        partial,
        last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval() -> Interval {
        Interval {
            records: 3,
            every: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_sealed_line_splits_back_into_its_canonical_bytes() {
        let mut c = Chain::new("r".into(), None, None, interval());
        let mut line = b"{\"a\":1}\n".to_vec();
        c.seal(&mut line);
        let text = String::from_utf8(line).unwrap();
        assert!(
            text.starts_with("{\"a\":1,\"seq\":1,\"chain\":\""),
            "{text}"
        );
        let (canonical, hexed) = split(text.trim_end()).unwrap();
        assert_eq!(canonical, "{\"a\":1,\"seq\":1}");
        assert_eq!(hexed, hex::encode(link(&[0; 32], canonical.as_bytes())));
        // The next line links to this one.
        let mut second = b"{\"b\":2}\n".to_vec();
        c.seal(&mut second);
        let second = String::from_utf8(second).unwrap();
        let (canonical2, hexed2) = split(second.trim_end()).unwrap();
        let mut prev = [0u8; 32];
        hex::decode_to_slice(hexed, &mut prev).unwrap();
        assert_eq!(hexed2, hex::encode(link(&prev, canonical2.as_bytes())));
    }

    #[test]
    fn lines_without_a_chain_do_not_split() {
        assert!(split("{\"a\":1}").is_none());
        assert!(split("{\"a\":1,\"chain\":\"abc\"}").is_none());
    }

    /// The signature of a run_start and a checkpoint covers every field that matters: the
    /// writer's message and the one rebuilt from the written line are the same, and changing
    /// any signed field (final, the interval, the time, the crash it names) changes it.
    #[test]
    fn signed_lines_cover_their_fields_and_rebuild_from_the_written_line() {
        use ed25519_dalek::Verifier;
        let key = SigningKey::from_bytes(&[7; 32]);
        let public = key.verifying_key();
        let mut c = Chain::new("r".into(), None, Some(key), interval());
        let tail = Tail {
            chain: Some("ab".repeat(32)),
            partial: false,
            last: Some(LastLine {
                run: "old".into(),
                seq: 9,
                closed: false,
            }),
        };
        let start = String::from_utf8(c.run_start(&tail, None)).unwrap();
        let mut rec = b"{\"event\":\"end\"}".to_vec();
        c.seal(&mut rec);
        let cp = String::from_utf8(c.checkpoint(false).unwrap()).unwrap();
        for line in [start, cp] {
            let (canonical, _) = split(line.trim_end()).unwrap();
            let v: Value = serde_json::from_str(&canonical).unwrap();
            let seq = v["seq"].as_u64().unwrap();
            let sig: [u8; 64] = hex::decode(v["signature"].as_str().unwrap())
                .unwrap()
                .try_into()
                .unwrap();
            let sig = ed25519_dalek::Signature::from_bytes(&sig);
            let msg = signed_message(&v, seq).unwrap();
            assert!(public.verify(&msg, &sig).is_ok(), "{line}");
            for (field, other) in [
                ("final", json!(true)),
                ("checkpoint_every_records", json!(1_000_000)),
                ("ts", json!("2000-01-01T00:00:00.000Z")),
                ("unclosed_run", Value::Null),
                ("prev_chain", Value::Null),
            ] {
                if v.get(field).is_none() {
                    continue;
                }
                let mut forged = v.clone();
                forged[field] = other;
                let msg = signed_message(&forged, seq).unwrap();
                assert!(public.verify(&msg, &sig).is_err(), "{field} is not signed");
            }
            assert!(public
                .verify(&signed_message(&v, seq + 1).unwrap(), &sig)
                .is_err());
        }
        assert!(signed_message(&json!({"event": "end"}), 1).is_none());
    }

    #[test]
    fn the_tail_names_a_run_that_ended_without_its_final_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let mut c = Chain::new(
            "r1".into(),
            None,
            Some(SigningKey::from_bytes(&[1; 32])),
            interval(),
        );
        let mut text = c.run_start(&Tail::default(), None);
        let mut rec = b"{\"event\":\"end\",\"run\":\"r1\"}".to_vec();
        c.seal(&mut rec);
        text.extend_from_slice(&rec);
        std::fs::write(&path, &text).unwrap();
        let t = last_chain(&path);
        assert_eq!(
            t.unclosed(),
            Some(&LastLine {
                run: "r1".into(),
                seq: 2,
                closed: false
            })
        );
        text.extend_from_slice(&c.checkpoint(true).unwrap());
        std::fs::write(&path, &text).unwrap();
        let t = last_chain(&path);
        assert!(t.unclosed().is_none() && t.last.is_some());
        assert!(!t.partial);
    }
}
