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

/// Issue 90: a name whose connections carried another protocol than TLS or HTTP is refused
/// under a port-named entry (in report mode: reported) and proposed as `tcp://host:port` —
/// the one spelling that declares opaque TCP; the proposal loads with `validate`.
#[test]
fn another_protocol_is_proposed_as_declared_opaque_tcp() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    // A destination that reads a Postgres startup message and answers with one byte.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"N");
        }
    });
    let cfg = dir.path().join("proxy.yaml");
    let yaml = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .host("db.test", "127.0.0.1")
        .sandbox(
            SandboxSpec::new("agent")
                .source("127.0.0.0/8")
                .report()
                .allow(&format!("db.test:{port}")),
        )
        .yaml(&dir.path().join("audit.jsonl"));
    std::fs::write(&cfg, yaml).unwrap();
    let mut proxy = Proxy::start_with(cfg.clone(), dir.path().join("audit.jsonl"), &[]);
    let mut s = std::net::TcpStream::connect(proxy.proxy).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    connect_on(&mut s, &format!("db.test:{port}"), None);
    s.write_all(b"\x00\x00\x00\x08\x04\xd2\x16\x2f").unwrap();
    let mut answer = [0u8; 1];
    // Report mode relays what enforcement would refuse, and says so.
    s.read_exact(&mut answer).unwrap();
    drop(s);
    let rec = proxy.wait_record(|r| r["event"] == "end" && r["reason"] == "unrecognised_protocol");
    assert_eq!(rec["decision"], "report", "{rec}");
    proxy.terminate();
    let log = dir.path().join("audit.jsonl");
    let (code, out) = suggest(&["--audit", &log.display().to_string(), "--sandbox", "agent"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(entries(&out), [format!("tcp://db.test:{port}")], "{out}");
}
