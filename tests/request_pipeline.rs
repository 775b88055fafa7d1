//! The one request pipeline (issue 58), tried as a sandboxed client would through the real
//! binary, against a real origin (Python's `http.server`, `tests/data/judged_origin.py`, which
//! logs every request it gets and reads a GraphQL form body as graphene-django does):
//! `network.http` rules hold on forwarded plain HTTP as on terminated hosts (HTTP/1.1 with curl,
//! HTTP/2 with hyper's client on the TLS listener); a sandbox's own identity header never
//! passes; a GraphQL body is read as its media type says or refused; a body on GET is refused
//! on a judged host; a plain rule cannot skip a GraphQL rule on its path.

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};

/// The judged origin (plain, or TLS under `ca`) and the file it logs requests to.
struct JudgedOrigin {
    origin: ScriptOrigin,
    log: PathBuf,
}

impl JudgedOrigin {
    fn start(dir: &Path, ca: Option<&TestCa>) -> JudgedOrigin {
        let log = dir.join("origin.log");
        std::fs::write(&log, "").unwrap();
        let mut args = vec![log.as_os_str()];
        if let Some(ca) = ca {
            args.push(ca.cert_pem.as_os_str());
            args.push(ca.key_pem.as_os_str());
        }
        JudgedOrigin {
            origin: ScriptOrigin::start("judged_origin.py", &args),
            log,
        }
    }

    /// Every request the origin got, in order.
    fn seen(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn port(&self) -> u16 {
        self.origin.port
    }
}

/// A proxy for sandbox `s` (token `s-token`) allowed to reach `api.test` on `port`, with these
/// `network.http` rules and what `sandbox` adds to its entry; `listen.proxy_tls` and `tls_intercept`
/// (rules name terminated hosts) too.
fn proxy(dir: &Path, port: u16, http: &str, sandbox: fn(SandboxSpec) -> SandboxSpec) -> Proxy {
    proxy_to(dir, None, port, http, sandbox)
}

/// [`proxy`], trusting `upstream` (the test CA of a TLS origin) for terminated hosts.
fn proxy_to(
    dir: &Path,
    upstream: Option<&TestCa>,
    port: u16,
    http: &str,
    sandbox: fn(SandboxSpec) -> SandboxSpec,
) -> Proxy {
    ca_init(&dir.join("ica"));
    let s = SandboxSpec::new("s")
        .token("s-token")
        .allow(&format!("api.test:{port}"))
        .network("http", http);
    let config = ProxyConfig::new()
        .socks5()
        .listen_at(
            "proxy_tls",
            "{ addr: 127.0.0.1:0, cert_file: server.pem, key_file: server.key }",
        )
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(sandbox(s));
    match upstream {
        Some(ca) => config.intercept(&dir.join("ica"), &ca.ca_pem),
        None => config.intercept_only(&dir.join("ica")),
    }
    .start(dir)
}

/// curl through `p` as sandbox `s`: (status, body).
fn through(p: &Proxy, args: &[&str]) -> (u16, String) {
    let proxy = format!("http://s:s-token@{}", p.proxy);
    let mut all = vec!["-x", &proxy, "-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(&all);
    let text = out.text();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

const GET_OK_ONLY: &str = r#"[{ host: api.test, methods: [GET], paths: ["/ok/**"] }]"#;

#[test]
fn forwarded_plain_http_is_held_to_the_hosts_method_and_path_rules() {
    let dir = tempfile::tempdir().unwrap();
    let origin = JudgedOrigin::start(dir.path(), None);
    let port = origin.port();
    proxy_certificate(dir.path());
    let p = proxy(dir.path(), port, GET_OK_ONLY, |s| s);
    let url = |path: &str| format!("http://api.test:{port}{path}");

    let (status, body) = through(&p, &[&url("/ok/a")]);
    assert_eq!(status, 200, "{body}");
    // Each of these reached the origin on the old code (only the host was decided).
    for (what, args) in [
        ("another path", vec![url("/secret")]),
        (
            "another method",
            vec!["-d".into(), "x=1".into(), url("/ok/a")],
        ),
        (
            "a dot segment",
            vec!["--path-as-is".into(), url("/ok/../secret")],
        ),
        ("an encoded dot segment", vec![url("/ok/%2e%2e/secret")]),
        (
            "a body on GET",
            vec![
                "-X".into(),
                "GET".into(),
                "-d".into(),
                "x".into(),
                url("/ok/a"),
            ],
        ),
        (
            "an override header",
            vec![
                "-H".into(),
                "X-HTTP-Method-Override: DELETE".into(),
                url("/ok/a"),
            ],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, body) = through(&p, &args);
        assert_eq!(status, 403, "{what}: {body}");
        assert!(body.contains("http_not_allowed"), "{what}: {body}");
    }
    let seen = origin.seen();
    assert_eq!(
        seen.len(),
        1,
        "only the allowed request reached the origin: {seen:?}"
    );
    assert_eq!(seen[0]["path"], "/ok/a");
    let rec = p.wait_record(|r| r["path"] == "/secret");
    assert_eq!(rec["decision"], "deny", "{rec}");
    assert_eq!(rec["reason"], "http_not_allowed", "{rec}");
    assert_eq!(rec["mode"], "http", "{rec}");
}

#[test]
fn forwarded_plain_http_over_http2_is_held_to_the_same_rules() {
    let dir = tempfile::tempdir().unwrap();
    let origin = JudgedOrigin::start(dir.path(), None);
    let port = origin.port();
    let roots = proxy_certificate(dir.path());
    let p = proxy(dir.path(), port, GET_OK_ONLY, |s| s);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let statuses = rt.block_on(async {
        let mut h2 = connect_h2::<Full<Bytes>>(p.proxy_tls.expect("proxy_tls"), roots).await;
        let mut out = Vec::new();
        for (method, path, body) in [
            ("GET", "/ok/a", ""),
            ("GET", "/secret", ""),
            ("POST", "/ok/a", "x=1"),
            ("GET", "/ok/%2e%2e/secret", ""),
            ("GET", "/ok/a", "a body on GET"),
        ] {
            let req = http::Request::builder()
                .method(method)
                .uri(format!("http://api.test:{port}{path}"))
                .header("proxy-authorization", basic("s", "s-token"))
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            h2.ready().await.unwrap();
            let resp = h2.send_request(req).await.unwrap();
            let status = resp.status().as_u16();
            let _ = resp.into_body().collect().await;
            out.push(status);
        }
        out
    });
    assert_eq!(statuses, [200, 403, 403, 403, 403]);
    let seen = origin.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["path"], "/ok/a");
}

#[test]
fn a_sandboxs_own_identity_header_never_passes_on_forwarded_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let origin = JudgedOrigin::start(dir.path(), None);
    let port = origin.port();
    proxy_certificate(dir.path());
    let p = proxy(dir.path(), port, "[]", |s| {
        s.entry("identity_token", "{ hosts: [api.test] }")
    });
    let url = format!("http://api.test:{port}/whoami");
    let (status, body) = through(&p, &["-H", "X-Sandbox-Identity: eyJ.forged.jwt", &url]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("credential_misuse"), "{body}");
    // Without it the request is refused too: plain HTTP to the identity host gets one answer
    // on every path, as inside a tunnel (issue 90; it used to go out without an identity).
    let (status, body) = through(&p, &[&url]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("identity token"), "{body}");
    assert!(origin.seen().is_empty(), "{:?}", origin.seen());
}

const GRAPHQL_READ_ONLY: &str = r#"[{ host: api.test, paths: [/graphql], protocol: graphql, operations: [query] }, { host: api.test, methods: [GET] }]"#;

/// The body that is JSON to a proxy that ignores the media type and a form to the origin
/// (security review round B, B2).
const SMUGGLE: &str = r#"{"query":"{ viewer }","variables":{"x":"&query=mutation+{+deleteRepository(id:1)+{+ok+}+}&"}}"#;

#[test]
fn a_graphql_body_is_read_as_its_media_type_and_a_plain_rule_cannot_skip_the_graphql_rule() {
    let dir = tempfile::tempdir().unwrap();
    let origin = JudgedOrigin::start(dir.path(), None);
    let port = origin.port();
    proxy_certificate(dir.path());
    let p = proxy(dir.path(), port, GRAPHQL_READ_ONLY, |s| s);
    let url = format!("http://api.test:{port}/graphql");
    let (status, body) = through(
        &p,
        &[
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"query":"{ viewer }"}"#,
            &url,
        ],
    );
    assert_eq!(status, 200, "{body}");
    for (what, args) in [
        (
            "the form smuggle",
            vec![
                "-H",
                "Content-Type: application/x-www-form-urlencoded",
                "-d",
                SMUGGLE,
                &url,
            ],
        ),
        (
            "text/plain",
            vec!["-H", "Content-Type: text/plain", "-d", SMUGGLE, &url],
        ),
    ] {
        let (status, body) = through(&p, &args);
        assert_eq!(status, 403, "{what}: {body}");
        assert!(body.contains("graphql_not_allowed"), "{what}: {body}");
    }
    // A mutation by GET is the GraphQL rule's to judge, not the plain GET rule's (W2).
    let get =
        format!("{url}?query=mutation%20%7B%20deleteRepository(id%3A1)%20%7B%20ok%20%7D%20%7D");
    let (status, body) = through(&p, &[&get]);
    assert_eq!(status, 403, "{body}");
    let seen = origin.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["executed"], "query");
}

#[test]
fn a_terminated_graphql_form_smuggle_never_reaches_a_server_that_reads_forms() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::generate(dir.path());
    let origin = JudgedOrigin::start(dir.path(), Some(&ca));
    let port = origin.port();
    proxy_certificate(dir.path());
    let p = proxy_to(dir.path(), Some(&ca), port, GRAPHQL_READ_ONLY, |s| s);
    let url = format!("https://api.test:{port}/graphql");
    let cacert = dir.path().join("ica/ca.crt");
    let cacert = cacert.to_str().unwrap();
    // (The same on HTTP/2 streams, against an upstream that speaks h2: credentials.rs.)
    let (status, body) = through(
        &p,
        &[
            "--cacert",
            cacert,
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"query":"{ viewer }"}"#,
            &url,
        ],
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = through(
        &p,
        &[
            "--cacert",
            cacert,
            "-H",
            "Content-Type: application/x-www-form-urlencoded",
            "-d",
            SMUGGLE,
            &url,
        ],
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("graphql_not_allowed"), "{body}");
    let seen = origin.seen();
    assert_eq!(
        seen.len(),
        1,
        "only the JSON query reached the origin: {seen:?}"
    );
    assert!(seen.iter().all(|r| r["executed"] == "query"), "{seen:?}");
    let rec = p.wait_record(|r| r["reason"] == "graphql_not_allowed");
    assert_eq!(rec["mode"], "https", "{rec}");
}

/// Plain HTTP inside a CONNECT or SOCKS5 tunnel to a host with `network.http` rules: each
/// request on the kept connection is judged by the same rules (the old code reset such a
/// tunnel as `credential_misuse`, a misleading reason, and judged nothing).
#[test]
fn plain_http_inside_connect_and_socks5_tunnels_is_judged_request_by_request() {
    let dir = tempfile::tempdir().unwrap();
    let origin = JudgedOrigin::start(dir.path(), None);
    let port = origin.port();
    proxy_certificate(dir.path());
    let p = proxy(dir.path(), port, GET_OK_ONLY, |s| s);
    let ok = format!("http://api.test:{port}/ok/a");
    let secret = format!("http://api.test:{port}/secret");
    let connect = format!("http://s:s-token@{}", p.proxy);
    let socks = format!("socks5h://s:s-token@{}", p.socks5.expect("listen.socks5"));
    for (how, proxy_args) in [
        ("CONNECT", vec!["-p", "-x", connect.as_str()]),
        ("SOCKS5", vec!["-x", socks.as_str()]),
    ] {
        // Two requests on one connection: the first allowed, the second refused.
        let mut args = proxy_args.clone();
        args.extend([
            "-w",
            "%{http_code}\n",
            "-o",
            "/dev/null",
            &ok,
            "-o",
            "/dev/null",
            &secret,
        ]);
        let out = curl(&args);
        assert_eq!(out.text(), "200\n403\n", "{how}: {}", out.stderr);
        let mut args = proxy_args;
        args.extend(["-d", "x=1", &ok]);
        let body = curl(&args).text();
        assert!(body.contains("http_not_allowed"), "{how}: {body}");
    }
    let seen = origin.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|r| r["path"] == "/ok/a"), "{seen:?}");
    let rec = p.wait_record(|r| r["path"] == "/secret" && r["mode"] == "http");
    assert_eq!(rec["reason"], "http_not_allowed", "{rec}");
}

/// Rack (`MethodOverride`, the first middleware of every Rails app) behind WEBrick: the real
/// origin of review round 7a B5. Its port, the log of what it ran, and the process.
struct Rack {
    port: u16,
    log: std::path::PathBuf,
    child: std::process::Child,
}

impl Drop for Rack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Rack {
    fn start(dir: &Path) -> Rack {
        use std::io::BufRead;
        let log = dir.join("rack.log");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rack_origin.rb");
        let mut child = std::process::Command::new("ruby")
            .arg(script)
            .arg(&log)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ruby (tests/run installs ruby, ruby-rack and ruby-webrick)");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            panic!("rack_origin.rb printed no port (tests/run installs ruby-rack): {line:?}")
        });
        Rack { port, log, child }
    }

    fn ran(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Review round 7a B5: with `methods: [GET, POST]`, a POST whose form or multipart body
/// carries `_method=DELETE` ran `DELETE` in Rack — query and header overrides were refused,
/// the body was not read. Now the body of a form POST on a host whose rules name methods is
/// read and such a request refused, forwarded and inside a CONNECT tunnel alike; a form
/// without the field passes.
#[test]
fn a_method_override_in_a_form_body_is_refused_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let rack = Rack::start(dir.path());
    let port = rack.port;
    // Rack itself runs the override (so the test cannot pass by an origin that ignores it).
    let direct = curl(&[
        "-s",
        "-d",
        "_method=DELETE",
        &format!("http://127.0.0.1:{port}/items/1"),
    ]);
    assert_eq!(direct.text(), "method=DELETE path=/items/1\n");
    let before = rack.ran();
    proxy_certificate(dir.path());
    let rules = r#"[{ host: api.test, methods: [GET, POST], paths: ["/items/**"] }]"#;
    let p = proxy(dir.path(), port, rules, |s| s);
    let url = format!("http://api.test:{port}/items/1");
    for tunnel in [false, true] {
        for body in [
            vec!["-d", "_method=DELETE"],
            vec!["-d", "a=1&%5Fmethod=delete"],
            vec!["-F", "_method=DELETE"],
            vec!["-F", "file=@/dev/null", "-F", "_method=DELETE"],
        ] {
            let mut args = body.clone();
            if tunnel {
                args.push("-p");
            }
            args.push(&url);
            let (status, text) = through(&p, &args);
            assert_eq!(status, 403, "{body:?} tunnel {tunnel}: {text}");
        }
        let mut args = vec!["-d", "a=1&method=DELETE"];
        if tunnel {
            args.push("-p");
        }
        args.push(&url);
        let (status, text) = through(&p, &args);
        assert_eq!(
            (status, text.as_str()),
            (200, "method=POST path=/items/1\n")
        );
    }
    let ran = rack.ran();
    assert!(
        !ran[before.len()..].contains("DELETE"),
        "an override reached Rack: {ran}"
    );
    let refused = p
        .audit_records()
        .into_iter()
        .filter(|r| {
            r["reason"] == "http_not_allowed"
                && r["detail"].as_str().unwrap_or("").contains("_method")
        })
        .count();
    assert_eq!(refused, 8, "{:#?}", p.audit_records());
}
