//! The `egress-proxy` command: parses arguments and hands over to the library.
//! Exit codes: 0 allow / success, 1 deny (`check`), 2 usage or configuration error.

#![deny(unsafe_code)]
#![warn(clippy::too_many_lines)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use egress_proxy::config::{self, Config};

mod approve_cli;
mod audit_cli;
mod review;

use review::{check, suggest, validate};

#[derive(Parser)]
#[command(
    name = "egress-proxy",
    version,
    about = "Per-sandbox egress proxy enforcing AIP-36 network allowlists"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (on the embedded default config unless --config is given).
    Run {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Decide whether a sandbox may reach TARGET (host[:port], ip[:port] or [v6][:port]).
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        sandbox: String,
        /// Resolve the name (dns.hosts, then DNS) and apply address rules and the guard.
        #[arg(long)]
        resolve: bool,
        /// Print the decision as JSON.
        #[arg(long)]
        json: bool,
        /// Decide for a connection of this executable (`network.scoped`, scoped http rules).
        #[arg(long)]
        binary: Option<String>,
        /// An ancestor of `--binary` (repeat, parent first).
        #[arg(long = "ancestor")]
        ancestors: Vec<String>,
        /// Decide for a connection of this vouched command (`sandbox~exec`).
        #[arg(long)]
        exec: Option<String>,
        target: String,
    },
    /// Load and validate a configuration; print a summary or every error.
    Validate {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Read a sandbox token on stdin and print its `token_sha256:` line (surrounding
    /// whitespace, such as the newline `echo` adds, is not part of the token — as for
    /// `token_file`). The token itself is never printed.
    HashToken,
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Propose a sandbox's network.egress from its audit records (allow, report and deny),
    /// as YAML to paste under its policy.
    Suggest {
        /// Audit files (JSON lines; chained files too).
        #[arg(long = "audit", required = true, num_args = 1..)]
        audit: Vec<PathBuf>,
        #[arg(long)]
        sandbox: String,
        /// Leave out entries covering fewer connections.
        #[arg(long, default_value_t = 1)]
        min_count: u64,
        /// Distinct names below one registrable domain before proposing `*.domain`.
        #[arg(long, default_value_t = 3)]
        wildcard_min: usize,
        /// Compare with the sandbox's current policy (and use its defaults.ports).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Replay audit records under a candidate configuration: which exchanges would it
    /// newly refuse, newly allow, or not be able to tell (exit 1 when any verdict changes).
    Simulate(review::SimulateArgs),
    /// Policy change tools.
    Policy {
        #[command(subcommand)]
        action: review::PolicyAction,
    },
    /// The interception CA (tls_intercept).
    Ca {
        #[command(subcommand)]
        action: CaAction,
    },
    /// Audit trail tools.
    Audit {
        #[command(subcommand)]
        action: audit_cli::AuditAction,
    },
    /// Watch decisions as they happen (GET /v1/observe on the admin listener): one line per
    /// decision (coloured on a terminal), or the audit records as JSON lines with --json.
    Observe {
        /// Only this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        /// Only this decision.
        #[arg(long, value_parser = egress_proxy::control::observe::DECISIONS)]
        decision: Option<String>,
        /// Only this reason code (e.g. no_rule_matched).
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(
            egress_proxy::policy::reason::Reason::ALL.map(|r| r.code())
        ))]
        reason: Option<String>,
        /// Only this destination host.
        #[arg(long)]
        host: Option<String>,
        /// Print the records as JSON lines.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        to: approve_cli::AdminArgs,
    },
    /// List the access requests sandboxes made (newest first).
    Requests {
        /// Only requests in this state.
        #[arg(long, value_parser = ["pending", "approved", "denied", "expired"])]
        state: Option<String>,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        to: approve_cli::AdminArgs,
    },
    /// List the standing grants (approved here, by a webhook or auto-approval, or restored):
    /// id, sandbox, host:port, scope, kind, end, approver, spent.
    Grants {
        /// Only this sandbox's grants.
        #[arg(long)]
        sandbox: Option<String>,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        to: approve_cli::AdminArgs,
    },
    /// Approve an access request: a grant for its host and port (1h unless told).
    Approve {
        /// The request's id (r-…).
        id: String,
        #[command(flatten)]
        kind: approve_cli::Kind,
        /// A note kept with the answer (and in the audit record).
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        to: approve_cli::AdminArgs,
    },
    /// End an approved request's grant now (on every replica; its exchanges are cut).
    Revoke {
        /// The request's id (r-…).
        id: String,
        #[command(flatten)]
        to: approve_cli::AdminArgs,
    },
    /// A sandbox's flow labels (`network.flows`): show them, or waive one.
    Flows {
        #[command(subcommand)]
        action: approve_cli::FlowsAction,
    },
    /// Deny an access request.
    Deny {
        /// The request's id (r-…).
        id: String,
        /// A note kept with the answer (and in the audit record).
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        to: approve_cli::AdminArgs,
    },
}

#[derive(Subcommand)]
enum CaAction {
    /// Make a new CA for tls_intercept: DIR/ca.crt (install it in sandboxes) and DIR/ca.key
    /// (mode 0600, for the proxy only).
    Init {
        dir: PathBuf,
        /// Limit the CA to these DNS domains (X.509 name constraints): a stolen CA key can then
        /// impersonate only names under them. Repeat for several domains.
        #[arg(long = "permit", value_name = "DOMAIN")]
        permit: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Print the embedded default configuration, every key commented.
    Example,
    /// Print what `preset: NAME` in `network.http` expands into (every preset without a
    /// NAME), as YAML: its `network.egress` entries and `network.http` rules.
    Presets { name: Option<String> },
}

/// `egress-proxy config …`.
fn config_action(action: ConfigAction) -> ExitCode {
    match action {
        ConfigAction::Example => {
            print!("{}", config::EMBEDDED_CONFIG);
            ExitCode::SUCCESS
        }
        ConfigAction::Presets { name } => match config::presets::to_yaml(name.as_deref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn main() -> ExitCode {
    // A command whose reader goes away (`| head -1`, `| grep -q`) ends quietly, killed by
    // SIGPIPE as git, ls and cat are, instead of panicking on the write (exit 101).
    pipe_signal(libc::SIG_DFL);
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => {
            // The server handles a vanished peer as a write error on that connection.
            pipe_signal(libc::SIG_IGN);
            run(config)
        }
        Command::Check {
            config,
            sandbox,
            resolve,
            json,
            binary,
            ancestors,
            exec,
            target,
        } => {
            let asked = egress_proxy::control::check::asked_process;
            let process = asked(binary.as_deref(), &ancestors, exec.as_deref());
            check(config, &sandbox, &target, resolve, json, process)
        }
        Command::Validate { config } => validate(config),
        Command::Simulate(args) => review::simulate(args),
        Command::Policy { action } => review::policy(action),
        Command::HashToken => hash_token(),
        Command::Ca {
            action: CaAction::Init { dir, permit },
        } => ca_init(&dir, &permit),
        Command::Suggest {
            audit,
            sandbox,
            min_count,
            wildcard_min,
            config,
        } => suggest(audit, sandbox, min_count, wildcard_min, config),
        Command::Audit { action } => audit_cli::audit_action(action),
        Command::Observe {
            sandbox,
            decision,
            reason,
            host,
            json,
            to,
        } => {
            let filters = [
                ("sandbox", sandbox),
                ("decision", decision),
                ("reason", reason),
                ("host", host),
            ];
            observe(&to, &filters, json)
        }
        Command::Requests { state, json, to } => approve_cli::requests(&to, state.as_deref(), json),
        Command::Approve { id, kind, note, to } => {
            approve_cli::approve(&to, &id, &kind, note.as_deref())
        }
        Command::Deny { id, note, to } => approve_cli::deny(&to, &id, note.as_deref()),
        Command::Flows { action } => approve_cli::flows(action),
        Command::Revoke { id, to } => approve_cli::revoke(&to, &id),
        Command::Grants { sandbox, json, to } => approve_cli::grants(&to, sandbox.as_deref(), json),
        Command::Config { action } => config_action(action),
    }
}

fn ca_init(dir: &std::path::Path, permit: &[String]) -> ExitCode {
    match egress_proxy::intercept::ca::init(dir, permit) {
        Ok(()) => {
            println!(
                "wrote {0}/ca.crt (give it to sandboxes) and {0}/ca.key (mode 0600: the proxy only)",
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn hash_token() -> ExitCode {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut raw = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut raw) {
        eprintln!("error: cannot read the token from stdin: {e}");
        return ExitCode::from(2);
    }
    let token = raw.trim();
    if token.is_empty() {
        eprintln!("error: no token on stdin (try: egress-proxy hash-token < token-file)");
        return ExitCode::from(2);
    }
    if token.len() != raw.len() {
        eprintln!(
            "note: surrounding whitespace (such as a trailing newline) is not part of the token"
        );
    }
    println!(
        "token_sha256: {}",
        hex::encode(Sha256::digest(token.as_bytes()))
    );
    ExitCode::SUCCESS
}

/// Load the config or print every error and return exit code 2.
/// The configuration `run` serves: every secret it names must be readable.
fn load(path: Option<&PathBuf>) -> Result<Config, ExitCode> {
    report(config::load(path.map(PathBuf::as_path)))
}

/// Print every configuration error (exit 2).
pub(crate) fn report(loaded: Result<Config, config::ConfigErrors>) -> Result<Config, ExitCode> {
    loaded.map_err(|errors| {
        for e in &errors.0 {
            eprintln!("error: {e}");
        }
        eprintln!("{} configuration error(s)", errors.0.len());
        ExitCode::from(2)
    })
}

fn run(path: Option<PathBuf>) -> ExitCode {
    let config = match load(path.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match egress_proxy::server::run(config, path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `egress-proxy observe`: follow the decisions ([`egress_proxy::control::observe_client`]).
fn observe(
    to: &approve_cli::AdminArgs,
    filters: &[(&str, Option<String>)],
    json: bool,
) -> ExitCode {
    let (admin, token) = (&to.admin, to.token_file.as_deref());
    match egress_proxy::control::observe_client::follow(admin, token, filters, json, &to.tls()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Set what SIGPIPE does: the default (end the process) for the one-shot commands, ignored
/// (writes fail with `EPIPE`) for the server.
#[allow(unsafe_code)]
fn pipe_signal(action: libc::sighandler_t) {
    // SAFETY: called from the main thread before any other thread exists, or (for `run`)
    // before the runtime starts; `SIG_DFL` and `SIG_IGN` are not handlers, so no code of ours
    // runs in signal context.
    unsafe {
        libc::signal(libc::SIGPIPE, action);
    }
}
