//! The review tools of the `egress-proxy` command — `validate`, `check`, `suggest`, and the
//! policy-change tools `simulate` and `policy diff` — which
//! read a configuration where the secrets it names may be absent (each is then a warning),
//! and print decisions and summaries.

use std::path::PathBuf;
use std::process::ExitCode;

use egress_proxy::config::{self, Config};
use egress_proxy::egress::resolve::Resolver;
use egress_proxy::sandboxes::set::PolicySet;

use std::io::BufRead;

use egress_proxy::control::policy_diff;
use egress_proxy::control::replay::{render, Replay};

use crate::report;

pub(crate) fn suggest(
    files: Vec<PathBuf>,
    sandbox: String,
    min_count: u64,
    wildcard_min: usize,
    config: Option<PathBuf>,
) -> ExitCode {
    use egress_proxy::audit::suggest;
    use egress_proxy::policy::ports::PortSet;
    let (default_ports, current) = match &config {
        Some(path) => {
            let c = match load_for_review(Some(path)) {
                Ok(c) => c,
                Err(code) => return code,
            };
            warn_absent_secrets(&c);
            let Some(b) = c.bindings.iter().find(|b| b.id == sandbox) else {
                eprintln!("error: {} defines no sandbox `{sandbox}`", path.display());
                return ExitCode::from(2);
            };
            let current: Vec<String> = b.network.egress.iter().map(|(t, _)| t.clone()).collect();
            (c.defaults.ports.clone(), Some(current))
        }
        None => match PortSet::from_ports(&[443]) {
            Ok(p) => (p, None),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let opts = suggest::Options {
        files,
        sandbox,
        min_count: min_count.max(1),
        wildcard_min: wildcard_min.max(2),
        default_ports,
        current,
    };
    match suggest::suggest(&opts) {
        Ok(p) => {
            print!("{}", suggest::render(&p, &opts));
            if p.skipped_lines > 0 {
                eprintln!(
                    "note: {} lines were not JSON records and were skipped",
                    p.skipped_lines
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The configuration the review tools read (`check`, `validate`, `suggest --config`): a
/// secret that cannot be read here is a warning, not an error.
pub(crate) fn load_for_review(path: Option<&PathBuf>) -> Result<Config, ExitCode> {
    report(config::load_for_review(path.map(PathBuf::as_path)))
}

/// Say on stderr which secrets a review tool did without (`run` would refuse to start).
pub(crate) fn warn_absent_secrets(config: &Config) {
    for w in &config.warnings {
        if w.contains(config::ABSENT_SECRET_NOTE) {
            eprintln!("warning: {w}");
        }
    }
}

/// The configuration and every sandbox compiled (`validate` and `check`); an error is printed.
pub(crate) fn load_compiled(path: Option<&PathBuf>) -> Result<(Config, PolicySet), ExitCode> {
    let config = load_for_review(path)?;
    match PolicySet::compile(&config, &[], vec![]) {
        Ok(set) => Ok((config, set)),
        Err(e) => {
            eprintln!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

pub(crate) fn validate(path: Option<PathBuf>) -> ExitCode {
    let (config, set) = match load_compiled(path.as_ref()) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let (mut egress, mut deny) = (0, 0);
    for b in &config.bindings {
        egress += b.network.egress.len();
        deny += b.network.deny.len();
    }
    // Counted as printed: the loader's warnings and those that need the compiled set.
    let warnings: Vec<String> = config
        .warnings
        .iter()
        .cloned()
        .chain(egress_proxy::control::check::address_only_hosts(
            &config, &set,
        ))
        .collect();
    println!(
        "{}: OK: {} sandboxes, {} egress rules, {} deny rules, {} warning{}, policy version {}",
        config.origin,
        config.bindings.len(),
        egress,
        deny,
        warnings.len(),
        if warnings.len() == 1 { "" } else { "s" },
        set.version()
    );
    for (id, chain) in config.layers.chains.iter() {
        let Some(l) = chain.last() else { continue };
        let ceiling = (l.ceiling.as_ref())
            .map(|c| {
                c.iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "(none of its own)".into());
        println!("  layer {id}: ceiling {ceiling}; deny {}", l.deny.len());
    }
    for b in &config.bindings {
        println!(
            "  {:<20} mode={:<10} enforcement={:<7} egress={:<4} deny={:<3} identity={} policy={}",
            b.id,
            b.network.mode.as_str(),
            b.enforcement.as_str(),
            b.network.egress.len(),
            b.network.deny.len(),
            identity_summary(b),
            b.policy_ref.as_deref().unwrap_or(&b.policy_file),
        );
        if !b.network.layers.is_empty() {
            let chain: Vec<&str> = b.network.layers.iter().map(|l| &*l.id).collect();
            println!("    bounded by layers {}", chain.join(" ⊇ "));
        }
        // Entries for some processes only (attribution).
        for s in &b.network.scoped {
            let entries: Vec<&str> = s.egress.iter().map(|(t, _)| t.as_str()).collect();
            println!("    scoped: {} -> {}", s.scope, entries.join(", "));
        }
        // The terminated hosts' rules, presets expanded, as they are matched.
        for r in b.network.http.iter() {
            println!(
                "    http: {}",
                r.text.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
    }
    println!("  {}", audit_summary(&config));
    for w in &warnings {
        println!("warning: {w}");
    }
    ExitCode::SUCCESS
}

/// Where the audit trail goes, and what happens while it cannot be written.
pub(crate) fn audit_summary(config: &config::Config) -> String {
    let to = config
        .audit_path
        .as_ref()
        .map_or("stdout".to_string(), |p| p.display().to_string());
    let failure = match config.audit_trail.on_failure {
        config::audit::OnFailure::Refuse => {
            "on_failure=refuse: while it cannot be written, new connections, requests and DNS queries are refused (audit_unavailable) and /readyz answers 503; no record is dropped"
        }
        config::audit::OnFailure::Continue => {
            "on_failure=continue: while it cannot be written, traffic is served and its records are dropped (counted in egress_audit_dropped_total)"
        }
    };
    format!("audit: {to}; {failure}")
}

pub(crate) fn identity_summary(b: &config::Binding) -> String {
    let mut parts = Vec::new();
    if b.token_sha256.is_some() {
        parts.push("token".to_string());
    }
    if !b.sources.is_empty() {
        parts.push(format!("sources({})", b.sources.len()));
    }
    if parts.is_empty() {
        parts.push("none".into());
    }
    parts.join("+")
}

pub(crate) fn check(
    path: Option<PathBuf>,
    sandbox: &str,
    target_text: &str,
    resolve: bool,
    as_json: bool,
    process: Option<egress_proxy::policy::process::Process>,
) -> ExitCode {
    let (config, set) = match load_compiled(path.as_ref()) {
        Ok(x) => x,
        Err(code) => return code,
    };
    warn_absent_secrets(&config);
    let Some(sb) = set.get(sandbox) else {
        eprintln!(
            "error: no sandbox `{sandbox}` (configured: {})",
            set.ids().join(", ")
        );
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let out = rt.block_on(async {
        let resolver = resolve.then(|| Resolver::new(&config.dns).0);
        let (r, p) = (resolver.as_ref(), process.as_ref());
        egress_proxy::control::check::check(&set, sb, target_text, r, p).await
    });
    print_decision(&out, as_json);
    if out["decision"] == "deny" {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

pub(crate) fn print_decision(out: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{out}");
        return;
    }
    let s = |k: &str| out[k].as_str().unwrap_or("-").to_string();
    println!(
        "{} {} -> {}: {} ({})",
        s("decision"),
        s("sandbox"),
        s("target"),
        s("reason"),
        s("enforcement")
    );
    println!("  {}", s("explanation"));
    if let Some(r) = out.get("resolved") {
        println!("  resolved: {r}");
    }
}

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
/// exchange's verdict changes or a member reaches beyond the candidate's ceilings (`run` would
/// refuse the candidate; a pipeline can gate on it), 2 on a usage error.
pub(crate) fn simulate(args: SimulateArgs) -> ExitCode {
    let SimulateArgs {
        config,
        sandbox,
        json,
        files,
    } = args;
    // Loaded as `run` would, except that members beyond a narrowed ceiling are listed (and
    // refused by the decisions) rather than refusing the candidate.
    let candidate = match report(config::load_for_simulation(Some(&config))) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let set = match PolicySet::compile(&candidate, &[], vec![]) {
        Ok(set) => set,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    warn_absent_secrets(&candidate);
    let mut replay = Replay::new(&set, sandbox.as_deref());
    replay.out.beyond_ceiling = candidate.beyond_ceiling.clone();
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
    match out.changed() == 0 && out.beyond_ceiling.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
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
