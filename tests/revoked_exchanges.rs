//! The pipeline's guarantees, with the real binary, real curl and raw sockets:
//! - every live forwarded plain-HTTP exchange (upload or download) is cut — reset — when its
//!   policy no longer allows it, by a reload and by a DELETE, with nothing more reaching the
//!   origin or the client after the cut (tunnels: `tests/cut.rs`);
//! - a bandwidth-shaped tunnel whose client stops reading is still idled out and revoked;
//! - a reload that lands while a CONNECT is between its decision and its dial (held by a slow
//!   DNS answer) still revokes that tunnel;
//! - every refusal path writes exactly one `end` record, timed from the accept.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;

const ADMIN_TOKEN: &str = "pipeline-admin-token";

/// Write `proxy.yaml` (proxy and admin on port 0, audit and admin token in `dir`) for
/// `config`.
fn write_config(dir: &Path, config: ProxyConfig) {
    let config = config.admin_token_file(&dir.join("admin.token"));
    std::fs::write(
        dir.join("proxy.yaml"),
        config.yaml(&dir.join("audit.jsonl")),
    )
    .unwrap();
}

fn start(dir: &Path) -> Proxy {
    std::fs::write(dir.join("admin.token"), ADMIN_TOKEN).unwrap();
    Proxy::start_with(dir.join("proxy.yaml"), dir.join("audit.jsonl"), &[])
}

/// The test names on loopback, and loopback let through the guard.
fn loopback() -> ProxyConfig {
    ["api.test", "slow.test", "big.test"]
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
}

/// A sandbox `tok` (token `tok-secret`) allowed to reach `egress`.
fn tok_sandbox(egress: &[&str]) -> SandboxSpec {
    egress
        .iter()
        .fold(SandboxSpec::new("tok").token("tok-secret"), |s, e| {
            s.allow(e)
        })
}

fn reload(p: &Proxy) {
    let (status, body) = admin_req(p.admin, "POST", "/v1/reload", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
}

/// A forwarded download of `/slow` (1 KiB per 100 ms) and a forwarded upload to `/upload`
/// (rate-limited by curl), both through the proxy as `creds`. Returns once bytes flow in both.
fn start_exchanges(p: &Proxy, origin: &Origin, creds: &str) -> [JoinHandle<(CurlOut, Instant)>; 2] {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upload.bin");
    std::fs::write(&file, vec![b'u'; 4 * 1024 * 1024]).unwrap();
    let px = format!("http://{creds}@{}", p.proxy);
    let down_url = format!("http://slow.test:{}/slow", origin.addr.port());
    let up_url = format!("http://api.test:{}/upload", origin.addr.port());
    let before = origin.received.load(Ordering::SeqCst);
    let down = {
        let px = px.clone();
        std::thread::spawn(move || (curl(&["-x", &px, &down_url]), Instant::now()))
    };
    let up = std::thread::spawn(move || {
        let data = format!("@{}", file.display());
        let out = curl(&[
            "-x",
            &px,
            "--limit-rate",
            "64K",
            "--data-binary",
            &data,
            &up_url,
        ]);
        drop(dir);
        (out, Instant::now())
    });
    let slow_before = origin.slow_sent.load(Ordering::SeqCst);
    eventually(Duration::from_secs(10), "both exchanges to flow", || {
        let up = origin.received.load(Ordering::SeqCst) > before + 64 * 1024;
        // A few of the download's chunks are out too.
        let down = origin.slow_sent.load(Ordering::SeqCst) >= slow_before + 3 * 1024;
        (up && down).then_some(())
    });
    [down, up]
}

/// After a revocation at `cut`: both exchanges are recorded `revoked`, both clients were cut
/// promptly, and nothing more reached the origin.
fn assert_cut(
    p: &Proxy,
    origin: &Origin,
    exchanges: [JoinHandle<(CurlOut, Instant)>; 2],
    cut: Instant,
) {
    let down = p.wait_record(|r| r["mode"] == "http" && r["target_host"] == "slow.test");
    let up = p.wait_record(|r| r["mode"] == "http" && r["target_host"] == "api.test");
    assert_eq!(down["close"], "revoked", "{down}");
    assert_eq!(up["close"], "revoked", "{up}");
    assert!(up["bytes_up"].as_u64().unwrap() > 0, "{up}");
    assert!(down["bytes_down"].as_u64().unwrap() > 0, "{down}");
    // The cut reached the origin: the upload's connection ended there (an uncut upload at
    // 64 KB/s would run on for a minute).
    origin.wait_uploads_ended();
    for (name, h) in ["download", "upload"].into_iter().zip(exchanges) {
        let (out, ended) = h.join().unwrap();
        // 56: "Recv failure: Connection reset by peer" — reset, not an orderly close (a
        // download closed with a FIN ends with 18, "transfer closed with bytes remaining").
        assert_eq!(out.code, 56, "{name} was not reset: {}", out.stderr);
        let after = ended.saturating_duration_since(cut);
        assert!(
            after < Duration::from_secs(5),
            "{name} went on for {after:?} after the revocation"
        );
    }
}

#[test]
fn forwarded_exchanges_are_cut_by_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    write_config(
        dir.path(),
        loopback().sandbox(tok_sandbox(&["api.test:*", "slow.test:*"])),
    );
    let p = start(dir.path());
    let running = start_exchanges(&p, &origin, "tok:tok-secret");
    write_config(dir.path(), loopback().sandbox(tok_sandbox(&["big.test:*"])));
    let cut = Instant::now();
    reload(&p);
    assert_cut(&p, &origin, running, cut);
}

#[test]
fn forwarded_exchanges_are_cut_by_delete() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    write_config(dir.path(), loopback().sandbox(tok_sandbox(&["big.test:*"])));
    let p = start(dir.path());
    let body = format!(
        r#"{{"auth": {{"token_sha256": "{}"}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["api.test:*", "slow.test:*"]}}}}}}"#,
        sha("rt-secret")
    );
    let (status, resp) = admin_req(p.admin, "PUT", "/v1/sandboxes/rt", &body, Some(ADMIN_TOKEN));
    assert_eq!(status, 201, "{resp}");
    let running = start_exchanges(&p, &origin, "rt:rt-secret");
    let cut = Instant::now();
    let (status, resp) = admin_req(p.admin, "DELETE", "/v1/sandboxes/rt", "", Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{resp}");
    assert_cut(&p, &origin, running, cut);
}

/// A stalled download as `tok` (see `common::stalled_download`).
fn stalled_download(p: &Proxy, origin: &Origin) -> TcpStream {
    common::stalled_download(p.proxy, origin, Some(&basic("tok", "tok-secret")))
}

/// Sandbox `tok` shaped to 4 MiB/s down, allowed to reach `egress`.
fn shaped_sandbox(egress: &str) -> SandboxSpec {
    tok_sandbox(&[egress]).limits("{ bandwidth_down_bps: 4194304 }")
}

#[test]
fn a_shaped_tunnel_whose_client_stops_reading_is_idled_out() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let config = loopback()
        .defaults("timeouts", "{ idle_ms: 1500 }")
        .sandbox(shaped_sandbox("big.test:*"));
    write_config(dir.path(), config);
    let p = start(dir.path());
    let _client = stalled_download(&p, &origin);
    let rec = p.wait_record(|r| r["target_host"] == "big.test" && r["mode"] != "http");
    assert_eq!(rec["close"], "idle", "{rec}");
    assert!(
        (rec["bytes_down"].as_u64().unwrap() as usize) < BIG,
        "the client read nothing, so not everything can have been delivered: {rec}"
    );
}

#[test]
fn a_shaped_tunnel_whose_client_stops_reading_is_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    write_config(dir.path(), loopback().sandbox(shaped_sandbox("big.test:*")));
    let p = start(dir.path());
    let _client = stalled_download(&p, &origin);
    p.wait_audit("open", |r| r["target_host"] == "big.test");
    // At 4 MiB/s the proxy's socket buffers towards the client fill within a second or two;
    // after that its write to the client is blocked and the origin stops sending.
    origin.wait_big_stalled();
    write_config(dir.path(), loopback().sandbox(shaped_sandbox("api.test:*")));
    reload(&p);
    let rec = p.wait_record(|r| r["target_host"] == "big.test" && r["mode"] != "http");
    assert_eq!(rec["close"], "revoked", "{rec}");
}

#[test]
fn a_reload_between_decision_and_dial_still_revokes_the_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    // `late.test` is not in dns.hosts: the proxy asks this server, which answers after 1.5 s.
    let dns = SlowDns::start(
        Duration::from_millis(1500),
        &[("late.test", Ipv4Addr::LOCALHOST)],
    );
    let slow = || {
        ProxyConfig::new()
            .dns_server(&dns.addr.to_string())
            .dns("timeout_ms", "8000")
            .guard_allow("127.0.0.1/32")
    };
    write_config(dir.path(), slow().sandbox(tok_sandbox(&["late.test:*"])));
    let p = start(dir.path());
    let px = format!("http://tok:tok-secret@{}", p.proxy);
    let url = format!("http://late.test:{}/slow", origin.addr.port());
    // -p: a CONNECT tunnel for plain HTTP.
    let client = std::thread::spawn(move || curl(&["-p", "-x", &px, &url]));
    // The name was decided (allowed) and the proxy is waiting for DNS: change the policy now.
    eventually(Duration::from_secs(10), "the proxy to ask DNS", || {
        (dns.queries.load(Ordering::SeqCst) > 0).then_some(())
    });
    write_config(dir.path(), slow().sandbox(tok_sandbox(&["api.test:*"])));
    reload(&p);
    // DNS answers, the proxy dials and opens the tunnel under the old decision — and the
    // tunnel must notice at once that the policy moved.
    // (It may be revoked while its first bytes are still being read: then nothing was ever
    // relayed and there is no `open` record.)
    let end = p.wait_record(|r| r["target_host"] == "late.test");
    assert_eq!(end["close"], "revoked", "{end}");
    let open = p
        .audit_records()
        .into_iter()
        .find(|r| r["event"] == "open" && r["target_host"] == "late.test");
    if let Some(open) = open {
        let lived = end["duration_ms"].as_u64().unwrap() - open["duration_ms"].as_u64().unwrap();
        assert!(lived < 1000, "the tunnel lived {lived} ms after it opened");
    }
    // Either way the tunnel ended within a second of the 1.5 s DNS answer.
    assert!(end["duration_ms"].as_u64().unwrap() < 1500 + 1000, "{end}");
    let out = client.join().unwrap();
    assert_ne!(out.code, 0, "the download completed");
}

/// Send `request` on a fresh connection after holding it idle for `hold`; returns the
/// response text.
fn held_request(p: &Proxy, hold: Duration, request: &str) -> String {
    let mut s = TcpStream::connect(p.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let_time_pass(hold, "a client that waits before it speaks");
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn every_refusal_path_writes_exactly_one_end_record_timed_from_accept() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // gone.test has no address at all.
    let config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "1000")
        .dns("hosts", "{ api.test: [127.0.0.1], gone.test: [] }")
        .guard_allow("127.0.0.1/32")
        .sandbox(tok_sandbox(&["api.test:*", "gone.test:*"]))
        .sandbox(
            SandboxSpec::new("one")
                .token("one-secret")
                .limits("{ max_connections: 1 }")
                .allow("tcp://api.test:*"),
        );
    write_config(dir.path(), config);
    let p = start(dir.path());
    // Each client waits this long between connecting and sending its request.
    let hold = Duration::from_millis(150);
    let tok = basic("tok", "tok-secret");
    let port = origin.addr.port();

    // One connection of `one` holds its only slot.
    let mut holder = TcpStream::connect(p.proxy).unwrap();
    write!(
        holder,
        "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        basic("one", "one-secret")
    )
    .unwrap();
    p.wait_audit("open", |r| r["sandbox"] == "one");

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "bad request",
            "GET /not-a-proxy-request HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
            "400",
        ),
        (
            "407",
            format!("CONNECT api.test:{port} HTTP/1.1\r\n\r\n"),
            "407",
        ),
        (
            "403",
            format!("CONNECT denied.test:443 HTTP/1.1\r\nProxy-Authorization: {tok}\r\n\r\n"),
            "403",
        ),
        (
            "429",
            format!(
                "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
                basic("one", "one-secret")
            ),
            "429",
        ),
        (
            "DNS failure",
            format!("CONNECT gone.test:443 HTTP/1.1\r\nProxy-Authorization: {tok}\r\n\r\n"),
            "502",
        ),
        (
            "dial failure",
            format!(
                "CONNECT api.test:{closed_port} HTTP/1.1\r\nProxy-Authorization: {tok}\r\n\r\n"
            ),
            "502",
        ),
    ];
    for (name, request, status) in &cases {
        let resp = held_request(&p, hold, request);
        assert!(
            resp.starts_with(&format!("HTTP/1.1 {status}")),
            "{name}: {resp}"
        );
    }
    // An allowed tunnel, held open for a while and then closed by the client.
    {
        let mut s = TcpStream::connect(p.proxy).unwrap();
        let_time_pass(hold, "a client that waits before it speaks");
        write!(
            s,
            "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {tok}\r\n\r\nGET / HTTP/1.1\r\nHost: api.test\r\n\r\n"
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(String::from_utf8_lossy(&out).contains("hello from origin"));
    }
    // And a connection that sends nothing at all before closing.
    drop(TcpStream::connect(p.proxy).unwrap());
    drop(holder);

    // (reason, how many end records, which connections)
    let expect = [
        (
            "invalid_target",
            2,
            "the bad request, and the connection that sent nothing",
        ),
        ("auth_required", 1, "407"),
        ("no_rule_matched", 1, "403"),
        ("connection_limit", 1, "429"),
        ("destination_not_found", 1, "DNS failure"),
        ("connection_refused", 1, "dial failure"),
        (
            "rule_matched",
            3,
            "the allowed tunnel, the request it carried (its own record), and the holder",
        ),
    ];
    // Wait until the last one (the holder) is written, then count.
    p.wait_record(|r| r["sandbox"] == "one" && r["reason"] == "rule_matched");
    p.wait_record(|r| r["detail"] == "closed before sending a request");
    let records = p.audit_records();
    let ends: Vec<&serde_json::Value> = records.iter().filter(|r| r["event"] == "end").collect();
    for (reason, want, what) in expect {
        let n = ends.iter().filter(|r| r["reason"] == reason).count();
        assert_eq!(
            n, want,
            "{what}: {n} end records with reason {reason}: {ends:#?}"
        );
    }
    // One end record per connection — conn_ids are unique — besides the record of the
    // request the allowed tunnel carried (mode http, its connection's conn_id).
    let tunnel_request = |r: &&&serde_json::Value| {
        r["mode"] == "http"
            && ends
                .iter()
                .any(|c| c["conn_id"] == r["conn_id"] && c["mode"] != "http")
    };
    assert_eq!(ends.iter().filter(tunnel_request).count(), 1, "{ends:#?}");
    let conns: Vec<&&serde_json::Value> = ends.iter().filter(|r| !tunnel_request(r)).collect();
    let mut ids: Vec<u64> = conns
        .iter()
        .map(|r| r["conn_id"].as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), conns.len(), "{ends:#?}");
    assert_eq!(conns.len(), 9, "{ends:#?}");
    // Every connection that lived at least `hold` says so: `duration_ms` counts from the
    // accept, not from the request. (A third of `hold`: on a loaded machine the proxy may
    // accept a while after the client connected.)
    for r in &conns {
        if r["detail"] == "closed before sending a request" {
            continue;
        }
        let ms = r["duration_ms"].as_u64().unwrap();
        assert!(
            ms >= hold.as_millis() as u64 / 3,
            "duration_ms {ms} for a connection held {hold:?}: {r}"
        );
    }
}
