//! The external decider and body DLP (issue 44), through the real binary: the documented
//! example decider (`examples/decider.py`) over HTTP and over a Unix socket denies by path and
//! by host, sets and removes headers, and asks for the body; a decider that sleeps past its
//! timeout and one that is stopped each give `decider_unavailable` within the timeout while a
//! sandbox without a decider is served meanwhile; a DLP rule cuts an upload that carries a
//! private key and lets the same upload without it through.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;

/// `examples/decider.py` with `args`; its first line (port or socket path), and the child.
struct Decider {
    child: Child,
    at: String,
}

impl Drop for Decider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Decider {
    /// How many asks it has been sent so far (its `GET /`).
    fn asked(&self) -> u64 {
        let out = curl(&["-s", &format!("http://127.0.0.1:{}/", self.at)]);
        serde_json::from_str::<serde_json::Value>(&out.text())
            .map_or(0, |v| v["asked"].as_u64().unwrap_or(0))
    }

    /// Wait until it has been sent at least `n` asks.
    fn wait_asked(&self, n: u64) {
        eventually(Duration::from_secs(10), "the decider to be asked", || {
            (self.asked() >= n).then_some(())
        });
    }
}

fn decider(args: &[&str]) -> Decider {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/decider.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    Decider {
        child,
        at: line.trim().to_string(),
    }
}

const PRIVATE_KEY: &str =
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\n-----END RSA PRIVATE KEY-----\n";

/// Sandbox `id` (token `{id}-secret`) reaching the origin's names, GET and POST on api.test.
fn sandbox(id: &str, port: u16) -> SandboxSpec {
    SandboxSpec::new(id)
        .token(&format!("{id}-secret"))
        .allow(&format!("api.test:{port}"))
        .allow(&format!("other.test:{port}"))
        .allow(&format!("blocked.test:{port}"))
        .network(
            "http",
            r#"[{ host: api.test, methods: [GET, POST], paths: ["/**"] }]"#,
        )
}

/// A proxy terminating TLS for `sandboxes`, with `top` (YAML) at the top level.
fn proxy(dir: &Path, ca: &TestCa, sandboxes: &[SandboxSpec], top: &str) -> Proxy {
    ca_init(&dir.join("ica"));
    let config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("other.test", "127.0.0.1")
        .host("blocked.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&dir.join("ica"), &ca.ca_pem)
        .raw(top);
    sandboxes
        .iter()
        .fold(config, |c, sb| c.sandbox(sb.clone()))
        .start(dir)
}

/// curl as `id` through `p` to `https://host:port/path` with `extra` arguments.
fn as_sandbox(p: &Proxy, dir: &Path, id: &str, url: &str, extra: &[&str]) -> CurlOut {
    let px = format!("http://{id}:{id}-secret@{}", p.proxy);
    let ica = dir.join("ica/ca.crt");
    let mut args = vec!["-x", &px, "--cacert", ica.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(url);
    curl(&args)
}

fn text(o: &CurlOut) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), o.stderr)
}

#[test]
fn the_example_decider_denies_rewrites_and_reads_bodies() {
    for over_unix in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::generate(dir.path());
        let origin = Origin::start(Some(&ca));
        let port = origin.addr.port();
        let sock = dir.path().join("decider.sock");
        // The decider checks every ask (and its answers) against the documented schema.
        let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/decider.schema.json");
        let schema = schema.to_str().unwrap();
        let d = match over_unix {
            true => decider(&["--unix", sock.to_str().unwrap(), "--schema", schema]),
            false => decider(&["--schema", schema]),
        };
        let url = match over_unix {
            true => format!("unix:{}", d.at),
            false => format!("http://127.0.0.1:{}/decide", d.at),
        };
        let decider = format!("{{ url: \"{url}\", timeout_ms: 2000 }}");
        let dev = sandbox("dev", port).entry("decider", &decider);
        let p = proxy(dir.path(), &ca, &[dev], "");
        let api = |path: &str| format!("https://api.test:{port}{path}");
        // Denied by path, before anything reaches the origin.
        let out = as_sandbox(&p, dir.path(), "dev", &api("/admin/users"), &[]);
        assert!(text(&out).contains("denied_by_decider"), "{}", text(&out));
        let rec = p.wait_record(|r| r["reason"] == "denied_by_decider");
        assert!(
            rec["decider"]
                .as_str()
                .unwrap()
                .contains("admin paths are off limits"),
            "{rec}"
        );
        assert!(!p
            .audit_records()
            .iter()
            .any(|r| r.to_string().contains("schema:")));
        // Allowed with a header set and one removed.
        let out = as_sandbox(&p, dir.path(), "dev", &api("/echo"), &["-H", "X-Debug: 1"]);
        let echoed = text(&out).to_ascii_lowercase();
        assert!(echoed.contains("x-decided-by: example-decider"), "{echoed}");
        assert!(!echoed.contains("x-debug"), "{echoed}");
        // A POST: the decider asks for the body, then allows it or not by what it says.
        let before = origin.received.load(Ordering::SeqCst);
        let out = as_sandbox(
            &p,
            dir.path(),
            "dev",
            &api("/upload"),
            &["--data-binary", "plain notes"],
        );
        assert!(text(&out).contains("received 11"), "{}", text(&out));
        let out = as_sandbox(
            &p,
            dir.path(),
            "dev",
            &api("/upload"),
            &["--data-binary", "about PROJECT-X"],
        );
        assert!(text(&out).contains("denied_by_decider"), "{}", text(&out));
        assert_eq!(
            origin.received.load(Ordering::SeqCst),
            before + 11,
            "the refused body was sent"
        );
        // Host level: a tunnel to a blocked host (not terminated) is refused at CONNECT.
        let out = as_sandbox(
            &p,
            dir.path(),
            "dev",
            &format!("https://blocked.test:{port}/"),
            &[],
        );
        assert!(text(&out).contains("403"), "{}", text(&out));
        let rec = p.wait_record(|r| r["mode"] == "connect" && r["reason"] == "denied_by_decider");
        assert!(
            rec["decider"].as_str().unwrap().starts_with("deny 403"),
            "{rec}"
        );
        // And the decider's allow of a tunnel is in its record.
        let _ = as_sandbox(
            &p,
            dir.path(),
            "dev",
            &format!("https://other.test:{port}/"),
            &["-k"],
        );
        let rec = p.wait_record(|r| r["mode"] == "connect" && r["target_host"] == "other.test");
        assert_eq!(rec["decider"], "allow", "{rec}");
    }
}

#[test]
fn a_slow_or_stopped_decider_is_unavailable_and_costs_other_sandboxes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let slow = decider(&["--sleep", "5"]);
    // A decider that is not there: a port that refuses, held for the whole test.
    let stopped = ClosedPort::new();
    let stopped_port = stopped.port();
    let slow_cfg = format!(
        "{{ url: \"http://127.0.0.1:{}/\", timeout_ms: 400 }}",
        slow.at
    );
    let gone_cfg = format!("{{ url: \"http://127.0.0.1:{stopped_port}/\", timeout_ms: 400 }}");
    let sandboxes = [
        sandbox("slow", port).entry("decider", &slow_cfg),
        sandbox("gone", port).entry("decider", &gone_cfg),
        sandbox("free", port),
    ];
    let p = proxy(dir.path(), &ca, &sandboxes, "");
    let api = format!("https://api.test:{port}/v1/x");
    // Eight slow asks at once; meanwhile the sandbox without a decider is served.
    let started = Instant::now();
    let waiting: Vec<_> = (0..8)
        .map(|_| {
            let (px, ica, api) = (
                format!("http://slow:slow-secret@{}", p.proxy),
                dir.path().join("ica/ca.crt"),
                api.clone(),
            );
            std::thread::spawn(move || {
                let t = Instant::now();
                let out = curl(&["-x", &px, "--cacert", ica.to_str().unwrap(), &api]);
                (text(&out), t.elapsed())
            })
        })
        .collect();
    // All eight are at the decider (it holds each for 5 s).
    slow.wait_asked(8);
    let free_started = Instant::now();
    let out = as_sandbox(&p, dir.path(), "free", &api, &[]);
    let free_took = free_started.elapsed();
    assert!(text(&out).contains("hello from origin"), "{}", text(&out));
    for w in waiting {
        let (body, took) = w.join().unwrap();
        // A CONNECT refusal: curl shows its status; the record names the reason.
        assert!(body.contains("response 503"), "{body}");
        // Within the timeout (400 ms) and the CONNECT handshake, not the decider's 5 s.
        assert!(took < Duration::from_secs(4), "{took:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(4));
    eprintln!("free sandbox served in {free_took:?} while the slow decider held eight asks");
    let rec = p.wait_record(|r| r["reason"] == "decider_unavailable" && r["sandbox"] == "slow");
    assert!(
        rec["decider"].as_str().unwrap().contains("did not answer"),
        "{rec}"
    );
    // A stopped decider: refused at once.
    let out = as_sandbox(&p, dir.path(), "gone", &api, &[]);
    assert!(text(&out).contains("response 503"), "{}", text(&out));
    let rec = p.wait_record(|r| r["reason"] == "decider_unavailable" && r["sandbox"] == "gone");
    assert!(
        rec["decider"].as_str().unwrap().contains("cannot reach"),
        "{rec}"
    );
}

#[test]
fn a_dlp_rule_cuts_an_upload_with_a_private_key_and_passes_it_without() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let dlp = "{ rules: [{ name: private_key, pattern: \"-----BEGIN [A-Z ]*PRIVATE KEY-----\" }], entropy: { min_length: 40, action: report } }";
    let p = proxy(
        dir.path(),
        &ca,
        &[sandbox("dev", port).entry("dlp", dlp)],
        "",
    );
    let api = format!("https://api.test:{port}/upload");
    let with_key = format!("config dump\n{PRIVATE_KEY}");
    let out = as_sandbox(&p, dir.path(), "dev", &api, &["--data-binary", &with_key]);
    assert!(text(&out).contains("dlp_blocked"), "{}", text(&out));
    let rec = p.wait_record(|r| r["reason"] == "dlp_blocked");
    assert_eq!(rec["dlp"], "private_key", "{rec}");
    assert!(
        !rec.to_string().contains("BEGIN RSA"),
        "the matched text is recorded: {rec}"
    );
    assert_eq!(
        origin.received.load(Ordering::SeqCst),
        0,
        "the key reached the origin"
    );
    // The same upload without the key passes.
    let without = "config dump\nnothing secret here\n";
    let out = as_sandbox(&p, dir.path(), "dev", &api, &["--data-binary", without]);
    assert!(
        text(&out).contains(&format!("received {}", without.len())),
        "{}",
        text(&out)
    );
    // A high-entropy token is only reported.
    let token = "token=q8Zr3LkP0vXw9TnB2sYh7JdM4cFg6AeRtUiOpQlKzXcVbNm";
    let out = as_sandbox(&p, dir.path(), "dev", &api, &["--data-binary", token]);
    assert!(text(&out).contains("received"), "{}", text(&out));
    let rec = p.wait_record(|r| r["dlp"] == "high_entropy");
    assert_eq!(rec["decision"], "allow", "{rec}");
}

#[test]
fn the_top_level_decider_applies_to_every_sandbox_without_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let d = decider(&[]);
    let top = format!("decider: {{ url: \"http://127.0.0.1:{}/\" }}", d.at);
    let p = proxy(dir.path(), &ca, &[sandbox("dev", port)], &top);
    let out = as_sandbox(
        &p,
        dir.path(),
        "dev",
        &format!("https://api.test:{port}/admin"),
        &[],
    );
    assert!(text(&out).contains("denied_by_decider"), "{}", text(&out));
}

/// Security review round A, A26: a private key sent gzip'd, base64'd, percent-encoded, in a
/// header or in the query reached the origin. The DLP phase now scans the target and headers
/// and the body as the origin may decode it, on terminated and forwarded plain-HTTP requests
/// alike; a coding it cannot undo is refused.
#[test]
fn dlp_finds_a_key_in_every_encoding_on_terminated_and_forwarded_requests() {
    use base64::Engine;
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let tls = Origin::start(Some(&ca));
    let plain = Origin::start(None);
    let (tls_port, plain_port) = (tls.addr.port(), plain.addr.port());
    let dlp = "{ rules: [{ name: private_key, pattern: \"-----BEGIN [A-Z ]*PRIVATE KEY-----\" }] }";
    let dev = SandboxSpec::new("dev")
        .token("dev-secret")
        .entry("dlp", dlp)
        .allow(&format!("api.test:{tls_port}"))
        .allow(&format!("other.test:{plain_port}"))
        .network(
            "http",
            r#"[{ host: api.test, methods: [GET, POST], paths: ["/**"] }]"#,
        );
    let p = proxy(dir.path(), &ca, &[dev], "");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(PRIVATE_KEY.as_bytes()).unwrap();
    let gz_file = dir.path().join("body.gz");
    std::fs::write(&gz_file, gz.finish().unwrap()).unwrap();
    let gz_arg = format!("@{}", gz_file.display());
    let b64 = base64::engine::general_purpose::STANDARD.encode(PRIVATE_KEY);
    let pct: String = PRIVATE_KEY.bytes().map(|b| format!("%{b:02X}")).collect();
    let header = format!("X-Config: {b64}");
    for base in [
        format!("https://api.test:{tls_port}"),
        format!("http://other.test:{plain_port}"),
    ] {
        let upload = format!("{base}/upload");
        let query = format!("{base}/upload?k={pct}");
        let cases: [(&str, &str, Vec<&str>); 6] = [
            (
                "gzip",
                &upload,
                vec!["-H", "Content-Encoding: gzip", "--data-binary", &gz_arg],
            ),
            ("base64", &upload, vec!["--data-binary", &b64]),
            ("percent", &upload, vec!["--data-binary", &pct]),
            ("header", &upload, vec!["-H", &header, "--data-binary", "x"]),
            ("query", &query, vec!["--data-binary", "x"]),
            (
                "br",
                &upload,
                vec!["-H", "Content-Encoding: br", "--data-binary", "x"],
            ),
        ];
        for (what, url, extra) in cases {
            let out = as_sandbox(&p, dir.path(), "dev", url, &extra);
            assert!(
                text(&out).contains("dlp_blocked"),
                "{base} {what}: {}",
                text(&out)
            );
        }
        // Without the key, the same request passes.
        let out = as_sandbox(
            &p,
            dir.path(),
            "dev",
            &upload,
            &["--data-binary", "nothing"],
        );
        assert!(text(&out).contains("received 7"), "{base}: {}", text(&out));
    }
    assert_eq!(
        tls.received.load(Ordering::SeqCst),
        7,
        "only the clean upload"
    );
    assert_eq!(
        plain.received.load(Ordering::SeqCst),
        7,
        "only the clean upload"
    );
    let rec = p.wait_record(|r| r["reason"] == "dlp_blocked" && r["mode"] == "http");
    assert_eq!(rec["dlp"], "private_key", "{rec}");
}

/// `n` requests to `https://api.test:port{path}-i` multiplexed by curl over one HTTP/2
/// connection through the proxy as `id`: their status codes.
fn h2_burst(p: &Proxy, dir: &Path, id: &str, port: u16, path: &str, n: usize) -> Vec<String> {
    let px = format!("http://{id}:{id}-secret@{}", p.proxy);
    let ica = dir.join("ica/ca.crt");
    let mut args: Vec<String> = [
        "-s",
        "--http2",
        "--parallel",
        "--parallel-max",
        "100",
        "-x",
        &px,
        "--cacert",
        ica.to_str().unwrap(),
        "-w",
        "%{http_code}\\n",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in 0..n {
        args.extend(["-o".into(), "/dev/null".into()]);
        args.push(format!("https://api.test:{port}{path}-{i}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    curl(&args).text().lines().map(str::to_string).collect()
}

/// Security review round C, C4c: under `on_error: allow` a sandbox made the decider "busy"
/// or "slow" with parallel streams and its forbidden requests rode through (32 of 40 on one
/// h2 connection). Asks are now bounded per sandbox (`max_in_flight_per_sandbox`, a quarter of
/// `max_in_flight` by default), and a failure that is the sandbox's own load is refused
/// whatever `on_error` says: all 40 forbidden streams are refused.
#[test]
fn a_sandbox_cannot_make_the_decider_fail_open_with_its_own_load() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let d = decider(&["--sleep", "0.15"]);
    let cfg = format!(
        "{{ url: \"http://127.0.0.1:{}/\", timeout_ms: 300, max_in_flight: 8, on_error: allow }}",
        d.at
    );
    let p = proxy(
        dir.path(),
        &ca,
        &[sandbox("flood", port).entry("decider", &cfg)],
        "",
    );
    let codes = h2_burst(&p, dir.path(), "flood", port, "/admin/forbidden", 40);
    assert_eq!(codes.len(), 40, "{codes:?}");
    let through = codes.iter().filter(|c| *c == "200").count();
    assert_eq!(
        through, 0,
        "forbidden requests reached the origin: {codes:?}"
    );
    let rec = p.wait_record(|r| {
        r["sandbox"] == "flood"
            && r["decider"]
                .as_str()
                .is_some_and(|d| d.contains("on_error does not apply"))
    });
    assert_eq!(rec["decision"], "deny", "{rec}");
    // One ask at a time is no load: a failure then is the decider's, and `allow` applies.
    drop(d);
    let out = as_sandbox(
        &p,
        dir.path(),
        "flood",
        &format!("https://api.test:{port}/v1/x"),
        &[],
    );
    assert!(text(&out).contains("hello from origin"), "{}", text(&out));
}

/// Security review round 7b, C4c: a decider that slows under load (each ask waits 10 ms for
/// every ask in flight) timed out asks of a flooding sandbox while its share was not full at
/// that instant, and under `on_error: allow` 9 and 13 of 300 forbidden requests passed. A
/// failure of an ask that overlapped another of the same sandbox is now its own load: all
/// 300 are refused, and the record says so.
#[test]
fn a_decider_that_slows_under_a_sandboxs_flood_never_fails_open_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let d = decider(&["--load-sleep", "0.01"]);
    let cfg = format!(
        "{{ url: \"http://127.0.0.1:{}/\", timeout_ms: 300, on_error: allow }}",
        d.at
    );
    let p = proxy(
        dir.path(),
        &ca,
        &[sandbox("slowed", port).entry("decider", &cfg)],
        "",
    );
    let codes = h2_burst(&p, dir.path(), "slowed", port, "/admin/forbidden", 300);
    assert_eq!(codes.len(), 300, "{codes:?}");
    let through = codes.iter().filter(|c| *c == "200").count();
    assert_eq!(through, 0, "forbidden requests reached the origin");
    let timed_out = p.wait_record(|r| {
        r["sandbox"] == "slowed"
            && r["decider"].as_str().is_some_and(|d| {
                d.contains("did not answer within") && d.contains("on_error does not apply")
            })
    });
    assert_eq!(timed_out["decision"], "deny", "{timed_out}");
}

/// Security review round C, C5: `max_in_flight` was one pool for every sandbox, so one
/// sandbox's flood refused its neighbour's requests (5 of 10 got 503). With a share per
/// sandbox the neighbour is unaffected.
#[test]
fn one_sandboxs_flood_of_asks_does_not_refuse_its_neighbour() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let d = decider(&["--sleep", "0.15"]);
    let top = format!(
        "decider: {{ url: \"http://127.0.0.1:{}/\", max_in_flight: 8, on_error: deny }}",
        d.at
    );
    let sandboxes = [sandbox("decx", port), sandbox("decy", port)];
    let p = std::sync::Arc::new(proxy(dir.path(), &ca, &sandboxes, &top));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let (p, stop, dir) = (p.clone(), stop.clone(), dir.path().to_path_buf());
        std::thread::spawn(move || {
            let mut asked = 0;
            while !stop.load(Ordering::Relaxed) {
                asked += h2_burst(&p, &dir, "decx", port, "/v1/flood", 60).len();
            }
            asked
        })
    };
    // The flood fills the decider's places (max_in_flight: 8) twice over before decy asks.
    d.wait_asked(16);
    let codes: Vec<String> = (0..10)
        .map(|i| {
            let url = format!("https://api.test:{port}/v1/y-{i}");
            let out = as_sandbox(
                &p,
                dir.path(),
                "decy",
                &url,
                &["-s", "-o", "/dev/null", "-w", "%{http_code}"],
            );
            out.text()
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    let asked = flood.join().unwrap();
    assert!(asked >= 60, "the flood ran");
    assert!(
        codes.iter().all(|c| c == "200"),
        "the neighbour was refused: {codes:?}"
    );
}

/// Security review A27: a sandbox could be granted the decider's own address, and the decider
/// could not tell the proxy's questions from forged ones. The decider's address is now
/// guarded like the proxy's own listeners (no rule, grant or approval reaches it; an access
/// request for it is refused), and with `decider.secret_file` every question is signed: the
/// example decider answers the proxy's and refuses a forged one.
#[test]
fn the_decider_is_out_of_reach_and_its_questions_are_signed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = Origin::start(Some(&ca));
    let port = origin.addr.port();
    let key = dir.path().join("decider.key");
    std::fs::write(&key, "decider-shared-secret\n").unwrap();
    let d = decider(&["--secret-file", key.to_str().unwrap()]);
    let top = format!(
        "decider: {{ url: \"http://127.0.0.1:{}/\", secret_file: {} }}",
        d.at,
        key.display()
    );
    let reach = SandboxSpec::new("reach")
        .token("reach-secret")
        .allow("127.0.0.1:*");
    let sandboxes = [sandbox("dev", port), reach];
    let p = proxy(dir.path(), &ca, &sandboxes, &top);
    // The proxy's questions are signed, so the decider answers them.
    let out = as_sandbox(
        &p,
        dir.path(),
        "dev",
        &format!("https://api.test:{port}/admin"),
        &[],
    );
    assert!(text(&out).contains("denied_by_decider"), "{}", text(&out));
    let out = as_sandbox(
        &p,
        dir.path(),
        "dev",
        &format!("https://api.test:{port}/v1/x"),
        &[],
    );
    assert!(text(&out).contains("hello from origin"), "{}", text(&out));
    // A forged question (what a sandbox that reached the decider would send): refused.
    let forged = r#"{"version":1,"sandbox":"dev","protocol":"connect","target":{"host":"api.test","port":443},"policy":{"decision":"allow"}}"#;
    let direct = format!("http://127.0.0.1:{}/", d.at);
    let out = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--data-binary",
        forged,
        &direct,
    ]);
    assert_eq!(out.text(), "401");
    // A sandbox whose rules allow 127.0.0.1:* does not reach the decider through the proxy.
    let px = format!("http://reach:reach-secret@{}", p.proxy);
    let out = curl(&["-s", "-x", &px, "--data-binary", forged, &direct]);
    assert!(out.text().contains("proxy_loop"), "{}", out.text());
    // And cannot ask for it.
    let body = format!(
        r#"{{"host": "127.0.0.1", "port": {}, "reason": "tools"}}"#,
        d.at
    );
    let out = curl(&[
        "-s",
        "-x",
        &px,
        "--data-binary",
        &body,
        "http://egress-proxy.local/v1/requests",
    ]);
    assert!(out.text().contains("never grantable"), "{}", out.text());
}

/// Issue 89: a forwarded request gets the terminated path's question, from the pipeline's one
/// decider phase, after its rules. Before, the decider was asked at admission — before the
/// rules (a request `network.http` refused was still asked about, and its record carried the
/// decider's "allow"), without the body (`need_body` was a 503) and with header changes it
/// could not make (`remove_headers` was a 503, clients review F10). Now: a request the rules
/// refuse reaches no decider; a POST's body is shown and the bytes shown are the bytes sent;
/// headers are set and removed as on a terminated request. And the schema refuses what the
/// proxy refuses.
#[test]
fn a_forwarded_request_is_asked_about_after_its_rules_with_its_body_and_edits() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let plain = Origin::start(None);
    let port = plain.addr.port();
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/decider.schema.json");
    let d = decider(&["--schema", schema.to_str().unwrap()]);
    let decider = format!(
        "{{ url: \"http://127.0.0.1:{}/decide\", timeout_ms: 2000 }}",
        d.at
    );
    let dev = sandbox("dev", port).entry("decider", &decider);
    let p = proxy(dir.path(), &ca, &[dev], "");
    let px = format!("http://dev:dev-secret@{}", p.proxy);
    let forwarded = |path: &str, more: &[&str]| {
        let url = format!("http://api.test:{port}{path}");
        let mut args = vec!["-sS", "-x", &px];
        args.extend_from_slice(more);
        args.push(&url);
        curl(&args).text()
    };
    // Refused by the rules (DELETE is not in them): the decider is never asked.
    let out = forwarded("/thing", &["-X", "DELETE"]);
    assert!(out.contains("http_not_allowed"), "{out}");
    let rec = p.wait_record(|r| r["mode"] == "http" && r["method"] == "DELETE");
    assert!(rec["decider"].is_null(), "asked before the rules: {rec}");
    // Allowed, with a header set and one removed, as on a terminated request.
    let out = forwarded("/echo", &["-H", "X-Debug: 1"]).to_ascii_lowercase();
    assert!(out.contains("x-decided-by: example-decider"), "{out}");
    assert!(!out.contains("x-debug"), "{out}");
    // A POST: the decider asks for the body, sees it, and allows it or not by what it says.
    let before = plain.received.load(Ordering::SeqCst);
    let out = forwarded("/upload", &["--data-binary", "plain notes"]);
    assert!(out.contains("received 11"), "{out}");
    let out = forwarded("/upload", &["--data-binary", "about PROJECT-X"]);
    assert!(out.contains("denied_by_decider"), "{out}");
    assert_eq!(plain.received.load(Ordering::SeqCst), before + 11);
    let rec = p.wait_record(|r| r["mode"] == "http" && r["reason"] == "denied_by_decider");
    assert!(
        rec["decider"].as_str().unwrap_or("").contains("PROJECT-X"),
        "{rec}"
    );
    assert!(!p
        .audit_records()
        .iter()
        .any(|r| r.to_string().contains("schema:")));
    // The schema refuses a framing or credential header, in any case.
    let check = format!(
        "import json, jsonschema\ns = json.load(open('{}'))\nfor a in [{{'verdict': 'allow', 'set_headers': {{'Content-Length': '1'}}}}, {{'verdict': 'allow', 'remove_headers': ['Authorization']}}, {{'verdict': 'allow', 'set_headers': {{'x-tenant': '7'}}}}]:\n    try:\n        jsonschema.validate(a, s)\n        print('valid')\n    except jsonschema.ValidationError:\n        print('invalid')",
        schema.display()
    );
    let out = Command::new("python3")
        .args(["-c", &check])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "invalid\ninvalid\nvalid\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
