//! The tamper-evident audit trail with the real binary: a chained, signed log verifies
//! across restarts; a deleted, edited, swapped or cut line is reported at the right line and
//! seq; signatures verify with the right key only; rotation and reopening keep the chain.
//! And a forger without the key — who edits, drops the signed lines after the edit and
//! recomputes every `seq` and `chain` — is caught by `--public-key`, as are a replaced or cut
//! tail, an emptied file and an unsigned run_start, while a crash followed by a restart still
//! verifies.

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

/// Sandbox `demo` (every loopback client) reaching `allowed.test`; these `audit` keys.
fn config(audit: &str) -> ProxyConfig {
    ProxyConfig::new().audit(audit).sandbox(
        SandboxSpec::new("demo")
            .source("127.0.0.0/8")
            .allow("allowed.test"),
    )
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
    let mut p = config(audit).start(dir);
    traffic(&p, n);
    p.terminate();
}

/// `egress-proxy audit verify FILES [--public-key K]`: (exit code, stdout).
fn verify(files: &[&Path], key: Option<&Path>) -> (i32, String) {
    verify_args(files, key, &[])
}

/// `egress-proxy audit verify FILES [--public-key K] EXTRA...`: (exit code, stdout).
fn verify_args(files: &[&Path], key: Option<&Path>, extra: &[&str]) -> (i32, String) {
    let mut c = Command::new(bin());
    c.args(["audit", "verify"]).args(files).args(extra);
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
    let mut p = config("chain: true, rotate: { max_bytes: 4096, keep: 20 }, fsync: every_record")
        .start(dir.path());
    traffic(&p, 30);
    // The writer has written the last request's record (into the log, or into `.1` when that
    // batch filled the log and rotated it): nothing is left to race the move.
    eventually(Duration::from_secs(10), "the last record written", || {
        let newest = [log.clone(), dir.path().join("audit.jsonl.1")]
            .into_iter()
            .find_map(|f| std::fs::read_to_string(f).ok().filter(|t| !t.is_empty()))?;
        newest
            .lines()
            .last()?
            .contains("denied29.test")
            .then_some(())
    });
    // logrotate's way: move the file away, then SIGUSR1; the proxy opens a new one.
    let moved = dir.path().join("moved.jsonl");
    std::fs::rename(&log, &moved).unwrap();
    unsafe_free_kill(p.child.id(), "USR1");
    eventually(Duration::from_secs(10), "the log opened again", || {
        log.exists().then_some(())
    });
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

/// What a forger without the signing key can do after changing lines: renumber `seq` within
/// each run and recompute every chain (each later run_start's `prev_chain` and each
/// checkpoint's `chain_head` too), so that the
/// hash chain alone finds nothing.
fn rechain(lines: &[String]) -> Vec<String> {
    use sha2::{Digest, Sha256};
    /// `text` with the JSON value of `field` (a string or null) replaced by `value`.
    fn set_field(text: &str, field: &str, value: &str) -> String {
        let key = format!("\"{field}\":");
        let Some(at) = text.find(&key) else {
            return text.to_string();
        };
        let from = at + key.len();
        let len = if text[from..].starts_with("null") {
            4
        } else {
            text[from + 1..].find('"').unwrap() + 2
        };
        format!("{}{value}{}", &text[..from], &text[from + len..])
    }
    let mut prev = [0u8; 32];
    let mut seq = 0u64;
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        // The bytes as written up to `,"seq":N`: everything else is kept to the byte.
        let mut body = l[..l.rfind(",\"seq\":").unwrap()].to_string();
        if is(l, "run_start") {
            seq = 0;
            let v: serde_json::Value = serde_json::from_str(&(body.clone() + "}")).unwrap();
            match v["prev_chain"].as_str() {
                Some(p) if i == 0 => hex::decode_to_slice(p, &mut prev).unwrap(),
                _ if i > 0 => {
                    body = set_field(&body, "prev_chain", &format!("\"{}\"", hex::encode(prev)))
                }
                _ => {}
            }
        }
        if is(l, "checkpoint") {
            body = set_field(&body, "chain_head", &format!("\"{}\"", hex::encode(prev)));
        }
        seq += 1;
        let canonical = format!("{body},\"seq\":{seq}}}");
        prev = Sha256::new()
            .chain_update(prev)
            .chain_update(canonical.as_bytes())
            .finalize()
            .into();
        out.push(format!(
            "{body},\"seq\":{seq},\"chain\":\"{}\"}}",
            hex::encode(prev)
        ));
    }
    out
}

fn is(line: &str, event: &str) -> bool {
    line.contains(&format!("\"event\":\"{event}\""))
}

/// Index of the last line of `lines` that is a `event` line (and not final, for checkpoints).
fn last_index(lines: &[String], pred: impl Fn(&str) -> bool) -> usize {
    lines.iter().rposition(|l| pred(l)).unwrap()
}

/// Write `lines` as a forged file and verify it without and with the key: the chain alone
/// must find nothing (the forger did the work), the key must. Returns the keyed output.
fn forged(dir: &Path, lines: &[String], pk: &Path) -> String {
    let f = dir.join("forged.jsonl");
    write_lines(&f, lines);
    let (code, out) = verify(&[&f], None);
    assert_eq!(
        code, 0,
        "the forgery should pass the chain check alone: {out}"
    );
    let (code, out) = verify(&[&f], Some(pk));
    assert_eq!(code, 1, "the key must catch the forgery: {out}");
    out
}

#[test]
fn an_edit_with_the_signed_lines_after_it_dropped_and_the_chain_recomputed_fails_with_the_key() {
    // Run 2 of the log: run_start, 4 records, checkpoint, 1 record, final checkpoint.
    let (dir, log, pk) = signed_log();
    let all = lines(&log);
    let start2 = last_index(&all, |l| is(l, "run_start"));
    let finals = all.iter().filter(|l| l.contains("\"final\":true")).count();
    assert_eq!(finals, 2, "two runs, each with its final checkpoint");

    // Edit the last record and drop the final checkpoint: the run no longer ends signed.
    let mut v = all.clone();
    v.pop();
    let k = v.len() - 1;
    v[k] = v[k].replace("denied", "allowed");
    let out = forged(dir.path(), &rechain(&v), &pk);
    assert!(
        out.contains(&format!(":{} (seq", k + 1))
            && out.contains("without its signed final checkpoint"),
        "{out}"
    );

    // Edit an earlier record of run 2 and drop every signed line after it: five lines follow
    // the run_start unsigned, while the run signed an interval of four.
    let mut v: Vec<String> = all[..all.len() - 1]
        .iter()
        .filter(|l| !is(l, "checkpoint") || all[..start2].contains(l))
        .cloned()
        .collect();
    let k = start2 + 2;
    v[k] = v[k].replace("denied", "allowed");
    let out = forged(dir.path(), &rechain(&v), &pk);
    assert!(
        out.contains("5 lines since the last signed line")
            && out.contains("signs every 4: checkpoints were removed"),
        "{out}"
    );

    // Edit a record of run 1 and drop its signed lines after it: run 2's signed run_start
    // pins the chain it continues, so recomputing it breaks its signature.
    let cp1 = all[..start2]
        .iter()
        .position(|l| is(l, "checkpoint"))
        .unwrap();
    let mut v: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(i, l)| !(is(l, "checkpoint") && *i > cp1 && *i < start2))
        .map(|(_, l)| l.clone())
        .collect();
    v[cp1 + 1] = v[cp1 + 1].replace("denied", "allowed");
    let out = forged(dir.path(), &rechain(&v), &pk);
    assert!(out.contains("run_start signature does not verify"), "{out}");
    assert_eq!(verify(&[&log], Some(&pk)).0, 0);
}

#[test]
fn a_replaced_or_cut_tail_an_emptied_file_and_an_unsigned_run_start_fail_with_the_key() {
    let (dir, log, pk) = signed_log();
    let all = lines(&log);
    let cp = last_index(&all, |l| {
        is(l, "checkpoint") && l.contains("\"final\":false")
    });

    // Everything after the last checkpoint replaced by other records.
    let mut v = all[..=cp].to_vec();
    for i in 0..3 {
        v.push(all[cp - 1].replace("denied", &format!("other{i}")));
    }
    let out = forged(dir.path(), &rechain(&v), &pk);
    assert!(out.contains("without its signed final checkpoint"), "{out}");

    // ... and the kept checkpoint turned into a final one: `final` is signed.
    let mut v = all[..=cp].to_vec();
    v[cp] = v[cp].replace("\"final\":false", "\"final\":true");
    let out = forged(dir.path(), &rechain(&v), &pk);
    assert!(
        out.contains(&format!(":{}", cp + 1))
            && out.contains("checkpoint signature does not verify"),
        "{out}"
    );

    // Truncated after the checkpoint (nothing recomputed: a plain cut).
    let cut = dir.path().join("cut.jsonl");
    write_lines(&cut, &all[..=cp]);
    let (code, out) = verify(&[&cut], Some(&pk));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("cut.jsonl:{} (seq", cp + 1))
            && out.contains("without its signed final checkpoint"),
        "{out}"
    );

    // Emptied.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    for key in [Some(pk.as_path()), None] {
        let (code, out) = verify(&[&empty], key);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("TAMPERED") && out.contains("empty"), "{out}");
    }

    // A forger's own trail, from scratch: its run_start is unsigned.
    let mut v: Vec<String> = all
        .iter()
        .filter(|l| !is(l, "checkpoint"))
        .cloned()
        .collect();
    let sig_at = v[0].find(",\"signature\":\"").unwrap();
    v[0] = format!("{}{}", &v[0][..sig_at], &v[0][sig_at + 143..]);
    let out = forged(dir.path(), &rechain(&v), &pk);
    assert!(
        out.contains(":1 (seq 1)") && out.contains("run_start is unsigned"),
        "{out}"
    );

    // A trail written without a signing key does not pass for a signed one.
    let plain = tempfile::tempdir().unwrap();
    run_and_stop(plain.path(), "chain: true", 2);
    let (code, out) = verify(&[&plain.path().join("audit.jsonl")], Some(&pk));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("run_start is unsigned"), "{out}");
}

#[test]
fn a_crashed_run_named_by_the_next_run_start_verifies_and_an_open_run_is_judged_by_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(dir.path(), "audit");
    let log = dir.path().join("audit.jsonl");
    let audit = format!(
        "chain: true, signing_key_file: {}, checkpoint_every_records: 1000, checkpoint_every_s: 3",
        sk.display()
    );
    let mut p = config(&audit).start(dir.path());
    traffic(&p, 3);
    eventually(Duration::from_secs(5), "three records written", || {
        (lines(&log).len() >= 4).then_some(())
    });
    // A live file: no final checkpoint yet. Plain verification fails; --open-run accepts
    // the unsigned tail and counts it.
    let (code, out) = verify(&[&log], Some(&pk));
    assert_eq!(code, 1, "{out}");
    let (code, out) = verify_args(&[&log], Some(&pk), &["--open-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("3 only chained"), "{out}");

    // The writer stops (SIGSTOP) before its next checkpoint: once the signed interval plus the
    // slack has passed, the open run's checkpoint is overdue.
    unsafe_free_kill(p.child.id(), "STOP");
    let_time_pass(
        Duration::from_millis(5500),
        "the signed interval and its slack, with the writer stopped",
    );
    let (code, out) = verify_args(&[&log], Some(&pk), &["--open-run"]);
    unsafe_free_kill(p.child.id(), "CONT");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("no checkpoint for") && out.contains("every 3 s"),
        "{out}"
    );
    // Running again, it signs at once.
    eventually(Duration::from_secs(5), "a checkpoint after SIGCONT", || {
        lines(&log).last().filter(|l| is(l, "checkpoint")).map(drop)
    });
    let (code, out) = verify_args(&[&log], Some(&pk), &["--open-run"]);
    assert_eq!(code, 0, "{out}");

    // A forger edits the live file's first record and drops the checkpoint after it: the
    // records after the edit are later than the signed interval allows.
    traffic(&p, 2);
    eventually(Duration::from_secs(5), "two more records", || {
        (lines(&log).len() >= 7).then_some(())
    });
    let mut v: Vec<String> = lines(&log)
        .into_iter()
        .filter(|l| !is(l, "checkpoint"))
        .collect();
    v[1] = v[1].replace("denied", "allowed");
    let f = dir.path().join("forged.jsonl");
    write_lines(&f, &rechain(&v));
    let (code, out) = verify_args(&[&f], Some(&pk), &["--open-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("after the last signed line") && out.contains("checkpoints were removed"),
        "{out}"
    );

    // kill -9: no final checkpoint. The next run names the run that ended unclosed.
    unsafe_free_kill(p.child.id(), "KILL");
    let _ = p.child.wait();
    let (code, out) = verify(&[&log], Some(&pk));
    assert_eq!(code, 1, "{out}");
    run_and_stop(dir.path(), &audit, 2);
    let (code, out) = verify(&[&log], Some(&pk));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ended without its final checkpoint (a crash or a kill)"),
        "{out}"
    );
    assert!(out.contains("intact: 7 records, 2 runs"), "{out}");
}

#[test]
fn the_checkpoint_file_finds_a_log_whose_last_runs_were_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(dir.path(), "audit");
    let log = dir.path().join("audit.jsonl");
    let anchor = dir.path().join("checkpoints.jsonl");
    let audit = format!(
        "chain: true, signing_key_file: {}, checkpoint_every_records: 4, checkpoint_file: {}",
        sk.display(),
        anchor.display()
    );
    run_and_stop(dir.path(), &audit, 6);
    run_and_stop(dir.path(), &audit, 5);
    let anchor_arg = anchor.to_str().unwrap();
    let (code, out) = verify_args(&[&log], Some(&pk), &["--checkpoints", anchor_arg]);
    assert_eq!(code, 0, "{out}");
    // Two run_starts, three checkpoints in run 1 ... every signed line of the log is there.
    let signed = lines(&log)
        .iter()
        .filter(|l| is(l, "run_start") || is(l, "checkpoint"))
        .count();
    assert_eq!(lines(&anchor).len(), signed);
    assert!(
        out.contains(&format!("{signed} signed lines matched")),
        "{out}"
    );

    // The whole second run cut off: the file ends at run 1's final checkpoint, which the key
    // alone cannot tell from a trail that ended there.
    let all = lines(&log);
    let start2 = last_index(&all, |l| is(l, "run_start"));
    let cut = dir.path().join("cut.jsonl");
    write_lines(&cut, &all[..start2]);
    assert_eq!(verify(&[&cut], Some(&pk)).0, 0);
    let (code, out) = verify_args(&[&cut], Some(&pk), &["--checkpoints", anchor_arg]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the log lacks this signed run_start") && out.contains("cut or replaced"),
        "{out}"
    );

    // A checkpoint file that was itself edited does not verify.
    let mut a = lines(&anchor);
    a[0] = a[0].replace("\"prev_chain\":null", "\"prev_chain\":\"00\"");
    write_lines(&anchor, &a);
    let (code, out) = verify_args(&[&log], Some(&pk), &["--checkpoints", anchor_arg]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("checkpoint file"), "{out}");
}

/// One fabricated record after a run's signed *final* checkpoint, chained correctly and
/// stamped now, is refused — with and without `--open-run`: nothing may follow a final
/// checkpoint but the next run's signed `run_start`.
#[test]
fn a_record_appended_after_the_final_checkpoint_is_refused() {
    let (dir, log, pk) = signed_log();
    let mut all = lines(&log);
    assert!(all.last().unwrap().contains("\"final\":true"));
    let record = all
        .iter()
        .rev()
        .find(|l| is(l, "end"))
        .unwrap()
        .replace("denied", "forged");
    all.push(record);
    let f = dir.path().join("appended.jsonl");
    write_lines(&f, &rechain(&all));
    let (code, out) = verify(&[&f], None);
    assert_eq!(code, 0, "the chain alone accepts it: {out}");
    for extra in [&[][..], &["--open-run"][..]] {
        let (code, out) = verify_args(&[&f], Some(&pk), extra);
        assert_eq!(code, 1, "{extra:?}: {out}");
        assert!(
            out.contains("after run") && out.contains("final checkpoint"),
            "{out}"
        );
    }
}

/// A live run signs a checkpoint every `checkpoint_every_s` even with no traffic, so
/// `--open-run` holds its file to the verifier's clock: the live file verifies, the same file
/// cut back to an earlier (non-final) checkpoint does not once the interval has passed.
#[test]
fn an_idle_live_run_keeps_signing_and_a_file_cut_at_an_old_checkpoint_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(dir.path(), "audit");
    let log = dir.path().join("audit.jsonl");
    let audit = format!(
        "chain: true, signing_key_file: {}, checkpoint_every_s: 1",
        sk.display()
    );
    let p = config(&audit).start(dir.path());
    traffic(&p, 2);
    // Idle from here: the run keeps signing.
    eventually(Duration::from_secs(10), "heartbeat checkpoints", || {
        let all = lines(&log);
        let after = all.iter().rev().take_while(|l| is(l, "checkpoint")).count();
        (after >= 4).then_some(())
    });
    let (code, out) = verify_args(&[&log], Some(&pk), &["--open-run"]);
    assert_eq!(code, 0, "{out}");
    // Cut after the first checkpoint that follows the records: by now it is more than the
    // interval plus the slack old.
    let all = lines(&log);
    let first_cp = all.iter().position(|l| is(l, "checkpoint")).unwrap();
    let cut = dir.path().join("cut.jsonl");
    write_lines(&cut, &all[..=first_cp]);
    eventually(Duration::from_secs(10), "the cut checkpoint to age", || {
        let (code, out) = verify_args(&[&cut], Some(&pk), &["--open-run"]);
        (code == 1).then_some(out)
    });
    let (code, out) = verify_args(&[&cut], Some(&pk), &["--open-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no checkpoint for"), "{out}");
    // The live file, meanwhile, still verifies.
    let (code, out) = verify_args(&[&log], Some(&pk), &["--open-run"]);
    assert_eq!(code, 0, "{out}");
    drop(p);
}

/// The proxy's `audit-writer` thread: its `/proc` status file. A new thread names itself once
/// it first runs, so on a loaded machine it can still bear its parent's name for a moment
/// after the proxy listens.
fn writer_thread(pid: u32) -> PathBuf {
    let tasks = PathBuf::from(format!("/proc/{pid}/task"));
    eventually(
        Duration::from_secs(10),
        "the proxy's audit-writer thread",
        || {
            std::fs::read_dir(&tasks)
                .unwrap()
                .filter_map(|t| t.ok().map(|t| t.path()))
                .find(|t| {
                    std::fs::read_to_string(t.join("comm"))
                        .is_ok_and(|c| c.trim() == "audit-writer")
                })
        },
    )
    .join("status")
}

/// How often a thread has been switched out (it slept, or was preempted), from its status.
fn wakes(status: &Path) -> u64 {
    std::fs::read_to_string(status)
        .unwrap()
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// An idle proxy's audit writer sleeps until a record (or a checkpoint) is due, not every
/// 5 ms: a second after the last record, over two idle seconds, its thread is switched out a
/// few times, where the old 5 ms cadence made it about 400. The record that ends the idle is
/// still written.
#[test]
fn an_idle_writer_sleeps_until_the_next_record_and_still_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = config("chain: false").start(dir.path());
    traffic(&p, 1);
    let denied = |p: &Proxy| {
        p.audit_records()
            .iter()
            .filter(|r| r["target_host"] == "denied0.test")
            .count()
    };
    eventually(Duration::from_secs(10), "the first record", || {
        (denied(&p) == 1).then_some(())
    });
    let writer = writer_thread(p.child.id());
    let_time_pass(
        Duration::from_millis(1500),
        "the writer drains on for a second after the last record, then sleeps",
    );
    let before = wakes(&writer);
    let_time_pass(
        Duration::from_secs(2),
        "the window its wakes are counted over",
    );
    let woke = wakes(&writer) - before;
    assert!(
        woke < 40,
        "the idle writer was switched out {woke} times in 2 s"
    );
    traffic(&p, 1);
    eventually(Duration::from_secs(10), "the record after the idle", || {
        (denied(&p) == 2).then_some(())
    });
    drop(p);
}

/// A stream of records keeps the writer on its 5 ms drains: it is not woken record by record
/// (each wake would be a `futex` call and a context switch on the data plane). 2,000 refused
/// DNS queries, one after another, each one record: the writer is switched out about once per
/// drain, far fewer times than there are records.
#[test]
fn a_stream_of_records_is_written_in_drains_not_woken_record_by_record() {
    let dir = tempfile::tempdir().unwrap();
    let p = ProxyConfig::new()
        .listen("dns")
        .raw("admission: { dns_queries_per_second_per_source: 1000000 }")
        .sandbox(
            SandboxSpec::new("demo")
                .source("127.0.0.0/8")
                .limits("{ dns_queries_per_second: 1000000 }")
                .allow("allowed.test"),
        )
        .start(dir.path());
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.connect(p.dns.expect("the DNS listener")).unwrap();
    let writer = writer_thread(p.child.id());
    let before = wakes(&writer);
    const QUERIES: u16 = 2000;
    let mut reply = [0u8; 512];
    for id in 0..QUERIES {
        sock.send(&dns_query(id, &format!("q{id}.denied.test"), 1))
            .unwrap();
        let n = sock.recv(&mut reply).unwrap();
        assert_eq!(dns_rcode(&reply[..n]), Some(3), "NXDOMAIN");
    }
    eventually(Duration::from_secs(20), "every query's record", || {
        let n = p
            .audit_records()
            .iter()
            .filter(|r| r["mode"] == "dns")
            .count();
        (n == usize::from(QUERIES)).then_some(())
    });
    let woke = wakes(&writer) - before;
    assert!(
        woke < u64::from(QUERIES) / 2,
        "the writer was switched out {woke} times for {QUERIES} records"
    );
    drop(p);
}

/// A signal that arrives the moment the proxy says it listens is handled, not left to its
/// default action (which ended the process at once: no drain, no final checkpoint, the trail
/// judged cut). SIGTERM right after start, ten times: each run exits 0 and closes its run;
/// and a SIGHUP at the same moment reloads rather than kills.
#[test]
fn a_signal_the_moment_the_proxy_listens_is_handled() {
    let dir = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(dir.path(), "audit");
    let audit = format!("chain: true, signing_key_file: {}", sk.display());
    let log = dir.path().join("audit.jsonl");
    for _ in 0..10 {
        let mut p = config(&audit).start(dir.path());
        let status = p.terminate();
        assert!(status.success(), "{status:?}: {}", p.stderr_text());
    }
    let (code, said) = verify(&[&log], Some(&pk));
    assert_eq!(code, 0, "{said}");
    assert!(!said.contains("without its"), "{said}");
    let mut p = config(&audit).start(dir.path());
    unsafe_free_kill(p.child.id(), "HUP");
    // The reload is counted (a positive marker), and the process is still there after it.
    common::eventually(Duration::from_secs(10), "the SIGHUP's reload", || {
        let (_, metrics) = p.admin_get("/metrics");
        metrics
            .contains("egress_config_reloads_total{result=\"ok\"} 1")
            .then_some(())
    });
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "SIGHUP ended it: {}",
        p.stderr_text()
    );
    assert!(p.terminate().success());
}
