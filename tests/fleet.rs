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
    fleet_on(dir, etcd.client_port, limits)
}

/// [`fleet`], reaching etcd at `port` (a relay the test can cut).
fn fleet_on(dir: &std::path::Path, port: u16, limits: &str) -> Vec<Proxy> {
    let plane = format!(
        "control_plane: {{ etcd: {{ endpoints: [\"127.0.0.1:{port}\"], prefix: /fleet/ }} }}"
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
    // The long poll is parked on replica 1 before replica 3 approves, so the delay measured is
    // the fleet's (a poll that came late would find the request approved).
    eventually(Duration::from_secs(10), "the long poll to wait", || {
        (replicas[0].metric("egress_approval_long_polls")? >= 1.0).then_some(())
    });
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

/// A TCP relay to etcd the test can cut: while cut, every open connection is shut and new
/// ones are closed at once.
struct Relay {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(to: u16) -> Relay {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in l.incoming().map_while(Result::ok) {
                if c.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                let mut kept = o.lock().unwrap();
                kept.push(client.try_clone().unwrap());
                kept.push(server.try_clone().unwrap());
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Relay { port, cut, open }
    }

    /// Cut every connection, and refuse new ones until [`Relay::mend`].
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn mend(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Two replicas are cut off from etcd; meanwhile a sandbox is registered, a grant and a
/// request are written, another replica's usage is counted — and etcd is compacted past all
/// of it, so no watch can resume from where the replicas left off. Once the link is back,
/// every replica has every change, without a restart: each session lists its prefix before it
/// watches, so a compacted revision is never needed. (Compacting while connected changes
/// nothing for a watch that is up to date: the changes after it arrive as usual.)
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn replicas_resynchronise_after_etcd_compacts_what_they_missed() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let relay = Relay::start(etcd.client_port);
    let replicas: Vec<Proxy> = fleet_on(dir.path(), relay.port, "{ bytes_per_day: 1000000000 }")
        .into_iter()
        .take(2)
        .collect();
    let pids: Vec<u32> = replicas.iter().map(|p| p.child.id()).collect();
    let revision = |etcd: &Etcd| -> i64 {
        let out = etcd.ctl(&["get", "/", "--prefix", "--limit=1", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["header"]["revision"].as_i64().unwrap()
    };
    // Compacted while connected: later changes still arrive.
    etcd.ctl(&["compact", &revision(&etcd).to_string()]);

    relay.cut();
    let body = format!(
        r#"{{"auth":{{"token_sha256":"{}"}},"policy":{{"provider":"local","config":{{}},"network":{{"egress":["api.test:*"]}}}}}}"#,
        sha("late-secret")
    );
    etcd.ctl(&["put", "/fleet/sandboxes/late", &body]);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let grant = format!(
        r#"{{"id":"r-00000000feed","sandbox":"asker","host":"granted.test","port":443,"kind":"ttl","expires_ms":{},"approver":"admin"}}"#,
        now_ms + 600_000
    );
    etcd.ctl(&["put", "/fleet/grants/asker/r-00000000feed", &grant]);
    let request = format!(
        r#"{{"id":"r-00000000beef","sandbox":"asker","host":"asked.test","port":443,"reason":"while cut","state":"pending","created_ms":{now_ms},"deadline_ms":{}}}"#,
        now_ms + 600_000
    );
    etcd.ctl(&["put", "/fleet/requests/r-00000000beef", &request]);
    let day = now_ms / 86_400_000;
    let usage = format!("/fleet/usage/{day}/r/00000000deadbeef");
    etcd.ctl(&["put", &usage, r#"{"bytes":4242,"requests":0}"#]);
    etcd.ctl(&["compact", &revision(&etcd).to_string()]);
    relay.mend();

    for p in &replicas {
        eventually(Duration::from_secs(30), "the replica to catch up", || {
            let known = admin(p, "GET", "/v1/sandboxes/late", "").0 == 200;
            let (_, grants) = admin(p, "GET", "/v1/grants", "");
            let granted = grants.to_string().contains("r-00000000feed");
            let (_, requests) = admin(p, "GET", "/v1/requests", "");
            let asked = requests.to_string().contains("r-00000000beef");
            let (_, used) = admin(p, "GET", "/v1/usage?sandbox=r", "");
            let counted = used["quotas"][0]["bytes"].as_u64() >= Some(4242);
            (known && granted && asked && counted).then_some(())
        });
    }
    let after: Vec<u32> = replicas.iter().map(|p| p.child.id()).collect();
    assert_eq!(pids, after, "no replica restarted");
    for p in &replicas {
        let log = p.stderr_text();
        assert!(
            log.contains("control plane unreachable"),
            "the cut was felt: {log}"
        );
    }
}

/// `n` GETs of `/` one after another on one kept plain-HTTP connection inside a CONNECT
/// tunnel to `api.test:port` as sandbox `r`: how many were answered 200 before the first
/// refusal or the connection's end.
fn kept_tunnel_gets(proxy: SocketAddr, port: u16, n: usize) -> usize {
    use std::io::{BufRead, BufReader};
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    connect_on(
        &mut s,
        &format!("api.test:{port}"),
        Some(&basic("r", "r-secret")),
    );
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut served = 0;
    for _ in 0..n {
        let asked = format!("GET / HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
        if s.write_all(asked.as_bytes()).is_err() {
            break;
        }
        let mut status = String::new();
        if r.read_line(&mut status).unwrap_or(0) == 0 || !status.contains(" 200 ") {
            break;
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if r.read_exact(&mut body).is_err() {
            break;
        }
        served += 1;
    }
    served
}

/// Plain HTTP kept open inside CONNECT tunnels is counted request by request against the
/// fleet's share too, and a request that finds its replica's share used up waits for the
/// next chunk instead of being refused: six tunnels (two per replica) of 60 requests each
/// against `requests_per_day: 60` serve exactly 60 in all. (Before, a request past the
/// replica's share on such a tunnel was refused at once while other replicas still held
/// none of the rest: fewer than 60 were served.) Each replica's clients ask for more than
/// the whole quota, so none stops asking while its replica still holds a leased share: a
/// share whose clients went away is given back only after `GIVE_BACK_AFTER` (with 20 each,
/// one replica's two tunnels could finish first, leaving units leased ahead unused).
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn kept_plain_tunnels_spend_a_fleet_quota_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let (port, reached) = counting_origin();
    let replicas = fleet(dir.path(), &etcd, "{ requests_per_day: 60 }");
    let addrs: Vec<SocketAddr> = replicas.iter().map(|p| p.proxy).collect();
    let start = Arc::new(Barrier::new(6));
    let served: usize = (0..6)
        .map(|i| {
            let (proxy, start) = (addrs[i % 3], start.clone());
            std::thread::spawn(move || {
                start.wait();
                kept_tunnel_gets(proxy, port, 60)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!((served, reached.load(Ordering::SeqCst)), (60, 60));
    assert_eq!(leased(&etcd), 60);
}

/// Two approvers answer the same request at the same moment on two replicas — one approves,
/// one denies: exactly one answer lands (200), the other is told the request was answered on
/// another replica (409), and all three replicas end up showing the same state. Without the
/// claim both answers were applied, each on its own replica, and the fleet disagreed.
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn two_answers_at_once_on_two_replicas_one_lands() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let (port, _) = counting_origin();
    let replicas = fleet(dir.path(), &etcd, "{}");
    for round in 0..5 {
        let asked = format!(
            r#"{{"host": "api.test", "port": {}, "reason": "round {round}"}}"#,
            port + round
        );
        let (status, r) = as_asker(replicas[0].proxy, "POST", "/v1/requests", &asked);
        assert_eq!(status, 202, "{r}");
        let id = r["id"].as_str().unwrap().to_string();
        for p in &replicas[1..] {
            eventually(
                Duration::from_secs(5),
                "the request to reach every replica",
                || (admin(p, "GET", &format!("/v1/requests/{id}"), "").0 == 200).then_some(()),
            );
        }
        let start = Arc::new(Barrier::new(2));
        let answers: Vec<(u16, serde_json::Value)> = [
            (1, "approve", r#"{"grant": "once"}"#),
            (2, "deny", r#"{"note": "no"}"#),
        ]
        .into_iter()
        .map(|(i, how, body)| {
            let (addr, start) = (replicas[i].admin, start.clone());
            let path = format!("/v1/requests/{id}/{how}");
            std::thread::spawn(move || {
                start.wait();
                let (s, t) = admin_req(addr, "POST", &path, body, Some(ADMIN_TOKEN));
                (s, serde_json::from_str(&t).unwrap_or_default())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
        let mut codes: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        codes.sort();
        assert_eq!(codes, [200, 409], "round {round}: {answers:?}");
        let landed = answers.iter().find(|(s, _)| *s == 200).unwrap();
        let state = landed.1["state"].as_str().unwrap().to_string();
        for p in &replicas {
            eventually(Duration::from_secs(5), "every replica to agree", || {
                let (_, r) = admin(p, "GET", &format!("/v1/requests/{id}"), "");
                (r["state"] == state.as_str()).then_some(())
            });
        }
    }
}

/// etcd goes silent (a relay the test cuts) while a sandbox's share is used up: the replica
/// serves what its share holds, then refuses — after waiting for a share that cannot come —
/// saying so (`quota_exceeded`, "could not lease"), never serving past its share; once etcd
/// is back, requests are served again.
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn a_replica_cut_off_from_etcd_serves_only_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let relay = Relay::start(etcd.client_port);
    let (port, reached) = counting_origin();
    // 640 a day: chunks of 10 at first, so the share runs out quickly.
    let replicas = fleet_on(dir.path(), relay.port, "{ requests_per_day: 640 }");
    let one = replicas[0].proxy;
    assert_eq!(forwarded_get(one, port), 200);
    relay.cut();
    let mut served = 1;
    let refused = loop {
        match forwarded_get(one, port) {
            200 => served += 1,
            code => break code,
        }
        assert!(
            served <= 80,
            "served past any share while cut off: {served}"
        );
    };
    assert_eq!(refused, 429);
    assert_eq!(reached.load(Ordering::SeqCst), served);
    replicas[0].wait_record(|r| {
        r["reason"] == "quota_exceeded"
            && r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("could not lease"))
    });
    relay.mend();
    eventually(
        Duration::from_secs(30),
        "served again once etcd is back",
        || (forwarded_get(one, port) == 200).then_some(()),
    );
}

/// A replica stopped gracefully (SIGTERM, a rolling update) gives its unused share back: the
/// fleet's counter then holds exactly what was served. (Before, the share was lost with the
/// replica: each rolling restart cost the fleet up to a chunk per replica.)
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn a_replica_stopped_gracefully_gives_its_share_back() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let (port, reached) = counting_origin();
    let mut replicas = fleet(dir.path(), &etcd, "{ requests_per_day: 640 }");
    for _ in 0..13 {
        assert_eq!(forwarded_get(replicas[2].proxy, port), 200);
    }
    let held = leased(&etcd);
    assert!(
        held > 13,
        "the replica holds a share beyond what it served: {held}"
    );
    assert!(replicas[2].terminate().success());
    assert_eq!(reached.load(Ordering::SeqCst), 13);
    assert_eq!(leased(&etcd), 13, "held {held} before the stop");
}
