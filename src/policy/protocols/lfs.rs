//! Git LFS's batch API (`POST {repository}/info/lfs/objects/batch`): a body whose `operation`
//! is `download` or `upload`. The batch call is where a client learns where to send or fetch
//! objects, so judging it decides the transfer (`lfs: [download | upload]` on a rule).

use serde_json::Value;

use super::{strict_json, ProtocolError};

/// An LFS batch operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LfsOp {
    /// Fetching objects.
    Download,
    /// Sending objects.
    Upload,
}

impl LfsOp {
    /// The operation an `lfs:` entry names.
    pub fn parse(s: &str) -> Result<LfsOp, ProtocolError> {
        match s {
            "download" => Ok(LfsOp::Download),
            "upload" => Ok(LfsOp::Upload),
            _ => Err(ProtocolError::rule(format!(
                "lfs: `{s}` is not download or upload"
            ))),
        }
    }

    /// The name written in rules and records.
    pub fn as_str(self) -> &'static str {
        match self {
            LfsOp::Download => "download",
            LfsOp::Upload => "upload",
        }
    }
}

/// The repository path of an LFS batch request, if `method` and `path` are one.
pub fn batch_repository<'p>(method: &str, path: &'p str) -> Option<&'p str> {
    if !method.eq_ignore_ascii_case("POST") {
        return None;
    }
    path.strip_suffix("/info/lfs/objects/batch")
}

/// Judge a batch body against the operations allowed: `Ok` with the call for the record.
pub fn judge(ops: &[LfsOp], body: &[u8]) -> Result<String, (String, Option<String>)> {
    let v = strict_json::parse(body).map_err(|e| (e.into_detail(), None))?;
    let op = match v.get("operation").and_then(Value::as_str) {
        Some(s) => {
            LfsOp::parse(s).map_err(|_| (format!("the LFS operation `{s}` is unknown"), None))?
        }
        None => return Err(("an LFS batch request without an operation".into(), None)),
    };
    let call = op.as_str().to_string();
    match ops.contains(&op) {
        true => Ok(call),
        false => Err((
            format!("an LFS {} is not in the rule's lfs operations", op.as_str()),
            Some(call),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_requests_are_judged_by_operation() {
        assert_eq!(
            batch_repository("POST", "/o/r.git/info/lfs/objects/batch"),
            Some("/o/r.git")
        );
        assert_eq!(
            batch_repository("GET", "/o/r.git/info/lfs/objects/batch"),
            None
        );
        let down = [LfsOp::Download];
        assert!(judge(&down, br#"{"operation":"download","objects":[]}"#).is_ok());
        assert!(judge(&down, br#"{"operation":"upload","objects":[]}"#).is_err());
        assert!(judge(&down, br#"{"operation":"download","operation":"upload"}"#).is_err());
        assert!(judge(&down, br#"{"objects":[]}"#).is_err());
        assert!(judge(&down, b"not json").is_err());
    }
}
