//! The usage ledger and daily quotas through the real binary (issue 45): a 1 MiB daily quota
//! cuts a download and keeps refusing after a restart, `requests_per_day` refuses the request
//! past it, `GET /v1/usage` sums to the audit records, and two replicas sharing etcd refuse on
//! each other's counts.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::*;

const MIB: u64 = 1024 * 1024;
/// What a cut may overshoot the quota by: the chunks in flight when the count crossed it.
const SLACK: u64 = 512 * 1024;

fn sandbox(id: &str, limits: &str) -> SandboxSpec {
    SandboxSpec::new(id)
        .token(&format!("{id}-secret"))
        .limits(limits)
        .allow("big.test:*")
        .allow("api.test:*")
        .allow("*.counted.test:*")
}

/// The quota sandboxes `q`, `r`, `free` and `d`, the test names on loopback; no state.
fn quotas() -> ProxyConfig {
    ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("big.test", "127.0.0.1")
        .host("a.counted.test", "127.0.0.1")
        .host("b.counted.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(sandbox("q", "{ bytes_per_day: 1048576 }"))
        .sandbox(sandbox("r", "{ requests_per_day: 3 }"))
        .sandbox(sandbox("free", "{}"))
        .sandbox(sandbox(
            "d",
            "{ per_destination: [{ host: big.test, bytes_per_day: 1048576 }, { host: \"*.counted.test\", requests_per_day: 2 }] }",
        ))
}

/// [`quotas`] with its counts kept in `dir/state`.
fn config(dir: &Path) -> ProxyConfig {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    quotas().raw(&format!("state_dir: {}", state.display()))
}

/// The status line of a CONNECT to `target` as `user`.
fn connect_status(proxy: std::net::SocketAddr, user: &str, target: &str) -> String {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = basic(user, &format!("{user}-secret"));
    write!(
        s,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut s);
    String::from_utf8_lossy(&head).into_owned()
}

/// Download `/big` (8 MiB) through a CONNECT tunnel as `user`: the bytes received.
fn tunnel_download(proxy: std::net::SocketAddr, user: &str, origin: &Origin) -> u64 {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = basic(user, &format!("{user}-secret"));
    let target = format!("big.test:{}", origin.addr.port());
    write!(
        s,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    )
    .unwrap();
    // A tunnel asked for once the quota is spent is refused (429): nothing delivered.
    if !read_head(&mut s).starts_with(b"HTTP/1.1 200") {
        return 0;
    }
    s.write_all(b"GET /big HTTP/1.1\r\nHost: big.test\r\n\r\n")
        .unwrap();
    let mut got = 0u64;
    let mut buf = vec![0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got += n as u64,
        }
    }
}

fn usage(p: &Proxy, query: &str) -> serde_json::Value {
    let (status, body) = p.admin_get(&format!("/v1/usage{query}"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_daily_byte_quota_cuts_the_download_that_crosses_it_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let mut proxy = config(dir.path()).start(dir.path());
    let target = format!("big.test:{}", origin.addr.port());

    // An 8 MiB download by the sandbox with a 1 MiB quota: cut near 1 MiB.
    let got = tunnel_download(proxy.proxy, "q", &origin);
    assert!(
        got < MIB + SLACK,
        "the download went on past the quota: {got}"
    );
    let cut = proxy.wait_record(|r| {
        r["sandbox"] == "q" && r["event"] == "end" && r["reason"] == "quota_exceeded"
    });
    assert_eq!(cut["decision"], "deny");
    assert_eq!(cut["close"], "limit");
    // Which quota cut it, and its value (clients review F7).
    assert_eq!(
        cut["detail"], "cut at the sandbox's bytes_per_day quota (1048576)",
        "{cut}"
    );
    let down = cut["bytes_down"].as_u64().unwrap();
    assert!(down < MIB + SLACK, "{cut}");
    // What the ledger counted reached the quota (the record leaves out what the reset dropped).
    let u = usage(&proxy, "?sandbox=q");
    let q = &u["quotas"][0];
    assert_eq!(q["sandbox"], "q");
    assert_eq!(q["spent"], "bytes_per_day");
    assert!(q["bytes"].as_u64().unwrap() >= MIB, "{u}");

    // New exchanges are refused, through either door; another sandbox is untouched.
    let status = connect_status(proxy.proxy, "q", &target);
    assert!(status.starts_with("HTTP/1.1 429"), "{status}");
    assert!(status.contains("quota_exceeded"), "{status}");
    assert!(
        status.to_ascii_lowercase().contains("retry-after"),
        "{status}"
    );
    let url = format!("http://{target}/");
    let out = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-x",
        &format!("http://q:q-secret@{}", proxy.proxy),
        &url,
    ]);
    assert_eq!(out.text(), "429", "{}", out.stderr);
    assert!(tunnel_download(proxy.proxy, "free", &origin) > 8 * MIB);

    // A restart (SIGTERM: usage saved) keeps the day's count: still refused.
    proxy.terminate();
    let saved = std::fs::read_to_string(dir.path().join("state/usage.state")).unwrap();
    assert!(saved.contains("\"quota\":[{\"sandbox\":\"q\""), "{saved}");
    let proxy = config(dir.path()).start(dir.path());
    let status = connect_status(proxy.proxy, "q", &target);
    assert!(
        status.starts_with("HTTP/1.1 429"),
        "{status} {}",
        proxy.stderr_text()
    );
    let refused = proxy.wait_record(|r| r["sandbox"] == "q" && r["reason"] == "quota_exceeded");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("bytes_per_day"),
        "{refused}"
    );
    let u = usage(&proxy, "?sandbox=q");
    assert_eq!(u["quotas"][0]["spent"], "bytes_per_day", "{u}");
}

#[test]
fn per_destination_quotas_count_their_hosts_only() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let port = origin.addr.port();
    // big.test's 1 MiB: the download is cut, big.test refused after, api.test still served.
    let got = tunnel_download(proxy.proxy, "d", &origin);
    assert!(got < MIB + SLACK, "{got}");
    let status = connect_status(proxy.proxy, "d", &format!("big.test:{port}"));
    assert!(status.starts_with("HTTP/1.1 429"), "{status}");
    let refused = proxy.wait_record(|r| {
        r["sandbox"] == "d" && r["reason"] == "quota_exceeded" && r["close"] != "limit"
    });
    let detail = refused["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("big.test (limits.per_destination)"),
        "{refused}"
    );
    let status = connect_status(proxy.proxy, "d", &format!("api.test:{port}"));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // *.counted.test: two requests in all, whichever names; other hosts go on.
    let via = format!("http://d:d-secret@{}", proxy.proxy);
    let code = |host: &str| {
        let url = format!("http://{host}:{port}/");
        curl(&["-o", "/dev/null", "-w", "%{http_code}", "-x", &via, &url]).text()
    };
    assert_eq!(code("a.counted.test"), "200");
    assert_eq!(code("b.counted.test"), "200");
    assert_eq!(code("a.counted.test"), "429");
    assert_eq!(code("api.test"), "200");
    let u = usage(&proxy, "?sandbox=d");
    let row = |dest: &str| {
        u["quotas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["destination"] == dest)
            .cloned()
            .unwrap_or_else(|| panic!("no {dest} row: {u}"))
    };
    assert_eq!(row("big.test")["spent"], "bytes_per_day");
    assert_eq!(row("*.counted.test")["spent"], "requests_per_day");
    assert_eq!(row("*.counted.test")["requests"], 2);
}

#[test]
fn requests_per_day_refuses_the_request_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let url = format!("http://api.test:{}/hello", origin.addr.port());
    let via = format!("http://r:r-secret@{}", proxy.proxy);
    let codes: Vec<String> = (0..5)
        .map(|_| curl(&["-o", "/dev/null", "-w", "%{http_code}", "-x", &via, &url]).text())
        .collect();
    assert_eq!(codes, ["200", "200", "200", "429", "429"]);
    // The refusal names the quota and its value (clients review F7), in the status line.
    let out = curl(&["-sS", "-i", "-x", &via, &url]);
    assert!(
        out.text().starts_with(
            "HTTP/1.1 429 egress-proxy [quota_exceeded]: refused GET http://api.test:"
        ) && out.text().lines().next().unwrap_or("").contains(
            ": sandbox r: the sandbox's requests_per_day quota (3) is spent until midnight UTC"
        ),
        "{}",
        out.text()
    );
    let u = usage(&proxy, "?sandbox=r");
    assert_eq!(u["quotas"][0]["requests"], 3, "{u}");
    assert_eq!(u["quotas"][0]["spent"], "requests_per_day", "{u}");
}

/// Clients review wave 4, B1: forwarded plain HTTP counted bodies only, so 8 KiB of header and
/// query per GET went up uncounted under a byte quota. The heads count now: the record's
/// `bytes_up` holds them, and the quota (1 MiB for `q`) refuses once they fill it.
#[test]
fn forwarded_heads_count_toward_the_byte_quota() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let via = format!("http://q:q-secret@{}", proxy.proxy);
    let big = "x".repeat(7000);
    let url = format!("http://api.test:{}/hello?d={big}", origin.addr.port());
    let header = format!("X-Data: {big}");
    let first = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-x",
        &via,
        "-H",
        &header,
        &url,
    ]);
    assert_eq!(first.text(), "200");
    let rec = proxy.wait_record(|r| r["sandbox"] == "q" && r["mode"] == "http");
    let up = rec["bytes_up"].as_u64().unwrap_or(0);
    assert!(up >= 14_000, "the head's bytes are counted: {rec}");
    assert!(rec["bytes_down"].as_u64().unwrap_or(0) > 0, "{rec}");
    // 1 MiB of quota: some 50 such requests (7 KiB of query and 7 KiB of header up, the path
    // echoed down), then refused — counting bodies alone, all 110 were served.
    let codes: Vec<String> = (0..110)
        .map(|_| {
            curl(&[
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-x",
                &via,
                "-H",
                &header,
                &url,
            ])
            .text()
        })
        .collect();
    assert!(codes.iter().any(|c| c == "429"), "{codes:?}");
    let served = codes.iter().filter(|c| *c == "200").count();
    assert!((30..=80).contains(&served), "{served} served: {codes:?}");
}

/// `n` forwarded GETs of `url` through `via`, released together: their status codes.
fn at_once(n: usize, url: &str, via: &str) -> Vec<String> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(n));
    (0..n)
        .map(|_| {
            let (url, via, start) = (url.to_string(), via.to_string(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                curl(&["-o", "/dev/null", "-w", "%{http_code}", "-x", &via, &url]).text()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect()
}

/// Security review round A, A11 (and the request pipeline's reservation phase): 30 forwarded
/// requests at once against `requests_per_day: 3` served 12 on the old code — each checked the
/// count before any had added to it. A request is now reserved (checked and counted in one
/// step): exactly 3 are served and the other 27 refused.
#[test]
fn parallel_requests_spend_a_request_quota_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let url = format!("http://api.test:{}/hello", origin.addr.port());
    let via = format!("http://r:r-secret@{}", proxy.proxy);
    let codes = at_once(30, &url, &via);
    let served = codes.iter().filter(|c| *c == "200").count();
    let refused = codes.iter().filter(|c| *c == "429").count();
    assert_eq!((served, refused), (3, 27), "{codes:?}");
    let u = usage(&proxy, "?sandbox=r");
    assert_eq!(u["quotas"][0]["requests"], 3, "{u}");
}

#[test]
fn usage_sums_match_the_audit_records() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let http = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let via = format!("http://free:free-secret@{}", proxy.proxy);
    let cacert = ca.ca_pem.display().to_string();
    for path in ["/a", "/b"] {
        let url = format!("https://api.test:{}{path}", https.addr.port());
        let out = curl(&["--cacert", &cacert, "-x", &via, &url]);
        assert_eq!(out.code, 0, "{}", out.stderr);
    }
    for path in ["/c", "/d", "/e"] {
        let url = format!("http://big.test:{}{path}", http.addr.port());
        let out = curl(&["-x", &via, &url]);
        assert_eq!(out.code, 0, "{}", out.stderr);
    }
    // Refused: not in the allowlist.
    let status = connect_status(proxy.proxy, "free", "nowhere.test:443");
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    let records = eventually(Duration::from_secs(10), "six end records", || {
        let rs = proxy.audit_records();
        let n = rs
            .iter()
            .filter(|r| r["sandbox"] == "free" && r["event"] == "end")
            .count();
        (n >= 6).then_some(rs)
    });
    // Sums of the connection records per destination and decision.
    let mut want: HashMap<(String, String), (u64, u64, u64, u64)> = HashMap::new();
    for r in records
        .iter()
        .filter(|r| r["sandbox"] == "free" && r["event"] == "end" && r["mode"] != "https")
    {
        let key = (
            r["target_host"].as_str().unwrap().to_string(),
            r["decision"].as_str().unwrap().to_string(),
        );
        let e = want.entry(key).or_default();
        e.0 += 1;
        e.1 += u64::from(r["mode"] == "http");
        e.2 += r["bytes_up"].as_u64().unwrap();
        e.3 += r["bytes_down"].as_u64().unwrap();
    }
    let u = usage(&proxy, "?sandbox=free");
    let mut got: HashMap<(String, String), (u64, u64, u64, u64)> = HashMap::new();
    for row in u["usage"].as_array().unwrap() {
        let key = (
            row["destination"].as_str().unwrap().to_string(),
            row["decision"].as_str().unwrap().to_string(),
        );
        let n = |k: &str| row[k].as_u64().unwrap();
        got.insert(
            key,
            (
                n("connections"),
                n("requests"),
                n("bytes_up"),
                n("bytes_down"),
            ),
        );
    }
    assert_eq!(got, want, "{u}");
    assert_eq!(got[&("big.test".to_string(), "allow".to_string())].1, 3);
    assert_eq!(got[&("nowhere.test".to_string(), "deny".to_string())].0, 1);
    assert!(got[&("api.test".to_string(), "allow".to_string())].3 > 0);

    // `since` in the future: nothing; a malformed one: a clear 400.
    let later = usage(&proxy, "?sandbox=free&since=4102444800");
    assert_eq!(later["usage"].as_array().unwrap().len(), 0, "{later}");
    let (status, body) = proxy.admin_get("/v1/usage?since=tomorrow");
    assert_eq!(status, 400, "{body}");

    // The same counts as metrics, summed over destinations (never a label).
    let (_, metrics) = proxy.admin_get("/metrics");
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("egress_usage_requests{")
                && l.contains("decision=\"allow\"")
                && l.contains("sandbox=\"free\"")
        })
        .unwrap_or_else(|| panic!("no usage gauge:\n{metrics}"));
    assert!(line.ends_with(" 3"), "{line}");
    assert!(
        !metrics.contains("big.test"),
        "destination hosts must not be labels"
    );
}

/// Two replicas on one etcd move at most `bytes_per_day` (1 MiB) for a sandbox between them
/// (issue 94): both download the 8 MiB `/big` through tunnels at once, each from the shares
/// it leases of the fleet's counter — taken before they are written, so the two together get
/// at most the quota and at least all of it less what a share might still hold; then both
/// refuse new tunnels, and another sandbox is still served. The same for forwarded bodies,
/// which hold what they read while their replica leases the next share. On the code before, each replica
/// judged on its own count and the other's as of its last report (a second): the two
/// downloads, a few milliseconds each, together moved about twice the quota.
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn replicas_sharing_etcd_move_a_byte_quota_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let origin = Origin::start(None);
    let plane = format!(
        "control_plane: {{ etcd: {{ endpoints: [\"127.0.0.1:{}\"], prefix: /usage-test/ }} }}\n",
        etcd.client_port
    );
    let start = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        quotas().raw(&plane).start(&d)
    };
    let a = start("a");
    let b = start("b");
    for p in [&a, &b] {
        eventually(Duration::from_secs(20), "ready", || {
            (p.admin_get("/readyz").0 == 200).then_some(())
        });
    }
    let (got_a, got_b) = std::thread::scope(|s| {
        let on_a = s.spawn(|| tunnel_download(a.proxy, "q", &origin));
        let on_b = s.spawn(|| tunnel_download(b.proxy, "q", &origin));
        (on_a.join().unwrap(), on_b.join().unwrap())
    });
    // Down bytes only: each GET (about 40 bytes up) counts too.
    let both = got_a + got_b;
    assert!(both <= MIB, "A {got_a} + B {got_b} = {both} of {MIB}");
    assert!(both >= MIB - 1024, "A {got_a} + B {got_b} = {both}");
    let target = format!("big.test:{}", origin.addr.port());
    for p in [&a, &b] {
        eventually(Duration::from_secs(10), "the replica to refuse q", || {
            connect_status(p.proxy, "q", &target)
                .starts_with("HTTP/1.1 429")
                .then_some(())
        });
    }
    // Forwarded bodies too (sandbox d's per_destination quota of 1 MiB on big.test): what
    // the two replicas passed together is at most the quota.
    let (fwd_a, fwd_b) = std::thread::scope(|s| {
        let on_a = s.spawn(|| forwarded_download(a.proxy, "d", &origin));
        let on_b = s.spawn(|| forwarded_download(b.proxy, "d", &origin));
        (on_a.join().unwrap(), on_b.join().unwrap())
    });
    let both = fwd_a + fwd_b;
    assert!(
        both <= MIB,
        "forwarded: A {fwd_a} + B {fwd_b} = {both} of {MIB}"
    );
    // (What the clients received may be less: the cut resets both sockets, and what was
    // still in flight is lost. The fleet leased the whole quota, no more.)
    let out = etcd.ctl(&[
        "get",
        "/usage-test/quota/",
        "--prefix",
        "--print-value-only",
    ]);
    let leased: u64 = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["bytes"].as_u64())
        .max()
        .unwrap_or(0);
    assert_eq!(leased, MIB, "{out}");
    // The usage API adds up both replicas' counts (their reports reach each other each
    // second).
    eventually(
        Duration::from_secs(10),
        "the fleet's count in the usage API",
        || {
            let u = usage(&b, "?sandbox=q");
            (u["quotas"][0]["bytes"].as_u64().unwrap() >= MIB - 1024).then_some(())
        },
    );
    // Another sandbox is still served by B.
    assert!(connect_status(b.proxy, "free", &target).starts_with("HTTP/1.1 200"));
}

#[test]
fn each_request_inside_a_terminated_tunnel_counts_and_the_one_past_the_quota_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = ScriptOrigin::start(
        "keepalive_origin.py",
        &[ca.cert_pem.as_os_str(), ca.key_pem.as_os_str()],
    );
    ca_init(&dir.path().join("ica"));
    let terminated = SandboxSpec::new("t")
        .token("t-secret")
        .limits("{ requests_per_day: 3 }")
        .allow("api.test:*")
        .network(
            "http",
            r#"[{ host: api.test, methods: [GET], paths: ["/**"] }]"#,
        );
    let proxy = config(dir.path())
        .intercept(&dir.path().join("ica"), &ca.ca_pem)
        .sandbox(terminated)
        .start(dir.path());
    let via = format!("http://t:t-secret@{}", proxy.proxy);
    let ica = dir.path().join("ica/ca.crt").display().to_string();
    let url = format!("https://api.test:{}/n", https.port);
    // Five requests in one tunnel (curl reuses the connection): the tunnel itself is not a
    // request; the fourth and fifth are past the quota.
    let mut args = vec!["-x", &via, "--cacert", &ica, "-w", "%{http_code}\\n"];
    for _ in 0..5 {
        args.extend(["-o", "/dev/null", &url]);
    }
    let out = curl(&args);
    let text = out.text();
    let codes: Vec<&str> = text.lines().collect();
    assert_eq!(codes, ["200", "200", "200", "429", "429"], "{}", out.stderr);
    // One tunnel carried them all.
    let tunnels = proxy
        .audit_records()
        .iter()
        .filter(|r| r["sandbox"] == "t" && r["event"] == "open")
        .count();
    assert_eq!(tunnels, 1);
    let refused = proxy.wait_record(|r| {
        r["sandbox"] == "t" && r["mode"] == "https" && r["reason"] == "quota_exceeded"
    });
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("requests_per_day"),
        "{refused}"
    );
    let u = usage(&proxy, "?sandbox=t");
    assert_eq!(u["quotas"][0]["requests"], 3, "{u}");
    let rows = u["usage"].as_array().unwrap();
    let requests = |d: &str| {
        rows.iter()
            .find(|r| r["decision"] == d)
            .map(|r| r["requests"].as_u64().unwrap())
    };
    assert_eq!(requests("allow"), Some(3), "{u}");
    assert_eq!(requests("deny"), Some(2), "{u}");
}

/// Security review round C, C3d, through a CONNECT tunnel carrying plain HTTP (the relay a
/// transparent connection takes too): six requests on one kept connection against
/// `requests_per_day: 3` are served three times; each request is reserved on its own.
#[test]
fn each_request_on_a_kept_plain_tunnel_counts() {
    let dir = tempfile::tempdir().unwrap();
    let port = keepalive_origin("127.0.0.1");
    let proxy = config(dir.path()).start(dir.path());
    let via = format!("http://r:r-secret@{}", proxy.proxy);
    let urls: Vec<String> = (0..6)
        .map(|i| format!("http://api.test:{port}/kept-{i}"))
        .collect();
    let mut args = vec!["-p", "-x", &via];
    args.extend(urls.iter().map(String::as_str));
    let out = curl(&args);
    assert_eq!(
        out.text().matches("hello from origin").count(),
        3,
        "{}",
        out.stderr
    );
    let u = usage(&proxy, "?sandbox=r");
    assert_eq!(u["quotas"][0]["requests"], 3, "{u}");
}

/// Security review round A, A17: a `per_destination` quota served 20 of 20 requests made at
/// once (and 57 of 100). The destination's meter is reserved with the sandbox's, in one step:
/// 20 forwarded requests at once against `*.counted.test requests_per_day: 2` serve 2.
#[test]
fn parallel_requests_spend_a_per_destination_quota_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let url = format!("http://a.counted.test:{}/hello", origin.addr.port());
    let via = format!("http://d:d-secret@{}", proxy.proxy);
    let codes = at_once(20, &url, &via);
    let served = codes.iter().filter(|c| *c == "200").count();
    assert_eq!(served, 2, "{codes:?}");
}

/// Security review round A, A15: a SIGKILL 0.3 s after spending `requests_per_day: 3` gave
/// the day back (`usage.state` was written every 2 s only): three more were served. A
/// reservation against a quota now has the file written within `SAVE_SOON` (100 ms): after a
/// kill half a second after the third request, the fourth is refused.
#[test]
fn a_kill_soon_after_spending_does_not_give_the_day_back() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let mut proxy = config(dir.path()).start(dir.path());
    let url = format!("http://api.test:{}/hello", origin.addr.port());
    let via = format!("http://r:r-secret@{}", proxy.proxy);
    let get = |via: &str| curl(&["-o", "/dev/null", "-w", "%{http_code}", "-x", via, &url]).text();
    for _ in 0..3 {
        assert_eq!(get(&via), "200");
    }
    let_time_pass(
        std::time::Duration::from_millis(500),
        "the bound under test: the day's count is on disk within half a second",
    );
    let _ = proxy.child.kill();
    let _ = proxy.child.wait();
    let proxy = config(dir.path()).start(dir.path());
    let via = format!("http://r:r-secret@{}", proxy.proxy);
    assert_eq!(get(&via), "429", "the day's count survived the kill");
}

/// Clients review F7: a forwarded download cut at the byte quota was recorded "the client went
/// away before the response ended"; its record says which quota cut it.
#[test]
fn a_forwarded_download_cut_by_the_quota_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(None);
    let proxy = config(dir.path()).start(dir.path());
    let url = format!("http://big.test:{}/big", origin.addr.port());
    let out = curl(&[
        "-sS",
        "-o",
        "/dev/null",
        "-x",
        &format!("http://q:q-secret@{}", proxy.proxy),
        &url,
    ]);
    assert_ne!(out.code, 0, "the download was cut: {}", out.stderr);
    let cut =
        proxy.wait_record(|r| r["sandbox"] == "q" && r["event"] == "end" && r["close"] == "limit");
    assert_eq!(cut["mode"], "http", "{cut}");
    assert_eq!(cut["reason"], "quota_exceeded", "{cut}");
    assert_eq!(
        cut["detail"], "cut at the sandbox's bytes_per_day quota (1048576)",
        "{cut}"
    );
}

/// Security review C3d (security-wave4) and issue 91 "charged = delivered": six requests
/// written at once (pipelined) on one kept connection against `requests_per_day: 3` —
/// forwarded to the explicit proxy, and plain HTTP inside a CONNECT tunnel. The first three
/// reach the origin and are answered, in order; then the fourth is refused — forwarded with
/// a 429 after them, in a tunnel by the connection's end after the third answer (the relay
/// speaks no HTTP of its own there; the record says why) — nothing more reaches the origin,
/// and the day's count is 3, what was delivered. (Before, in the tunnel: a reset, and the
/// client got no answer at all.)
#[test]
fn pipelined_requests_past_the_quota_cost_the_earlier_ones_nothing() {
    use std::sync::atomic::Ordering;
    for (tunnel, split) in [(false, false), (false, true), (true, false), (true, true)] {
        let dir = tempfile::tempdir().unwrap();
        let (port, served) = counting_origin();
        let proxy = config(dir.path()).start(dir.path());
        let mut s = TcpStream::connect(proxy.proxy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let auth = basic("r", "r-secret");
        let target = format!("api.test:{port}");
        let mut burst = String::new();
        if tunnel {
            connect_on(&mut s, &target, Some(&auth));
        }
        for i in 0..6 {
            match tunnel {
                true => burst.push_str(&format!("GET /p{i} HTTP/1.1\r\nHost: {target}\r\n\r\n")),
                false => burst.push_str(&format!(
                    "GET http://{target}/p{i} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
                )),
            }
        }
        // Split: the last two requests arrive after the refusal of the fourth — a client
        // still writing when the proxy ends the connection must not cost it the answers.
        let at = match split {
            true => burst.match_indices("GET ").nth(4).map_or(0, |(i, _)| i),
            false => burst.len(),
        };
        s.write_all(&burst.as_bytes()[..at]).unwrap();
        if split {
            proxy.wait_record(|r| r["reason"] == "quota_exceeded");
            let _ = s.write_all(&burst.as_bytes()[at..]);
        }
        let mut answers = Vec::new();
        let ended = s.read_to_end(&mut answers);
        drop(s);
        let answers = String::from_utf8_lossy(&answers);
        // The answers' bodies end without a line end: the status lines are found by text.
        let statuses: Vec<&str> = answers
            .match_indices("HTTP/1.1 ")
            .filter_map(|(i, _)| answers.get(i + 9..i + 12))
            .collect();
        let want: &[&str] = match tunnel {
            true => &["200", "200", "200"],
            false => &["200", "200", "200", "429"],
        };
        assert_eq!(
            statuses,
            want,
            "tunnel={tunnel} split={split}: {ended:?} {answers} {:?}",
            proxy.audit_records()
        );
        assert_eq!(served.load(Ordering::SeqCst), 3, "tunnel={tunnel}");
        let u = usage(&proxy, "?sandbox=r");
        assert_eq!(u["quotas"][0]["requests"], 3, "tunnel={tunnel}: {u}");
        let rec = proxy.wait_record(|r| r["reason"] == "quota_exceeded");
        assert_eq!(rec["decision"], "deny", "{rec}");
    }
}

/// A forwarded GET of `/big` as `user` with the client reading slowly at first: the body
/// bytes it received.
fn forwarded_download(proxy: std::net::SocketAddr, user: &str, origin: &Origin) -> u64 {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = basic(user, &format!("{user}-secret"));
    let port = origin.addr.port();
    write!(
        s,
        "GET http://big.test:{port}/big HTTP/1.1\r\nHost: big.test:{port}\r\nProxy-Authorization: {auth}\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    // A download refused before it began gets the house refusal page: not origin bytes.
    if !got.starts_with(b"HTTP/1.1 200") {
        return 0;
    }
    let body = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |end| got.len() - end - 4);
    body as u64
}

/// Issue 91 (review 7b): a `bytes_per_day` of 1 MiB delivered 1.78 MB on forwarded downloads
/// under load, 1.02 MB through CONNECT — the frame that crossed the quota, and every frame
/// in flight beside it, went out before the cut. Eight downloads at once, forwarded and then
/// through CONNECT: what the clients received stays within one 64 KiB buffer of the quota
/// (forwarded: not a byte past it — each frame takes its bytes from the quota before it is
/// passed, and the one that crosses is cut to the rest).
#[test]
fn parallel_downloads_stop_at_the_byte_quota() {
    const QUOTA: u64 = 1_048_576;
    for tunnel in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let origin = Origin::start(None);
        let proxy = config(dir.path()).start(dir.path());
        let received: u64 = std::thread::scope(|s| {
            let runs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| match tunnel {
                        true => tunnel_download(proxy.proxy, "q", &origin),
                        false => forwarded_download(proxy.proxy, "q", &origin),
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).sum()
        });
        eprintln!("tunnel={tunnel}: {received} bytes delivered against {QUOTA}");
        let limit = match tunnel {
            true => QUOTA + 65_536,
            false => QUOTA,
        };
        assert!(
            received <= limit && received > QUOTA / 2,
            "tunnel={tunnel}: {received} bytes delivered against a quota of {QUOTA}"
        );
    }
}
