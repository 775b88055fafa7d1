//! The tamper-evident audit trail with the real binary: a chained, signed log verifies
//! across restarts; a deleted, edited, swapped or cut line is reported at the right line and
//! seq; signatures verify with the right key only; rotation and reopening keep the chain.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_egress-proxy")
}

/// An Ed25519 key pair made by openssl: (private PEM, public PEM).
fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let sk = dir.join(format!("{name}.pem"));
    let pk = dir.join(format!("{name}.pub.pem"));
    let ok = Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&sk)
        .status()
        .expect("openssl")
        .success();
    assert!(ok);
    let ok = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&sk)
        .arg("-out")
        .arg(&pk)
        .status()
        .expect("openssl")
        .success();
    assert!(ok);
    (sk, pk)
}

fn config(dir: &Path, audit: &str) -> PathBuf {
    let path = dir.join("proxy.yaml");
    std::fs::write(
        &path,
        format!(
            r#"listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0 }}
audit: {{ path: {log}, {audit} }}
sandboxes:
  - id: demo
    sources: [127.0.0.0/8]
    policy: {{ provider: local, config: {{}}, network: {{ egress: ["allowed.test"] }} }}
"#,
            log = dir.join("audit.jsonl").display()
        ),
    )
    .unwrap();
    path
}

/// `n` refused requests through `p` (each one audit record).
fn traffic(p: &Proxy, n: usize) {
    for i in 0..n {
        let out = curl(&[
            "-x",
            &format!("http://{}", p.proxy),
            &format!("http://denied{i}.test/"),
        ]);
        assert_eq!(out.code, 0, "{}", out.text());
    }
}

fn run_and_stop(dir: &Path, audit: &str, n: usize) {
    let mut p = Proxy::start_with(config(dir, audit), dir.join("audit.jsonl"), &[]);
    traffic(&p, n);
    p.terminate();
}

/// `egress-proxy audit verify FILES [--public-key K]`: (exit code, stdout).
fn verify(files: &[&Path], key: Option<&Path>) -> (i32, String) {
    let mut c = Command::new(bin());
    c.args(["audit", "verify"]).args(files);
    if let Some(k) = key {
        c.arg("--public-key").arg(k);
    }
    let out = c.output().expect("run verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// A signed log of two runs: (dir, log, public key).
fn signed_log() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(dir.path(), "audit");
    let audit = format!(
        "chain: true, signing_key_file: {}, checkpoint_every_records: 4",
        sk.display()
    );
    run_and_stop(dir.path(), &audit, 6);
    run_and_stop(dir.path(), &audit, 5);
    let log = dir.path().join("audit.jsonl");
    (dir, log, pk)
}

fn seq_at(line: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_signed_chained_log_of_two_runs_verifies() {
    let (dir, log, pk) = signed_log();
    let all = lines(&log);
    // Two runs; the second names the first's last chain.
    let starts: Vec<serde_json::Value> = all
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "run_start")
        .collect();
    assert_eq!(starts.len(), 2);
    assert!(starts[0]["prev_chain"].is_null());
    let i = all
        .iter()
        .position(|l| l.contains("\"run_start\"") && !l.contains("\"prev_chain\":null"))
        .unwrap();
    let before: serde_json::Value = serde_json::from_str(&all[i - 1]).unwrap();
    assert_eq!(starts[1]["prev_chain"], before["chain"]);
    assert_eq!(before["event"], "checkpoint");
    assert_eq!(before["final"], true);
    // Every end record has seq and chain.
    assert!(
        all.iter()
            .filter(|l| l.contains("\"event\":\"end\""))
            .count()
            >= 11
    );
    let (code, out) = verify(&[&log], Some(&pk));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("intact: 11 records, 2 runs"), "{out}");
    // Another key: the first checkpoint is refused.
    let (_, other) = keypair(dir.path(), "other");
    let (code, out) = verify(&[&log], Some(&other));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("signature does not verify"), "{out}");
    // Without a key the chain still verifies, and says signatures were not checked.
    let (code, out) = verify(&[&log], None);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("not checked"), "{out}");
}

#[test]
fn deleting_editing_swapping_or_cutting_a_line_is_found_where_it_happened() {
    let (dir, log, pk) = signed_log();
    let all = lines(&log);
    let end_lines: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("\"event\":\"end\""))
        .map(|(i, _)| i)
        .collect();
    let k = end_lines[2];
    let tampered = dir.path().join("tampered.jsonl");

    // Deleted: the next record is reported, with the seq that is missing.
    let mut v = all.clone();
    let removed_seq = seq_at(&v[k]);
    v.remove(k);
    write_lines(&tampered, &v);
    let (code, out) = verify(&[&tampered], Some(&pk));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(":{} (seq {})", k + 1, removed_seq + 1))
            && out.contains(&format!("expected seq {removed_seq}")),
        "{out}"
    );

    // Edited: the bytes of one record changed (a denial turned into an allow).
    let mut v = all.clone();
    assert!(v[k].contains("\"decision\":\"deny\""));
    v[k] = v[k].replace("\"decision\":\"deny\"", "\"decision\":\"allow\"");
    write_lines(&tampered, &v);
    let (code, out) = verify(&[&tampered], Some(&pk));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(":{} (seq {})", k + 1, seq_at(&all[k]))) && out.contains("altered"),
        "{out}"
    );

    // Swapped.
    let mut v = all.clone();
    v.swap(k, k + 1);
    write_lines(&tampered, &v);
    let (code, out) = verify(&[&tampered], Some(&pk));
    assert_eq!(code, 1, "{out}");
    let first = seq_at(&all[k]);
    assert!(
        out.contains(&format!(":{} (seq {})", k + 1, first + 1))
            && out.contains(&format!(
                "reordered: seq {} comes before seq {first}",
                first + 1
            )),
        "{out}"
    );

    // Cut in the middle of a line.
    let text = std::fs::read_to_string(&log).unwrap();
    let cut_at = all[..k].iter().map(|l| l.len() + 1).sum::<usize>() + 40;
    std::fs::write(&tampered, &text[..cut_at]).unwrap();
    let (code, out) = verify(&[&tampered], Some(&pk));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(":{}", k + 1)) && out.contains("truncated"),
        "{out}"
    );

    // A whole run removed from the middle: the next run_start names a chain that is not there.
    let second_start = all
        .iter()
        .rposition(|l| l.contains("\"event\":\"run_start\""))
        .unwrap();
    let mut v = all.clone();
    v.remove(second_start - 1);
    write_lines(&tampered, &v);
    let (code, out) = verify(&[&tampered], Some(&pk));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("deleted before this run_start"), "{out}");

    // The untouched log still verifies.
    assert_eq!(verify(&[&log], Some(&pk)).0, 0);
}

#[test]
fn rotation_and_reopening_keep_the_chain_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let mut p = Proxy::start_with(
        config(
            dir.path(),
            "chain: true, rotate: { max_bytes: 4096, keep: 20 }, fsync: every_record",
        ),
        log.clone(),
        &[],
    );
    traffic(&p, 30);
    // logrotate's way: move the file away, then SIGUSR1; the proxy opens a new one.
    std::thread::sleep(Duration::from_millis(100));
    let moved = dir.path().join("moved.jsonl");
    std::fs::rename(&log, &moved).unwrap();
    unsafe_free_kill(p.child.id(), "USR1");
    std::thread::sleep(Duration::from_millis(300));
    traffic(&p, 3);
    p.terminate();
    let mut rotated: Vec<PathBuf> = (1..=20)
        .map(|n| dir.path().join(format!("audit.jsonl.{n}")))
        .filter(|f| f.exists())
        .collect();
    assert!(rotated.len() >= 2, "expected several rotated files");
    rotated.reverse();
    // Oldest first: the rotated files, the moved file, the new file.
    let mut all: Vec<&Path> = rotated.iter().map(PathBuf::as_path).collect();
    all.push(&moved);
    all.push(&log);
    let (code, out) = verify(&all, None);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("intact: 33 records, 1 runs"), "{out}");
    // One rotated file missing from the middle: found.
    let mut gap = all.clone();
    gap.remove(1);
    let (code, out) = verify(&gap, None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("deleted"), "{out}");
    // The newest file alone verifies from where it starts.
    let (code, out) = verify(&[&log], None);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("start at seq"), "{out}");
}

#[test]
fn a_line_cut_by_a_crash_is_closed_and_named_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    run_and_stop(dir.path(), "chain: true", 3);
    // A crash in the middle of a write leaves half a line.
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"ts\":\"2026-11-23T00:00:00Z\",\"event\":\"end\",\"conn");
    std::fs::write(&log, &text).unwrap();
    let (code, out) = verify(&[&log], None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("truncated"), "{out}");
    run_and_stop(dir.path(), "chain: true", 2);
    let (code, out) = verify(&[&log], None);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("cut short by a crash"), "{out}");
}

#[test]
fn verify_usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _) = verify(&[&dir.path().join("missing.jsonl")], None);
    assert_eq!(code, 2);
    let f = dir.path().join("x.jsonl");
    std::fs::write(&f, "").unwrap();
    let (code, out) = verify(&[&f], Some(&dir.path().join("nokey.pem")));
    assert_eq!(code, 2, "{out}");
    let out = Command::new(bin())
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
