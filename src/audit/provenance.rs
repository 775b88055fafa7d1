//! `egress-proxy audit provenance`: what a sandbox read — every response the proxy relayed to
//! it on a terminated or plain-HTTP path, by destination, method, path, status, the SHA-256 of
//! the body it was given (`body_sha256`, computed while relaying) and the flow labels it
//! carried — as one JSON attestation signed with the audit key (Ed25519,
//! `audit.signing_key_file`). The signature covers the attestation's canonical JSON (keys
//! sorted, no spaces): `{"attestation": {...}, "signature": {"alg", "public_key", "value"}}`,
//! keys and signature in hex.

use std::io::BufRead;
use std::path::PathBuf;

use ed25519_dalek::Signer;
use serde_json::{json, Value};

/// What is attested: whose reads, from when.
pub struct Asked<'a> {
    /// The sandbox.
    pub sandbox: &'a str,
    /// RFC 3339: only records at or after it (`None`: all).
    pub since: Option<&'a str>,
}

/// One read: a response record with a body digest, as the attestation lists it.
fn read_of(v: &Value) -> Option<Value> {
    let digest = v["body_sha256"].as_str()?;
    Some(json!({
        "ts": v["ts"],
        "destination": format!("{}:{}", v["target_host"].as_str()?, v["target_port"]),
        "method": v["method"],
        "path": v["path"],
        "status": v["status"],
        "sha256": digest,
        "labels": v["labels"],
        "conn_id": v["conn_id"],
    }))
}

/// The reads of `asked` in `files` (oldest first, as written), in order.
pub fn reads(files: &[PathBuf], asked: &Asked<'_>) -> std::io::Result<Vec<Value>> {
    let mut out = Vec::new();
    for f in files {
        let file = std::fs::File::open(f)?;
        for line in std::io::BufReader::new(file).lines() {
            let Ok(v) = serde_json::from_str::<Value>(&line?) else {
                continue;
            };
            if v["sandbox"] != asked.sandbox || v["event"] != "end" {
                continue;
            }
            let ts = v["ts"].as_str().unwrap_or("");
            if asked.since.is_some_and(|s| ts < s) {
                continue;
            }
            out.extend(read_of(&v));
        }
    }
    Ok(out)
}

/// The attestation of `reads`, signed with `key`.
pub fn attest(asked: &Asked<'_>, reads: Vec<Value>, key: &ed25519_dalek::SigningKey) -> Value {
    let attestation = json!({
        "type": "egress-proxy/provenance/v1",
        "sandbox": asked.sandbox,
        "since": asked.since,
        "generated": super::record::rfc3339(std::time::SystemTime::now()),
        "reads": reads,
    });
    let canonical = canonical(&attestation);
    let signature = key.sign(&canonical);
    json!({
        "attestation": attestation,
        "signature": {
            "alg": "ed25519",
            "public_key": hex::encode(key.verifying_key().as_bytes()),
            "value": hex::encode(signature.to_bytes()),
        },
    })
}

/// The bytes a signature covers: the JSON with its keys sorted, without spaces.
pub fn canonical(v: &Value) -> Vec<u8> {
    // serde_json's map keeps keys sorted (no `preserve_order`), so this is canonical.
    serde_json::to_vec(v).unwrap_or_default()
}
