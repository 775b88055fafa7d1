//! `egress-proxy audit verify` (the hash chain and signed checkpoints of audit files) and
//! `egress-proxy audit provenance` (what a sandbox read, as a signed attestation).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum AuditAction {
    /// Check the hash chain (audit.chain) of audit files given oldest first (rotated files:
    /// audit.jsonl.3 audit.jsonl.2 audit.jsonl.1 audit.jsonl) and, with --public-key, the
    /// signatures of their checkpoints. Exit 0 intact, 1 tampered, 2 usage.
    Verify {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The Ed25519 public key (PEM) matching audit.signing_key_file: signatures are
        /// checked and the trail must keep its signed checkpoint interval, end every run with
        /// its final checkpoint (or have the next run name the crash), and not be empty.
        #[arg(long)]
        public_key: Option<PathBuf>,
        /// The newest file is still being written: accept its last run without a final
        /// checkpoint while its next checkpoint is not overdue (the lines after the last
        /// checkpoint are reported as only chained).
        #[arg(long, requires = "public_key")]
        open_run: bool,
        /// audit.checkpoint_file: the log must hold every signed line it holds (from the
        /// first one the given files hold on); a cut or replaced end of the log is found.
        #[arg(long, value_name = "FILE")]
        checkpoints: Option<PathBuf>,
    },
    /// What a sandbox read: every response relayed to it on a terminated or plain-HTTP path
    /// (destination, method, path, status, SHA-256 of the body it was given, its flow labels),
    /// from audit files given oldest first, as one JSON attestation signed with the audit key.
    Provenance {
        /// The sandbox.
        #[arg(long)]
        sandbox: String,
        /// Only what it read at or after this time (RFC 3339, as the records spell it).
        #[arg(long)]
        since: Option<String>,
        /// The Ed25519 private key (PKCS#8 PEM): audit.signing_key_file.
        #[arg(long)]
        signing_key: PathBuf,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// `egress-proxy audit verify|provenance`.
pub(crate) fn audit_action(action: AuditAction) -> ExitCode {
    match action {
        AuditAction::Verify {
            files,
            public_key,
            open_run,
            checkpoints,
        } => audit_verify(
            &files,
            public_key.as_deref(),
            open_run,
            checkpoints.as_deref(),
        ),
        AuditAction::Provenance {
            sandbox,
            since,
            signing_key,
            files,
        } => provenance(&sandbox, since.as_deref(), &signing_key, &files),
    }
}

/// `egress-proxy audit provenance`: the signed attestation on stdout.
fn provenance(
    sandbox: &str,
    since: Option<&str>,
    key: &std::path::Path,
    files: &[PathBuf],
) -> ExitCode {
    use egress_proxy::audit::provenance;
    let key = match egress_proxy::audit::verify::read_signing_key(key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let asked = provenance::Asked { sandbox, since };
    match provenance::reads(files, &asked) {
        Ok(reads) => {
            let out = provenance::attest(&asked, reads, &key);
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot read the audit files: {e}");
            ExitCode::from(2)
        }
    }
}

/// `egress-proxy audit verify`: intact (0), tampered (1), incomplete (3), or usage (2).
fn audit_verify(
    files: &[PathBuf],
    public_key: Option<&std::path::Path>,
    open_run: bool,
    checkpoints: Option<&std::path::Path>,
) -> ExitCode {
    use egress_proxy::audit::verify;
    let key = match public_key.map(verify::read_public_key).transpose() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = verify::Options {
        key: key.as_ref(),
        open_run,
        checkpoints,
        ..verify::Options::default()
    };
    let report = match verify::verify_with(files, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for n in &report.notes {
        println!("note: {n}");
    }
    match (report.verdict(), &report.problem) {
        (verify::Verdict::Tampered, Some(p)) => {
            println!("TAMPERED: {p}");
            ExitCode::from(1)
        }
        (verify::Verdict::Incomplete, _) => {
            for l in &report.lost {
                println!("lost: {l}");
            }
            println!(
                "INCOMPLETE: {} records, {} runs unaltered, but the trail says records were lost",
                report.records, report.runs
            );
            ExitCode::from(3)
        }
        _ => {
            let mut extra = String::new();
            if open_run {
                extra.push_str(&format!(", {} only chained", report.only_chained));
            }
            if checkpoints.is_some() {
                extra.push_str(&format!(
                    ", {} signed lines matched in the checkpoint file",
                    report.anchored
                ));
            }
            println!(
                "intact: {} records, {} runs, {} checkpoints ({} signatures checked{extra})",
                report.records, report.runs, report.checkpoints, report.signatures_checked
            );
            ExitCode::SUCCESS
        }
    }
}
