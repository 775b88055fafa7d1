//! Built-in DLP on request bodies to terminated hosts (`dlp:` of a sandbox): named patterns
//! and a high-entropy token detector, run over the body as it streams — no whole-body
//! buffering: each chunk is scanned with the last [`OVERLAP`] bytes of the one before, so a
//! match split across chunks is found — within `max_bytes`. A `deny` match cuts the request
//! (`dlp_blocked`; the upstream gets an incomplete body, never a complete one), a `report`
//! match is recorded. Matches are recorded by rule name, never by the text matched.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use crate::config::decider::{DlpAction, DlpConfig};

/// Bytes of the previous chunk scanned again with the next.
pub const OVERLAP: usize = 1024;
/// The name the entropy detector's finds are recorded under.
pub const HIGH_ENTROPY: &str = "high_entropy";

/// What the scanner found, shared with the exchange.
#[derive(Default, Debug)]
pub struct Found {
    /// Rule names, in the order first found.
    pub names: Vec<String>,
    /// A `deny` rule matched (the body was cut).
    pub blocked: Option<String>,
}

/// The scanner of one body.
pub struct Scanner {
    cfg: Arc<DlpConfig>,
    /// `deny` acts as `report` (the sandbox is in report mode).
    report_only: bool,
    tail: BytesMut,
    scanned: u64,
    pub found: Arc<Mutex<Found>>,
}

/// Shannon entropy of `s`, in bits per byte.
fn entropy(s: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for b in s {
        counts[usize::from(*b)] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

impl Scanner {
    pub fn new(cfg: Arc<DlpConfig>, report_only: bool) -> Self {
        Scanner {
            cfg,
            report_only,
            tail: BytesMut::new(),
            scanned: 0,
            found: Default::default(),
        }
    }

    /// Scan the next chunk; `Err` with the rule when a `deny` rule matched.
    pub fn scan(&mut self, chunk: &Bytes) -> Result<(), String> {
        let left = self.cfg.max_bytes.saturating_sub(self.scanned);
        if left == 0 {
            return Ok(());
        }
        let take = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.scanned += take as u64;
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(&chunk[..take]);
        let mut hits: Vec<(String, DlpAction)> = Vec::new();
        for r in &self.cfg.rules {
            if r.pattern.is_match(&window) {
                hits.push((r.name.clone(), r.action));
            }
        }
        if let Some((min, bits, action)) = self.cfg.entropy {
            let token = |b: &u8| b.is_ascii_alphanumeric() || b"+/=_-".contains(b);
            let high = window[..]
                .split(|b| !token(b))
                .any(|t| t.len() >= min && entropy(t) >= bits);
            if high {
                hits.push((HIGH_ENTROPY.to_string(), action));
            }
        }
        let keep = window.len().min(OVERLAP);
        self.tail = window.split_off(window.len() - keep);
        let Ok(mut f) = self.found.lock() else {
            return Err("the scanner failed".into());
        };
        for (name, action) in hits {
            if !f.names.contains(&name) {
                f.names.push(name.clone());
            }
            if action == DlpAction::Deny && !self.report_only && f.blocked.is_none() {
                f.blocked = Some(name.clone());
                return Err(format!("dlp rule {name} matched the request body"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decider::{resolve_dlp, RawDlp, RawDlpRule, RawEntropy};

    fn cfg() -> Arc<DlpConfig> {
        let raw = RawDlp {
            rules: vec![RawDlpRule {
                name: "private_key".into(),
                pattern: "-----BEGIN [A-Z ]*PRIVATE KEY-----".into(),
                action: None,
            }],
            entropy: Some(RawEntropy {
                min_length: Some(32),
                bits_per_char: Some(4.5),
                action: Some("report".into()),
            }),
            max_bytes: Some(1 << 20),
        };
        resolve_dlp(&raw, &mut Vec::new()).unwrap()
    }

    #[test]
    fn a_pattern_split_across_chunks_is_found_and_denies() {
        let mut s = Scanner::new(cfg(), false);
        assert!(s
            .scan(&Bytes::from_static(b"hello -----BEGIN RSA PRIV"))
            .is_ok());
        assert!(s.scan(&Bytes::from_static(b"ATE KEY-----\nMIIE")).is_err());
        let f = s.found.lock().unwrap();
        assert_eq!(f.blocked.as_deref(), Some("private_key"));
    }

    #[test]
    fn high_entropy_tokens_are_reported_and_text_is_not() {
        let mut s = Scanner::new(cfg(), false);
        s.scan(&Bytes::from_static(
            b"the quick brown fox jumps over the lazy dog again and again",
        ))
        .unwrap();
        assert!(s.found.lock().unwrap().names.is_empty());
        s.scan(&Bytes::from_static(
            b"token=q8Zr3LkP0vXw9TnB2sYh7JdM4cFg6AeRtUiOpQlKz",
        ))
        .unwrap();
        assert_eq!(
            s.found.lock().unwrap().names,
            vec![HIGH_ENTROPY.to_string()]
        );
        // Report mode: a deny rule only reports.
        let mut r = Scanner::new(cfg(), true);
        assert!(r
            .scan(&Bytes::from_static(b"-----BEGIN PRIVATE KEY-----"))
            .is_ok());
        assert_eq!(
            r.found.lock().unwrap().names,
            vec!["private_key".to_string()]
        );
    }
}
