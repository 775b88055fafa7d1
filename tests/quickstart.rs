//! The README's offline quick start, run as it is written: the block after
//! `<!-- quickstart -->` goes to bash in an empty directory with the built binary on `PATH`;
//! it must show the origin's page, a 403 whose status line starts with its reason code, and
//! an allow and a deny record.

mod common;

use std::process::Command;

#[test]
fn the_readme_quick_start_runs_offline_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let after = readme
        .split_once("<!-- quickstart -->")
        .expect("the README marks its quick start")
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .expect("a sh block after the marker")
        .0;
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(block)
        .current_dir(dir.path())
        .env("PATH", path)
        // No proxy setting of the caller's may reach curl.
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let all = format!("{stdout}\n--- stderr:\n{stderr}\n--- proxy.log:\n{log}");
    assert!(out.status.success(), "{all}");
    assert!(stdout.contains("<!DOCTYPE HTML>"), "{all}");
    assert!(
        stdout.contains(
            "HTTP/1.1 403 egress-proxy [no_rule_matched]: refused GET http://denied.test:18000/"
        ),
        "{all}"
    );
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &serde_json::Value| r["event"] == "end")
        .collect();
    assert!(
        records
            .iter()
            .any(|r| r["decision"] == "allow" && r["target_host"] == "origin.test"),
        "{all}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["decision"] == "deny" && r["reason"] == "no_rule_matched"),
        "{all}"
    );
}

/// The README's sample refusal on the embedded default config (`egress-proxy run`, no
/// `--config`) is what the proxy answers: every line of the sample's response appears in
/// curl's, the status line first (the sample once showed a generic `403 Forbidden`).
#[test]
fn the_readme_sample_refusal_is_what_the_embedded_config_answers() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let command = "$ curl -i -x http://127.0.0.1:3128 http://gist.github.com/\n";
    let sample = readme
        .split_once(command)
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README shows the refusal of gist.github.com")
        .0;
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .arg("run")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ask = || {
        let out = Command::new("curl")
            .args(["-sS", "-i", "--noproxy", "", "-x", "http://127.0.0.1:3128"])
            .arg("http://gist.github.com/")
            .env_remove("http_proxy")
            .output()
            .expect("curl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n"),
        )
    };
    let every = std::time::Duration::from_millis(100);
    let out = common::within(every, std::time::Duration::from_secs(20), || {
        let (ok, text) = ask();
        ok.then_some(text)
    })
    .unwrap_or_else(|| ask().1);
    let _ = proxy.kill();
    let _ = proxy.wait();
    let first = sample.lines().next().unwrap_or_default();
    assert!(out.starts_with(first), "README: {first}\nproxy: {out}");
    for line in sample.lines().filter(|l| !l.is_empty()) {
        assert!(
            out.contains(line),
            "README line not in the answer: {line}\n{out}"
        );
    }
}
