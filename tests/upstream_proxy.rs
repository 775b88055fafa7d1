//! `upstream_proxy`: a real Squid (Debian's `squid`) on loopback as the parent, requiring a
//! password (basic_ncsa_auth). Allowed CONNECT tunnels reach the origin through it as
//! CONNECTs of the decided authority, forwarded plain HTTP as requests in absolute form on
//! kept connections (its access log shows the URLs and the proxy's source port) — through a
//! Squid that, as corporate ones do, refuses `CONNECT` to ports other than 443; a denied
//! target never reaches it; its refusal (407 with a wrong password) comes back as
//! `upstream_proxy_refused` with its status; the parent's password appears in no log; a parent
//! on loopback is refused by the guard unless `guard_allow_ranges` lists it; a bypassed name
//! is dialled directly. The same through an `https://` parent (Squid's `https_port`, its
//! certificate from the test CA given as `ca_file`): the password and every tunnel travel
//! inside TLS, brokered TLS runs inside that, a reload still cuts at once, and a parent whose
//! certificate is not trusted is refused. Fails (never skips) when squid is missing:
//! `.ci/run` installs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const PASSWORD: &str = "parent-pass-7f3a";

/// A Squid on 127.0.0.1 that requires `agent` / [`PASSWORD`] and logs every request; with
/// `tls`, spoken to over TLS (`https_port`) with the test CA's certificate.
struct Squid {
    port: u16,
    log: PathBuf,
    child: Child,
    tls: bool,
}

impl Squid {
    fn start(dir: &Path, tls: Option<&TestCa>) -> Squid {
        Self::start_with(dir, tls, "")
    }

    /// With `rules`: `http_access` lines placed before the ones that let `agent` in.
    fn start_with(dir: &Path, tls: Option<&TestCa>, rules: &str) -> Squid {
        let sq = dir.join("squid");
        std::fs::create_dir_all(&sq).unwrap();
        // Squid's workers run as `proxy`: they must reach their files.
        for d in [dir, sq.as_path()] {
            Command::new("chmod").arg("755").arg(d).status().unwrap();
        }
        let hash = Command::new("openssl")
            .args(["passwd", "-apr1", PASSWORD])
            .output()
            .unwrap();
        let hash = String::from_utf8(hash.stdout).unwrap();
        std::fs::write(sq.join("passwd"), format!("agent:{}", hash.trim())).unwrap();
        std::fs::write(
            sq.join("hosts"),
            "127.0.0.1 api.test plain.test other.test\n",
        )
        .unwrap();
        if let Some(ca) = tls {
            for (from, to) in [(&ca.cert_pem, "tls.pem"), (&ca.key_pem, "tls.key")] {
                std::fs::copy(from, sq.join(to)).unwrap();
            }
        }
        // The port is chosen free and then given to Squid: another test may bind it in
        // between. Squid then exits ("Cannot bind socket") while a connect to the port still
        // succeeds (to that other listener), so readiness is Squid's own word that it accepts
        // on the port, and a lost race is tried again on another port.
        for _ in 0..5 {
            let port = free_port();
            if let Some(squid) = Self::launch(&sq, tls.is_some(), rules, port) {
                return squid;
            }
        }
        panic!(
            "squid never started: {}",
            std::fs::read_to_string(sq.join("cache.log")).unwrap_or_default()
        );
    }

    /// Start Squid on `port`; `None` when it exits before it accepts there.
    fn launch(sq: &Path, tls: bool, rules: &str, port: u16) -> Option<Squid> {
        let log = sq.join("access.log");
        let cache_log = sq.join("cache.log");
        let _ = std::fs::remove_file(&cache_log);
        let listen = match tls {
            false => format!("http_port 127.0.0.1:{port}"),
            true => format!(
                "https_port 127.0.0.1:{port} tls-cert={d}/tls.pem tls-key={d}/tls.key",
                d = sq.display()
            ),
        };
        std::fs::write(
            sq.join("squid.conf"),
            format!(
                "{listen}
pid_filename {d}/squid.pid
logformat ep %ts %>a:%>p %Ss/%03>Hs %rm %ru %[un
access_log stdio:{log} ep
cache_log {d}/cache.log
cache_store_log none
cache deny all
coredump_dir {d}
hosts_file {d}/hosts
dns_nameservers 127.0.0.1
auth_param basic program /usr/lib/squid/basic_ncsa_auth {d}/passwd
auth_param basic realm parent
acl authed proxy_auth REQUIRED
{rules}
http_access allow authed
http_access deny all
shutdown_lifetime 0 seconds
",
                d = sq.display(),
                log = log.display(),
            ),
        )
        .unwrap();
        Command::new("chown")
            .args(["-R", "proxy:proxy"])
            .arg(sq)
            .status()
            .unwrap();
        // A service name of its own: instances of the same name share memory segments.
        let child = Command::new("squid")
            .args(["-N", "-n", &format!("eptest{port}"), "-f"])
            .arg(sq.join("squid.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("squid is installed (.ci/run installs Debian's squid)");
        let mut squid = Squid {
            port,
            log,
            child,
            tls,
        };
        let ready = "Socket connections at conn";
        let at = format!("local=127.0.0.1:{port} ");
        let mut text = String::new();
        let every = Duration::from_millis(50);
        let listening = within(every, Duration::from_secs(20), || {
            text = std::fs::read_to_string(&cache_log).unwrap_or_default();
            if text.lines().any(|l| l.contains(ready) && l.contains(&at)) {
                return Some(true);
            }
            matches!(squid.child.try_wait(), Ok(Some(_))).then_some(false)
        })
        .unwrap_or_else(|| panic!("squid did not listen: {text}"));
        listening.then_some(squid)
    }

    /// Squid's access log, once `pred` holds (it writes each line when a transaction ends).
    fn log_when(&self, pred: impl Fn(&str) -> bool) -> String {
        let read = || std::fs::read_to_string(&self.log).unwrap_or_default();
        within(Duration::from_millis(50), Duration::from_secs(10), || {
            Some(read()).filter(|text| pred(text))
        })
        .unwrap_or_else(read)
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Env {
    dir: tempfile::TempDir,
    ca: TestCa,
    https: Origin,
    http: Origin,
    squid: Squid,
}

fn env() -> Env {
    env_with(false)
}

/// With an `https://` parent.
fn env_tls() -> Env {
    env_with(true)
}

fn env_with(tls: bool) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let http = Origin::start(None);
    let squid = Squid::start(dir.path(), tls.then_some(&ca));
    Env {
        dir,
        ca,
        https,
        http,
        squid,
    }
}

impl Env {
    /// `url` (and `ca_file`) of `upstream_proxy` for this Squid, as YAML mapping entries.
    fn parent(&self) -> String {
        match self.squid.tls {
            false => format!("url: \"http://127.0.0.1:{}\"", self.squid.port),
            true => format!(
                "url: \"https://127.0.0.1:{}\", ca_file: {}",
                self.squid.port,
                self.ca.ca_pem.display()
            ),
        }
    }

    /// Start the proxy with `upstream_proxy` pointing at Squid with `password`; loopback let
    /// through the guard when `guarded` is false.
    fn proxy(&self, tag: &str, password: &str, guarded: bool) -> Proxy {
        self.proxy_to(tag, password, guarded, &self.parent())
    }

    /// [`Env::proxy`] with `parent` as `upstream_proxy`'s url (and ca_file) entries.
    fn proxy_to(&self, tag: &str, password: &str, guarded: bool, parent: &str) -> Proxy {
        let d = self.dir.path().join(tag);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("parent.pw"), format!("{password}\n")).unwrap();
        self.config(
            &d,
            guarded,
            parent,
            &["api.test:*", "plain.test:*", "other.test:*"],
        )
        .start(&d)
    }

    /// The configuration of [`Env::proxy_to`] in `d`, sandbox `s` reaching `egress`.
    fn config(&self, d: &Path, guarded: bool, parent: &str, egress: &[&str]) -> ProxyConfig {
        let s = egress
            .iter()
            .fold(SandboxSpec::new("s").source("127.0.0.0/8"), |s, e| {
                s.allow(e)
            })
            .deny("denied.test");
        let config = ["api.test", "plain.test", "denied.test", "other.test"]
            .iter()
            .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
            .dns_server("127.0.0.1:9")
            .dns("timeout_ms", "500")
            .defaults("timeouts", "{ connect_ms: 3000 }")
            .raw(&format!(
                "upstream_proxy: {{ {parent}, auth: {{ username: agent, password_file: {} }}, bypass: [other.test] }}",
                d.join("parent.pw").display()
            ))
            .sandbox(s);
        match guarded {
            true => config,
            false => config.guard_allow("127.0.0.1/32"),
        }
    }

    fn via(&self, p: &Proxy, url: &str) -> CurlOut {
        curl(&[
            "-x",
            &format!("http://{}", p.proxy),
            "--cacert",
            &self.ca.ca_pem.to_string_lossy(),
            "-i",
            url,
        ])
    }
}

/// Loopback (the origins) let through the guard.
const GUARD: bool = false;

#[test]
fn allowed_exchanges_go_through_the_parent_and_denied_ones_never_reach_it() {
    allowed_exchanges_go_through_the_parent_and_denied_ones_never_reach_it_with(&env());
}

#[test]
fn an_https_parent_carries_tunnels_and_forwarded_requests_inside_tls() {
    allowed_exchanges_go_through_the_parent_and_denied_ones_never_reach_it_with(&env_tls());
}

fn allowed_exchanges_go_through_the_parent_and_denied_ones_never_reach_it_with(e: &Env) {
    let p = e.proxy("ok", PASSWORD, GUARD);
    let hp = e.https.addr.port();
    let pp = e.http.addr.port();

    // An allowed CONNECT: the tunnel goes through Squid to the origin.
    let out = e.via(&p, &format!("https://api.test:{hp}/hello"));
    assert!(
        out.text().contains("hello from origin /hello"),
        "{} {}",
        out.text(),
        out.stderr
    );
    // A forwarded GET: a request in absolute form through Squid.
    let out = e.via(&p, &format!("http://plain.test:{pp}/hello"));
    assert!(
        out.text().contains("hello from origin /hello"),
        "{} {}",
        out.text(),
        out.stderr
    );
    // A denied one: refused here, never seen by Squid.
    let out = e.via(&p, &format!("https://denied.test:{hp}/"));
    assert!(
        out.stderr.contains("403") || out.text().contains("403"),
        "{} {}",
        out.text(),
        out.stderr
    );

    let log = e.squid.log_when(|l| {
        l.contains(&format!("CONNECT api.test:{hp}"))
            && l.contains(&format!("GET http://plain.test:{pp}/hello"))
    });
    assert!(log.contains(&format!("CONNECT api.test:{hp}")), "{log}");
    assert!(
        log.contains(&format!("GET http://plain.test:{pp}/hello agent")),
        "{log}"
    );
    assert!(
        log.contains("agent"),
        "Squid authenticated the proxy: {log}"
    );
    assert!(
        !log.contains("denied.test"),
        "a denied target reached the parent: {log}"
    );

    // The records name the route; the password is in no log, nor its Basic form.
    let rec = p.wait_record(|r| r["target_host"] == "api.test" && r["decision"] == "allow");
    assert_eq!(
        rec["dialed"],
        format!("127.0.0.1:{}", e.squid.port),
        "{rec}"
    );
    assert!(
        rec["detail"]
            .as_str()
            .unwrap_or("")
            .contains("through upstream proxy"),
        "{rec}"
    );
    let basic = basic("agent", PASSWORD);
    let audit = std::fs::read_to_string(&p.audit).unwrap();
    for secret in [PASSWORD, basic.trim_start_matches("Basic ")] {
        assert!(
            !audit.contains(secret),
            "the parent's password in the audit log"
        );
        assert!(
            !p.stderr_text().contains(secret),
            "the parent's password in the proxy's log"
        );
    }
}

#[test]
fn a_parent_refusal_is_reported_with_its_status() {
    let e = env();
    let p = e.proxy("wrong", "not-the-password", GUARD);
    let hp = e.https.addr.port();
    let out = e.via(&p, &format!("https://api.test:{hp}/hello"));
    let all = format!("{}{}", out.text(), out.stderr);
    assert!(all.contains("502"), "{all}");
    assert!(all.contains("upstream_proxy_refused"), "{all}");
    let rec = p.wait_record(|r| r["target_host"] == "api.test");
    assert_eq!(rec["reason"], "upstream_proxy_refused", "{rec}");
    assert!(
        rec["detail"].as_str().unwrap_or("").contains("407"),
        "{rec}"
    );
    // A forwarded request too.
    let pp = e.http.addr.port();
    let out = e.via(&p, &format!("http://plain.test:{pp}/hello"));
    assert!(out.text().starts_with("HTTP/1.1 502"), "{}", out.text());
    assert!(
        out.text().contains("upstream_proxy_refused"),
        "{}",
        out.text()
    );
}

/// An `https://` parent is verified: without `ca_file` naming its CA, its certificate is
/// not trusted, and the exchange is refused with the reason and the TLS error — the password
/// is never sent to it.
#[test]
fn an_https_parent_must_present_a_trusted_certificate() {
    let e = env_tls();
    let untrusted = format!("url: \"https://127.0.0.1:{}\"", e.squid.port);
    let p = e.proxy_to("untrusted", PASSWORD, GUARD, &untrusted);
    let hp = e.https.addr.port();
    let out = e.via(&p, &format!("https://api.test:{hp}/hello"));
    let all = format!("{}{}", out.text(), out.stderr);
    assert!(all.contains("502"), "{all}");
    let rec = p.wait_record(|r| r["target_host"] == "api.test");
    assert_eq!(rec["reason"], "upstream_proxy_refused", "{rec}");
    let detail = rec["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("TLS") && detail.contains("certificate"),
        "{rec}"
    );

    // The same parent with the CA: through.
    let p = e.proxy("trusted", PASSWORD, GUARD);
    let out = e.via(&p, &format!("https://api.test:{hp}/hello"));
    // Squid logs a request only once one arrived inside TLS: the trusted tunnel's is the one
    // line naming the host (the refused one, logged, would have come before it).
    let log = e.squid.log_when(|l| l.contains("api.test"));
    let named = log.lines().filter(|l| l.contains("api.test")).count();
    assert_eq!(named, 1, "{log}");
    assert!(
        out.text().contains("hello from origin /hello"),
        "{} {}",
        out.text(),
        out.stderr
    );
}

#[test]
fn the_guard_judges_the_parent_and_bypassed_names_go_direct() {
    let e = env();
    // Without guard_allow_ranges, a parent on loopback is refused with a hint.
    let p = e.proxy("guarded", PASSWORD, true);
    let hp = e.https.addr.port();
    let out = e.via(&p, &format!("https://api.test:{hp}/hello"));
    assert!(
        out.text().contains("403") || out.stderr.contains("403"),
        "{} {}",
        out.text(),
        out.stderr
    );
    let rec = p.wait_record(|r| r["target_host"] == "api.test");
    assert_eq!(rec["reason"], "destination_ip_prohibited", "{rec}");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap_or("")
            .contains("guard_allow_ranges"),
        "{rec}"
    );

    // A bypassed name is dialled directly: the origin answers, Squid never sees it.
    let p = e.proxy("bypass", PASSWORD, GUARD);
    let out = e.via(&p, &format!("https://other.test:{hp}/hello"));
    assert!(
        out.text().contains("hello from origin /hello"),
        "{} {}",
        out.text(),
        out.stderr
    );
    let rec = p.wait_record(|r| r["target_host"] == "other.test");
    assert_eq!(rec["dialed"], format!("127.0.0.1:{hp}"), "{rec}");
    // A later tunnel that does go through the parent is in Squid's log: by then it would have
    // logged the bypassed one, had it seen it.
    let marker = e.via(&p, &format!("https://api.test:{hp}/marker"));
    assert!(
        marker.text().contains("hello from origin /marker"),
        "{}",
        marker.stderr
    );
    let log = e.squid.log_when(|l| l.contains("CONNECT api.test"));
    assert!(log.contains("CONNECT api.test"), "{log}");
    assert!(!log.contains("other.test"), "{log}");
}

/// A terminated host with a brokered credential works through the parent: TLS to the origin
/// runs inside the parent's tunnel, the secret reaches the origin, and the parent saw only a
/// CONNECT.
#[test]
fn a_brokered_credential_goes_through_the_parent_inside_its_tunnel() {
    a_brokered_credential_goes_through_the_parent_inside_its_tunnel_with(&env());
}

#[test]
fn a_brokered_credential_goes_through_an_https_parent() {
    a_brokered_credential_goes_through_the_parent_inside_its_tunnel_with(&env_tls());
}

fn a_brokered_credential_goes_through_the_parent_inside_its_tunnel_with(e: &Env) {
    let d = e.dir.path().join("broker");
    std::fs::create_dir_all(&d).unwrap();
    ca_init(&d.join("ica"));
    std::fs::write(d.join("parent.pw"), PASSWORD).unwrap();
    std::fs::write(
        d.join("api.secret"),
        "sk-brokered-through-parent-0123456789",
    )
    .unwrap();
    let credential = format!(
        "{{ name: api, hosts: [api.test], inject: {{ header: X-Api-Key, format: \"{{secret}}\" }}, source: {{ file: {} }} }}",
        d.join("api.secret").display()
    );
    let p = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "500")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&d.join("ica"), &e.ca.ca_pem)
        .raw(&format!(
            "upstream_proxy: {{ {}, auth: {{ username: agent, password_file: {} }} }}",
            e.parent(),
            d.join("parent.pw").display()
        ))
        .sandbox(
            SandboxSpec::new("s")
                .source("127.0.0.0/8")
                .credential(&credential)
                .allow("api.test:*"),
        )
        .start(&d);
    let hp = e.https.addr.port();
    let out = curl(&[
        "-x",
        &format!("http://{}", p.proxy),
        "--cacert",
        &d.join("ica/ca.crt").to_string_lossy(),
        &format!("https://api.test:{hp}/echo"),
    ]);
    // The origin echoes the request head it received: the credential was put on it (the
    // proxy scrubs the secret from what comes back, so look for the header name and the
    // record's credential).
    assert_eq!(
        out.code,
        0,
        "{}\nproxy's records: {:?}\nsquid: {}",
        out.stderr,
        p.audit_records(),
        std::fs::read_to_string(&e.squid.log).unwrap_or_default()
    );
    assert!(
        out.text().to_ascii_lowercase().contains("x-api-key"),
        "{}",
        out.text()
    );
    let rec = p.wait_record(|r| r["path"] == "/echo");
    assert_eq!(rec["credential"], "api", "{rec}");
    assert_eq!(rec["status"], 200, "{rec}");
    let log = e
        .squid
        .log_when(|l| l.contains(&format!("CONNECT api.test:{hp}")));
    assert!(log.contains(&format!("CONNECT api.test:{hp}")), "{log}");
}

/// A reload that takes the rule away cuts a tunnel that runs through the parent, at once, and
/// the record says `revoked`; a new attempt is refused here and never reaches the parent.
#[test]
fn a_tunnel_through_the_parent_is_revoked_by_a_reload() {
    a_tunnel_through_the_parent_is_revoked_by_a_reload_with(&env());
}

#[test]
fn a_tunnel_through_an_https_parent_is_revoked_by_a_reload() {
    a_tunnel_through_the_parent_is_revoked_by_a_reload_with(&env_tls());
}

fn a_tunnel_through_the_parent_is_revoked_by_a_reload_with(e: &Env) {
    let p = e.proxy("revoke", PASSWORD, GUARD);
    let hp = e.https.addr.port();
    let px = format!("http://{}", p.proxy);
    let ca = e.ca.ca_pem.to_string_lossy().into_owned();
    let url = format!("https://api.test:{hp}/slow");
    let slow = std::thread::spawn(move || {
        let out = curl(&["-x", &px, "--cacert", &ca, &url]);
        (out, Instant::now())
    });
    // The download (a minute long) is under way through Squid.
    p.wait_audit("open", |r| r["target_host"] == "api.test");
    eventually(Duration::from_secs(10), "the download to flow", || {
        (e.https.slow_sent.load(std::sync::atomic::Ordering::SeqCst) >= 2048).then_some(())
    });
    let d = e.dir.path().join("revoke");
    let narrowed = e.config(&d, GUARD, &e.parent(), &["plain.test:*", "other.test:*"]);
    std::fs::write(&p.config, narrowed.yaml(&p.audit)).unwrap();
    let reloaded = Instant::now();
    unsafe_free_kill(p.child.id(), "HUP");
    let (out, ended) = slow.join().unwrap();
    assert_ne!(out.code, 0, "the download was cut");
    assert!(
        ended.duration_since(reloaded) < Duration::from_secs(20),
        "cut {:?} after the reload",
        ended.duration_since(reloaded)
    );
    let rec = p.wait_record(|r| r["target_host"] == "api.test" && r["close"] == "revoked");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap_or("")
            .contains("through upstream proxy"),
        "{rec}"
    );
    // Squid writes the cut tunnel's line when it ends; count once it is there.
    let naming_api = |log: &str| log.lines().filter(|l| l.contains("api.test")).count();
    let before = naming_api(
        &e.squid
            .log_when(|l| l.contains(&format!("CONNECT api.test:{hp}"))),
    );
    assert!(before > 0);
    let again = e.via(&p, &format!("https://api.test:{hp}/again"));
    assert!(
        again.stderr.contains("403") || again.text().contains("403"),
        "{}",
        again.stderr
    );
    // A later request through the parent: once Squid logged it, the refused attempt would
    // have been logged before it, had it reached the parent.
    let pp = e.http.addr.port();
    let marker = e.via(&p, &format!("http://plain.test:{pp}/marker"));
    assert!(
        marker.text().contains("hello from origin /marker"),
        "{}",
        marker.stderr
    );
    let log = e.squid.log_when(|l| l.contains("/marker"));
    assert!(
        log.contains("/marker"),
        "the marker never reached the parent: {log}"
    );
    assert_eq!(
        naming_api(&log),
        before,
        "the refused attempt reached the parent: {log}"
    );
}

/// Per sandbox: a sandbox's own `upstream_proxy` replaces the top-level one (here: none at
/// the top, one sandbox through Squid, another direct), `direct` opts out of a top-level
/// parent, and a runtime registration cannot name a password file for its parent.
#[test]
fn each_sandbox_may_have_its_own_parent_or_go_direct() {
    let e = env();
    let d = e.dir.path().join("per-sandbox");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("parent.pw"), PASSWORD).unwrap();
    std::fs::write(d.join("admin.token"), "per-sandbox-admin").unwrap();
    let parent = format!(
        "{{ {}, auth: {{ username: agent, password_file: {} }} }}",
        e.parent(),
        d.join("parent.pw").display()
    );
    let p = ProxyConfig::new()
        .admin_token_file(&d.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "500")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("via")
                .token("via-token")
                .entry("upstream_proxy", &parent)
                .allow("api.test:*"),
        )
        .sandbox(
            SandboxSpec::new("plain")
                .token("plain-token")
                .allow("api.test:*"),
        )
        .start(&d);
    let hp = e.https.addr.port();
    let get = |user: &str, path: &str| {
        curl(&[
            "-x",
            &format!("http://{}", p.proxy),
            "--proxy-user",
            user,
            "--cacert",
            &e.ca.ca_pem.to_string_lossy(),
            &format!("https://api.test:{hp}{path}"),
        ])
    };
    let out = get("via:via-token", "/via");
    assert!(
        out.text().contains("hello from origin /via"),
        "{} {}",
        out.text(),
        out.stderr
    );
    let out = get("plain:plain-token", "/plain");
    assert!(
        out.text().contains("hello from origin /plain"),
        "{} {}",
        out.text(),
        out.stderr
    );
    let via = p.wait_record(|r| r["sandbox"] == "via" && r["target_host"] == "api.test");
    assert_eq!(
        via["dialed"],
        format!("127.0.0.1:{}", e.squid.port),
        "{via}"
    );
    let plain = p.wait_record(|r| r["sandbox"] == "plain" && r["target_host"] == "api.test");
    assert_eq!(plain["dialed"], format!("127.0.0.1:{hp}"), "{plain}");
    let log = e.squid.log_when(|l| l.contains("CONNECT api.test"));
    assert_eq!(
        log.matches("CONNECT api.test").count(),
        1,
        "only `via` used the parent: {log}"
    );

    // A runtime registration may pick a parent without auth, or direct, never a file.
    let body = format!(
        r#"{{"auth": {{"token_sha256": "{}"}}, "upstream_proxy": {{"url": "http://127.0.0.1:{}", "auth": {{"username": "agent", "password_file": "/etc/shadow"}}}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["api.test:*"]}}}}}}"#,
        sha("rt-token"),
        e.squid.port
    );
    let (status, resp) = admin_req(
        p.admin,
        "PUT",
        "/v1/sandboxes/rt",
        &body,
        Some("per-sandbox-admin"),
    );
    assert_eq!(status, 400, "{resp}");
    assert!(resp.contains("upstream_proxy.auth"), "{resp}");
    assert!(!resp.contains("root:"), "{resp}");
    // Nor a CA file: the answer must not tell whether it exists or what it holds.
    let with_ca = body.replace(
        r#""auth": {"username": "agent", "password_file": "/etc/shadow"}"#,
        r#""ca_file": "/etc/shadow""#,
    );
    let (status, resp) = admin_req(
        p.admin,
        "PUT",
        "/v1/sandboxes/rt",
        &with_ca,
        Some("per-sandbox-admin"),
    );
    assert_eq!(status, 400, "{resp}");
    assert!(resp.contains("upstream_proxy.ca_file"), "{resp}");
    assert!(!resp.contains("root:"), "{resp}");
    let body = body.replace(
        r#", "auth": {"username": "agent", "password_file": "/etc/shadow"}"#,
        "",
    );
    let (status, resp) = admin_req(
        p.admin,
        "PUT",
        "/v1/sandboxes/rt",
        &body,
        Some("per-sandbox-admin"),
    );
    assert_eq!(status, 201, "{resp}");

    // `direct` opts a sandbox out of a top-level parent.
    let d2 = e.dir.path().join("direct");
    std::fs::create_dir_all(&d2).unwrap();
    std::fs::write(d2.join("parent.pw"), PASSWORD).unwrap();
    let p2 = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .dns("timeout_ms", "500")
        .host("other.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .raw(&format!(
            "upstream_proxy: {{ {}, auth: {{ username: agent, password_file: {} }} }}",
            e.parent(),
            d2.join("parent.pw").display()
        ))
        .sandbox(
            SandboxSpec::new("s")
                .source("127.0.0.0/8")
                .entry("upstream_proxy", "direct")
                .allow("other.test:*"),
        )
        .start(&d2);
    let out = e.via(&p2, &format!("https://other.test:{hp}/direct"));
    assert!(
        out.text().contains("hello from origin /direct"),
        "{} {}",
        out.text(),
        out.stderr
    );
    let rec = p2.wait_record(|r| r["target_host"] == "other.test");
    assert_eq!(rec["dialed"], format!("127.0.0.1:{hp}"), "{rec}");
    // A later tunnel through the parent is in Squid's log: by then it would have logged the
    // direct one, had it seen it.
    let via_parent = e.proxy("marker", PASSWORD, GUARD);
    let marker = e.via(&via_parent, &format!("https://api.test:{hp}/marker"));
    assert!(marker.text().contains("/marker"), "{}", marker.stderr);
    // (The `via` sandbox's tunnel above was the first.)
    let log = e
        .squid
        .log_when(|l| l.matches("CONNECT api.test").count() >= 2);
    assert_eq!(log.matches("CONNECT api.test").count(), 2, "{log}");
    assert!(!log.contains("other.test"), "{log}");
}

/// A Squid configured as corporate parents usually are (`http_access deny CONNECT
/// !SSL_ports`) refuses a CONNECT to port 80: plain HTTP goes to it as requests in absolute
/// form, with the parent's credentials, one after another on one kept connection (Squid logs
/// each URL with the same source port of this proxy). A CONNECT to another port is still
/// refused by that Squid, and is `upstream_proxy_refused` here.
#[test]
fn plain_http_goes_to_a_corporate_parent_as_requests_on_one_kept_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let https = Origin::start(Some(&ca));
    let http = Origin::start(None);
    let rules =
        "acl SSL_ports port 443\nacl CONNECT method CONNECT\nhttp_access deny CONNECT !SSL_ports";
    let squid = Squid::start_with(dir.path(), None, rules);
    let e = Env {
        dir,
        ca,
        https,
        http,
        squid,
    };
    let p = e.proxy("corporate", PASSWORD, GUARD);
    let pp = e.http.addr.port();
    for path in ["/one", "/two", "/three?q=1"] {
        let out = e.via(&p, &format!("http://plain.test:{pp}{path}"));
        assert!(
            out.text().contains(&format!("hello from origin {path}")),
            "{} {}",
            out.text(),
            out.stderr
        );
    }
    let log = e
        .squid
        .log_when(|l| l.contains(&format!("GET http://plain.test:{pp}/three?q=1")));
    let ports: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("GET http://plain.test:{pp}/")))
        .map(|l| l.split_whitespace().nth(1).unwrap_or(""))
        .collect();
    assert_eq!(ports.len(), 3, "{log}");
    assert!(
        ports.iter().all(|p| *p == ports[0]),
        "one kept connection to the parent: {log}"
    );
    assert!(!log.contains("CONNECT"), "{log}");
    // The records say so.
    let rec = p.wait_record(|r| {
        r["target_host"] == "plain.test" && r["detail"].as_str().is_some_and(|d| d.contains("kept"))
    });
    assert_eq!(rec["decision"], "allow", "{rec}");
    // A tunnel to a port that Squid refuses to CONNECT to: the parent's refusal, said so.
    let hp = e.https.addr.port();
    let out = e.via(&p, &format!("https://api.test:{hp}/"));
    let all = format!("{}{}", out.text(), out.stderr);
    assert!(all.contains("upstream_proxy_refused"), "{all}");
    let rec = p.wait_record(|r| r["target_host"] == "api.test");
    assert!(
        rec["detail"].as_str().unwrap_or("").contains("403"),
        "{rec}"
    );
}
