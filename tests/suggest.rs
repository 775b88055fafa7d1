//! `egress-proxy suggest` on a log recorded by the real proxy in report mode: it proposes
//! exactly the destinations used, collapses names into `*.domain` only when enough names of
//! one registrable domain were seen, never proposes a public-suffix wildcard, and its output
//! loads with `validate`.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

const NAMES: &[&str] = &[
    "api.one.test",
    "cdn1.two.test",
    "cdn2.two.test",
    "cdn3.two.test",
    "a.github.io",
    "b.github.io",
    "c.github.io",
    "x.co.uk",
    "y.co.uk",
    "z.co.uk",
];

fn config(dir: &Path, port: u16) -> String {
    let mut c = ProxyConfig::new()
        .audit("chain: true")
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("agent")
                .source("127.0.0.0/8")
                .report()
                .allow(&format!("api.one.test:{port}"))
                .allow("unused.test")
                .deny("denied.test"),
        );
    for n in NAMES.iter().chain(&["denied.test"]) {
        c = c.host(n, "127.0.0.1");
    }
    c.yaml(&dir.join("audit.jsonl"))
}

fn suggest(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .arg("suggest")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.stderr.is_empty() || out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The entries of a proposal, in order.
fn entries(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| l.trim().strip_prefix("- \""))
        .map(|l| l.split('"').next().unwrap().to_string())
        .collect()
}

#[test]
fn suggest_proposes_what_was_used_and_never_a_public_suffix_wildcard() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let cfg = dir.path().join("proxy.yaml");
    std::fs::write(&cfg, config(dir.path(), port)).unwrap();
    let mut proxy = Proxy::start_with(cfg.clone(), dir.path().join("audit.jsonl"), &[]);
    let px = format!("http://{}", proxy.proxy);
    // api.one.test twice, every other name once, and an IP literal.
    let mut targets: Vec<String> = NAMES
        .iter()
        .map(|n| format!("http://{n}:{port}/"))
        .collect();
    targets.push(format!("http://api.one.test:{port}/again"));
    targets.push(format!("http://127.0.0.1:{port}/ip"));
    for t in &targets {
        let out = curl(&["-x", &px, t]);
        assert_eq!(out.code, 0, "{t}: {}", out.text());
    }
    // Matched by network.deny (reported in report mode; refused once enforced): never
    // proposed, said apart.
    for _ in 0..2 {
        let out = curl(&["-x", &px, &format!("http://denied.test:{port}/")]);
        assert_eq!(out.code, 0, "{}", out.text());
    }
    proxy.terminate();
    let log = dir.path().join("audit.jsonl");
    let log_s = log.display().to_string();
    let cfg_s = cfg.display().to_string();

    let (code, yaml) = suggest(&["--audit", &log_s, "--sandbox", "agent", "--config", &cfg_s]);
    assert_eq!(code, 0, "{yaml}");
    let mut got = entries(&yaml);
    got.sort();
    let mut want: Vec<String> = [
        "api.one.test",
        "*.two.test",
        "a.github.io",
        "b.github.io",
        "c.github.io",
        "x.co.uk",
        "y.co.uk",
        "z.co.uk",
        "127.0.0.1",
    ]
    .iter()
    .map(|h| format!("{h}:{port}"))
    .collect();
    want.sort();
    assert_eq!(got, want, "{yaml}");
    // The busiest first, with its count; the wildcard lists what it covers.
    assert!(
        yaml.contains(&format!("- \"api.one.test:{port}\"")),
        "{yaml}"
    );
    assert!(yaml.contains("2 connections"), "{yaml}");
    assert!(yaml.contains("# 1 connection\n"), "{yaml}");
    assert!(
        yaml.contains(&format!("# left out: denied.test:{port} (2 connections) was refused by network.deny rule `denied.test`")),
        "{yaml}"
    );
    assert!(
        yaml.contains("3 names: cdn1.two.test, cdn2.two.test, cdn3.two.test"),
        "{yaml}"
    );
    assert!(
        !yaml.contains("*.github.io") && !yaml.contains("*.co.uk"),
        "{yaml}"
    );
    // Compared with the current policy.
    assert!(
        yaml.contains(&format!("adds    *.two.test:{port}")),
        "{yaml}"
    );
    assert!(yaml.contains("removes unused.test"), "{yaml}");
    assert!(
        !yaml.contains(&format!("adds    api.one.test:{port}")),
        "{yaml}"
    );

    // Without wildcard collapse: the three names.
    let (_, yaml2) = suggest(&[
        "--audit",
        &log_s,
        "--sandbox",
        "agent",
        "--wildcard-min",
        "50",
    ]);
    let got2 = entries(&yaml2);
    for n in ["cdn1.two.test", "cdn2.two.test", "cdn3.two.test"] {
        assert!(got2.contains(&format!("{n}:{port}")), "{yaml2}");
    }
    assert!(!yaml2.contains('*'), "{yaml2}");
    // --min-count 2 keeps only entries covering two connections or more (the wildcard covers
    // three), busiest first.
    let (_, yaml3) = suggest(&["--audit", &log_s, "--sandbox", "agent", "--min-count", "2"]);
    assert_eq!(
        entries(&yaml3),
        vec![format!("*.two.test:{port}"), format!("api.one.test:{port}")],
        "{yaml3}"
    );
    // Another sandbox: nothing.
    let (_, yaml4) = suggest(&["--audit", &log_s, "--sandbox", "nobody"]);
    assert!(entries(&yaml4).is_empty(), "{yaml4}");

    // The proposal loads: pasted under the sandbox's policy, validate accepts it.
    let pasted: String = yaml
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("      {l}\n"))
        .collect();
    let proposal_cfg = dir.path().join("proposal.yaml");
    std::fs::write(
        &proposal_cfg,
        format!(
            "sandboxes:\n  - id: agent\n    sources: [127.0.0.0/8]\n    policy:\n      provider: local\n      config: {{}}\n{pasted}"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["validate", "--config"])
        .arg(&proposal_cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("9 egress rules"));
}
