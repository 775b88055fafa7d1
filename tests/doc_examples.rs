//! The docs against the code (issue 61, F8 and F12 of the client review: a usage example on an
//! admin port the proxy never listens on, a "not built yet" for what was built):
//! - every fenced block marked `sh runnable` in `docs/*.md` and the README is run with the
//!   real binary on `PATH`, in a scratch directory, under `bash -euo pipefail`; each
//!   `# prints: TEXT` line must be in what the command before it printed;
//! - every local URL in the docs that names the admin API (`/v1/…`, `/metrics`, `/healthz`,
//!   `/readyz`) is on the embedded configuration's admin port, and every proxy URL given to a
//!   client (`-x`, `HTTPS_PROXY=`) on its proxy port — unless the same file declares that
//!   port in a `listen` of its own (the README's quick start does);
//! - every `egress-proxy COMMAND --flag` the docs write exists: the command's `--help` lists
//!   each flag.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_egress-proxy")
}

/// `README.md` and `docs/*.md`, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The fenced blocks of `text`: (info string, body).
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn every_runnable_example_runs_and_prints_what_it_says() {
    let bindir = Path::new(bin()).parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bindir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for (file, text) in documents() {
        for (info, body) in blocks(&text) {
            if info != "sh runnable" {
                continue;
            }
            ran += 1;
            let dir = tempfile::tempdir().unwrap();
            // Each command's output is kept, so that the `# prints:` line after it is checked
            // against it alone.
            let mut script = String::from("set -euo pipefail\nout=\n");
            for line in body.lines() {
                match line.trim().strip_prefix("# prints: ") {
                    Some(expected) => script.push_str(&format!(
                        "case \"$out\" in *{q}*) ;; *) echo \"expected {e}, got: $out\" >&2; exit 1;; esac\n",
                        q = shell_quote(expected),
                        e = expected.replace('"', "'"),
                    )),
                    None if line.trim().is_empty() || line.trim().starts_with('#') => {}
                    None => script.push_str(&format!("out=$( {line}\n)\n")),
                }
            }
            let out = Command::new("bash")
                .args(["-c", &script])
                .current_dir(dir.path())
                .env("PATH", &path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: a runnable example failed:\n{body}\n{}{}",
                file.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(ran >= 1, "no block is marked `sh runnable`");
}

/// `s` as a quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The embedded configuration's `listen.proxy` and `listen.admin` ports.
fn default_ports() -> (u16, u16) {
    let out = Command::new(bin())
        .args(["config", "example"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let port = |key: &str| -> u16 {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("listen.{key} in the embedded config"))
    };
    (port("proxy"), port("admin"))
}

/// `host:port` pairs in `text` after `prefix` (a local host and a port).
fn local_ports(text: &str) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    for host in ["127.0.0.1:", "localhost:"] {
        let mut rest = text;
        while let Some(i) = rest.find(host) {
            let after = &rest[i + host.len()..];
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            let tail: String = after[digits.len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !"'\"`)".contains(*c))
                .collect();
            let before = &rest[..i];
            let lead = before.rsplit(['\n']).next().unwrap_or("").to_string();
            if let Ok(p) = digits.parse() {
                out.push((p, format!("{lead}{host}{digits}{tail}")));
            }
            rest = &after[digits.len()..];
        }
    }
    out
}

#[test]
fn local_urls_in_the_docs_use_the_default_ports() {
    let (proxy, admin) = default_ports();
    let mut wrong = Vec::new();
    for (file, text) in documents() {
        // Ports the file declares itself (`listen: { proxy: 127.0.0.1:P, admin: … }`).
        let declared: BTreeSet<u16> = text
            .lines()
            .filter(|l| l.contains("listen") || l.trim_start().starts_with("admin:"))
            .flat_map(|l| local_ports(l).into_iter().map(|(p, _)| p))
            .collect();
        for (port, seen) in local_ports(&text) {
            let admin_path = ["/v1/", "/metrics", "/healthz", "/readyz"]
                .iter()
                .any(|p| seen.contains(&format!(":{port}{p}")));
            let proxy_use = [
                "-x http://",
                "-x \"http://",
                "HTTPS_PROXY=http://",
                "HTTP_PROXY=http://",
            ]
            .iter()
            .any(|p| seen.contains(p));
            let expected = match (admin_path, proxy_use) {
                (true, _) => admin,
                (false, true) => proxy,
                (false, false) => continue,
            };
            if port != expected && !declared.contains(&port) {
                wrong.push(format!(
                    "{}: `{seen}` (expected port {expected})",
                    file.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `egress-proxy WORD [WORD] … --flag …` in `text`: (command words, flags).
fn commands(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for piece in text.split(['`', '\n']) {
        let Some(i) = piece.find("egress-proxy ") else {
            continue;
        };
        let rest = &piece[i + "egress-proxy ".len()..];
        // One command: up to the next pipe, list or redirection.
        let rest = rest.split(['|', ';', '>', '&']).next().unwrap_or("");
        let words: Vec<&str> = rest.split_whitespace().collect();
        let command: Vec<String> = words
            .iter()
            .take(2)
            .take_while(|w| {
                w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-')
            })
            .map(|w| w.to_string())
            .collect();
        if command.is_empty() {
            continue;
        }
        let flags = words
            .iter()
            .filter_map(|w| w.trim_start_matches(['[', '(']).strip_prefix("--"))
            .map(|f| {
                f.split(['=', ']', ')', ',', '`'])
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .filter(|f| !f.is_empty())
            .collect();
        out.push((command, flags));
    }
    out
}

#[test]
fn every_command_and_flag_the_docs_write_exists() {
    let subcommands =
        String::from_utf8_lossy(&Command::new(bin()).arg("--help").output().unwrap().stdout)
            .into_owned();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (file, text) in documents() {
        for (command, flags) in commands(&text) {
            // Only the binary's commands: "egress-proxy refused GET …" is a refusal's text.
            if !subcommands.contains(&format!("  {} ", command[0])) {
                continue;
            }
            let help = |words: &[String]| {
                let out = Command::new(bin())
                    .args(words)
                    .arg("--help")
                    .output()
                    .unwrap();
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            };
            let Some(text) = help(&command).or_else(|| help(&command[..1])) else {
                wrong.push(format!(
                    "{}: egress-proxy {}",
                    file.display(),
                    command.join(" ")
                ));
                continue;
            };
            checked += 1;
            for f in flags {
                if !text.contains(&format!("--{f}")) {
                    wrong.push(format!(
                        "{}: egress-proxy {} --{f}",
                        file.display(),
                        command.join(" ")
                    ));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} commands found in the docs");
    assert!(
        wrong.is_empty(),
        "not in the binary's --help:\n{}",
        wrong.join("\n")
    );
}
