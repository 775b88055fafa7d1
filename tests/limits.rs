//! Per-sandbox limits through the real proxy: concurrent connections, connection rate and
//! bandwidth. Lower time bounds only — never an upper one.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

/// Credentials of a test sandbox: its token is `{user}-secret`.
fn creds(user: &str) -> String {
    basic(user, &format!("{user}-secret"))
}

struct Env {
    _dir: tempfile::TempDir,
    ca: TestCa,
    https: Origin,
    http: Origin,
    proxy: Proxy,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let http = Origin::start(None);
    let mut config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("big.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32");
    for (id, limits) in [
        ("small", "{ max_connections: 3 }"),
        ("other", "{}"),
        ("rate", "{ connections_per_second: 0.01, burst: 5 }"),
        ("bw", "{ bandwidth_down_bps: 4194304 }"),
    ] {
        let sb = SandboxSpec::new(id)
            .token(&format!("{id}-secret"))
            .limits(limits)
            .allow("api.test:*")
            .allow("big.test:*");
        config = config.sandbox(sb);
    }
    let proxy = config.start(dir.path());
    Env {
        _dir: dir,
        ca,
        https,
        http,
        proxy,
    }
}

/// Open a CONNECT tunnel and keep it; returns the stream and the status line + headers.
fn connect(e: &Env, user: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(e.proxy.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "CONNECT api.test:{} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        e.https.addr.port(),
        creds(user)
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

#[test]
fn max_connections_refuses_the_fourth_but_not_another_sandbox() {
    let e = env();
    let open: Vec<_> = (0..3).map(|_| connect(&e, "small")).collect();
    for (_, head) in &open {
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    let (_s, head) = connect(&e, "small");
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("retry-after: "), "{head}");
    assert!(
        lower.contains("proxy-status: egress-proxy; error=connection_limit_reached"),
        "{head}"
    );
    let (_o, head) = connect(&e, "other");
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "another sandbox is unaffected: {head}"
    );
    // Closing one tunnel frees a place.
    drop(open);
    let mut head = String::new();
    within(Duration::from_millis(100), Duration::from_secs(10), || {
        let (_s, h) = connect(&e, "small");
        head = h;
        head.starts_with("HTTP/1.1 200").then_some(())
    })
    .unwrap_or_else(|| panic!("the freed place was never given back: {head}"));
    let rec = e.proxy.wait_record(|r| r["reason"] == "connection_limit");
    assert_eq!(rec["sandbox"], "small");
    assert_eq!(rec["close"], "limit");
    let metrics = e.proxy.admin_get("/metrics").1;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("egress_rate_limited_total{limit=\"connections\",sandbox=\"small\"}")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.rsplit(' ').next().unwrap().parse::<u64>().unwrap() >= 1);
    assert!(!metrics.contains("egress_rate_limited_total{limit=\"connections\",sandbox=\"other\"}"));
}

#[test]
fn connection_rate_admits_exactly_the_burst() {
    let e = env();
    let proxy = e.proxy.proxy;
    let port = e.https.addr.port();
    let threads: Vec<_> = (0..20)
        .map(|_| {
            std::thread::spawn(move || {
                let text = raw_exchange(
                    proxy,
                    format!(
                        "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
                        creds("rate")
                    )
                    .as_bytes(),
                    Duration::from_millis(500),
                );
                text.starts_with("HTTP/1.1 200")
            })
        })
        .collect();
    let admitted = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|ok| *ok)
        .count();
    // Burst 5; at 0.01/s nothing refills while the test runs (the bucket's arithmetic has
    // its own unit tests with explicit timestamps).
    assert_eq!(admitted, 5, "admitted {admitted} of 20");
    let refused = e
        .proxy
        .audit_records()
        .iter()
        .filter(|r| r["reason"] == "rate_limited")
        .count();
    assert_eq!(refused, 20 - admitted);
    let text = raw_exchange(
        proxy,
        format!(
            "CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
            creds("rate")
        )
        .as_bytes(),
        Duration::from_millis(500),
    );
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    // The next token is 100 s away.
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 100"),
        "{text}"
    );
    let metrics = e.proxy.admin_get("/metrics").1;
    assert!(
        metrics.contains("egress_rate_limited_total{limit=\"rate\",sandbox=\"rate\"}"),
        "{metrics}"
    );
}

#[test]
fn bandwidth_is_shaped_not_corrupted() {
    let e = env();
    let ca = e.ca.ca_pem.display().to_string();
    let url = format!("https://big.test:{}/big", e.https.addr.port());
    let start = Instant::now();
    let out = curl(&[
        "-x",
        &format!("http://bw:bw-secret@{}", e.proxy.proxy),
        "--cacert",
        &ca,
        &url,
    ]);
    let took = start.elapsed();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.len(), BIG);
    assert!(
        out.stdout
            .iter()
            .enumerate()
            .all(|(i, b)| *b == big_byte(i)),
        "corrupted"
    );
    // 8 MiB at 4 MiB/s with a 0.4 MiB burst: at least ~1.9 s; assert a generous lower bound.
    assert!(
        took >= Duration::from_millis(1500),
        "took only {took:?}: not shaped"
    );
    let rec = e.proxy.wait_record(|r| r["sandbox"] == "bw");
    assert!(rec["bytes_down"].as_u64().unwrap() >= BIG as u64);
    let metrics = e.proxy.admin_get("/metrics").1;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("egress_bytes_total{direction=\"down\",sandbox=\"bw\"}"))
        .unwrap();
    let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= BIG as u64, "{line}");
    // An unlimited sandbox is not shaped by bw's limit (no upper bound asserted, just success).
    let out = curl(&[
        "-x",
        &format!("http://other:other-secret@{}", e.proxy.proxy),
        "--cacert",
        &ca,
        &url,
    ]);
    assert_eq!(out.stdout.len(), BIG);
}

#[test]
fn forwarded_http_bodies_are_shaped_too() {
    let e = env();
    let url = format!("http://big.test:{}/big", e.http.addr.port());
    let start = Instant::now();
    let out = curl(&[
        "-x",
        &format!("http://bw:bw-secret@{}", e.proxy.proxy),
        &url,
    ]);
    let took = start.elapsed();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.len(), BIG);
    assert!(
        out.stdout
            .iter()
            .enumerate()
            .all(|(i, b)| *b == big_byte(i)),
        "corrupted"
    );
    assert!(
        took >= Duration::from_millis(1500),
        "took only {took:?}: not shaped"
    );
    let rec = e
        .proxy
        .wait_record(|r| r["sandbox"] == "bw" && r["mode"] == "http");
    assert!(rec["bytes_down"].as_u64().unwrap() >= BIG as u64, "{rec}");
}
