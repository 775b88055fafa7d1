//! The console (issue 66) through the real binary: `tests/console/drive.py` drives it in
//! headless Chromium (Debian's chromium and chromium-driver, Selenium from PyPI) — sign-in,
//! a refusal in *Live* and an access request in *Inbox* within a second, a hostile reason
//! shown inert, an approval for 5 s that lets the sandbox through and ends, the grant in
//! *Grants*, the usage chart equal to `/v1/usage`, the trail verified on *Audit*, a viewer
//! without buttons whose forged POST is refused, a POST without the CSRF token refused. Here,
//! with curl: the security headers, the cookie's flags, sign-in refused across sites, and
//! sign-in with a client certificate on the TLS admin listener (`Secure` cookie). Fails,
//! never skips, when Chromium, its driver or Selenium is missing.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const ADMIN_TOKEN: &str = "console-admin-token-0123456789";
const ALICE: &str = "alice-approver-token-0123456789";
const VERA: &str = "vera-viewer-token-0123456789ab";

/// `config` with the console: alice approves, vera views, and `more` users (YAML flow maps).
fn console(d: &Path, more: &[&str], config: ProxyConfig) -> ProxyConfig {
    std::fs::write(d.join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
    std::fs::write(d.join("alice.token"), format!("{ALICE}\n")).unwrap();
    std::fs::write(d.join("vera.token"), VERA).unwrap();
    let mut users = vec![
        format!(
            "{{ name: alice, role: approver, token_file: {} }}",
            d.join("alice.token").display()
        ),
        format!(
            "{{ name: vera, role: viewer, token_file: {} }}",
            d.join("vera.token").display()
        ),
    ];
    users.extend(more.iter().map(|u| u.to_string()));
    config
        .admin_token_file(&d.join("admin.token"))
        .raw(&format!(
            "admin: {{ console: true, session_ttl_s: 600, users: [{}] }}",
            users.join(", ")
        ))
}

/// A sign-in's answer (`curl -i`): the session cookie (`name=value`) and the session's place
/// (`/ui/s/{place}/`), where its pages are.
fn session_of(answer: &str) -> (String, String) {
    let header = |name: &str| {
        answer
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in {answer}"))
            .to_string()
    };
    let cookie = header("set-cookie: ");
    let cookie = cookie.split(';').next().unwrap().trim().to_string();
    let inbox = header("location: ");
    let base = inbox
        .strip_suffix("inbox")
        .unwrap_or_else(|| panic!("{inbox}"));
    (cookie, base.to_string())
}

/// An Ed25519 key pair made by openssl: the private key's path (the public key is beside
/// it, `audit.pub.pem`).
fn signing_key(d: &Path) -> std::path::PathBuf {
    let sk = d.join("audit.pem");
    let run = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .current_dir(d)
            .status()
            .expect("openssl")
            .success();
        assert!(ok, "openssl {args:?}");
    };
    run(&["genpkey", "-algorithm", "ed25519", "-out", "audit.pem"]);
    run(&[
        "pkey",
        "-pubout",
        "-in",
        "audit.pem",
        "-out",
        "audit.pub.pem",
    ]);
    sk
}

#[test]
fn a_person_approves_in_the_console_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::generate(d);
    let https = Origin::start(Some(&ca));
    let config = ["granted.test", "blocked.test", "other.test", "api.test"]
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
        .audit("chain: true")
        .audit(&format!("signing_key_file: {}", signing_key(d).display()))
        .raw(&format!("state_dir: {}", d.join("state").display()))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("agent")
                .token("tok-agent")
                .limits("{ requests_per_day: 40, bytes_per_day: 100000 }")
                .allow("api.test:*"),
        );
    let proxy = console(d, &[], config).start(d);
    // Some traffic the usage chart counts before the browser looks.
    let px = format!("http://agent:tok-agent@{}", proxy.proxy);
    let cacert = ca.ca_pem.display().to_string();
    let url = format!("https://api.test:{}/hello", https.addr.port());
    assert_eq!(curl(&["-x", &px, "--cacert", &cacert, &url]).code, 0);

    let shots = std::env::var("CONSOLE_SCREENSHOTS")
        .unwrap_or_else(|_| d.join("screenshots").display().to_string());
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/console/drive.py"
        ))
        .env("ADMIN", format!("http://{}", proxy.admin))
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .env("ALICE_TOKEN", ALICE)
        .env("VERA_TOKEN", VERA)
        .env("PROXY", &px)
        .env("ORIGIN_PORT", https.addr.port().to_string())
        .env("CACERT", &cacert)
        .env("CONSOLE_SCREENSHOTS", &shots)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser run failed (needs chromium, chromium-driver and selenium: tests/run installs them)\n{stdout}\n{stderr}"
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    eprintln!("console: {summary}");
    assert_eq!(summary["ok"], true, "{summary}");
    for page in ["sign-in", "live", "inbox", "grants", "sandbox", "audit"] {
        let png = std::fs::read(Path::new(&shots).join(format!("{page}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{page}.png is a PNG");
    }

    // The approval names the signed-in principal, never a token.
    let approved = proxy
        .wait_record(|r| r["approval"]["step"] == "approved" && r["approval"]["by"] == "console");
    assert_eq!(
        approved["approval"]["credential"], "console alice (approver, token)",
        "{approved}"
    );
    assert_eq!(approved["approval"]["text"], "for the docs, 5 s");
    let trail = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    for secret in [ADMIN_TOKEN, ALICE, VERA] {
        assert!(!trail.contains(secret), "a token in the trail");
        assert!(!proxy.stderr_text().contains(secret), "a token in the log");
    }
    // The trail the console said verifies, verifies.
    let verify = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["audit", "verify", "--open-run", "--public-key"])
        .arg(d.join("audit.pub.pem"))
        .arg(d.join("audit.jsonl"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
}

/// Headers, flags and refusals a browser does not show: read with curl.
#[test]
fn console_headers_cookies_csrf_and_certificate_sign_in() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server = Pki::new(d, "adminca");
    server.issue(
        "server",
        "egress-proxy admin",
        vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())],
    );
    let clients = Pki::new(d, "clients");
    let (cc, ck) = clients.issue("carol", "carol", vec![]);
    let config = ProxyConfig::new().listen_at(
        "admin_tls",
        "{ cert_file: server.pem, key_file: server.key, client_ca_file: clients-ca.pem }",
    );
    let carol = "{ name: carol, role: approver, certificate: \"CN=carol\" }";
    let proxy = console(d, &[carol], config).start(d);
    let base = format!("https://127.0.0.1:{}", proxy.admin.port());
    let tls = [
        "--cacert",
        server.ca_pem.to_str().unwrap(),
        "--cert",
        cc.to_str().unwrap(),
        "--key",
        ck.to_str().unwrap(),
    ];
    let call = |extra: &[&str], path: &str| -> String {
        let mut args: Vec<&str> = tls.to_vec();
        args.extend(["-i"]);
        args.extend(extra);
        let url = format!("{base}{path}");
        args.push(&url);
        curl(&args).text()
    };
    // The sign-in page offers the certificate's user; headers on every console answer.
    let page = call(&[], "/ui/login");
    assert!(
        page.contains("Sign in as carol (client certificate)"),
        "{page}"
    );
    let lower = page.to_ascii_lowercase();
    for h in [
        "content-security-policy: default-src 'none'; script-src 'self'",
        "x-frame-options: deny",
        "x-content-type-options: nosniff",
        "cache-control: no-store",
    ] {
        assert!(lower.contains(h), "{h}: {page}");
    }
    assert!(!page.contains("<script>"), "no inline script: {page}");
    // Signed out, a page sends to sign-in; a form is refused.
    assert!(call(&[], "/ui/inbox").contains("location: /ui/login"));
    assert!(call(
        &["-X", "POST", "-d", "csrf=x"],
        "/ui/requests/r-0123456789ab/deny"
    )
    .contains(" 401 "));
    // A sign-in from another site is refused (login CSRF).
    let cross = call(
        &[
            "-d",
            "with=certificate",
            "-H",
            "Origin: https://evil.example",
        ],
        "/ui/login",
    );
    assert!(cross.contains(" 403 "), "{cross}");
    // A wrong token: refused, and nothing set.
    let wrong = call(&["-d", "token=not-a-users-token"], "/ui/login");
    assert!(
        wrong.contains(" 401 ") && !wrong.contains("set-cookie"),
        "{wrong}"
    );
    // The certificate signs carol in: a Secure, HttpOnly, SameSite=Strict session cookie,
    // sent back only under the session's place.
    let ok = call(&["-d", "with=certificate"], "/ui/login");
    let (session, place) = session_of(&ok);
    assert!(
        place.starts_with("/ui/s/") && place.len() == "/ui/s/".len() + 33,
        "{place}"
    );
    let cookie = ok
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("{ok}"));
    let path = format!("Path={place};");
    for flag in [
        "HttpOnly",
        "SameSite=Strict",
        "Secure",
        &path,
        "Max-Age=600",
    ] {
        assert!(cookie.contains(flag), "{flag}: {cookie}");
    }
    let inbox = call(
        &["-H", &format!("Cookie: {session}")],
        &format!("{place}inbox"),
    );
    assert!(
        inbox.contains(" 200 ") && inbox.contains("carol · approver"),
        "{inbox}"
    );
    assert!(
        inbox.contains(&format!("<base href=\"{place}\">")),
        "{inbox}"
    );
    // The cookie alone, as a page on another port of this host would get it, opens nothing:
    // not the pages outside the place, not another place.
    let other_place = format!("/ui/s/{}/inbox", "0".repeat(32));
    for path in ["/ui/inbox", other_place.as_str()] {
        let r = call(&["-H", &format!("Cookie: {session}")], path);
        assert!(
            r.contains(" 303 ") && r.contains("location: /ui/login"),
            "{path}: {r}"
        );
    }
    // The CSRF token is required, and another session's does not do.
    let no_csrf = call(
        &["-H", &format!("Cookie: {session}"), "-d", "note=x"],
        &format!("{place}requests/r-0123456789ab/deny"),
    );
    assert!(
        no_csrf.contains(" 403 ") && no_csrf.contains("CSRF"),
        "{no_csrf}"
    );
    // The admin API is unchanged: the cookie is not a bearer token.
    let api = call(&["-H", &format!("Cookie: {session}")], "/v1/sandboxes");
    assert!(api.contains(" 401 "), "{api}");
    // Without `admin.console`, /ui/ is not there.
    let other = tempfile::tempdir().unwrap();
    let off = ProxyConfig::new().start(other.path());
    let r = curl(&["-i", &format!("http://{}/ui/login", off.admin)]).text();
    assert!(r.contains(" 404 ") && r.contains("admin.console"), "{r}");
}

/// A layer names its approvers: another approver sees the request without the forms, and its
/// answer is refused (403, naming the layer); the named approver answers it.
#[test]
fn a_layer_names_who_may_answer_for_its_members() {
    const BOB: &str = "bob-approver-token-0123456789ab";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("bob.token"), BOB).unwrap();
    ca_init(&d.join("ica"));
    let bob = format!(
        "{{ name: bob, role: approver, token_file: {} }}",
        d.join("bob.token").display()
    );
    let config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("docs.test", "127.0.0.1")
        .intercept_only(&d.join("ica"))
        .raw(r#"layers: [{ id: org, ceiling: ["api.test", "docs.test"] }, { id: team-a, parent: org, approvers: [alice] }]"#)
        .sandbox(
            SandboxSpec::new("agent")
                .entry("layer", "team-a")
                .token("tok-agent")
                .limits("{ requests_per_day: 7 }")
                .allow("api.test")
                .network(
                    "http",
                    r#"[{ host: api.test, methods: [GET], paths: ["/docs/**"] }]"#,
                ),
        );
    let proxy = console(d, &[&bob], config).start(d);
    let px = format!("http://agent:tok-agent@{}", proxy.proxy);
    let asked = curl(&[
        "-x",
        &px,
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        r#"{"host": "docs.test", "port": 443, "reason": "docs"}"#,
        "http://egress-proxy.local/v1/requests",
    ])
    .text();
    let id = serde_json::from_str::<Value>(&asked).unwrap()["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{asked}"))
        .to_string();
    let admin = format!("http://{}", proxy.admin);
    // Sign in with a token: the session cookie, its place and the inbox's CSRF token.
    let sign_in = |token: &str| -> (String, String, String) {
        let r = curl(&[
            "-i",
            "-d",
            &format!("token={token}"),
            &format!("{admin}/ui/login"),
        ])
        .text();
        let (cookie, place) = session_of(&r);
        let inbox = curl(&[
            "-H",
            &format!("Cookie: {cookie}"),
            &format!("{admin}{place}inbox"),
        ])
        .text();
        let csrf = inbox
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap_or_else(|| panic!("{inbox}"))
            .to_string();
        (cookie, place, csrf)
    };
    let approve = |(cookie, place, csrf): &(String, String, String)| -> String {
        let url = format!("{admin}{place}requests/{id}/approve");
        let body = format!("csrf={csrf}&grant=ttl&ttl_s=60");
        curl(&["-i", "-H", &format!("Cookie: {cookie}"), "-d", &body, &url]).text()
    };
    let bob = sign_in(BOB);
    let inbox = curl(&[
        "-H",
        &format!("Cookie: {}", bob.0),
        &format!("{admin}{}inbox", bob.1),
    ])
    .text();
    assert!(inbox.contains(&format!("req-{id}")), "{inbox}");
    assert!(!inbox.contains("button class=\"approve\""), "{inbox}");
    assert!(
        inbox.contains("layer team-a names who may answer"),
        "{inbox}"
    );
    let refused = approve(&bob);
    assert!(
        refused.contains(" 403 ") && refused.contains("layer team-a"),
        "{refused}"
    );
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let r = curl(&["-H", &bearer, &format!("{admin}/v1/requests/{id}")]).text();
    assert_eq!(
        serde_json::from_str::<Value>(&r).unwrap()["state"],
        "pending",
        "{r}"
    );
    let alice = sign_in(ALICE);
    let ok = approve(&alice);
    let back = format!("location: {}inbox", alice.1);
    assert!(ok.contains(" 303 ") && ok.contains(&back), "{ok}");
    let grant = proxy.wait_record(|r| r["approval"]["step"] == "approved");
    assert_eq!(
        grant["approval"]["credential"],
        "console alice (approver, token)"
    );
    // The sandbox's page shows its whole effective policy: the per-request rules, the
    // limits, the layers and the grant just given, with who gave it.
    let page = curl(&[
        "-H",
        &format!("Cookie: {}", alice.0),
        &format!("{admin}{}sandboxes/agent", alice.1),
    ])
    .text();
    for shown in [
        "/docs/**",
        "requests_per_day",
        "Layer team-a",
        "docs.test",
        "by console alice",
    ] {
        assert!(page.contains(shown), "{shown}: {page}");
    }
}

/// One user's sign-ins never sign another out (1,025 of them); the 11th wrong token from an
/// address in a second is `429` with `Retry-After`; the *Audit* page says plainly that the
/// chain is off when it is; `validate` refuses a user token `run` would refuse.
#[test]
fn sign_ins_are_bounded_per_user_and_per_address() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = console(d, &[], ProxyConfig::new());
    let proxy = config.start(d);
    let admin = format!("http://{}", proxy.admin);
    let login = format!("{admin}/ui/login");
    let sign_in = |token: &str| curl(&["-i", "-d", &format!("token={token}"), &login]).text();
    let alice = session_of(&sign_in(ALICE));
    let vera = session_of(&sign_in(VERA));
    let page = |(cookie, place): &(String, String), name: &str| {
        let url = format!("{admin}{place}{name}");
        curl(&["-i", "-H", &format!("Cookie: {cookie}"), &url]).text()
    };
    assert!(page(&vera, "inbox").contains(" 200 "));
    // 1,025 more sign-ins of vera, in one curl: each URL is one POST.
    let mut args = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}\n", "-d"];
    let field = format!("token={VERA}");
    args.push(&field);
    let urls = vec![login.as_str(); 1025];
    args.extend(urls);
    let codes = curl(&args).text();
    let count = |c: &str| codes.lines().filter(|l| *l == c).count();
    assert_eq!(count("303") + count("429"), 1025, "{codes}");
    assert!(count("429") > 0, "one user's sign-ins are rate-limited");
    // vera's oldest sessions were closed for her new ones; alice's never.
    let alice_inbox = page(&alice, "inbox");
    assert!(
        alice_inbox.contains(" 200 ") && alice_inbox.contains("alice · approver"),
        "{alice_inbox}"
    );
    assert!(page(&vera, "inbox").contains("location: /ui/login"));
    // The chain is off (the default): the Audit page says so, not that the trail fails.
    let audit = page(&alice, "audit");
    assert!(audit.contains("Chain off"), "{audit}");
    assert!(!audit.contains("does not verify"), "{audit}");
    // Wrong tokens: ten are refused 401, the eleventh waits (429, Retry-After), right or not.
    for i in 0..10 {
        let r = sign_in("not-a-users-token-0123456789");
        assert!(r.contains(" 401 "), "attempt {i}: {r}");
    }
    let r = sign_in("not-a-users-token-0123456789");
    assert!(r.contains(" 429 ") && r.contains("retry-after: "), "{r}");
    let r = sign_in(ALICE);
    assert!(
        r.contains(" 429 ") && !r.contains("set-cookie"),
        "checked before the token: {r}"
    );
    // `validate` refuses what `run` refuses: a user token under 16 characters.
    std::fs::write(d.join("vera.token"), "short").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["validate", "--config"])
        .arg(d.join("proxy.yaml"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("fewer than 16"), "{said}");
}

/// A console over sandbox `agent` (token `tok-agent`) with a `private` label on
/// `origin.test:port`, already armed by a GET of `/doc` from the origin on `port`.
fn flows_console(d: &Path, port: u16) -> Proxy {
    let config = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("origin.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("agent")
                .token("tok-agent")
                .allow(&format!("origin.test:{port}"))
                .network(
                    "flows",
                    "{ labels: { private: [origin.test] }, rules: [{ name: no-exfil, after: [private], refuse: writes, except: [private] }] }",
                ),
        );
    let proxy = console(d, &[], config).start(d);
    let px = format!("http://agent:tok-agent@{}", proxy.proxy);
    let url = format!("http://origin.test:{port}/doc");
    assert!(curl(&["-s", "-x", &px, &url])
        .text()
        .contains("hello from origin"));
    proxy
}

/// Flow rules (issue 93) in the console: a sandbox's page shows the labels armed on it, what
/// armed each and when, to a viewer.
#[test]
fn the_sandbox_page_shows_its_flow_labels_and_what_armed_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let proxy = flows_console(d, port);
    let admin = format!("http://{}", proxy.admin);
    let signed = curl(&[
        "-i",
        "-d",
        &format!("token={VERA}"),
        &format!("{admin}/ui/login"),
    ])
    .text();
    let (cookie, place) = session_of(&signed);
    let page = curl(&[
        "-H",
        &format!("Cookie: {cookie}"),
        &format!("{admin}{place}sandboxes/agent"),
    ])
    .text();
    for shown in [
        "Flow labels",
        "<code>private</code>",
        "<code>GET origin.test/doc</code>",
    ] {
        assert!(page.contains(shown), "{shown}: {page}");
    }
}

/// An approver waives a flow label from the sandbox's page (a form with the CSRF token):
/// the label is reset, and the trail records who gave it; a viewer's form is refused.
#[test]
fn an_approver_resets_a_flow_label_from_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let origin = Origin::start(None);
    let port = origin.addr.port();
    let proxy = flows_console(d, port);
    let admin = format!("http://{}", proxy.admin);
    let session = |token: &str| {
        let signed = curl(&[
            "-i",
            "-d",
            &format!("token={token}"),
            &format!("{admin}/ui/login"),
        ])
        .text();
        let (cookie, place) = session_of(&signed);
        let page = curl(&[
            "-H",
            &format!("Cookie: {cookie}"),
            &format!("{admin}{place}sandboxes/agent"),
        ])
        .text();
        let csrf = page
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_string();
        (cookie, place, csrf, page)
    };
    let post = |(cookie, place, csrf): (&str, &str, &str)| {
        curl(&[
            "-i",
            "-H",
            &format!("Cookie: {cookie}"),
            "-H",
            &format!("Origin: {admin}"),
            "-d",
            &format!("csrf={csrf}&label=private&how=reset"),
            &format!("{admin}{place}sandboxes/agent/flows/waive"),
        ])
        .text()
    };
    let (cookie, place, csrf, page) = session(VERA);
    assert!(
        !page.contains("Waive once"),
        "a viewer gets no form: {page}"
    );
    assert!(
        post((&cookie, &place, &csrf)).contains(" 403 "),
        "a viewer's post"
    );
    let (cookie, place, csrf, page) = session(ALICE);
    assert!(
        page.contains("Waive once") && page.contains("Reset"),
        "{page}"
    );
    let done = post((&cookie, &place, &csrf));
    assert!(done.contains(" 303 "), "{done}");
    let page = curl(&[
        "-H",
        &format!("Cookie: {cookie}"),
        &format!("{admin}{place}sandboxes/agent"),
    ])
    .text();
    assert!(page.contains("none armed"), "{page}");
    let step = proxy.wait_record(|r| r["approval"]["step"] == "flow_reset");
    assert_eq!(step["approval"]["by"], "console", "{step}");
    assert_eq!(step["sandbox"], "agent", "{step}");
}
