//! The policy-change tools of the `egress-proxy` command: `simulate` (replay an audit trail
//! under a candidate configuration) and `policy diff` (what changed between two).

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use egress_proxy::audit::simulate::{render, Replay};
use egress_proxy::control::policy_diff;

use crate::review::{load_compiled, load_for_review, warn_absent_secrets};

/// `simulate`'s arguments.
#[derive(clap::Args)]
pub(crate) struct SimulateArgs {
    /// The candidate configuration.
    #[arg(long)]
    config: PathBuf,
    /// Only this sandbox's records.
    #[arg(long)]
    sandbox: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Audit files (JSON lines).
    #[arg(required = true, num_args = 1..)]
    files: Vec<PathBuf>,
}

/// `policy …`.
#[derive(clap::Subcommand)]
pub(crate) enum PolicyAction {
    /// What changed between two configurations, per sandbox and layer: entries added,
    /// removed, widened, narrowed (exit 1 when reach widens).
    Diff {
        old: PathBuf,
        new: PathBuf,
        /// Print the changes as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run a `policy` action.
pub(crate) fn policy(action: PolicyAction) -> ExitCode {
    match action {
        PolicyAction::Diff { old, new, json } => diff(old, new, json),
    }
}

/// `simulate --config CANDIDATE [--sandbox ID] [--json] FILES…`: exit 0, or 1 when any
/// exchange's verdict changes (a pipeline can gate on it), 2 on a usage error.
pub(crate) fn simulate(args: SimulateArgs) -> ExitCode {
    let SimulateArgs {
        config,
        sandbox,
        json,
        files,
    } = args;
    let (candidate, set) = match load_compiled(Some(&config)) {
        Ok(c) => c,
        Err(code) => return code,
    };
    warn_absent_secrets(&candidate);
    let mut replay = Replay::new(&set, sandbox.as_deref());
    for f in &files {
        let file = match std::fs::File::open(f) {
            Ok(file) => file,
            Err(e) => {
                eprintln!("error: {}: {e}", f.display());
                return ExitCode::from(2);
            }
        };
        for line in std::io::BufReader::with_capacity(1 << 20, file).split(b'\n') {
            match line {
                Ok(l) => replay.line(&String::from_utf8_lossy(&l)),
                Err(e) => {
                    eprintln!("error: {}: {e}", f.display());
                    return ExitCode::from(2);
                }
            }
        }
    }
    let out = replay.out;
    if json {
        match serde_json::to_string_pretty(&out) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", render(&out));
    }
    match out.changed() {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}

/// `policy diff OLD NEW`: exit 0 when nothing widens, 1 when something does, 2 on an error.
pub(crate) fn diff(old: PathBuf, new: PathBuf, json: bool) -> ExitCode {
    let (old, new) = match (load_for_review(Some(&old)), load_for_review(Some(&new))) {
        (Ok(o), Ok(n)) => (o, n),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let changes = policy_diff::diff(&old, &new);
    if json {
        match serde_json::to_string_pretty(&changes) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", policy_diff::render(&changes));
    }
    match changes.iter().any(|c| c.widens) {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    }
}
