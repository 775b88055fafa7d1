//! `audit:` settings beyond the path and queue: the hash chain and signed checkpoints
//! ([`crate::audit::chain`]), rotation, durability and the record format.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::Sink;

/// `audit.fsync`: how often written records are forced to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Never: the kernel writes back when it likes (a power loss can lose seconds).
    Never,
    /// After every batch the writer writes (every 5 ms at most; each record is on disk
    /// before the next batch is written).
    EveryRecord,
    /// At most this often.
    Interval(Duration),
}

/// `audit.format`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// This proxy's own record (DESIGN §7).
    #[default]
    Json,
    /// OCSF 1.8: Network Activity (4001) for connections, DNS Activity (4003) for queries.
    Ocsf,
}

/// `audit.on_failure`: what the proxy does while the audit sink cannot be written (a full
/// disk, an I/O error, a read-only remount, a closed pipe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Keep every record and retry; refuse new connections, requests and DNS queries
    /// (`audit_unavailable`) until the records can be written again. `/readyz` says 503.
    #[default]
    Refuse,
    /// Serve on and drop the records that cannot be written, counting them
    /// (`egress_audit_dropped_total`).
    Continue,
}

/// `audit.rotate`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotate {
    /// Start a new file once the current one holds this many bytes.
    pub max_bytes: u64,
    /// Rotated files kept (`path.1` newest … `path.keep`); older ones are deleted.
    pub keep: u32,
}

/// The tamper-evidence, rotation, durability and format settings of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditTrail {
    /// Every record gets `seq` and `chain`.
    pub chain: bool,
    /// Ed25519 private key (PKCS#8 PEM): signed `checkpoint` records.
    pub signing_key_file: Option<PathBuf>,
    /// `checkpoint_every_records`: a signed checkpoint after this many records.
    pub checkpoint_every_records: u64,
    /// `checkpoint_every_s`: and at least this often.
    pub checkpoint_every: Duration,
    /// Every signed line (`run_start`, `checkpoint`) is also appended here: another volume,
    /// or a pipe to a shipper, so that a cut or replaced tail of the log can be detected.
    pub checkpoint_file: Option<PathBuf>,
    /// When the file is rotated, if it is.
    pub rotate: Option<Rotate>,
    /// When records reach the disk.
    pub fsync: Fsync,
    /// The record format (the house JSON or OCSF).
    pub format: Format,
    /// What the proxy does when records cannot be written.
    pub on_failure: OnFailure,
    /// Where records that could not be written by the time the proxy stops are kept
    /// (`audit.spill_file`; by default `state_dir/audit.spill`, else beside the log): the
    /// next start puts them back into the trail before its own first line.
    pub spill_file: Option<PathBuf>,
}

impl Default for AuditTrail {
    fn default() -> Self {
        AuditTrail {
            chain: false,
            signing_key_file: None,
            checkpoint_every_records: 10_000,
            checkpoint_every: Duration::from_secs(60),
            checkpoint_file: None,
            rotate: None,
            fsync: Fsync::Never,
            format: Format::Json,
            on_failure: OnFailure::Refuse,
            spill_file: None,
        }
    }
}

/// The `audit:` keys this module owns, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrail {
    #[serde(default)]
    pub chain: bool,
    #[serde(default)]
    pub signing_key_file: Option<String>,
    #[serde(default)]
    pub checkpoint_every_records: Option<u64>,
    #[serde(default)]
    pub checkpoint_every_s: Option<u64>,
    #[serde(default)]
    pub checkpoint_file: Option<String>,
    #[serde(default)]
    pub rotate: Option<RawRotate>,
    /// `never`, `every_record`, or a number of milliseconds.
    #[serde(default)]
    pub fsync: Option<serde_yaml::Value>,
    #[serde(default)]
    pub format: Format,
    /// `refuse` (default) or `continue`.
    #[serde(default)]
    pub on_failure: OnFailure,
    #[serde(default)]
    pub spill_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRotate {
    pub max_bytes: u64,
    #[serde(default = "d_keep")]
    pub keep: u32,
}

fn d_keep() -> u32 {
    5
}

/// `audit.spill_file` when it is not set: `state_dir/audit.spill` (another volume than the
/// log's, when there is a state_dir: a full audit volume is what spills), else beside the log;
/// none for stdout.
fn default_spill(
    trail: &mut AuditTrail,
    path: &str,
    state_dir: Option<&str>,
    rel: &dyn Fn(&str) -> PathBuf,
) {
    if trail.spill_file.is_some() || path == "-" {
        return;
    }
    trail.spill_file = Some(match state_dir {
        Some(d) => rel(d).join("audit.spill"),
        None => rel(&format!("{path}.spill")),
    });
}

/// `audit.fsync`: `never`, `every_record`, or a number of milliseconds.
fn fsync_of(fsync: Option<&serde_yaml::Value>, sink: &mut Sink<'_>) -> Fsync {
    match fsync {
        None => Fsync::Never,
        Some(serde_yaml::Value::String(s)) if s == "never" => Fsync::Never,
        Some(serde_yaml::Value::String(s)) if s == "every_record" => Fsync::EveryRecord,
        Some(serde_yaml::Value::Number(n))
            if n.as_u64().is_some_and(|v| (1..=60_000).contains(&v)) =>
        {
            Fsync::Interval(Duration::from_millis(n.as_u64().unwrap_or(1000)))
        }
        Some(_) => {
            sink.top(
                "audit.fsync",
                "must be never, every_record, or a number of milliseconds from 1 to 60000",
                Some("fsync"),
            );
            Fsync::Never
        }
    }
}

/// Validate the trail settings; every problem goes to `sink`.
pub(super) fn resolve_trail(
    raw: RawTrail,
    (path, state_dir): (&str, Option<&str>),
    rel: &dyn Fn(&str) -> PathBuf,
    sink: &mut Sink<'_>,
) -> AuditTrail {
    let to_file = path != "-";
    let d = AuditTrail::default();
    let fsync = fsync_of(raw.fsync.as_ref(), sink);
    if raw.signing_key_file.is_some() && !raw.chain {
        sink.top(
            "audit.signing_key_file",
            "signed checkpoints need `audit.chain: true` (they sign the chain)",
            Some("signing_key_file"),
        );
    }
    if raw.checkpoint_file.is_some() && raw.signing_key_file.is_none() {
        sink.top(
            "audit.checkpoint_file",
            "a checkpoint file holds signed lines: it needs `audit.signing_key_file` (and `chain: true`)",
            Some("checkpoint_file"),
        );
    }
    let rotate = raw.rotate.map(|r| Rotate {
        max_bytes: r.max_bytes,
        keep: r.keep,
    });
    if let Some(r) = &rotate {
        if r.max_bytes < 4096 || r.keep == 0 || r.keep > 1000 {
            sink.top(
                "audit.rotate",
                "max_bytes must be at least 4096 and keep from 1 to 1000",
                Some("rotate"),
            );
        }
    }
    if !to_file && (rotate.is_some() || fsync != Fsync::Never) {
        sink.top(
            "audit",
            "rotate and fsync need `audit.path` to be a file, not stdout (\"-\")",
            Some("audit:"),
        );
    }
    let every_records = raw
        .checkpoint_every_records
        .unwrap_or(d.checkpoint_every_records);
    let every_s = raw
        .checkpoint_every_s
        .unwrap_or(d.checkpoint_every.as_secs());
    if every_records == 0 || every_s == 0 {
        sink.top(
            "audit.checkpoint_every_records",
            "checkpoint_every_records and checkpoint_every_s must be at least 1",
            Some("checkpoint_every"),
        );
    }
    let mut trail = AuditTrail {
        chain: raw.chain,
        signing_key_file: raw.signing_key_file.as_deref().map(rel),
        checkpoint_every_records: every_records.max(1),
        checkpoint_every: Duration::from_secs(every_s.max(1)),
        checkpoint_file: raw.checkpoint_file.as_deref().map(rel),
        rotate,
        fsync,
        format: raw.format,
        on_failure: raw.on_failure,
        spill_file: raw.spill_file.as_deref().map(rel),
    };
    default_spill(&mut trail, path, state_dir, rel);
    trail
}

/// `validate`'s warning when nothing could say that records were lost at a stop (security
/// review A32): no `checkpoint_file`, and the spill file (where the loss note goes) on the
/// same volume as the log — the full volume that loses the records loses the note too.
pub(super) fn loss_warning(trail: &AuditTrail, log: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if trail.checkpoint_file.is_some() || log.as_os_str() == "-" {
        return None;
    }
    let device = |p: &std::path::Path| {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty())?;
        std::fs::metadata(dir).ok().map(|m| m.dev())
    };
    let spill = trail.spill_file.as_deref()?;
    let same = match (device(log), device(spill)) {
        (Some(a), Some(b)) => a == b,
        // Not made yet: judged by the configuration alone (beside the log unless a state_dir).
        _ => spill.parent() == log.parent(),
    };
    same.then(|| format!(
        "audit: {} is on the audit log's volume and there is no audit.checkpoint_file: a stop while that volume is full loses the records it could not write and the note that says so (`audit verify` would not know); put state_dir or audit.spill_file on another volume, or set audit.checkpoint_file",
        spill.display()
    ))
}
