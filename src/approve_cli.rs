//! `egress-proxy requests`, `grants`, `approve ID`, `deny ID`, `revoke ID` and `flows`: the approvers' commands,
//! one admin API call each ([`egress_proxy::control::admin_client`]); and how every admin
//! client command (these and `observe`) reaches the admin listener ([`AdminArgs`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{json, Value};

use egress_proxy::control::admin_client::{call, human, human_grants, parse_duration};
use egress_proxy::control::observe_client::AdminTls;

/// How to reach the admin listener (as `observe`).
#[derive(Args)]
pub struct AdminArgs {
    /// The admin listener.
    #[arg(long, default_value = "http://127.0.0.1:9901")]
    pub admin: String,
    /// A file holding the admin token (default: $EGRESS_PROXY_ADMIN_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// An `https://` admin listener's CA (PEM), trusted besides the public roots.
    #[arg(long)]
    cacert: Option<PathBuf>,
    /// A client certificate (PEM) for an admin listener that asks for one.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
}

impl AdminArgs {
    /// How to speak TLS to an `https://` admin listener.
    pub fn tls(&self) -> AdminTls {
        AdminTls {
            cacert: self.cacert.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// How long an approval holds.
#[derive(Args)]
#[group(multiple = false)]
pub struct Kind {
    /// For one exchange.
    #[arg(long)]
    once: bool,
    /// For this long: 3s, 10m, 2h, 1d (the default kind; 1h unless given).
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<u64>,
    /// Until revoked.
    #[arg(long)]
    permanent: bool,
}

fn run(to: &AdminArgs, method: &str, path: &str, body: Option<&Value>, json_out: bool) -> ExitCode {
    match call(
        &to.admin,
        to.token_file.as_deref(),
        &to.tls(),
        method,
        path,
        body,
    ) {
        Ok((200..=299, text)) => {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if json_out || (v.get("requests").is_none() && v.get("grants").is_none()) {
                let pretty = serde_json::to_string_pretty(&v).unwrap_or(text);
                println!("{}", egress_proxy::control::shown::json_for_person(&pretty));
            } else if v.get("grants").is_some() {
                print!("{}", human_grants(&v));
            } else {
                print!("{}", human(&v));
            }
            ExitCode::SUCCESS
        }
        Ok((status, text)) => {
            eprintln!("error: the admin API answered {status}: {}", text.trim());
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `egress-proxy requests [--state S] [--json]`.
pub fn requests(to: &AdminArgs, state: Option<&str>, json_out: bool) -> ExitCode {
    let path = match state {
        Some(s) => format!("/v1/requests?state={s}"),
        None => "/v1/requests".into(),
    };
    run(to, "GET", &path, None, json_out)
}

/// `egress-proxy grants [--sandbox ID] [--json]`: the standing grants.
pub fn grants(to: &AdminArgs, sandbox: Option<&str>, json_out: bool) -> ExitCode {
    let path = match sandbox {
        Some(s) => format!("/v1/grants?sandbox={s}"),
        None => "/v1/grants".into(),
    };
    run(to, "GET", &path, None, json_out)
}

/// `egress-proxy approve ID [--once | --ttl D | --permanent] [--note N]`.
pub fn approve(to: &AdminArgs, id: &str, kind: &Kind, note: Option<&str>) -> ExitCode {
    let body = match (kind.once, kind.ttl, kind.permanent) {
        (true, ttl, _) => json!({ "grant": "once", "ttl_s": ttl, "note": note }),
        (_, _, true) => json!({ "grant": "permanent", "note": note }),
        (_, ttl, _) => json!({ "grant": "ttl", "ttl_s": ttl.unwrap_or(3600), "note": note }),
    };
    run(
        to,
        "POST",
        &format!("/v1/requests/{id}/approve"),
        Some(&body),
        true,
    )
}

/// `egress-proxy revoke ID`: an approved request's grant (its id is the request's, as
/// `grants` lists it) ends now.
pub fn revoke(to: &AdminArgs, id: &str) -> ExitCode {
    run(to, "POST", &format!("/v1/requests/{id}/revoke"), None, true)
}

/// `egress-proxy deny ID [--note N]`.
pub fn deny(to: &AdminArgs, id: &str, note: Option<&str>) -> ExitCode {
    let body = json!({ "note": note });
    run(
        to,
        "POST",
        &format!("/v1/requests/{id}/deny"),
        Some(&body),
        true,
    )
}

/// `egress-proxy flows show|waive`: a sandbox's flow labels, and a person's waiver.
#[derive(clap::Subcommand)]
pub enum FlowsAction {
    /// The sandbox's flow rules, the labels armed on it (which request armed each, and when)
    /// and the waivers in force.
    Show {
        /// The sandbox's id.
        sandbox: String,
        #[command(flatten)]
        to: AdminArgs,
    },
    /// Waive a label of a sandbox: let one request through, take it out of force for a
    /// time, or reset it (recorded in the audit trail with who gave it).
    Waive {
        /// The sandbox's id.
        sandbox: String,
        /// The label (as `network.flows.labels` names it).
        label: String,
        #[command(flatten)]
        how: Waiver,
        /// A note kept in the audit record.
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        to: AdminArgs,
    },
}

/// How long a waiver holds: exactly one.
#[derive(Args)]
#[group(multiple = false, required = true)]
pub struct Waiver {
    /// One request the label would refuse goes through.
    #[arg(long)]
    once: bool,
    /// The label is out of force this long: 30s, 10m, 2h (at most 1d).
    #[arg(long = "for", value_parser = parse_duration)]
    for_s: Option<u64>,
    /// Disarm the label (a later response from its destinations arms it again).
    #[arg(long)]
    reset: bool,
}

/// `egress-proxy flows …`.
pub fn flows(action: FlowsAction) -> ExitCode {
    match action {
        FlowsAction::Show { sandbox, to } => run(
            &to,
            "GET",
            &format!("/v1/sandboxes/{sandbox}/flows"),
            None,
            true,
        ),
        FlowsAction::Waive {
            sandbox,
            label,
            how,
            note,
            to,
        } => {
            let mut body = json!({ "label": label, "note": note });
            match (how.once, how.for_s, how.reset) {
                (true, _, _) => body["once"] = json!(true),
                (_, Some(s), _) => body["for_s"] = json!(s),
                _ => body["reset"] = json!(true),
            }
            let path = format!("/v1/sandboxes/{sandbox}/flows/waive");
            run(&to, "POST", &path, Some(&body), true)
        }
    }
}
