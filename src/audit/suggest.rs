//! `egress-proxy suggest`: propose a sandbox's `network.egress` from what its connections
//! asked for (audit records: allowed, reported and denied alike), for the rollout workflow
//! report mode → suggest → review → enforce.
//!
//! Exact names by default. A `*.domain` entry replaces a domain's names only when at least
//! `wildcard_min` distinct names below one registrable domain (the Public Suffix List's
//! idea of who owns a name) were seen — and only if the loader itself would accept that
//! entry (never a public suffix). Names under a private-section suffix are each their own
//! registrable domain (`user1.github.io` and `user2.github.io` have different owners), so
//! they are never merged into one wildcard. IP-literal targets become address rules. A port
//! is written only when it is not in `defaults.ports`. A destination that `network.deny`
//! refused (`denied_by_rule`) is never proposed — deny wins, so the entry would change
//! nothing — and is listed apart, with the rule that refused it. Requests on terminated hosts
//! that called something (an MCP tool, a GraphQL operation, a git service) propose
//! `network.http` rules ([`super::suggest_http`]). A name whose connections carried another
//! protocol than TLS or HTTP is proposed as `tcp://host:port` (opaque TCP, declared).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

use crate::policy::entry::parse_entry;
use crate::policy::ports::PortSet;

/// What to propose from.
pub struct Options {
    /// The audit files to read.
    pub files: Vec<PathBuf>,
    /// The sandbox to suggest entries for.
    pub sandbox: String,
    /// Entries covering fewer connections are left out.
    pub min_count: u64,
    /// Distinct names below one registrable domain before a `*.domain` entry is proposed.
    pub wildcard_min: usize,
    /// Ports written without a `:port` (the configuration's `defaults.ports`).
    pub default_ports: PortSet,
    /// The sandbox's current entries and, for each, whether any record was allowed by it
    /// (with `--config`).
    pub current: Option<Vec<String>>,
}

/// One proposed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposed {
    /// The entry, as it would be written.
    pub entry: String,
    /// How many refused connections it would have allowed.
    pub connections: u64,
    /// The names a wildcard stands for (empty for exact entries).
    pub names: Vec<String>,
}

/// The proposal.
#[derive(Debug, Default)]
pub struct Proposal {
    /// The entries proposed, most used first.
    pub entries: Vec<Proposed>,
    /// Records of the sandbox read, by decision.
    pub by_decision: BTreeMap<String, u64>,
    /// Entries of the current policy no record in the files was allowed by.
    pub unused: Vec<String>,
    /// Proposed entries not in the current policy.
    pub added: Vec<String>,
    /// `host:port` refused by a deny rule → (connections, the rule): left out.
    pub denied: BTreeMap<String, (u64, String)>,
    /// Lines that were not records (skipped).
    pub skipped_lines: u64,
    /// Calls seen on terminated hosts, for `network.http` rules.
    pub http: super::suggest_http::Calls,
    /// Entries only one process asked for, by that process (`network.scoped`).
    pub scoped: BTreeMap<super::suggest_scoped::Who, Vec<Proposed>>,
}

/// Read the records and build the proposal. `Err` when a file cannot be read.
/// An audit file `suggest` cannot read.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct SuggestError {
    path: std::path::PathBuf,
    #[source]
    source: std::io::Error,
}

/// Read the files and propose entries for the refusals of the sandbox.
pub fn suggest(opts: &Options) -> Result<Proposal, SuggestError> {
    let mut p = Proposal::default();
    // (host, port) → connections
    let mut seen: BTreeMap<(String, u16), u64> = BTreeMap::new();
    // (host, port) whose connections carried a protocol the proxy does not read.
    let mut opaque: BTreeSet<(String, u16)> = BTreeSet::new();
    let mut rules_used: BTreeSet<String> = BTreeSet::new();
    let mut askers = super::suggest_scoped::Askers::default();
    for f in &opts.files {
        let text = std::fs::read_to_string(f).map_err(|source| SuggestError {
            path: f.clone(),
            source,
        })?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                p.skipped_lines += 1;
                continue;
            };
            if v["event"] != "end" || v["sandbox"] != opts.sandbox.as_str() || v["mode"] == "dns" {
                continue;
            }
            if v["mode"] == "https" {
                // A request in a terminated tunnel: its connection is counted by its own
                // record; what it called may propose a network.http rule.
                p.http.add(&v);
                continue;
            }
            let (Some(host), Some(port)) = (v["target_host"].as_str(), v["target_port"].as_u64())
            else {
                continue;
            };
            let Ok(port) = u16::try_from(port) else {
                continue;
            };
            let decision = v["decision"].as_str().unwrap_or("?").to_string();
            *p.by_decision.entry(decision.clone()).or_default() += 1;
            if v["reason"] == "denied_by_rule" {
                let rule = v["rule"].as_str().unwrap_or("?").to_string();
                let key = format!("{}:{port}", host.to_ascii_lowercase());
                p.denied.entry(key).or_insert((0, rule)).0 += 1;
                continue;
            }
            if decision == "allow" {
                if let Some(rule) = v["rule"].as_str() {
                    rules_used.insert(rule.to_string());
                }
            }
            askers.add(&host.to_ascii_lowercase(), &v);
            *seen.entry((host.to_ascii_lowercase(), port)).or_default() += 1;
            if carried_another_protocol(&v) {
                opaque.insert((host.to_ascii_lowercase(), port));
            }
        }
    }
    p.entries = propose(&seen, &opaque, opts);
    p.scoped = askers.split(&mut p.entries);
    if let Some(current) = &opts.current {
        let have: BTreeSet<&str> = current.iter().map(String::as_str).collect();
        p.added = p
            .entries
            .iter()
            .filter(|e| !have.contains(e.entry.as_str()))
            .map(|e| e.entry.clone())
            .collect();
        p.unused = current
            .iter()
            .filter(|c| !rules_used.contains(c.as_str()))
            .cloned()
            .collect();
    }
    Ok(p)
}

/// A connection that carried neither TLS nor HTTP: relayed as opaque TCP, or refused because
/// its entry did not declare it (`unrecognised_protocol` for another protocol, not for bytes
/// that start like TLS or HTTP).
fn carried_another_protocol(v: &serde_json::Value) -> bool {
    let detail = v["detail"].as_str().unwrap_or("");
    v["mode"] == "tcp" && v["decision"] == "allow"
        || v["reason"] == "unrecognised_protocol"
            && detail.contains(crate::wire::first_bytes::OPAQUE)
}

fn propose(
    seen: &BTreeMap<(String, u16), u64>,
    opaque: &BTreeSet<(String, u16)>,
    opts: &Options,
) -> Vec<Proposed> {
    // Names per (registrable domain, port), to decide on wildcards.
    let mut by_domain: BTreeMap<(String, u16), Vec<(&str, u64)>> = BTreeMap::new();
    let mut out = Vec::new();
    let with_port = |host: String, port: u16| {
        if opts.default_ports.contains(port) {
            host
        } else {
            format!("{host}:{port}")
        }
    };
    for ((host, port), n) in seen {
        if opaque.contains(&(host.clone(), *port)) && host.parse::<IpAddr>().is_err() {
            // Opaque TCP is declared name by name and port by port, never by a wildcard.
            out.push(Proposed {
                entry: format!("{}{host}:{port}", crate::policy::entry::OPAQUE_SCHEME),
                connections: *n,
                names: Vec::new(),
            });
            continue;
        }
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            let entry = match ip {
                IpAddr::V4(a) => with_port(a.to_string(), *port),
                IpAddr::V6(a) if opts.default_ports.contains(*port) => a.to_string(),
                IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            out.push(Proposed {
                entry,
                connections: *n,
                names: Vec::new(),
            });
            continue;
        }
        match psl::domain_str(host) {
            Some(d) if d != host => by_domain
                .entry((d.to_string(), *port))
                .or_default()
                .push((host, *n)),
            _ => out.push(Proposed {
                entry: with_port(host.clone(), *port),
                connections: *n,
                names: Vec::new(),
            }),
        }
    }
    for ((domain, port), names) in by_domain {
        let wildcard = format!("*.{domain}");
        // The loader's own check: the entry must parse (never a public suffix).
        if names.len() >= opts.wildcard_min && parse_entry(&wildcard).is_ok() {
            out.push(Proposed {
                entry: with_port(wildcard, port),
                connections: names.iter().map(|(_, n)| n).sum(),
                names: names.iter().map(|(h, _)| h.to_string()).collect(),
            });
        } else {
            for (h, n) in names {
                out.push(Proposed {
                    entry: with_port(h.to_string(), port),
                    connections: n,
                    names: Vec::new(),
                });
            }
        }
    }
    out.retain(|e| e.connections >= opts.min_count);
    out.sort_by(|a, b| {
        b.connections
            .cmp(&a.connections)
            .then(a.entry.cmp(&b.entry))
    });
    out
}

/// The proposal as YAML to paste under a sandbox's `policy:`.
/// "1 connection", "2 connections".
fn connections(n: u64) -> String {
    match n {
        1 => "1 connection".into(),
        n => format!("{n} connections"),
    }
}

/// The proposal as YAML, with comments on what was left out.
pub fn render(p: &Proposal, opts: &Options) -> String {
    let total: u64 = p.by_decision.values().sum();
    let decisions: Vec<String> = p
        .by_decision
        .iter()
        .map(|(d, n)| format!("{d} {n}"))
        .collect();
    let mut s = format!(
        "# egress-proxy suggest: sandbox {}, {total} connections in {} file(s) ({})\n",
        opts.sandbox,
        opts.files.len(),
        decisions.join(", ")
    );
    if opts.min_count > 1 {
        s.push_str(&format!(
            "# entries covering fewer than {} connections are left out\n",
            opts.min_count
        ));
    }
    s.push_str("network:\n  egress:\n");
    if p.entries.is_empty() {
        s.push_str("    []\n");
    }
    let width = p.entries.iter().map(|e| e.entry.len()).max().unwrap_or(0) + 2;
    for e in &p.entries {
        let quoted = format!("\"{}\"", e.entry);
        let what = if e.names.is_empty() {
            connections(e.connections)
        } else {
            format!(
                "{}, {} names: {}",
                connections(e.connections),
                e.names.len(),
                e.names.join(", ")
            )
        };
        s.push_str(&format!(
            "    - {quoted:<width$} # {what}\n",
            width = width + 2
        ));
    }
    s.push_str(&super::suggest_scoped::render(&p.scoped));
    if !p.http.is_empty() {
        s.push_str(&p.http.render());
    }
    for (target, (n, rule)) in &p.denied {
        s.push_str(&format!(
            "# left out: {target} ({}) was refused by network.deny rule `{rule}`: deny wins, so an egress entry would change nothing\n",
            connections(*n)
        ));
    }
    if opts.current.is_some() {
        s.push_str("# compared with the sandbox's current network.egress:\n");
        if p.added.is_empty() {
            s.push_str("#   adds nothing\n");
        }
        for a in &p.added {
            s.push_str(&format!("#   adds    {a}\n"));
        }
        for u in &p.unused {
            s.push_str(&format!(
                "#   removes {u}   (no connection in these records was allowed by it)\n"
            ));
        }
    }
    s
}
