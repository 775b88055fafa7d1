//! The hash chain of the audit trail (`audit.chain: true`).
//!
//! Every line gets `seq` (1, 2, … from the start of this run) and, last, `chain`: the hex
//! SHA-256 of the previous line's chain (32 bytes; zeros before the first) followed by this
//! line's *canonical bytes* — the line as written, without its trailing `,"chain":"…"` and
//! newline. So the canonical form needs no JSON canonicalisation: a verifier cuts the chain
//! field off the line it reads ([`split`]).
//!
//! A run begins with a `run_start` line naming the chain it continues (`prev_chain`: the last
//! chain in the file when the process started, `null` for a new file). With a signing key,
//! `checkpoint` lines sign the chain so far every N records or T seconds and at shutdown
//! (`final: true`): whoever rewrites the file after an edit cannot re-sign it. Rotation and
//! reopening continue the chain; `egress-proxy audit verify` ([`super::verify`]) checks it.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::SystemTime;

use ed25519_dalek::{Signer, SigningKey};
use serde_json::json;
use sha2::{Digest, Sha256};

/// What a checkpoint signature covers (the verifier builds the same bytes).
pub fn checkpoint_message(run: &str, seq: u64, chain_head: &str) -> Vec<u8> {
    format!("egress-proxy audit checkpoint v1\n{run}\n{seq}\n{chain_head}").into_bytes()
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
    /// Records since the last checkpoint.
    since_checkpoint: u64,
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
    pub fn new(run: String, prev: Option<[u8; 32]>, key: Option<SigningKey>) -> Chain {
        Chain {
            prev: prev.unwrap_or([0; 32]),
            seq: 0,
            run,
            key,
            since_checkpoint: 0,
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
        self.since_checkpoint += 1;
        line.extend_from_slice(format!(",\"seq\":{}}}", self.seq).as_bytes());
        self.prev = link(&self.prev, line);
        line.pop();
        line.extend_from_slice(b",\"chain\":\"");
        line.extend_from_slice(hex::encode(self.prev).as_bytes());
        line.extend_from_slice(b"\"}\n");
    }

    /// The `run_start` line: which chain this run continues, and whether the file ended in
    /// a partial line (a crash mid-write) that was closed with a newline.
    pub fn run_start(&mut self, prev_chain: Option<&str>, partial_tail: bool) -> Vec<u8> {
        let mut v = json!({
            "ts": super::record::rfc3339(SystemTime::now()),
            "event": "run_start",
            "run": self.run,
            "prev_chain": prev_chain,
        });
        if partial_tail {
            v["partial_tail"] = json!(true);
        }
        if let Some(k) = &self.key {
            v["key_id"] = json!(key_id(&k.verifying_key().to_bytes()));
        }
        self.sealed(&v)
    }

    /// Whether a checkpoint is due after `records_threshold` records.
    pub fn checkpoint_due(&self, records_threshold: u64) -> bool {
        self.key.is_some() && self.since_checkpoint >= records_threshold
    }

    /// Whether records were written since the last checkpoint (and one can be signed).
    pub fn has_unsigned(&self) -> bool {
        self.key.is_some() && self.since_checkpoint > 0
    }

    /// A signed `checkpoint` line over the chain so far (`None` without a key).
    pub fn checkpoint(&mut self, last: bool) -> Option<Vec<u8>> {
        let key = self.key.as_ref()?;
        let head = hex::encode(self.prev);
        // The checkpoint's own seq: the one `sealed` gives it.
        let seq = self.seq + 1;
        let sig = key.sign(&checkpoint_message(&self.run, seq, &head));
        let v = json!({
            "ts": super::record::rfc3339(SystemTime::now()),
            "event": "checkpoint",
            "run": self.run,
            "chain_head": head,
            "key_id": key_id(&key.verifying_key().to_bytes()),
            "signature": hex::encode(sig.to_bytes()),
            "final": last,
        });
        let line = self.sealed(&v);
        self.since_checkpoint = 0;
        Some(line)
    }

    fn sealed(&mut self, v: &serde_json::Value) -> Vec<u8> {
        let mut line = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
        self.seal(&mut line);
        line
    }
}

/// The last chain written to `path` (or, when it is empty or missing, to `path.1`), and
/// whether `path` ends in a partial line.
pub fn last_chain(path: &Path) -> (Option<String>, bool) {
    let (chain, partial) = tail_chain(path);
    if chain.is_some() || partial {
        return (chain, partial);
    }
    let rotated = super::output::rotated_name(path, 1);
    (tail_chain(&rotated).0, false)
}

fn tail_chain(path: &Path) -> (Option<String>, bool) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return (None, false);
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(1 << 20);
    if f.seek(SeekFrom::Start(from)).is_err() {
        return (None, false);
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return (None, false);
    }
    let partial = !buf.is_empty() && buf.last() != Some(&b'\n');
    let text = String::from_utf8_lossy(&buf);
    let chain = text
        .lines()
        .rev()
        .filter_map(|l| split(l).map(|(_, c)| c.to_string()))
        .next();
    (chain, partial)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_line_splits_back_into_its_canonical_bytes() {
        let mut c = Chain::new("r".into(), None, None);
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
}
