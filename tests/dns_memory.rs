//! The DNS listener's answer memory under a flood, through the real binary and raw UDP
//! queries: one sandbox asking 20,000 distinct names fills only its own share (16,384
//! addresses), another sandbox's new names still resolve and are remembered meanwhile, and
//! once the answers expired (TTL + `dns.answer_grace_s`) the shares are empty and the
//! process gives a good part of the flood's resident memory back (bounded loosely: RSS is
//! the allocator's business and moves with the machine's load; the failure this catches is
//! nothing given back, RSS staying at the peak and a second flood building on the first). Memory is counted, not timed:
//! the only waits are for the sweep to run, and they have generous limits.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::*;

const FLOOD: u32 = 20_000;
const OTHER: u32 = 20;
/// `egress::answers::PER_SANDBOX`.
const SHARE: u64 = 16_384;

/// `flood` (127.0.0.1) may ask any of the `FLOOD` names, `other` (127.0.0.2) the others;
/// every name is in `dns.hosts`; answers live a second, remembered 15 s more.
fn config() -> ProxyConfig {
    let mut config = ProxyConfig::new()
        .listen("dns")
        .audit("dns: denied")
        .dns_server("127.0.0.1:9")
        .dns("max_answer_ttl_s", "1")
        .dns("answer_grace_s", "15")
        .guard_allow("10.0.0.0/8");
    for i in 0..FLOOD {
        let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        config = config.host(&format!("n{i}.flood.test"), &ip);
    }
    for k in 0..2 * OTHER {
        config = config.host(&format!("o{k}.other.test"), &format!("10.200.0.{k}"));
    }
    config
        .sandbox(
            SandboxSpec::new("flood")
                .source("127.0.0.1/32")
                .limits("{ dns_queries_per_second: 1000000, burst: 1000000 }")
                .allow("*.flood.test"),
        )
        .sandbox(
            SandboxSpec::new("other")
                .source("127.0.0.2/32")
                .allow("*.other.test"),
        )
}

/// Resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// `egress_dns_remembered_addresses{sandbox}` for each sandbox that has a series.
fn remembered(proxy: &Proxy) -> Vec<(String, u64)> {
    let (status, text) = proxy.admin_get("/metrics");
    assert_eq!(status, 200);
    text.lines()
        .filter_map(|l| l.strip_prefix("egress_dns_remembered_addresses{sandbox=\""))
        .filter_map(|l| {
            let (id, rest) = l.split_once("\"} ")?;
            Some((id.to_string(), rest.trim().parse().ok()?))
        })
        .collect()
}

/// Ask `name` from `sock`; the response code and the number of answers.
fn ask(sock: &UdpSocket, dns: std::net::SocketAddr, id: u16, name: &str) -> Option<(u8, u16)> {
    sock.send_to(&dns_query(id, name, 1), dns).unwrap();
    let mut buf = [0u8; 1500];
    loop {
        let n = sock.recv(&mut buf).ok()?;
        let r = &buf[..n];
        if n >= 12 && r[..2] == id.to_be_bytes() {
            return Some((r[3] & 15, u16::from_be_bytes([r[6], r[7]])));
        }
    }
}

/// One flood from 127.0.0.1; every 1,000 names the other sandbox asks one new name of its
/// own, which must resolve. How many flood queries were answered.
fn flood(proxy: &Proxy, other_from: u32) -> u32 {
    let dns = proxy.dns.unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let o = UdpSocket::bind("127.0.0.2:0").unwrap();
    o.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answered = 0;
    for i in 0..FLOOD {
        if let Some((0, 1)) = ask(&s, dns, i as u16, &format!("n{i}.flood.test")) {
            answered += 1;
        }
        if i % 1000 == 999 {
            let k = other_from + i / 1000;
            let got = ask(&o, dns, k as u16, &format!("o{k}.other.test"));
            assert_eq!(
                got,
                Some((0, 1)),
                "the other sandbox's new name o{k}.other.test did not resolve during the flood"
            );
        }
    }
    answered
}

#[test]
fn one_sandbox_flooding_fills_only_its_share_and_the_memory_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = config().start(dir.path());
    let pid = proxy.child.id();

    // Warm up (allocator arenas, the loops' buffers) before the baseline.
    let o = UdpSocket::bind("127.0.0.2:0").unwrap();
    o.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        ask(&o, proxy.dns.unwrap(), 1, "o0.other.test"),
        Some((0, 1))
    );
    let start = steady(Duration::from_millis(250), Duration::from_secs(10), || {
        rss_kib(pid)
    });

    let answered = flood(&proxy, 0);
    assert_eq!(answered, FLOOD, "every flood query was answered");
    let peak = rss_kib(pid);
    let shares = remembered(&proxy);
    let share = |id: &str| shares.iter().find(|(s, _)| s == id).map(|(_, n)| *n);
    // The flooder holds its share and no more; the other sandbox's 20 answers (the warm-up's
    // o0 asked again in the flood) are all remembered.
    assert_eq!(share("flood"), Some(SHARE), "{shares:?}");
    assert_eq!(share("other"), Some(u64::from(OTHER)), "{shares:?}");
    assert!(
        peak >= start + 4 * 1024,
        "the flood should have cost memory to give back (start {start} KiB, peak {peak} KiB)"
    );

    // TTL 1 s + grace 15 s (longer than a debug build's flood takes on a loaded 2-core
    // machine: with 2 s, the 10 s sweep could pass mid-flood and take its first answers), then
    // the sweep: nothing remembered, memory given back.
    eventually(Duration::from_secs(60), "the answers to expire", || {
        remembered(&proxy).is_empty().then_some(())
    });
    // The sweep that forgot them gives the memory back right after: measure once RSS settles.
    let settled = || {
        steady(Duration::from_millis(250), Duration::from_secs(10), || {
            rss_kib(pid)
        })
    };
    let after = settled();
    eprintln!("RSS: start {start} KiB, after the flood {peak} KiB, after expiry {after} KiB");
    // What the flood cost, at least half of it given back (with nothing given back RSS stays
    // at or above the peak). With glibc's dynamic thresholds this ranged from 15 % to 78 %
    // (a worker arena's free top stayed resident: `dns::give_back`); with them fixed, three
    // runs gave back 74-78 % of the first flood and 97 % of the second.
    let cost = peak - start;
    assert!(
        after + cost / 2 <= peak,
        "less than half of the flood's memory was given back (start {start} KiB, peak {peak} KiB, after {after} KiB)"
    );

    // A second flood does not build on the first.
    assert_eq!(flood(&proxy, OTHER), FLOOD);
    let peak2 = rss_kib(pid);
    eventually(Duration::from_secs(60), "the answers to expire", || {
        remembered(&proxy).is_empty().then_some(())
    });
    let after2 = settled();
    eprintln!("RSS: after a second flood {peak2} KiB, after its expiry {after2} KiB");
    // Not built on the first: once the second flood's answers expired, the process holds no
    // more than at the first flood's peak, give or take a quarter of what a flood costs (the
    // allocator's noise: CI once saw 276 KiB above a 12 MiB flood's peak; a second flood built
    // on the first would hold a whole flood more).
    assert!(
        after2 <= peak + cost / 4,
        "a second flood built on the first (start {start} KiB, first peak {peak} KiB, second {peak2} KiB, after {after2} KiB)"
    );
    // What the second flood itself cost is measured from where the first left the process
    // (`after`), not from the start: the part of the first flood glibc kept is reused by the
    // second, not the second's to give back. CI once gave back 4,544 of 19,236 KiB counted
    // from the start (a quarter missed by 265 KiB) — 44 % of the second flood's own 10,388.
    let cost2 = peak2.saturating_sub(after);
    assert!(
        after2 + cost2 / 2 <= peak2,
        "less than half of the second flood's memory was given back (before it {after} KiB, peak {peak2} KiB, after {after2} KiB)"
    );
}
