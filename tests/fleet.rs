//! A fleet that behaves as one proxy (issue 94), against a real etcd and three replicas the
//! test starts: a sandbox's `requests_per_day` is served exactly once over the whole fleet
//! (shares leased from one counter in etcd), and a replica killed mid-run loses at most the
//! share it held.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;

/// The admin token every replica takes.
const ADMIN_TOKEN: &str = "fleet-admin-token";

/// Three replicas on `etcd`, each with sandbox `r` (`limits`) allowed to `api.test`, and
/// sandbox `asker` allowed only `other.test:443` (it asks for more).
fn fleet(dir: &std::path::Path, etcd: &Etcd, limits: &str) -> Vec<Proxy> {
    let plane = format!(
        "control_plane: {{ etcd: {{ endpoints: [\"127.0.0.1:{}\"], prefix: /fleet/ }} }}",
        etcd.client_port
    );
    let token = dir.join("admin.token");
    std::fs::write(&token, format!("{ADMIN_TOKEN}\n")).unwrap();
    let replicas: Vec<Proxy> = (0..3)
        .map(|i| {
            let d = dir.join(format!("replica{i}"));
            std::fs::create_dir_all(&d).unwrap();
            ProxyConfig::new()
                .dns_server("127.0.0.1:9")
                .host("api.test", "127.0.0.1")
                .guard_allow("127.0.0.1/32")
                .admin_token_file(&token)
                .raw(&plane)
                .sandbox(
                    SandboxSpec::new("r")
                        .token("r-secret")
                        .allow("api.test:*")
                        .limits(limits),
                )
                .sandbox(
                    SandboxSpec::new("asker")
                        .token("asker-secret")
                        .allow("other.test:443"),
                )
                .start(&d)
        })
        .collect();
    for p in &replicas {
        eventually(Duration::from_secs(20), "replica ready", || {
            (p.admin_get("/readyz").0 == 200).then_some(())
        });
    }
    replicas
}

fn admin(p: &Proxy, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, text) = admin_req(p.admin, method, path, body, Some(ADMIN_TOKEN));
    (status, serde_json::from_str(&text).unwrap_or_default())
}

/// A call of sandbox `asker` to the in-sandbox endpoint through `proxy`: (status, body).
fn as_asker(proxy: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let via = format!("http://asker:asker-secret@{proxy}");
    let url = format!("http://egress-proxy.local{path}");
    let mut args = vec!["-s", "-x", &via, "-X", method, "-w", "\n%{http_code}"];
    if !body.is_empty() {
        args.extend([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ]);
    }
    args.push(&url);
    let text = curl(&args).text();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        status.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or_default(),
    )
}

/// One forwarded GET to `api.test:port` as sandbox `r` through `proxy`: its status (0: the
/// proxy could not be reached or did not answer).
fn forwarded_get(proxy: SocketAddr, port: u16) -> u16 {
    get_as(proxy, port, "r")
}

/// [`forwarded_get`] as sandbox `who` (its token `{who}-secret`).
fn get_as(proxy: SocketAddr, port: u16, who: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(proxy) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let auth = basic(who, &format!("{who}-secret"));
    let request = format!(
        "GET http://api.test:{port}/ HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text);
    text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The requests the fleet leased today for `r`, as etcd holds them.
fn leased(etcd: &Etcd) -> u64 {
    let out = etcd.ctl(&["get", "--prefix", "/fleet/quota/", "--print-value-only"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    v["requests"].as_u64().unwrap()
}

/// 200 forwarded requests released at once, spread over three replicas, against
/// `requests_per_day: 50`: exactly 50 reach the origin and are answered 200, the other 150
/// get 429 — on the old code each replica judged on its own count and the others' as of the
/// last second, and the fleet served far more (up to 150 here: 50 per replica).
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn a_request_quota_is_exact_over_three_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let (port, reached) = counting_origin();
    let replicas = fleet(dir.path(), &etcd, "{ requests_per_day: 50 }");
    let addrs: Vec<SocketAddr> = replicas.iter().map(|p| p.proxy).collect();
    let start = Arc::new(Barrier::new(200));
    let codes: Vec<u16> = (0..200)
        .map(|i| {
            let (proxy, start) = (addrs[i % 3], start.clone());
            std::thread::spawn(move || {
                start.wait();
                forwarded_get(proxy, port)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let served = codes.iter().filter(|c| **c == 200).count();
    let refused = codes.iter().filter(|c| **c == 429).count();
    assert_eq!((served, refused), (50, 150), "{codes:?}");
    assert_eq!(reached.load(Ordering::SeqCst), 50);
    assert_eq!(leased(&etcd), 50);
    // The refusal says which quota.
    let refusal = replicas[0].wait_record(|r| r["reason"] == "quota_exceeded");
    let detail = refusal["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("requests_per_day quota (50)"), "{refusal}");
}

/// Three replicas serve `requests_per_day: 640` as fast as they can; replica 3 is killed
/// (SIGKILL) mid-run. The survivors go on until the fleet is out: what reached the origin is
/// at most the quota and at least the quota less one chunk (1/8 of it) — all the dead replica
/// could have held unused.
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn a_replica_killed_mid_run_loses_at_most_its_chunk() {
    const QUOTA: usize = 640;
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let (port, reached) = counting_origin();
    let mut replicas = fleet(
        dir.path(),
        &etcd,
        "{ requests_per_day: 640, connections_per_second: 100000, burst: 100000 }",
    );
    let addrs: Vec<SocketAddr> = replicas.iter().map(|p| p.proxy).collect();
    let by_third = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = addrs
        .iter()
        .enumerate()
        .map(|(i, &proxy)| {
            let by_third = by_third.clone();
            std::thread::spawn(move || loop {
                match forwarded_get(proxy, port) {
                    200 if i == 2 => {
                        by_third.fetch_add(1, Ordering::SeqCst);
                    }
                    200 => {}
                    code => return code,
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(30), "replica 3 to serve 40", || {
        (by_third.load(Ordering::SeqCst) >= 40).then_some(())
    });
    replicas[2].child.kill().unwrap();
    let ends: Vec<u16> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(
        ends[..2],
        [429, 429],
        "the survivors stop at the quota: {ends:?}"
    );
    let total = reached.load(Ordering::SeqCst);
    let third = by_third.load(Ordering::SeqCst);
    eprintln!("{total} reached the origin, {third} through the replica killed");
    assert!(
        (QUOTA - QUOTA / 8..=QUOTA).contains(&total),
        "{total} reached the origin (quota {QUOTA}, chunk at most {})",
        QUOTA / 8
    );
    assert!(leased(&etcd) <= QUOTA as u64);
}

/// One desk for the fleet: a request asked on replica 1 is listed on replica 2 and approved on
/// replica 3; the sandbox waiting on replica 1 (`?wait=`) learns it within a second and its
/// next request through replica 1 is allowed at once (the grant came with the answer). A
/// second answer on replica 2 is refused (409: answered on another replica), and each step is
/// recorded once, by the replica that took it. On the old code replica 2 listed nothing and
/// replica 3 answered 404.
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn a_request_asked_on_one_replica_is_approved_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let (port, reached) = counting_origin();
    let replicas = fleet(dir.path(), &etcd, "{}");
    let one = replicas[0].proxy;
    assert_eq!(get_as(one, port, "asker"), 403);
    let asked = format!(r#"{{"host": "api.test", "port": {port}, "reason": "fleet test"}}"#);
    let (status, r) = as_asker(one, "POST", "/v1/requests", &asked);
    assert_eq!(status, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    let listed = eventually(Duration::from_secs(5), "replica 2 to list it", || {
        let (_, all) = admin(&replicas[1], "GET", "/v1/requests?state=pending", "");
        let found = all["requests"]
            .as_array()?
            .iter()
            .any(|q| q["id"] == id.as_str());
        found.then_some(all)
    });
    assert_eq!(listed["requests"][0]["reason"], "fleet test", "{listed}");
    let waiting = {
        let path = format!("/v1/requests/{id}?wait=20");
        std::thread::spawn(move || {
            let (status, r) = as_asker(one, "GET", &path, "");
            (status, r, std::time::Instant::now())
        })
    };
    // Time for the long poll to park on replica 1, so the delay measured is the fleet's (the
    // assertions hold without it: a poll that comes late finds the request approved).
    std::thread::sleep(Duration::from_millis(300));
    let approve = format!("/v1/requests/{id}/approve");
    let (status, r) = admin(
        &replicas[2],
        "POST",
        &approve,
        r#"{"grant": "ttl", "ttl_s": 60}"#,
    );
    assert_eq!(status, 200, "{r}");
    let approved = std::time::Instant::now();
    let (status, r, woke) = waiting.join().unwrap();
    assert_eq!(
        (status, r["state"].as_str()),
        (200, Some("approved")),
        "{r}"
    );
    let delay = woke.duration_since(approved);
    eprintln!(
        "the sandbox waiting on replica 1 learnt of the approval on replica 3 {delay:?} later"
    );
    assert!(delay < Duration::from_secs(1), "{delay:?}");
    assert_eq!(get_as(one, port, "asker"), 200);
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    let (status, r) = admin(&replicas[1], "POST", &approve, r#"{"grant": "once"}"#);
    assert_eq!(status, 409, "{r}");
    // Each step recorded once in the fleet, where it was taken.
    let steps = |p: &Proxy, step: &str| {
        p.audit_records()
            .iter()
            .filter(|r| r["mode"] == "approval" && r["approval"]["step"] == step)
            .count()
    };
    replicas[2].wait_record(|r| r["approval"]["step"] == "approved");
    let counts: Vec<(usize, usize)> = replicas
        .iter()
        .map(|p| (steps(p, "requested"), steps(p, "approved")))
        .collect();
    assert_eq!(counts, [(1, 0), (0, 0), (0, 1)]);
}
