//! `git: [fetch | push]` rules (issue 42's first part) with the real `git` client through the
//! proxy to a real `git http-backend` behind a test certificate (`tests/data/git_https.py`):
//! under `git: [fetch]` a clone passes and a push is refused (`git_not_allowed`, nothing
//! written to the repository); under `git: [fetch, push]` the push passes.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn git(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        // Only what the test sets: the machine's CA bundle and proxies would override it.
        .env_remove("GIT_SSL_CAINFO")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .output()
        .expect("git is installed (.ci/run installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A second commit in the clone at `clone`: a file `NEW` holding `text`.
fn commit(clone: &Path, text: &str) {
    std::fs::write(clone.join("NEW"), text).unwrap();
    for args in [
        &["config", "user.email", "t@test"][..],
        &["config", "user.name", "t"],
        &["add", "NEW"],
        &["commit", "-q", "-m", "two"],
    ] {
        assert!(git(clone, args).0);
    }
}

/// A bare repository `ROOT/org/app.git` with one commit, served over HTTPS.
fn origin(dir: &Path, ca: &TestCa) -> ScriptOrigin {
    let root = dir.join("repos");
    std::fs::create_dir_all(root.join("org")).unwrap();
    let bare = root.join("org/app.git");
    assert!(
        git(
            dir,
            &["init", "-q", "--bare", "-b", "main", bare.to_str().unwrap()]
        )
        .0
    );
    let work = dir.join("seed");
    std::fs::create_dir_all(&work).unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["config", "user.email", "t@test"],
        &["config", "user.name", "t"],
    ] {
        assert!(git(&work, args).0);
    }
    std::fs::write(work.join("README"), "hello\n").unwrap();
    assert!(git(&work, &["add", "README"]).0);
    assert!(git(&work, &["commit", "-q", "-m", "one"]).0);
    let (ok, out) = git(&work, &["push", "-q", bare.to_str().unwrap(), "main"]);
    assert!(ok, "{out}");
    ScriptOrigin::start(
        "git_https.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            root.as_os_str(),
        ],
    )
}

/// A proxy terminating git.test with a git rule for `git_services`.
fn proxy(dir: &Path, ca: &TestCa, port: u16, git_services: &str) -> Proxy {
    let dev = SandboxSpec::new("dev")
        .allow(&format!("git.test:{port}"))
        .network(
            "http",
            &format!(r#"[{{ host: git.test, paths: ["/org/*.git"], git: [{git_services}] }}]"#),
        );
    proxy_with(dir, ca, dev)
}

/// A proxy for sandbox `dev` (token `dev-secret`, its lists in `dev`) terminating TLS
/// (git.test and github.com are the test origin).
fn proxy_with(dir: &Path, ca: &TestCa, dev: SandboxSpec) -> Proxy {
    ca_init(&dir.join("ica"));
    ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("git.test", "127.0.0.1")
        .host("github.com", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .sandbox(dev.token("dev-secret"))
        .start(dir)
}

/// `git ARGS` in `dir` through `p` as sandbox `dev`, trusting the interception CA.
fn via(p: &Proxy, dir: &Path, ica: &Path, args: &[&str]) -> (bool, String) {
    let proxy = format!("http.proxy=http://dev:dev-secret@{}", p.proxy);
    let ca = format!("http.sslCAInfo={}", ica.display());
    let mut full = vec!["-c", &proxy, "-c", &ca];
    full.extend_from_slice(args);
    git(dir, &full)
}

#[test]
fn fetch_only_clones_and_refuses_a_push() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let o = origin(dir.path(), &ca);
    let p = proxy(dir.path(), &ca, o.port, "fetch");
    let ica = dir.path().join("ica/ca.crt");
    let url = format!("https://git.test:{}/org/app.git", o.port);
    let (ok, out) = via(&p, dir.path(), &ica, &["clone", "-q", &url, "clone"]);
    assert!(ok, "the clone passes: {out}");
    let clone = dir.path().join("clone");
    assert_eq!(
        std::fs::read_to_string(clone.join("README")).unwrap(),
        "hello\n"
    );
    let rec =
        p.wait_record(|r| r["mode"] == "https" && r["path"] == "/org/app.git/git-upload-pack");
    assert_eq!(rec["decision"], "allow", "{rec}");

    // A push: refused at its first request, nothing reaches the repository.
    commit(&clone, "exfiltrated\n");
    let (ok, out) = via(&p, &clone, &ica, &["push", "-q", "origin", "main"]);
    assert!(!ok, "the push was refused: {out}");
    // What git prints says "push" (clients review F1: it said `GET …/info/refs`, which the
    // clone had just made).
    let said = "remote: reason: git_not_allowed: git push is not allowed on git.test/org/app (the rules allow git: [fetch])";
    assert!(out.contains(said), "{out}");
    // The refusal keeps the port (F11).
    let first = format!(
        "remote: egress-proxy refused GET https://git.test:{} for sandbox dev.",
        o.port
    );
    assert!(out.contains(&first), "{out}");
    let rec = p.wait_record(|r| r["mode"] == "https" && r["reason"] == "git_not_allowed");
    assert_eq!(rec["path"], "/org/app.git/info/refs", "{rec}");
    let bare = dir.path().join("repos/org/app.git");
    let (_, log) = git(&bare, &["log", "--oneline", "main"]);
    assert_eq!(
        log.lines().count(),
        1,
        "the repository kept one commit: {log}"
    );
    // Another repository than the rule names is refused even for fetch.
    let other = format!("https://git.test:{}/elsewhere/app.git", o.port);
    let (ok, _) = via(&p, dir.path(), &ica, &["clone", "-q", &other, "other"]);
    assert!(!ok);
    // The probe with a second, percent-encoded `service` (review W3): `git http-backend`
    // decodes the name and keeps the last, so it would advertise receive-pack.
    for query in [
        "service=git-upload-pack&servic%65=git-receive-pack",
        "service=git-upload-pack&%73ervice=git-receive-pack",
        "servic%65=git-receive-pack",
    ] {
        let out = curl(&[
            "-x",
            &format!("http://dev:dev-secret@{}", p.proxy),
            "--cacert",
            ica.to_str().unwrap(),
            "-w",
            "\n%{http_code} %{content_type}",
            &format!("https://git.test:{}/org/app.git/info/refs?{query}", o.port),
        ]);
        let text = out.text();
        assert!(text.contains("git_not_allowed"), "{query}: {text}");
        assert!(
            !text.contains("receive-pack-advertisement"),
            "{query}: {text}"
        );
    }
}

#[test]
fn fetch_and_push_allows_the_push() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let o = origin(dir.path(), &ca);
    let p = proxy(dir.path(), &ca, o.port, "fetch, push");
    let ica = dir.path().join("ica/ca.crt");
    let url = format!("https://git.test:{}/org/app.git", o.port);
    assert!(via(&p, dir.path(), &ica, &["clone", "-q", &url, "clone"]).0);
    let clone = dir.path().join("clone");
    commit(&clone, "allowed\n");
    let (ok, out) = via(&p, &clone, &ica, &["push", "-q", "origin", "main"]);
    assert!(ok, "the push passes: {out}");
    let (_, log) = git(
        &dir.path().join("repos/org/app.git"),
        &["log", "--oneline", "main"],
    );
    assert_eq!(log.lines().count(), 2, "{log}");
}

/// `preset: github-read-only` (the origin stands in for github.com; the test adds its port to
/// the preset's `github.com:443`): the clone passes, the push is refused at its first
/// request, and the repository keeps one commit.
#[test]
fn github_read_only_clones_and_refuses_a_push() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let o = origin(dir.path(), &ca);
    let dev = SandboxSpec::new("dev")
        .allow(&format!("github.com:{}", o.port))
        .network("http", "[{ preset: github-read-only }]");
    let p = proxy_with(dir.path(), &ca, dev);
    let ica = dir.path().join("ica/ca.crt");
    let url = format!("https://github.com:{}/org/app.git", o.port);
    let (ok, out) = via(&p, dir.path(), &ica, &["clone", "-q", &url, "clone"]);
    assert!(ok, "the clone passes: {out}");
    let clone = dir.path().join("clone");
    commit(&clone, "exfiltrated\n");
    let (ok, out) = via(&p, &clone, &ica, &["push", "-q", "origin", "main"]);
    assert!(!ok, "the push is refused: {out}");
    let rec = p.wait_record(|r| r["reason"] == "git_not_allowed");
    assert_eq!(rec["call"], "git push", "{rec}");
    let bare = dir.path().join("repos/org/app.git");
    let (_, log) = git(&bare, &["log", "--oneline", "main"]);
    assert_eq!(
        log.lines().count(),
        1,
        "the repository kept one commit: {log}"
    );
}

/// Flow rules (issue 93) with the real `git`: before the sandbox read anything private, it
/// clones from `github.com` (the stand-in origin); after it cloned from the private
/// `git.test`, a push to `github.com` is refused (`flow_refused` at its POST: git prints the
/// 403, the record says why) and the
/// public repository keeps its one commit — and so is a new clone from it: git's fetch sends
/// its wants in a POST, a write.
#[test]
fn after_a_private_clone_a_push_to_a_public_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let o = origin(dir.path(), &ca);
    let port = o.port;
    let dev = SandboxSpec::new("dev")
        .allow(&format!("git.test:{port}"))
        .allow(&format!("github.com:{port}"))
        .network(
            "http",
            "[{ host: git.test, git: [fetch, push] }, { host: github.com, git: [fetch, push] }]",
        )
        .network(
            "flows",
            "{ labels: { private: [git.test] }, rules: [{ name: no-exfil, after: [private], refuse: writes, except: [private] }] }",
        );
    let p = proxy_with(dir.path(), &ca, dev);
    let ica = dir.path().join("ica/ca.crt");
    let public = format!("https://github.com:{port}/org/app.git");
    let (ok, out) = via(&p, dir.path(), &ica, &["clone", "-q", &public, "public"]);
    assert!(ok, "the public clone passes before any private read: {out}");
    let private = format!("https://git.test:{port}/org/app.git");
    let (ok, out) = via(&p, dir.path(), &ica, &["clone", "-q", &private, "private"]);
    assert!(ok, "the private clone passes: {out}");
    let clone = dir.path().join("public");
    commit(&clone, "private data\n");
    let (ok, out) = via(&p, &clone, &ica, &["push", "-q", "origin", "main"]);
    assert!(!ok && out.contains("403"), "the push is refused: {out}");
    let (_, log) = git(
        &dir.path().join("repos/org/app.git"),
        &["log", "--oneline", "main"],
    );
    assert_eq!(log.lines().count(), 1, "nothing was written: {log}");
    let (ok, out) = via(&p, dir.path(), &ica, &["clone", "-q", &public, "again"]);
    assert!(!ok && out.contains("403"), "a fetch is a write: {out}");
    let rec = p.wait_record(|r| r["reason"] == "flow_refused" && r["call"] == "git push");
    assert!(
        rec["detail"].as_str().unwrap().contains("git.test"),
        "{rec}"
    );
}
