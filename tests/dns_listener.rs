//! The DNS listener (`listen.dns`) through real interfaces: the real binary, real `dig` over
//! UDP and TCP, raw datagrams for what `dig` will not send, and a counting upstream server
//! (`SlowDns`) to prove which names ever left the proxy.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;

/// Start `config` with the DNS listener on too; the proxy and the listener's address.
fn start_full(dir: &std::path::Path, config: ProxyConfig) -> (Proxy, SocketAddr) {
    let proxy = config.listen("dns").start(dir);
    let dns = proxy.dns.expect("the DNS listener is on");
    (proxy, dns)
}

/// Sandbox `id` reaching `egress`.
fn sandbox(id: &str, egress: &[&str]) -> SandboxSpec {
    egress.iter().fold(SandboxSpec::new(id), |s, e| s.allow(e))
}

/// A dead upstream resolver, these names (each to one address) in `dns.hosts`, loopback let
/// through the guard, and sandbox `s` (the default sandbox) reaching `ok.test`.
fn default_s(hosts: &[(&str, &str)]) -> ProxyConfig {
    hosts
        .iter()
        .fold(ProxyConfig::new(), |c, (n, ip)| c.host(n, ip))
        .listen_at("default_sandbox", "s")
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.0/8")
        .sandbox(sandbox("s", &["ok.test"]))
}

/// The unidentified case: sandbox `far` owns a range no test client is in.
fn far_only(admission: &str) -> ProxyConfig {
    ProxyConfig::new()
        .raw(&format!("admission: {admission}"))
        .dns_server("127.0.0.1:9")
        .host("ok.test", "127.0.0.5")
        .sandbox(sandbox("far", &["ok.test"]).source("10.200.0.0/16"))
}

/// Every record, once `pred` holds for the whole log (15 s at most).
fn wait_records(
    proxy: &Proxy,
    pred: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    eventually(Duration::from_secs(15), "the audit log to match", || {
        Some(proxy.audit_records()).filter(|recs| pred(recs))
    })
}

fn ips(d: &Dig) -> Vec<String> {
    let mut v: Vec<String> = d.answers.iter().map(|a| a.3.clone()).collect();
    v.sort();
    v
}

fn dns_record<'a>(recs: &'a [serde_json::Value], name: &str, qtype: &str) -> &'a serde_json::Value {
    recs.iter()
        .rev()
        .find(|r| r["mode"] == "dns" && r["target_host"] == name && r["qtype"] == qtype)
        .unwrap_or_else(|| panic!("no dns record for {name} {qtype}: {recs:#?}"))
}

#[test]
fn answers_follow_the_policy_and_refused_names_never_leave() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = SlowDns::start_with_cnames(
        Duration::ZERO,
        &[("edge.cdn.test", "127.0.0.11".parse().unwrap())],
        &[("www.allowed.test", "edge.cdn.test")],
    );
    let config = ProxyConfig::new()
        .listen_at("default_sandbox", "s")
        .dns_server(&upstream.addr.to_string())
        .dns("timeout_ms", "1000")
        .dns("max_answer_ttl_s", "7")
        .dns("address_rule_zones", "[svc.test]")
        .dns(
            "hosts",
            r#"{ api.allowed.test: [127.0.0.10, 169.254.169.254, 10.9.2.3, "::1"], github.test: [127.0.0.13], db.svc.test: [10.1.0.5], mixed.svc.test: [10.1.0.6, 127.0.0.12] }"#,
        )
        .guard_allow("127.0.0.0/8")
        .guard_allow("::1/128")
        .sandbox(
            sandbox("s", &["*.allowed.test", "github.test:22", "10.1.0.0/16"])
                .deny("blocked.allowed.test"),
        );
    let (proxy, dns) = start_full(dir.path(), config);

    // A name rule allows it: answered, minus metadata and an uncovered private address.
    let d = dig(dns, &["api.allowed.test", "A"]);
    assert_eq!(d.status, "NOERROR", "{}", d.raw);
    assert_eq!(ips(&d), ["127.0.0.10"], "{}", d.raw);
    assert!(d.answers.iter().all(|a| a.1 <= 7), "TTL capped: {}", d.raw);
    let d = dig(dns, &["api.allowed.test", "AAAA"]);
    assert_eq!(ips(&d), ["::1"], "{}", d.raw);
    // A CNAME is flattened: the final address under the name asked, nothing else.
    let d = dig(dns, &["www.allowed.test", "A"]);
    assert_eq!(d.status, "NOERROR", "{}", d.raw);
    assert_eq!(d.answers.len(), 1, "{}", d.raw);
    assert_eq!(d.answers[0].0, "www.allowed.test.", "{}", d.raw);
    assert_eq!(d.answers[0].2, "A", "{}", d.raw);
    assert_eq!(d.answers[0].3, "127.0.0.11", "{}", d.raw);
    assert!(
        d.answers[0].1 <= 7,
        "upstream said 60, the cap is 7: {}",
        d.raw
    );
    // A name allowed on port 22 only is still answered (SSH by name).
    assert_eq!(ips(&dig(dns, &["github.test", "A"])), ["127.0.0.13"]);
    // HTTPS/SVCB: empty, so no ECH configuration reaches the client.
    let d = dig(dns, &["api.allowed.test", "HTTPS"]);
    assert_eq!(d.status, "NOERROR", "{}", d.raw);
    assert!(d.answers.is_empty(), "{}", d.raw);
    // Address rules only: answered when every address is covered, refused otherwise.
    assert_eq!(ips(&dig(dns, &["db.svc.test", "A"])), ["10.1.0.5"]);
    assert_eq!(dig(dns, &["mixed.svc.test", "A"]).status, "NXDOMAIN");
    // Inside an address zone, a name that exists but is not covered and one that does not
    // exist get the same answer (before, only the first carried an explanation: an oracle
    // for internal names).
    let exists = dig(dns, &["mixed.svc.test", "A"]);
    let missing = dig(dns, &["nope.svc.test", "A"]);
    assert_eq!(exists.status, missing.status);
    assert_eq!(
        exists
            .ede
            .as_deref()
            .map(|e| e.replace("mixed.svc.test", "N")),
        missing
            .ede
            .as_deref()
            .map(|e| e.replace("nope.svc.test", "N")),
        "{}\n{}",
        exists.raw,
        missing.raw
    );
    // Over TCP too.
    let d = dig(dns, &["+tcp", "api.allowed.test", "A"]);
    assert_eq!(ips(&d), ["127.0.0.10"], "{}", d.raw);

    // The exfiltration attempts: none of them reaches the upstream server.
    let before = upstream.queries.load(Ordering::SeqCst);
    let d = dig(dns, &["c2VjcmV0.exfil.test", "TXT"]);
    assert_eq!(d.status, "REFUSED", "{}", d.raw);
    assert!(d.ede.as_deref().unwrap_or("").contains("TXT"), "{}", d.raw);
    let d = dig(dns, &["c2VjcmV0.exfil.test", "A"]);
    assert_eq!(d.status, "NXDOMAIN", "{}", d.raw);
    let ede = d.ede.clone().unwrap_or_default();
    assert!(
        ede.contains("Blocked") && ede.contains("not in network.egress of sandbox s"),
        "{}",
        d.raw
    );
    // The reason's code, and where to ask (issue 61): the http:// form without tls_intercept.
    assert!(
        ede.contains("egress-proxy [no_rule_matched]: c2vjcmv0.exfil.test: ")
            && ede.contains("(ask: POST http://egress-proxy.local/v1/requests)"),
        "{}",
        d.raw
    );
    assert_eq!(dig(dns, &["blocked.allowed.test", "A"]).status, "NXDOMAIN");
    assert_eq!(dig(dns, &["edge.cdn.test", "A"]).status, "NXDOMAIN");
    assert_eq!(dig(dns, &["x.outside-zones.test", "A"]).status, "NXDOMAIN");
    assert_eq!(dig(dns, &["c2VjcmV0.exfil.test", "ANY"]).status, "REFUSED");
    // A denied name that exists upstream and one that does not get the same answer (no
    // existence oracle), apart from the name itself.
    let exists = dig(dns, &["edge.cdn.test", "A"]);
    let missing = dig(dns, &["nope.cdn.test", "A"]);
    assert_eq!(exists.status, missing.status);
    assert_eq!(
        exists
            .ede
            .as_deref()
            .map(|e| e.replace("edge.cdn.test", "N")),
        missing
            .ede
            .as_deref()
            .map(|e| e.replace("nope.cdn.test", "N")),
        "{}\n{}",
        exists.raw,
        missing.raw
    );
    assert_eq!(
        upstream.queries.load(Ordering::SeqCst),
        before,
        "a refused query reached the upstream resolver"
    );

    // One record per query, with what was asked and answered.
    let recs = wait_records(&proxy, |r| {
        r.iter().filter(|x| x["mode"] == "dns").count() >= 14
    });
    let r = dns_record(&recs, "api.allowed.test", "A");
    assert_eq!(r["decision"], "allow", "{r}");
    assert_eq!(r["rule"], "*.allowed.test", "{r}");
    assert_eq!(r["answers"], serde_json::json!(["127.0.0.10"]), "{r}");
    assert_eq!(r["resolved"].as_array().unwrap().len(), 3, "{r}");
    assert_eq!(r["rcode"], "NOERROR", "{r}");
    let r = dns_record(&recs, "c2vjcmv0.exfil.test", "TXT");
    assert_eq!(r["decision"], "deny", "{r}");
    assert_eq!(r["reason"], "protocol_not_allowed", "{r}");
    assert_eq!(r["rcode"], "REFUSED", "{r}");
    let r = dns_record(&recs, "c2vjcmv0.exfil.test", "A");
    assert_eq!(r["reason"], "no_rule_matched", "{r}");
    assert_eq!(r["rcode"], "NXDOMAIN", "{r}");
    let r = dns_record(&recs, "blocked.allowed.test", "A");
    assert_eq!(r["reason"], "denied_by_rule", "{r}");
    let tcp = recs
        .iter()
        .any(|r| r["mode"] == "dns" && r["transport"] == "tcp");
    assert!(tcp, "{recs:#?}");
    let (_, metrics) = proxy.admin_get("/metrics");
    assert!(
        metrics.contains("egress_dns_queries_total{decision=\"allow\",sandbox=\"s\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("egress_dns_queries_total{decision=\"deny\",sandbox=\"s\"}"),
        "{metrics}"
    );
}

#[test]
fn hostile_datagrams_get_an_error_or_nothing_and_the_listener_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, dns) = start_full(dir.path(), default_s(&[("ok.test", "127.0.0.5")]));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut two_questions = dns_query(7, "ok.test", 1);
    two_questions[5] = 2;
    two_questions.extend_from_slice(&dns_query(7, "ok.test", 1)[12..]);
    let mut truncated = dns_query(8, "ok.test", 1);
    truncated.truncate(15);
    let mut label_loop = dns_query(9, "ok.test", 1);
    label_loop.splice(12..12, [0xc0, 0x0c]);
    for bad in [
        vec![0u8; 3],
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        truncated,
        label_loop,
        two_questions,
        vec![0xff; 600],
    ] {
        sock.send_to(&bad, dns).unwrap();
        let mut buf = [0u8; 1500];
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let rcode = dns_rcode(&buf[..n]).unwrap();
            assert!(rcode != 0, "a malformed query was answered NOERROR");
        }
    }
    let d = dig(dns, &["ok.test", "A"]);
    assert_eq!(ips(&d), ["127.0.0.5"], "{}", d.raw);
}

/// A source no sandbox has gets `REFUSED`, and its refusals are summed into one record per
/// period (`count`, `first_ts`, `last_ts`) instead of one record per query.
#[test]
fn unidentified_clients_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy, dns) = start_full(dir.path(), far_only("{ dns_summary_s: 1 }"));
    let d = dig(dns, &["ok.test", "A"]);
    assert_eq!(d.status, "REFUSED", "{}", d.raw);
    let recs = wait_records(&proxy, |r| r.iter().any(|x| x["mode"] == "dns"));
    let r = recs.iter().find(|x| x["mode"] == "dns").unwrap();
    assert_eq!(r["reason"], "auth_required", "{r}");
    assert_eq!(r["count"], 1, "{r}");
    assert!(r["first_ts"].is_string() && r["last_ts"].is_string(), "{r}");
    assert!(r["sandbox"].is_null(), "{r}");
}

/// 20,000 queries from an unidentified address: a bounded number of answers (its rate) and a
/// bounded number of audit lines (one per source and period), every query counted in them.
#[test]
fn an_unidentified_flood_writes_a_bounded_number_of_records() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy, dns) = start_full(
        dir.path(),
        far_only("{ dns_summary_s: 1, dns_queries_per_second_per_source: 50 }"),
    );
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let started = std::time::Instant::now();
    const FLOOD: u64 = 20_000;
    let receiver = sock.try_clone().unwrap();
    receiver
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let answers = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut buf = [0u8; 1500];
        while receiver.recv_from(&mut buf).is_ok() {
            n += 1;
        }
        n
    });
    for i in 0..FLOOD {
        sock.send_to(&dns_query(i as u16, "ok.test", 1), dns)
            .unwrap();
        if i % 500 == 0 {
            let_time_pass(
                Duration::from_millis(2),
                "the flood's pace: most datagrams fit the kernel's socket buffers",
            );
        }
    }
    let answered = answers.join().unwrap();
    let secs = started.elapsed().as_secs_f64();
    // Burst (2 × rate) plus the rate over the flood's duration (and the receiver's wait).
    assert!(
        (answered as f64) <= 100.0 + 50.0 * (secs + 1.0),
        "{answered} answers in {secs:.1} s"
    );
    // Datagrams the kernel dropped before the listener read them are not counted anywhere.
    wait_records(&proxy, |r| {
        r.iter()
            .filter(|x| x["mode"] == "dns")
            .map(|x| x["count"].as_u64().unwrap_or(0))
            .sum::<u64>()
            >= FLOOD / 10
    });
    // One query from another address after the flood: once its sum is written, every sum of
    // the flood is (a period's sums are written together, in order).
    let marker = UdpSocket::bind("127.0.0.9:0").unwrap();
    marker.send_to(&dns_query(1, "ok.test", 1), dns).unwrap();
    let is_marker = |x: &serde_json::Value| {
        x["client"]
            .as_str()
            .is_some_and(|c| c.starts_with("127.0.0.9"))
    };
    let recs = wait_records(&proxy, |r| {
        r.iter().any(|x| x["mode"] == "dns" && is_marker(x))
    });
    let secs = started.elapsed().as_secs_f64();
    let flood_sum = |x: &&serde_json::Value| x["mode"] == "dns" && !is_marker(x);
    let lines = recs.iter().filter(flood_sum).count();
    let counted: u64 = recs
        .iter()
        .filter(flood_sum)
        .map(|x| x["count"].as_u64().unwrap_or(0))
        .sum();
    assert!(counted <= FLOOD, "{counted}");
    assert!(
        lines as f64 <= secs + 3.0,
        "{lines} audit lines for {FLOOD} queries over {secs:.1} s"
    );
    eprintln!("{FLOOD} unidentified queries: {answered} answered, {counted} counted in {lines} audit lines");
}

#[test]
fn rate_limit_report_mode_pass_types_and_denied_only_audit() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = SlowDns::start(
        Duration::ZERO,
        &[("txt.ok.test", "127.0.0.6".parse().unwrap())],
    );
    let config = ProxyConfig::new()
        .audit("dns: denied")
        .listen_at("default_sandbox", "s")
        .dns_server(&upstream.addr.to_string())
        .dns("timeout_ms", "1000")
        .dns("pass_types", "[TXT]")
        .host("ok.test", "127.0.0.5")
        .host("other.test", "127.0.0.7")
        .guard_allow("127.0.0.0/8")
        .sandbox(
            sandbox("s", &["*.ok.test", "ok.test"])
                .report()
                .limits("{ dns_queries_per_second: 5 }"),
        );
    let (proxy, dns) = start_full(dir.path(), config);

    // Report mode: an unlisted name is answered, and recorded as `report`.
    let d = dig(dns, &["other.test", "A"]);
    assert_eq!(ips(&d), ["127.0.0.7"], "{}", d.raw);
    // A passed type for an allowed name goes upstream; for another name it does not.
    let before = upstream.queries.load(Ordering::SeqCst);
    let d = dig(dns, &["txt.ok.test", "TXT"]);
    assert_eq!(d.status, "NOERROR", "{}", d.raw);
    assert_eq!(upstream.queries.load(Ordering::SeqCst), before + 1);
    // ok.test answered (allowed: not recorded under `audit.dns: denied`).
    assert_eq!(ips(&dig(dns, &["ok.test", "A"])), ["127.0.0.5"]);

    // Far over 5 queries per second: the excess is refused and counted.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut refused = 0;
    for i in 0..40u16 {
        sock.send_to(&dns_query(100 + i, "ok.test", 1), dns)
            .unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = sock
            .recv_from(&mut buf)
            .expect("every query gets an answer");
        if dns_rcode(&buf[..n]) == Some(5) {
            refused += 1;
        }
    }
    assert!(
        refused >= 20,
        "only {refused} of 40 refused at 5 per second"
    );
    let (_, metrics) = proxy.admin_get("/metrics");
    assert!(
        metrics.contains("egress_rate_limited_total{limit=\"dns\",sandbox=\"s\"}"),
        "{metrics}"
    );

    let recs = wait_records(&proxy, |r| r.iter().any(|x| x["reason"] == "rate_limited"));
    let r = dns_record(&recs, "other.test", "A");
    assert_eq!(r["decision"], "report", "{r}");
    assert_eq!(r["answers"], serde_json::json!(["127.0.0.7"]), "{r}");
    assert!(
        !recs
            .iter()
            .any(|r| r["mode"] == "dns" && r["decision"] == "allow"),
        "audit.dns: denied recorded an allowed query: {recs:#?}"
    );
}

/// An answer is never larger than the client can take over UDP: 512 bytes without EDNS
/// (truncated, TC set, so the client retries over TCP), the advertised size with EDNS; over
/// TCP the whole answer comes. A response sent to the listener is never answered (no
/// reflection loop between two resolvers).
#[test]
fn udp_answers_fit_the_client_payload_and_responses_are_never_answered() {
    let dir = tempfile::tempdir().unwrap();
    let many: Vec<String> = (1..=60).map(|i| format!("127.0.3.{i}")).collect();
    let config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "500")
        .dns("hosts", &format!("{{ many.test: [{}] }}", many.join(", ")))
        .guard_allow("127.0.0.0/8")
        .sandbox(sandbox("s", &["many.test"]).source("127.0.0.0/8"));
    let (_p, dns) = start_full(dir.path(), config);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];

    // No EDNS: at most 512 bytes, TC set.
    sock.send_to(&dns_query(7, "many.test", 1), dns).unwrap();
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    assert!(n <= 512, "{n} bytes to a client without EDNS");
    assert_eq!(&buf[..2], &7u16.to_be_bytes());
    assert_ne!(buf[2] & 0x02, 0, "TC is set on a truncated answer");

    // EDNS with 4096: all 60 addresses (60 × 16 bytes plus the question) fit in our 1232.
    let mut q = dns_query(8, "many.test", 1);
    q[11] = 1; // ARCOUNT 1: the OPT record follows
    q.extend_from_slice(&[0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0]);
    sock.send_to(&q, dns).unwrap();
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    assert!(n > 512 && n <= 1232, "{n} bytes with EDNS");
    assert_eq!(buf[2] & 0x02, 0, "not truncated with EDNS");
    assert_eq!(u16::from_be_bytes([buf[6], buf[7]]), 60);

    // Over TCP (dig retries there after TC) every address comes.
    let d = dig(dns, &["many.test", "A", "+noedns"]);
    assert_eq!(d.answers.len(), 60, "{}", d.raw);

    // A response (QR set) gets nothing; the next query is answered.
    let mut response = dns_query(9, "many.test", 1);
    response[2] |= 0x80;
    sock.send_to(&response, dns).unwrap();
    sock.send_to(&dns_query(10, "many.test", 1), dns).unwrap();
    let (_, _) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..2], &10u16.to_be_bytes(), "the response was answered");
}

/// The listener's UDP sockets share their port among themselves (`SO_REUSEPORT`), never with
/// another process: a second proxy started on the same DNS address (an old instance still
/// running, with an old policy) refuses to start instead of answering some of the queries.
#[test]
fn a_second_proxy_on_the_same_dns_port_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let on = |port: u16| {
        ProxyConfig::new()
            .listen_at("dns", &format!("127.0.0.1:{port}"))
            .dns_server("127.0.0.1:9")
            .host("a.test", "127.0.0.1")
            .guard_allow("127.0.0.0/8")
            .sandbox(sandbox("s", &["a.test"]).source("127.0.0.0/8"))
    };
    let yaml = |audit: &str| on(port).yaml(std::path::Path::new(audit));
    let first_cfg = dir.path().join("first.yaml");
    std::fs::write(
        &first_cfg,
        yaml(&dir.path().join("a1.jsonl").display().to_string()),
    )
    .unwrap();
    let first = Proxy::start_with(first_cfg, dir.path().join("a1.jsonl"), &[]);
    let second_cfg = dir.path().join("second.yaml");
    std::fs::write(
        &second_cfg,
        yaml(&dir.path().join("a2.jsonl").display().to_string()),
    )
    .unwrap();
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["run", "--config"])
        .arg(&second_cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = within(Duration::from_millis(50), Duration::from_secs(15), || {
        second.try_wait().unwrap()
    });
    if status.is_none() {
        let _ = second.kill();
    }
    let mut err = String::new();
    use std::io::Read;
    let _ = second.stderr.take().unwrap().read_to_string(&mut err);
    let status = status.expect("the second proxy kept running on a taken DNS port");
    assert!(!status.success(), "{err}");
    assert!(err.contains("listen.dns"), "{err}");
    // Another process holding the UDP port with SO_REUSEPORT of its own (TCP free): joining
    // its group would split the queries with it; the proxy refuses the port instead.
    let port2 = free_port();
    let squatter = {
        use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
        let fd = socket::socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::empty(),
            None,
        )
        .unwrap();
        socket::setsockopt(&fd, sockopt::ReusePort, &true).unwrap();
        let addr: std::net::SocketAddrV4 = format!("127.0.0.1:{port2}").parse().unwrap();
        socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(addr),
        )
        .unwrap();
        fd
    };
    let third_cfg = dir.path().join("third.yaml");
    std::fs::write(&third_cfg, on(port2).yaml(&dir.path().join("a3.jsonl"))).unwrap();
    let out = std::process::Command::new("timeout")
        .args(["15", env!("CARGO_BIN_EXE_egress-proxy"), "run", "--config"])
        .arg(&third_cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && out.status.code() != Some(124),
        "started beside another process's SO_REUSEPORT socket: {text}"
    );
    assert!(text.contains("listen.dns"), "{text}");
    drop(squatter);

    // The first one still answers every query.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for id in 0..20u16 {
        sock.send_to(&dns_query(id, "a.test", 1), first.dns.unwrap())
            .unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        assert!(n > 12 && buf[..2] == id.to_be_bytes());
    }
}

/// A repeated query is answered again (each repeat with its own id and its own record) —
/// but never across sandboxes, and never past a policy change: the query that follows a
/// reload is decided under the new policy at once.
#[test]
fn repeated_queries_are_answered_alike_until_the_policy_changes_and_never_across_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let config = |a_reaches: &[&str]| {
        ProxyConfig::new()
            .dns_server("127.0.0.1:9")
            .dns("timeout_ms", "500")
            .host("gone.test", "127.0.0.8")
            .host("stay.test", "127.0.0.9")
            .host("new.test", "127.0.0.10")
            .guard_allow("127.0.0.0/8")
            .sandbox(sandbox("a", a_reaches).source("127.0.0.1/32"))
            .sandbox(sandbox("b", &["stay.test"]).source("127.0.0.2/32"))
    };
    let (proxy, dns) = start_full(dir.path(), config(&["gone.test", "stay.test"]));
    let ask = |sock: &UdpSocket, id: u16, name: &str| -> Vec<u8> {
        sock.send_to(&dns_query(id, name, 1), dns).unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = sock.recv_from(&mut buf).expect("an answer");
        assert_eq!(
            &buf[..2],
            &id.to_be_bytes(),
            "the answer carries the query's id"
        );
        buf[..n].to_vec()
    };
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for id in 1..=50u16 {
        let r = ask(&a, id, "gone.test");
        assert_eq!(dns_rcode(&r), Some(0), "query {id}");
        assert!(r.ends_with(&[127, 0, 0, 8]), "query {id}: {r:?}");
    }
    let recs = wait_records(&proxy, |r| {
        r.iter().filter(|x| x["target_host"] == "gone.test").count() >= 50
    });
    let ids: std::collections::HashSet<String> = recs
        .iter()
        .filter(|x| x["target_host"] == "gone.test")
        .map(|x| {
            assert_eq!(x["decision"], "allow", "{x}");
            assert_eq!(x["sandbox"], "a", "{x}");
            x["conn_id"].to_string()
        })
        .collect();
    assert_eq!(ids.len(), 50, "one record of its own per query");

    // Sandbox b asks the very same bytes right after a's answers: refused every time, from
    // sockets landing on either receive loop.
    for i in 0..8u16 {
        let b = UdpSocket::bind("127.0.0.2:0").unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(dns_rcode(&ask(&b, 1, "gone.test")), Some(3), "socket {i}");
        assert_eq!(dns_rcode(&ask(&a, 1, "gone.test")), Some(0));
    }

    // The reload takes gone.test from a: once it applies (new.test answers), gone.test is
    // refused at once, though the same query was answered a moment before.
    let moved = config(&["new.test", "stay.test"]).listen("dns");
    std::fs::write(&proxy.config, moved.yaml(&proxy.audit)).unwrap();
    unsafe_free_kill(proxy.child.id(), "HUP");
    eventually(Duration::from_secs(15), "the reload to apply", || {
        let warm = ask(&a, 2, "gone.test");
        if dns_rcode(&ask(&a, 3, "new.test")) == Some(0) {
            let after = ask(&a, 2, "gone.test");
            assert_eq!(
                dns_rcode(&after),
                Some(3),
                "answered from before the reload"
            );
            return Some(());
        }
        assert_eq!(dns_rcode(&warm), Some(0));
        None
    });
}

/// A burst the listener reads in batches (`recvmmsg`, up to 32 a call) and answers in batches
/// (`sendmmsg`): valid queries from two clients interleaved with hostile datagrams (responses,
/// fragments, text, garbage with a readable header). Every valid query is answered exactly
/// once, to the client that sent it, with its own id and its own verdict; no hostile datagram
/// gets `NOERROR`; and every valid query is recorded.
#[test]
fn a_burst_of_mixed_datagrams_is_answered_query_by_query_to_each_sender() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy, dns) = start_full(
        dir.path(),
        default_s(&[("ok.test", "127.0.0.5"), ("no.test", "127.0.0.6")]),
    );
    let clients = [
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    ];
    for c in &clients {
        c.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
    }
    // ids 1000.. are valid (even: ok.test, odd: no.test); 5000.. are hostile.
    let mut sent = [Vec::new(), Vec::new()];
    // 96 datagrams: more than a batch, well under a socket's receive buffer (UDP drops what
    // does not fit, which would be the kernel's loss, not the listener's).
    for i in 0..32u16 {
        let who = usize::from(i % 2);
        let id = 1000 + i;
        let name = if i % 4 < 2 { "ok.test" } else { "no.test" };
        clients[who].send_to(&dns_query(id, name, 1), dns).unwrap();
        sent[who].push((id, name));
        let mut response = dns_query(5000 + i, "ok.test", 1);
        response[2] |= 0x80;
        let mut cut = dns_query(5000 + i, "ok.test", 1);
        cut.truncate(15);
        let hostile = match i % 2 {
            0 => [response, cut],
            _ => [vec![0u8; 3], b"GET / HTTP/1.1\r\n\r\n".to_vec()],
        };
        for bad in hostile {
            clients[who].send_to(&bad, dns).unwrap();
        }
    }
    for (who, c) in clients.iter().enumerate() {
        let mut answered = std::collections::HashMap::new();
        let mut buf = [0u8; 1500];
        while let Ok((n, _)) = c.recv_from(&mut buf) {
            let id = u16::from_be_bytes([buf[0], buf[1]]);
            let rcode = dns_rcode(&buf[..n]).unwrap();
            if id >= 5000 {
                assert_ne!(rcode, 0, "a hostile datagram was answered NOERROR");
                continue;
            }
            assert!(
                answered.insert(id, (rcode, buf[..n].to_vec())).is_none(),
                "query {id} answered twice"
            );
        }
        assert_eq!(
            answered.len(),
            sent[who].len(),
            "client {who}: {answered:?}"
        );
        for (id, name) in &sent[who] {
            let (rcode, bytes) = &answered[id];
            if *name == "ok.test" {
                assert_eq!(*rcode, 0, "{id}");
                assert!(
                    bytes.windows(4).any(|w| w == [127, 0, 0, 5]),
                    "{id}: the allowed answer"
                );
            } else {
                assert_ne!(*rcode, 0, "{id}: no.test is not in the policy");
                assert!(
                    !bytes.windows(4).any(|w| w == [127, 0, 0, 6]),
                    "{id}: the refused name's address leaked"
                );
            }
        }
    }
    let queried = |recs: &[serde_json::Value]| {
        recs.iter()
            .filter(|r| {
                r["mode"] == "dns"
                    && (r["target_host"] == "ok.test" || r["target_host"] == "no.test")
            })
            .count()
    };
    let recs = wait_records(&proxy, |recs| queried(recs) >= 32);
    // A later query: every query of the burst was answered before it was sent, so once its
    // record is written a 33rd record of the burst would have been written before it.
    let d = dig(dns, &["marker.test", "A"]);
    assert_ne!(d.status, "NOERROR", "{}", d.raw);
    let after = wait_records(&proxy, |recs| {
        recs.iter()
            .any(|r| r["mode"] == "dns" && r["target_host"] == "marker.test")
    });
    assert_eq!(queried(&after), 32, "one record per query: {recs:#?}");
}

/// A refused name is answered and recorded alike whichever way the listener reads its query:
/// the common shape is read and answered from the wire format, an uncommon one (a Client
/// Subnet option, a byte after the question) by hickory. A sandbox that shapes its query
/// oddly gets the same NXDOMAIN, the same Extended DNS Error and one record per query.
#[test]
fn a_refused_name_gets_the_same_answer_and_record_whichever_way_its_query_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "500")
        .sandbox(sandbox("s", &["allowed.test"]).source("127.0.0.0/8"));
    let (proxy, dns) = start_full(dir.path(), config);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let name = "Q1.Exfil.test";
    // An OPT record (payload 4096) with one option.
    let with_option = |code: u16, data: &[u8]| {
        let mut q = dns_query(7, name, 1);
        q[11] = 1;
        q.extend_from_slice(&[0, 0, 41, 0x10, 0x00, 0, 0, 0, 0]);
        q.extend_from_slice(&(4 + data.len() as u16).to_be_bytes());
        q.extend_from_slice(&code.to_be_bytes());
        q.extend_from_slice(&(data.len() as u16).to_be_bytes());
        q.extend_from_slice(data);
        q
    };
    let cookie = with_option(10, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let subnet = with_option(8, &[0, 1, 24, 0, 192, 0, 2]);
    let plain = dns_query(7, name, 1);
    let mut trailing = plain.clone();
    trailing.push(0);
    let ask = |q: &[u8]| {
        sock.send_to(q, dns).unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        buf[..n].to_vec()
    };
    let (wire_edns, general_edns) = (ask(&cookie), ask(&subnet));
    let (wire_plain, general_plain) = (ask(&plain), ask(&trailing));
    assert_eq!(dns_rcode(&wire_edns), Some(3), "NXDOMAIN");
    assert_eq!(wire_edns, general_edns, "the answers with EDNS differ");
    assert_eq!(wire_plain, general_plain, "the answers without EDNS differ");
    let text = String::from_utf8_lossy(&wire_edns);
    assert!(
        text.contains("q1.exfil.test") && text.contains("no_rule_matched"),
        "{text}"
    );
    assert!(wire_plain.len() < wire_edns.len(), "no EDE without EDNS");
    // A type without a name is refused and recorded by its RFC 3597 name.
    let private = ask(&dns_query(8, "allowed.test", 65280));
    assert_eq!(dns_rcode(&private), Some(5), "REFUSED");
    let recs = wait_records(&proxy, |recs| {
        recs.iter().any(|r| r["qtype"] == "TYPE65280")
    });
    let r = dns_record(&recs, "allowed.test", "TYPE65280");
    assert_eq!(r["reason"], "protocol_not_allowed", "{r}");

    let recs = wait_records(&proxy, |recs| {
        recs.iter()
            .filter(|r| r["target_host"] == "q1.exfil.test")
            .count()
            >= 4
    });
    let refused: Vec<_> = recs
        .iter()
        .filter(|r| r["target_host"] == "q1.exfil.test")
        .collect();
    assert_eq!(refused.len(), 4, "one record per query: {refused:#?}");
    for r in refused {
        assert_eq!(r["mode"], "dns", "{r}");
        assert_eq!(r["decision"], "deny", "{r}");
        assert_eq!(r["reason"], "no_rule_matched", "{r}");
        assert_eq!(r["rcode"], "NXDOMAIN", "{r}");
        assert_eq!(r["qtype"], "A", "{r}");
        assert_eq!(r["sandbox"], "s", "{r}");
    }
}

/// `egress-proxy.local` (issue 94): a sandbox whose only resolver is this listener resolves
/// the proxy's own name — to ask for access — to the address it reaches the proxy on: the
/// DNS listener's own (127.0.0.1 here) or `dns.self_address`; AAAA is empty, not refused; an
/// unidentified source learns nothing; a sandbox allowed nothing still gets the answer (no
/// policy applies to the proxy itself). On the old code the name was refused like any other
/// the policy does not name (NXDOMAIN).
#[test]
fn egress_proxy_local_is_answered_with_the_proxys_address() {
    let dir = tempfile::tempdir().unwrap();
    let local = || {
        ProxyConfig::new()
            .dns_server("127.0.0.1:9")
            .sandbox(sandbox("local", &["ok.test"]).source("127.0.0.1/32"))
    };
    let (proxy, dns) = start_full(dir.path(), local());
    let d = dig(dns, &["egress-proxy.local", "A"]);
    assert_eq!(
        (d.status.as_str(), ips(&d)),
        ("NOERROR", vec!["127.0.0.1".to_string()]),
        "{}",
        d.raw
    );
    let d = dig(dns, &["EGRESS-PROXY.LOCAL.", "AAAA"]);
    assert_eq!(
        (d.status.as_str(), d.answers.len()),
        ("NOERROR", 0),
        "{}",
        d.raw
    );
    let recs = wait_records(&proxy, |r| {
        r.iter().any(|x| x["mode"] == "dns" && x["qtype"] == "AAAA")
    });
    let r = dns_record(&recs, "egress-proxy.local", "A");
    assert_eq!(
        (&r["decision"], &r["reason"]),
        (&"allow".into(), &"proxy_endpoint".into()),
        "{r}"
    );
    drop(proxy);

    let dir = tempfile::tempdir().unwrap();
    let (_proxy, dns) = start_full(dir.path(), local().dns("self_address", "10.9.8.7"));
    let d = dig(dns, &["egress-proxy.local", "A"]);
    assert_eq!(ips(&d), ["10.9.8.7"], "{}", d.raw);

    // Another source: not a sandbox, told nothing.
    let dir = tempfile::tempdir().unwrap();
    let far = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .sandbox(sandbox("far", &["ok.test"]).source("10.200.0.0/16"));
    let (_proxy, dns) = start_full(dir.path(), far);
    let d = dig(dns, &["egress-proxy.local", "A"]);
    assert_eq!(
        (d.status.as_str(), d.answers.len()),
        ("REFUSED", 0),
        "{}",
        d.raw
    );
}
