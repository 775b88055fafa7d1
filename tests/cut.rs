//! What a cut does on the wire and in the record, with the real binary and raw sockets:
//! - a tunnel revoked by a reload, by a `DELETE`, or still open when the shutdown grace runs
//!   out is *reset*: a client that reads slowly stops receiving within a second (nothing the
//!   proxy had queued towards it arrives later), and an upload that keeps writing delivers
//!   nothing more to the origin;
//! - the record's byte counts say what actually left the proxy: byte-exact against what the
//!   origin sent for a completed 8 MiB transfer (zero-copy, shaped and forwarded), and for a
//!   cut one what the peer received (never more; short by at most a segment or so).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;

const ADMIN_TOKEN: &str = "cut-admin-token";

/// `proxy.yaml` in `dir`: sandbox `tok` (token `tok-secret`, these `limits`) may reach
/// `egress` (one entry); tunnels get `grace_ms` at shutdown.
fn write_config(dir: &Path, egress: &str, limits: &str, grace_ms: u64) {
    let yaml = ProxyConfig::new()
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("big.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("timeouts", &format!("{{ shutdown_grace_ms: {grace_ms} }}"))
        .sandbox(
            SandboxSpec::new("tok")
                .token("tok-secret")
                .limits(&format!("{{ {limits} }}"))
                .allow(egress),
        )
        .yaml(&dir.join("audit.jsonl"));
    std::fs::write(dir.join("proxy.yaml"), yaml).unwrap();
}

fn start(dir: &Path, egress: &str) -> Proxy {
    std::fs::write(dir.join("admin.token"), ADMIN_TOKEN).unwrap();
    write_config(dir, egress, "", 30_000);
    Proxy::start_with(dir.join("proxy.yaml"), dir.join("audit.jsonl"), &[])
}

fn tok() -> String {
    basic("tok", "tok-secret")
}

/// A client reading the stalled `/big` download slowly (4 KiB per 50 ms, about 80 KB/s):
/// megabytes wait in the proxy's socket buffer towards it. Returns what it read, when it
/// stopped, and how (`eof` or `error`).
fn slow_reader(mut s: TcpStream) -> std::thread::JoinHandle<(usize, Instant, &'static str)> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        loop {
            match s.read(&mut buf) {
                Ok(0) => return (total, Instant::now(), "eof"),
                Ok(n) => total += n,
                Err(_) => return (total, Instant::now(), "error"),
            }
            let_time_pass(Duration::from_millis(50), "a slow reader's pace");
        }
    })
}

/// The slow reader was reset within a second of `cut`, and the record (`close`) counts no
/// more than it received.
fn assert_reset(
    p: &Proxy,
    reader: std::thread::JoinHandle<(usize, Instant, &'static str)>,
    cut: Instant,
    close: &str,
) {
    let rec = p.wait_record(|r| r["target_host"] == "big.test" && r["mode"] != "http");
    assert_eq!(rec["close"], close, "{rec}");
    let (total, ended, how) = reader.join().unwrap();
    let after = ended.saturating_duration_since(cut);
    assert!(
        after < Duration::from_secs(1),
        "the client kept receiving for {after:?} after the cut ({total} bytes, then {how})"
    );
    assert_eq!(how, "error", "a reset, not an orderly end ({total} bytes)");
    assert!(total < BIG);
    assert_counts_what_arrived(&rec, "bytes_down", total);
}

/// Before the cut the proxy had handed megabytes to the kernel; the reset discarded what was
/// still unsent, and the record's `field` counts only what was sent — on loopback, what the
/// peer `received`. (The kernel may send one more segment between the proxy's measurement
/// and the reset, so the record may fall short by that; it may never say more.)
fn assert_counts_what_arrived(rec: &serde_json::Value, field: &str, received: usize) {
    let counted = rec[field].as_u64().unwrap() as usize;
    assert!(
        counted <= received && received - counted <= 256 * 1024,
        "{field} {counted}, but the peer received {received}: {rec}"
    );
}

#[test]
fn a_reload_resets_a_tunnel_so_queued_bytes_stop_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), "big.test:*");
    let reader = slow_reader(stalled_download(p.proxy, &origin, Some(&tok())));
    p.wait_audit("open", |r| r["target_host"] == "big.test");
    // A megabyte queued between the origin and the slow reader.
    origin.wait_big_sent(1 << 20);
    write_config(dir.path(), "api.test:*", "", 30_000);
    let cut = Instant::now();
    let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    assert_reset(&p, reader, cut, "revoked");
}

#[test]
fn a_delete_resets_the_sandboxes_tunnels() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), "api.test:*");
    let body = format!(
        r#"{{"auth": {{"token_sha256": "{}"}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["big.test:*"]}}}}}}"#,
        sha("rt-secret")
    );
    let (status, resp) = admin_req(p.admin, "PUT", "/v1/sandboxes/rt", &body, Some(ADMIN_TOKEN));
    assert_eq!(status, 201, "{resp}");
    let s = stalled_download(p.proxy, &origin, Some(&basic("rt", "rt-secret")));
    let reader = slow_reader(s);
    p.wait_audit("open", |r| r["target_host"] == "big.test");
    // A megabyte queued between the origin and the slow reader.
    origin.wait_big_sent(1 << 20);
    let cut = Instant::now();
    let (status, resp) = admin_req(p.admin, "DELETE", "/v1/sandboxes/rt", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{resp}");
    assert_reset(&p, reader, cut, "revoked");
}

#[test]
fn tunnels_left_when_the_shutdown_grace_runs_out_are_reset() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).unwrap();
    write_config(dir.path(), "big.test:*", "", 500);
    let mut p = Proxy::start_with(
        dir.path().join("proxy.yaml"),
        dir.path().join("audit.jsonl"),
        &[],
    );
    let reader = slow_reader(stalled_download(p.proxy, &origin, Some(&tok())));
    p.wait_audit("open", |r| r["target_host"] == "big.test");
    // A megabyte queued between the origin and the slow reader.
    origin.wait_big_sent(1 << 20);
    unsafe_free_kill(p.child.id(), "TERM");
    // The grace period is half a second: the cut comes then.
    let cut = Instant::now() + Duration::from_millis(500);
    assert_reset(&p, reader, cut, "shutdown");
    assert!(p.terminate().success());
}

/// An upload through a CONNECT tunnel that writes as fast as the origin reads, until the
/// proxy cuts it. Returns the request-head length.
fn endless_upload(p: &Proxy, origin: &Origin) -> (usize, std::thread::JoinHandle<()>) {
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let port = origin.addr.port();
    write!(
        s,
        "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        tok()
    )
    .unwrap();
    assert!(read_head(&mut s).starts_with(b"HTTP/1.1 200"));
    let request = format!(
        "POST /upload HTTP/1.1\r\nHost: api.test\r\nContent-Length: {}\r\n\r\n",
        1u64 << 40
    );
    let writer = {
        let request = request.clone();
        std::thread::spawn(move || {
            s.write_all(request.as_bytes()).unwrap();
            let chunk = vec![b'u'; 64 * 1024];
            while s.write_all(&chunk).is_ok() {}
        })
    };
    (request.len(), writer)
}

#[test]
fn an_upload_that_keeps_writing_after_the_cut_delivers_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), "api.test:*");
    let (head, writer) = endless_upload(&p, &origin);
    eventually(Duration::from_secs(10), "the upload to get going", || {
        (origin.received.load(Ordering::SeqCst) >= 32 << 20).then_some(())
    });
    write_config(dir.path(), "big.test:*", "", 30_000);
    let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    let rec = p.wait_record(|r| r["target_host"] == "api.test" && r["mode"] != "http");
    assert_eq!(rec["close"], "revoked", "{rec}");
    writer.join().unwrap();
    // The origin reads everything that reaches it.
    let at_cut = origin.wait_uploads_ended();
    assert_counts_what_arrived(&rec, "bytes_up", head + at_cut as usize);
}

/// CONNECT to `/big` and read the whole response: what the client received.
fn whole_download(p: &Proxy, origin: &Origin) -> (usize, usize) {
    let mut s = stalled_download(p.proxy, origin, Some(&tok()));
    let mut got = Vec::with_capacity(BIG + 256);
    s.read_to_end(&mut got).unwrap();
    let request = "GET /big HTTP/1.1\r\nHost: big.test\r\n\r\n".len();
    (request, got.len())
}

fn assert_exact_tunnel(limits: &str) {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).unwrap();
    write_config(dir.path(), "big.test:*", limits, 30_000);
    let p = Proxy::start_with(
        dir.path().join("proxy.yaml"),
        dir.path().join("audit.jsonl"),
        &[],
    );
    let (sent, received) = whole_download(&p, &origin);
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\nConnection: close\r\n\r\n");
    assert_eq!(received, head.len() + BIG, "the origin's whole response");
    let rec = p.wait_record(|r| r["target_host"] == "big.test" && r["mode"] != "http");
    assert_eq!(rec["close"], "eof", "{rec}");
    assert_eq!(rec["bytes_down"].as_u64(), Some(received as u64), "{rec}");
    assert_eq!(rec["bytes_up"].as_u64(), Some(sent as u64), "{rec}");
}

#[test]
fn a_completed_8_mib_tunnel_is_counted_to_the_byte() {
    assert_exact_tunnel("");
}

#[test]
fn a_completed_8_mib_shaped_tunnel_is_counted_to_the_byte() {
    assert_exact_tunnel("bandwidth_down_bps: 1073741824");
}

#[test]
fn a_completed_8_mib_forwarded_download_is_counted_to_the_byte() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let p = start(dir.path(), "big.test:*");
    let px = format!("http://tok:tok-secret@{}", p.proxy);
    let url = format!("http://big.test:{}/big", origin.addr.port());
    let out = curl(&[
        "-x",
        &px,
        "-o",
        "/dev/null",
        "-w",
        "%{size_download} %{size_header}",
        &url,
    ]);
    assert_eq!(out.code, 0, "{}", out.text());
    let text = out.text();
    let (body, head) = text.trim().split_once(' ').unwrap();
    assert_eq!(body, BIG.to_string());
    // The heads count too (clients review B1): the origin's response head, as the client got
    // it give or take the hop-by-hop and `date` headers, and the request head sent up.
    let head: u64 = head.parse().unwrap();
    let rec = p.wait_record(|r| r["target_host"] == "big.test");
    let down = rec["bytes_down"].as_u64().unwrap() - BIG as u64;
    assert!(
        down > 16 && down <= head + 64,
        "body plus head ({head}): {rec}"
    );
    let up = rec["bytes_up"].as_u64().unwrap();
    assert!(up > 16 && up < 512, "the request head, no body: {rec}");
}
