//! Credential brokering end to end, with real TLS: an upstream with its own CA (HTTP/1.1 and
//! HTTP/2, recording what reaches it), an interception CA made by `egress-proxy ca init`,
//! curl (and a hyper HTTP/2 client for trailers) in the sandbox's role trusting that CA.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};

/// What reached the upstream: (host, method, path, version, authorization, x-api-key).
type Seen = Arc<Mutex<Vec<(String, String, String, String, String, String)>>>;

/// An HTTPS upstream (certificate from `ca`) speaking HTTP/1.1 and HTTP/2. `/grpc/...`
/// answers with trailers (`grpc-status: 0`); everything else `ok <path>`.
struct Upstream {
    addr: std::net::SocketAddr,
    seen: Seen,
    _rt: tokio::runtime::Runtime,
}

impl Upstream {
    fn start(ca: &TestCa) -> Upstream {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cfg = ca.server_config(&[b"h2", b"http/1.1"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let s2 = seen.clone();
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let seen = s2.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let seen = seen.clone();
                            async move {
                                let h = |n: &str| {
                                    req.headers()
                                        .get(n)
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or("")
                                        .to_string()
                                };
                                let host = req
                                    .uri()
                                    .host()
                                    .map(str::to_string)
                                    .unwrap_or_else(|| h("host"));
                                seen.lock().unwrap().push((
                                    host.split(':').next().unwrap_or("").to_string(),
                                    req.method().to_string(),
                                    req.uri().path().to_string(),
                                    format!("{:?}", req.version()),
                                    h("authorization"),
                                    h("x-api-key"),
                                ));
                                let path = req.uri().path().to_string();
                                if path.starts_with("/echo") {
                                    // Reflects what it got: the path and every header in the
                                    // body, Origin as Access-Control-Allow-Origin, and
                                    // Authorization as X-Echo-Auth.
                                    let mut text = format!("path={path}\n");
                                    for (n, v) in req.headers() {
                                        text.push_str(&format!(
                                            "{n}: {}\n",
                                            String::from_utf8_lossy(v.as_bytes())
                                        ));
                                    }
                                    let mut r = http::Response::new(
                                        Full::new(Bytes::from(text))
                                            .map_err(|never| match never {})
                                            .boxed(),
                                    );
                                    if let Some(o) = req.headers().get("origin") {
                                        r.headers_mut()
                                            .insert("access-control-allow-origin", o.clone());
                                    }
                                    if let Some(a) = req.headers().get("authorization") {
                                        r.headers_mut().insert("x-echo-auth", a.clone());
                                    }
                                    return Ok::<_, std::convert::Infallible>(r);
                                }
                                if path.starts_with("/v1/enc") || path.starts_with("/v1/gzip") {
                                    let auth = h("authorization");
                                    let secret = auth.strip_prefix("Bearer ").unwrap_or("");
                                    let mut r = if path.starts_with("/v1/gzip") {
                                        // Compressed although the proxy asked for identity.
                                        let mut r = http::Response::new(
                                            Full::new(Bytes::from(gzip(
                                                format!("token={secret}\n").as_bytes(),
                                            )))
                                            .map_err(|never| match never {})
                                            .boxed(),
                                        );
                                        r.headers_mut()
                                            .insert("content-encoding", "gzip".parse().unwrap());
                                        r
                                    } else {
                                        // The secret in the encodings the review found.
                                        let body = encoded_forms(secret).join("\n");
                                        let mut r = http::Response::new(
                                            Full::new(Bytes::from(body))
                                                .map_err(|never| match never {})
                                                .boxed(),
                                        );
                                        *r.status_mut() = http::StatusCode::FOUND;
                                        let location = format!(
                                            "https://cb.example/?token={}",
                                            encoded_forms(secret)[0]
                                        );
                                        r.headers_mut()
                                            .insert("location", location.parse().unwrap());
                                        r
                                    };
                                    r.headers_mut().insert("x-kind", "enc".parse().unwrap());
                                    return Ok::<_, std::convert::Infallible>(r);
                                }
                                if let Some(to) = path.strip_prefix("/v1/redirect-token/") {
                                    // A redirect to another host that carries the token it
                                    // got (an OAuth-style callback), in the path.
                                    let port = host_port(&h("host"), &req);
                                    let auth = h("authorization");
                                    let token = auth.strip_prefix("Bearer ").unwrap_or(&auth);
                                    let mut r = http::Response::new(
                                        Full::new(Bytes::new())
                                            .map_err(|never| match never {})
                                            .boxed(),
                                    );
                                    *r.status_mut() = http::StatusCode::FOUND;
                                    r.headers_mut().insert(
                                        "location",
                                        format!("https://{to}:{port}/v1/landing/{token}")
                                            .parse()
                                            .unwrap(),
                                    );
                                    return Ok::<_, std::convert::Infallible>(r);
                                }
                                if let Some(to) = path.strip_prefix("/v1/redirect/") {
                                    // A redirect to another host (same upstream, another name).
                                    let port = host_port(&h("host"), &req);
                                    let mut r = http::Response::new(
                                        Full::new(Bytes::new())
                                            .map_err(|never| match never {})
                                            .boxed(),
                                    );
                                    *r.status_mut() = http::StatusCode::FOUND;
                                    r.headers_mut().insert(
                                        "location",
                                        format!("https://{to}:{port}/v1/landing").parse().unwrap(),
                                    );
                                    return Ok::<_, std::convert::Infallible>(r);
                                }
                                if path.starts_with("/v1/trailer") {
                                    // Reflects Authorization in a response trailer.
                                    let mut trailers = http::HeaderMap::new();
                                    if let Some(a) = req.headers().get("authorization") {
                                        trailers.insert("x-echo-auth", a.clone());
                                    }
                                    let body = GrpcBody {
                                        step: 0,
                                        trailers: Some(trailers),
                                    };
                                    return Ok::<_, std::convert::Infallible>(http::Response::new(
                                        body.boxed(),
                                    ));
                                }
                                let _ = req.into_body().collect().await;
                                if path.starts_with("/grpc/") {
                                    let mut trailers = http::HeaderMap::new();
                                    trailers.insert("grpc-status", "0".parse().unwrap());
                                    let body = GrpcBody {
                                        step: 0,
                                        trailers: Some(trailers),
                                    };
                                    let mut r = http::Response::new(body.boxed());
                                    r.headers_mut().insert(
                                        "content-type",
                                        "application/grpc".parse().unwrap(),
                                    );
                                    return Ok::<_, std::convert::Infallible>(r);
                                }
                                let body = Full::new(Bytes::from(format!("ok {path}\n")))
                                    .map_err(|never| match never {})
                                    .boxed();
                                Ok(http::Response::new(body))
                            }
                        },
                    );
                    let io = hyper_util::rt::TokioIo::new(tls);
                    if h2 {
                        let _ = hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(io, svc)
                        .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, svc)
                            .await;
                    }
                });
            }
        });
        Upstream {
            addr,
            seen,
            _rt: rt,
        }
    }

    fn seen(&self) -> Vec<(String, String, String, String, String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// The port a request was sent to (from its URI or `Host`).
fn host_port(host: &str, req: &http::Request<hyper::body::Incoming>) -> u16 {
    req.uri()
        .port_u16()
        .or_else(|| host.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
        .unwrap_or(443)
}

/// `secret` partly percent-encoded (`-` as `%2D`, as Python's `quote()` keeps letters),
/// JSON `\uXXXX`-escaped, in hex (both cases), and upper-cased.
fn encoded_forms(secret: &str) -> Vec<String> {
    vec![
        secret.replace('-', "%2D"),
        secret
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
        hex::encode(secret),
        hex::encode(secret).to_uppercase(),
        secret.to_uppercase(),
        secret.replace('-', "%2d").replace('a', "%61"),
    ]
}

/// `data` gzip-compressed (the system's `gzip`).
fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = std::process::Command::new("gzip")
        .args(["-c", "-n"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    child.stdin.take().unwrap().write_all(data).unwrap();
    child.wait_with_output().unwrap().stdout
}

/// A gRPC-like response body: one data frame, then trailers.
struct GrpcBody {
    step: u8,
    trailers: Option<http::HeaderMap>,
}

impl hyper::body::Body for GrpcBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.step += 1;
        std::task::Poll::Ready(match self.step {
            1 => Some(Ok(hyper::body::Frame::data(Bytes::from_static(
                b"\0\0\0\0\x02hi",
            )))),
            2 => self
                .trailers
                .take()
                .map(|t| Ok(hyper::body::Frame::trailers(t))),
            _ => None,
        })
    }
}

const SECRET_API: &str = "sk-live-0123456789abcdefghijklmnopqrstuv";
const SECRET_OTHER: &str = "other-secret-ZYXWVUTSRQ";
const ADMIN: &str = "admin-token-for-credentials";

struct Env {
    dir: tempfile::TempDir,
    upstream: Upstream,
    upstream_ca: TestCa,
    proxy: Proxy,
    placeholders: serde_json::Value,
    /// The running configuration, as written.
    yaml: String,
}

const HTTP: &str =
    r#"[{ host: api.test, methods: [GET, POST], paths: ["/v1/**", "/grpc/**", "/echo/**"] }]"#;

fn env() -> Env {
    env_with("")
}

/// [`env`] with these `defaults.timeouts` (a YAML flow map) when not empty.
fn env_with(timeouts: &str) -> Env {
    env_of(timeouts, |s| s, HTTP)
}

/// [`env`], the sandbox as `sandbox` makes it.
fn env_full(sandbox: fn(SandboxSpec) -> SandboxSpec) -> Env {
    env_of("", sandbox, HTTP)
}

/// [`env`] with these `network.http` rules.
fn env_rules(http: &str) -> Env {
    env_of("", |s| s, http)
}

/// Sandbox `agent` (by source address) with its two credentials, reaching `hosts` on `port`,
/// with these `network.http` rules.
fn agent(port: u16, hosts: &[&str], http: &str) -> SandboxSpec {
    let agent = SandboxSpec::new("agent")
        .source("127.0.0.0/8")
        .credential("{ name: api, hosts: [api.test], inject: { header: Authorization, format: \"Bearer {secret}\" }, source: { file: api.secret } }")
        .credential("{ name: other, hosts: [other.test], inject: { replace_placeholder: { headers: [X-Api-Key, Authorization] } }, source: { env: OTHER_SECRET } }")
        .network("http", http);
    hosts
        .iter()
        .fold(agent, |a, h| a.allow(&format!("{h}:{port}")))
}

const HOSTS: [&str; 3] = ["api.test", "other.test", "mixed.test"];

/// The configuration around sandbox `agent`: its names on loopback, TLS terminated.
fn around(d: &Path, upstream_ca: &TestCa, timeouts: &str) -> ProxyConfig {
    let config = HOSTS
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
        .admin_token_file(Path::new("admin.token"))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .intercept(&d.join("ica"), &upstream_ca.ca_pem);
    if timeouts.is_empty() {
        config
    } else {
        config.defaults("timeouts", timeouts)
    }
}

fn env_of(timeouts: &str, sandbox: fn(SandboxSpec) -> SandboxSpec, http: &str) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca_init(&d.join("ica"));
    let upstream_ca = TestCa::generate(d);
    let upstream = Upstream::start(&upstream_ca);
    let port = upstream.addr.port();
    std::fs::write(d.join("admin.token"), ADMIN).unwrap();
    std::fs::write(d.join("api.secret"), format!("{SECRET_API}\n")).unwrap();
    let config = around(d, &upstream_ca, timeouts).sandbox(sandbox(agent(port, &HOSTS, http)));
    let yaml = config.yaml(&d.join("audit.jsonl"));
    let proxy = config.start_env(d, &[("OTHER_SECRET", SECRET_OTHER)]);
    let (status, body) = admin_req(
        proxy.admin,
        "GET",
        "/v1/sandboxes/agent/placeholders",
        "",
        Some(ADMIN),
    );
    assert_eq!(status, 200, "{body}");
    let placeholders: serde_json::Value = serde_json::from_str(&body).unwrap();
    Env {
        dir,
        upstream,
        upstream_ca,
        proxy,
        placeholders,
        yaml,
    }
}

impl Env {
    fn placeholder(&self, name: &str) -> String {
        self.placeholders["placeholders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["placeholder"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn ica(&self) -> String {
        self.dir.path().join("ica/ca.crt").display().to_string()
    }

    /// A CA bundle for a client that follows a terminated host (the interception CA's
    /// certificate) to a relayed one (its own): both CAs.
    fn both_cas(&self) -> std::path::PathBuf {
        let both = self.dir.path().join("both.pem");
        let pem = std::fs::read_to_string(self.ica()).unwrap()
            + &std::fs::read_to_string(&self.upstream_ca.ca_pem).unwrap();
        std::fs::write(&both, pem).unwrap();
        both
    }

    /// curl through the proxy to `https://host:port/path` trusting `ca`, with `extra` args.
    fn curl(&self, ca: &str, host: &str, path: &str, extra: &[&str]) -> CurlOut {
        let url = format!("https://{host}:{}{path}", self.upstream.addr.port());
        let px = format!("http://{}", self.proxy.proxy);
        let mut args = vec!["-sS", "-x", &px, "--cacert", ca];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args)
    }
}

#[test]
fn placeholders_become_secrets_only_on_their_hosts() {
    let e = env();
    let api = e.placeholder("api");
    let other = e.placeholder("other");
    assert_eq!(api.len(), SECRET_API.len());
    assert_ne!(api, SECRET_API);
    let ica = e.ica();

    // The placeholder goes to its host: the upstream receives the real secret.
    let auth = format!("Authorization: Bearer {api}");
    let out = e.curl(&ica, "api.test", "/v1/models", &["-H", &auth]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.text().contains("ok /v1/models"), "{}", out.text());
    let seen = e.upstream.seen();
    let got = seen.iter().find(|s| s.2 == "/v1/models").unwrap();
    assert_eq!(got.4, format!("Bearer {SECRET_API}"));

    // Replaced where it appears, for a replace_placeholder credential.
    let key = format!("X-Api-Key: {other}");
    let out = e.curl(&ica, "other.test", "/data", &["-H", &key]);
    assert_eq!(out.code, 0, "{}", out.text());
    let seen = e.upstream.seen();
    assert_eq!(
        seen.iter().find(|s| s.2 == "/data").unwrap().5,
        SECRET_OTHER
    );

    // The api placeholder sent to other.test (terminated for its own credential): refused,
    // and nothing reaches other.test.
    let out = e.curl(&ica, "other.test", "/steal", &["-H", &auth, "-i"]);
    assert!(
        out.text().contains("403") && out.text().contains("credential_misuse"),
        "{}",
        out.text()
    );
    assert!(!e.upstream.seen().iter().any(|s| s.2 == "/steal"));
    let rec = e.proxy.wait_record(|r| r["path"] == "/steal");
    assert_eq!(rec["reason"], "credential_misuse");
    assert_eq!(rec["credential"], "api");
    assert_eq!(rec["mode"], "https");

    // In the URL too.
    let out = e.curl(&ica, "other.test", &format!("/q?key={api}"), &["-i"]);
    assert!(out.text().contains("credential_misuse"), "{}", out.text());

    // Plain HTTP: to a bound host, and with a placeholder to another host — refused before
    // anything is dialled.
    let px = format!("http://{}", e.proxy.proxy);
    let port = e.upstream.addr.port();
    let out = curl(&[
        "-sS",
        "-i",
        "-x",
        &px,
        &format!("http://api.test:{port}/v1/x"),
    ]);
    assert!(out.text().contains("credential_misuse"), "{}", out.text());
    let out = curl(&[
        "-sS",
        "-i",
        "-x",
        &px,
        "-H",
        &auth,
        &format!("http://mixed.test:{port}/"),
    ]);
    assert!(out.text().contains("credential_misuse"), "{}", out.text());
}

#[test]
fn only_bound_hosts_are_terminated() {
    let e = env();
    // mixed.test has no credential and no HTTP rule: the client talks TLS with the upstream
    // itself — the interception CA does not verify it, the upstream's own CA does.
    let out = e.curl(&e.ica(), "mixed.test", "/direct", &[]);
    assert_ne!(out.code, 0, "{}", out.text());
    let uca = e.upstream_ca.ca_pem.display().to_string();
    let out = e.curl(&uca, "mixed.test", "/direct", &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    // And api.test is terminated: only the interception CA verifies it.
    assert_ne!(e.curl(&uca, "api.test", "/v1/x", &[]).code, 0);
    assert_eq!(e.curl(&e.ica(), "api.test", "/v1/x", &[]).code, 0);
}

#[test]
fn http2_grpc_trailers_and_http_rules() {
    let e = env();
    let ica = e.ica();
    // HTTP/2 end to end.
    let out = e.curl(
        &ica,
        "api.test",
        "/v1/h2",
        &["--http2", "-w", " %{http_version}"],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.text().ends_with(" 2"), "{}", out.text());
    let seen = e.upstream.seen();
    let got = seen.iter().find(|s| s.2 == "/v1/h2").unwrap();
    assert_eq!(got.3, "HTTP/2.0");
    assert_eq!(got.4, format!("Bearer {SECRET_API}"));

    // HTTP rules: DELETE refused (nothing reaches the upstream), GET allowed, a path outside
    // the rules refused, TRACE refused.
    let out = e.curl(&ica, "api.test", "/v1/things/1", &["-X", "DELETE", "-i"]);
    assert!(
        out.text().contains("403") && out.text().contains("http_not_allowed"),
        "{}",
        out.text()
    );
    assert!(!e.upstream.seen().iter().any(|s| s.1 == "DELETE"));
    assert!(e
        .curl(&ica, "api.test", "/v1/things/1", &[])
        .text()
        .contains("ok /v1/things/1"));
    assert!(e
        .curl(&ica, "api.test", "/admin", &["-i"])
        .text()
        .contains("http_not_allowed"));
    assert!(e
        .curl(&ica, "api.test", "/v1/x", &["-X", "TRACE", "-i"])
        .text()
        .contains("403"));

    // A gRPC-style HTTP/2 POST: the response trailers reach the client.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let trailers = rt.block_on(grpc_call(&e));
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    let seen = e.upstream.seen();
    assert!(seen
        .iter()
        .any(|s| s.2 == "/grpc/svc.Echo/Say" && s.1 == "POST" && s.3 == "HTTP/2.0"));
}

/// CONNECT through the proxy, TLS with ALPN h2 trusting the interception CA, one POST.
async fn grpc_call(e: &Env) -> http::HeaderMap {
    let port = e.upstream.addr.port();
    let mut send = h2_through(e).await;
    let req = http::Request::post(format!("https://api.test:{port}/grpc/svc.Echo/Say"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x02hi")))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = resp.into_body().collect().await.unwrap();
    collected.trailers().cloned().expect("trailers")
}

#[test]
fn secrets_never_show_and_a_changed_secret_is_used_after_reload() {
    let e = env();
    let api = e.placeholder("api");
    let auth = format!("Authorization: Bearer {api}");
    assert_eq!(
        e.curl(&e.ica(), "api.test", "/v1/a", &["-H", &auth]).code,
        0
    );
    // A new secret in the file, a reload: the next request carries it.
    let new_secret = "sk-live-rotated-000000000000000000000000";
    std::fs::write(e.dir.path().join("api.secret"), new_secret).unwrap();
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN));
    assert_eq!(status, 200, "{body}");
    // The reload is in force when it answers.
    // The placeholder is unchanged only if the length is (it follows the secret's length).
    let (_, body) = admin_req(
        e.proxy.admin,
        "GET",
        "/v1/sandboxes/agent/placeholders",
        "",
        Some(ADMIN),
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let api2 = v["placeholders"][0]["placeholder"]
        .as_str()
        .unwrap()
        .to_string();
    let auth2 = format!("Authorization: Bearer {api2}");
    assert_eq!(
        e.curl(&e.ica(), "api.test", "/v1/b", &["-H", &auth2]).code,
        0
    );
    let seen = e.upstream.seen();
    assert_eq!(
        seen.iter().find(|s| s.2 == "/v1/b").unwrap().4,
        format!("Bearer {new_secret}")
    );
    // No secret in the audit log, the logs, or any admin answer.
    let (_, list) = admin_req(e.proxy.admin, "GET", "/v1/sandboxes", "", Some(ADMIN));
    let (_, one) = admin_req(e.proxy.admin, "GET", "/v1/sandboxes/agent", "", Some(ADMIN));
    let audit = std::fs::read_to_string(e.dir.path().join("audit.jsonl")).unwrap();
    let logs = e.proxy.stderr_text();
    for s in [SECRET_API, new_secret, SECRET_OTHER] {
        for (what, text) in [
            ("audit", &audit),
            ("logs", &logs),
            ("list", &list),
            ("sandbox", &one),
            ("placeholders", &body),
        ] {
            assert!(!text.contains(s), "a secret in {what}");
        }
    }
    // Placeholders need the admin token.
    let (status, _) = admin_req(
        e.proxy.admin,
        "GET",
        "/v1/sandboxes/agent/placeholders",
        "",
        None,
    );
    assert_eq!(status, 401);
    let _ = Path::new("/");
}

#[test]
fn a_python_client_with_a_placeholder_in_its_environment() {
    let e = env();
    let api = e.placeholder("api");
    let port = e.upstream.addr.port();
    let script = format!(
        r#"
import os, urllib.request, ssl
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
req = urllib.request.Request("https://api.test:{port}/v1/python",
                             headers={{"Authorization": "Bearer " + os.environ["API_KEY"]}})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{"https": os.environ["HTTPS_PROXY"]}}),
                                     urllib.request.HTTPSHandler(context=ctx))
print(opener.open(req, timeout=10).read().decode())
"#
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .env("HTTPS_PROXY", format!("http://{}", e.proxy.proxy))
        .env("SSL_CERT_FILE", e.ica())
        .env("API_KEY", &api)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok /v1/python"));
    let seen = e.upstream.seen();
    assert_eq!(
        seen.iter().find(|s| s.2 == "/v1/python").unwrap().4,
        format!("Bearer {SECRET_API}")
    );
}

/// A CONNECT tunnel to `api.test` (terminated) carrying a ClientHello for it and nothing
/// more: the client never finishes its TLS handshake.
fn stalled_handshake(e: &Env) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(e.proxy.proxy).unwrap();
    connect_on(
        &mut s,
        &format!("api.test:{}", e.upstream.addr.port()),
        None,
    );
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("api.test").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    s.write_all(&hello).unwrap();
    s
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// A CONNECT tunnel to `host` (at the upstream's port) and TLS through it, trusting the
/// interception CA: the client side of a terminated connection, for hand-written requests.
fn tls_through(e: &Env, host: &str) -> Tls {
    let mut s = std::net::TcpStream::connect(e.proxy.proxy).unwrap();
    connect_on(&mut s, &format!("{host}:{}", e.upstream.addr.port()), None);
    let cfg = client_config(e.ica(), &[]);
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    rustls::StreamOwned::new(conn, s)
}

/// Write `request` (raw bytes) on `tls` and read one response (head and a Content-Length
/// body) as text.
fn roundtrip(tls: &mut Tls, request: &[u8]) -> String {
    use std::io::{Read, Write};
    tls.sock
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    tls.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return text;
            }
        }
        let n = tls.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "closed before the answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

/// A terminated keep-alive HTTP/1.1 connection to `api.test` that made one request and
/// got its answer; the client then says nothing.
fn keep_alive_after_one_request(e: &Env) -> Tls {
    let mut tls = tls_through(e, "api.test");
    let port = e.upstream.addr.port();
    let text = roundtrip(
        &mut tls,
        format!("GET /v1/keep HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").as_bytes(),
    );
    assert!(text.contains("ok /v1/keep"), "{text}");
    tls
}

/// Reads until the proxy closes `s` (EOF or reset); panics if it is still open after 15 s.
fn closed_by_proxy(s: &mut impl std::io::Read, tcp: &std::net::TcpStream) {
    tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("the proxy kept the connection open: {e}")
            }
            // Reset, or a TLS alert/close without close_notify: closed.
            Err(_) => return,
        }
    }
}

#[test]
fn a_terminated_tunnel_whose_client_stalls_its_handshake_is_closed_at_header_ms() {
    let e = env_with("{ idle_ms: 60000, header_ms: 700 }");
    let mut s = stalled_handshake(&e);
    let tcp = s.try_clone().unwrap();
    closed_by_proxy(&mut s, &tcp);
    let rec = e.proxy.wait_record(|r| {
        r["detail"]
            .as_str()
            .is_some_and(|d| d.contains("client's TLS handshake took longer"))
    });
    assert_eq!(rec["close"], "idle", "{rec}");
}

#[test]
fn a_silent_terminated_keep_alive_connection_is_closed_at_idle_ms() {
    let e = env_with("{ idle_ms: 800, header_ms: 60000 }");
    let mut tls = keep_alive_after_one_request(&e);
    let tcp = tls.sock.try_clone().unwrap();
    closed_by_proxy(&mut tls, &tcp);
    let rec = e
        .proxy
        .wait_record(|r| r["mode"] == "connect" && r["close"] == "idle");
    assert!(rec["bytes_down"].as_u64().unwrap() > 0, "{rec}");
}

/// A reload that takes api.test out of the sandbox's egress cuts its terminated connections:
/// one that is mid-handshake (the client never finishes) and a keep-alive one between requests.
#[test]
fn revocation_cuts_terminated_connections_in_their_handshake_and_between_requests() {
    let timeouts = "{ idle_ms: 60000, header_ms: 60000 }";
    let e = env_with(timeouts);
    let mut stalled = stalled_handshake(&e);
    let mut tls = keep_alive_after_one_request(&e);
    let port = e.upstream.addr.port();
    let d = e.dir.path();
    let narrowed = around(d, &e.upstream_ca, timeouts)
        .sandbox(agent(port, &["other.test", "mixed.test"], HTTP))
        .yaml(&d.join("audit.jsonl"));
    std::fs::write(d.join("proxy.yaml"), narrowed).unwrap();
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN));
    assert_eq!(status, 200, "{body}");
    let tcp = tls.sock.try_clone().unwrap();
    closed_by_proxy(&mut tls, &tcp);
    let tcp = stalled.try_clone().unwrap();
    closed_by_proxy(&mut stalled, &tcp);
    let revoked = |r: &serde_json::Value| r["mode"] == "connect" && r["close"] == "revoked";
    e.proxy
        .wait_record(|r| revoked(r) && r["bytes_down"].as_u64() > Some(0));
    e.proxy
        .wait_record(|r| revoked(r) && r["bytes_down"].as_u64() == Some(0));
}

/// Requests to api.test (terminated, a secret injected as `Authorization`) that name another
/// authority: each is refused `host_mismatch` and nothing reaches the upstream; a request with
/// no Host goes up with the one the proxy writes.
#[test]
fn a_terminated_request_names_exactly_the_decided_authority() {
    let e = env();
    let port = e.upstream.addr.port();
    let attacks = [
        format!("GET /v1/two HTTP/1.1\r\nHost: api.test:{port}\r\nHost: evil.test\r\n\r\n"),
        format!("GET https://api.test:{port}/v1/abs HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
        format!("GET /v1/userinfo HTTP/1.1\r\nHost: api.test:{port}@evil.test\r\n\r\n"),
        "GET /v1/port HTTP/1.1\r\nHost: api.test:9999\r\n\r\n".to_string(),
        "GET /v1/other HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_string(),
    ];
    for attack in &attacks {
        let mut tls = tls_through(&e, "api.test");
        let text = roundtrip(&mut tls, attack.as_bytes());
        assert!(
            text.starts_with("HTTP/1.1 403") && text.contains("host_mismatch"),
            "{attack}\n{text}"
        );
    }
    assert!(
        e.upstream.seen().is_empty(),
        "{:?} reached the upstream",
        e.upstream.seen()
    );
    // No Host at all: the proxy writes exactly the decided one.
    let mut tls = tls_through(&e, "api.test");
    let text = roundtrip(&mut tls, b"GET /echo/nohost HTTP/1.1\r\n\r\n");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains(&format!("host: api.test:{port}\n")), "{text}");
    assert_eq!(text.matches("host: ").count(), 1, "{text}");

    // HTTP/2: `:authority api.test` with a `host: evil.test` header.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let mut send = h2_through(&e).await;
        let req = http::Request::get(format!("https://api.test:{port}/v1/h2host"))
            .header("host", "evil.test")
            .body(Full::new(Bytes::new()))
            .unwrap();
        send.send_request(req).await.unwrap().status()
    });
    assert_eq!(status, 403);
    assert!(e.upstream.seen().iter().all(|s| s.2 != "/v1/h2host"));
}

/// An HTTP/2 connection to api.test through the proxy, trusting the interception CA.
async fn h2_through(e: &Env) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = e.upstream.addr.port();
    let mut tcp = tokio::net::TcpStream::connect(e.proxy.proxy).await.unwrap();
    tcp.write_all(format!("CONNECT api.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let cfg = client_config(e.ica(), &[b"h2"]);
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect("api.test".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

/// Dot-segments and encoded separators cannot walk out of a `GET /v1/**` rule; methods are
/// compared without regard to case; TRACE and TRACK never go upstream.
#[test]
fn paths_are_canonical_and_methods_any_case() {
    let e = env();
    let ica = e.ica();
    for path in [
        "/v1/../admin",
        "/v1/%2e%2e/admin",
        "/v1/..%2fadmin",
        "/v1/.%2e/admin",
        "/v1/..;/admin",
        "/v1/%5c..%5cadmin",
    ] {
        let out = e.curl(&ica, "api.test", path, &["-i", "--path-as-is"]);
        assert!(
            out.text().contains("403") && out.text().contains("http_not_allowed"),
            "{path}: {}",
            out.text()
        );
    }
    for method in ["trace", "TRACK", "Trace", "delete", "PROPFIND"] {
        let out = e.curl(&ica, "api.test", "/v1/m", &["-i", "-X", method]);
        assert!(
            out.text().contains("403") && out.text().contains("http_not_allowed"),
            "{method}: {}",
            out.text()
        );
    }
    let seen = e.upstream.seen();
    assert!(seen.is_empty(), "{seen:?} reached the upstream");
    // An ordinary request still passes.
    let out = e.curl(&ica, "api.test", "/v1/fine", &[]);
    assert!(out.text().contains("ok /v1/fine"), "{}", out.text());
}

/// other.test's credential is replaced only in X-Api-Key and Authorization: the placeholder
/// in Origin (reflected as Access-Control-Allow-Origin) or in the path is refused; Basic
/// credentials from a URL (git, pip, npm) carry it replaced.
#[test]
fn a_placeholder_is_replaced_only_in_the_headers_named() {
    let e = env();
    let ica = e.ica();
    let other = e.placeholder("other");
    let origin = format!("Origin: https://{other}");
    let out = e.curl(&ica, "other.test", "/echo/origin", &["-i", "-H", &origin]);
    assert!(
        out.text().contains("403") && out.text().contains("credential_misuse"),
        "{}",
        out.text()
    );
    let out = e.curl(&ica, "other.test", &format!("/echo/{other}"), &["-i"]);
    assert!(out.text().contains("credential_misuse"), "{}", out.text());
    assert!(
        e.upstream.seen().is_empty(),
        "{:?} reached the upstream",
        e.upstream.seen()
    );
    assert!(!out.text().contains(SECRET_OTHER));

    // curl -u user:<placeholder>: the upstream gets Basic user:<secret>.
    let userpass = format!("git:{other}");
    let out = e.curl(&ica, "other.test", "/basic", &["-u", &userpass]);
    assert_eq!(out.code, 0, "{}", out.text());
    use base64::Engine;
    let want = base64::engine::general_purpose::STANDARD.encode(format!("git:{SECRET_OTHER}"));
    let seen = e.upstream.seen();
    let got = seen.iter().find(|s| s.2 == "/basic").unwrap();
    assert_eq!(got.4, format!("Basic {want}"));
}

/// A placeholder behind a byte that is not UTF-8 is still found on plain HTTP.
#[test]
fn raw_bytes_do_not_hide_a_placeholder_on_plain_http() {
    use std::io::{Read, Write};
    let e = env();
    let api = e.placeholder("api");
    let port = e.upstream.addr.port();
    let mut s = std::net::TcpStream::connect(e.proxy.proxy).unwrap();
    let mut req =
        format!("GET http://mixed.test:{port}/raw HTTP/1.1\r\nHost: mixed.test:{port}\r\nX-Key: ")
            .into_bytes();
    req.push(0xff);
    req.extend_from_slice(format!("{api}\r\nConnection: close\r\n\r\n").as_bytes());
    s.write_all(&req).unwrap();
    let mut text = String::new();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    text.push_str(&String::from_utf8_lossy(&raw));
    assert!(text.contains("credential_misuse"), "{text}");
}

/// An upstream that echoes request headers sends the injected secret back: the client sees
/// the placeholder, in the body and in a header; the record says `secret_reflected`.
#[test]
fn reflected_secrets_are_scrubbed_from_responses() {
    let e = env();
    let api = e.placeholder("api");
    let auth = format!("Authorization: Bearer {api}");
    for http in ["--http1.1", "--http2"] {
        let out = e.curl(&e.ica(), "api.test", "/echo/me", &["-i", http, "-H", &auth]);
        assert_eq!(out.code, 0, "{}", out.text());
        let text = out.text();
        assert!(
            !text.contains(SECRET_API),
            "{http}: the secret came back:\n{text}"
        );
        assert!(
            text.contains(&format!("authorization: Bearer {api}")),
            "{text}"
        );
        assert!(
            text.to_ascii_lowercase()
                .contains(&format!("x-echo-auth: bearer {api}")),
            "{text}"
        );
    }
    // The upstream did get the secret.
    assert!(e
        .upstream
        .seen()
        .iter()
        .any(|s| s.2 == "/echo/me" && s.4 == format!("Bearer {SECRET_API}")));
    let rec = e.proxy.wait_record(|r| r["path"] == "/echo/me");
    assert_eq!(rec["secret_reflected"], "api", "{rec}");
    let (_, metrics) = e.proxy.admin_get("/metrics");
    assert!(
        metrics.contains("egress_secret_reflected_total{credential=\"api\",sandbox=\"agent\"}"),
        "{metrics}"
    );
}

/// An upstream that reflects the injected secret in a response *trailer* (HTTP/2 trailing
/// HEADERS) does not get it to the client: trailers are scrubbed like headers, and the record
/// says `secret_reflected`. (HTTP/1.1 chunked trailers are the same body frame to the
/// scrubber: `intercept::scrub`'s unit tests.)
#[test]
fn reflected_secrets_are_scrubbed_from_trailers() {
    let e = env();
    let api = e.placeholder("api");
    let port = e.upstream.addr.port();
    // HTTP/2.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let trailers = rt.block_on(async {
        let mut send = h2_through(&e).await;
        let req = http::Request::get(format!("https://api.test:{port}/v1/trailer/h2"))
            .header("authorization", format!("Bearer {api}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .trailers()
            .cloned()
    });
    let trailers = trailers.expect("the trailers reach the client");
    let echoed = trailers
        .get("x-echo-auth")
        .expect("x-echo-auth")
        .to_str()
        .unwrap();
    assert!(
        !echoed.contains(SECRET_API),
        "HTTP/2: the secret came back in a trailer"
    );
    assert_eq!(echoed, format!("Bearer {api}"));
    let rec = e.proxy.wait_record(|r| r["path"] == "/v1/trailer/h2");
    assert_eq!(rec["secret_reflected"], "api", "{rec}");
}

/// A rule that allows only `GET /v1/**` cannot be walked past with a method-override header,
/// a `_method` parameter or a URL-rewrite header: each is refused before anything (or any
/// credential) reaches the upstream.
#[test]
fn override_headers_cannot_walk_past_method_and_path_rules() {
    let e = env();
    let ica = e.ica();
    let cases: [(&str, &[&str]); 7] = [
        ("/v1/o1", &["-H", "X-HTTP-Method-Override: DELETE"]),
        ("/v1/o2", &["-H", "X-HTTP-Method: DELETE"]),
        ("/v1/o3?_method=DELETE", &[]),
        ("/v1/o4?a=1&%5Fmethod=DELETE", &[]),
        ("/v1/o5", &["-H", "X-Original-URL: /admin"]),
        ("/v1/o6", &["-H", "X-Rewrite-URL: /admin"]),
        ("/v1/o7", &["-H", "X-Forwarded-Host: internal.example"]),
    ];
    for (path, extra) in cases {
        let mut args = vec!["-i"];
        args.extend_from_slice(extra);
        let out = e.curl(&ica, "api.test", path, &args);
        let text = out.text();
        assert!(
            text.contains(" 403") && text.contains("http_not_allowed"),
            "{path} {extra:?}: {text}"
        );
    }
    let seen = e.upstream.seen();
    assert!(
        !seen.iter().any(|s| s.2.starts_with("/v1/o")),
        "reached the upstream: {seen:?}"
    );
    // Without them, the same request passes.
    assert!(e
        .curl(&ica, "api.test", "/v1/o8?method=x", &[])
        .text()
        .contains("ok /v1/o8"));
}

/// The injected secret reflected partly percent-encoded (in the body and a redirect's
/// `Location`), `\uXXXX`-escaped, in hex and upper-cased is found in every form; a body
/// compressed although `identity` was asked is refused (502 `unscannable_response`), never
/// passed unscanned.
#[test]
fn encoded_and_compressed_reflections_never_reach_the_client() {
    let e = env();
    let ica = e.ica();
    for http in ["--http1.1", "--http2"] {
        let out = e.curl(&ica, "api.test", "/v1/enc", &["-i", http]);
        assert_eq!(out.code, 0, "{}", out.text());
        let text = out.text();
        assert!(text.contains("x-kind: enc"), "{text}");
        for form in encoded_forms(SECRET_API) {
            assert!(!text.contains(&form), "{http}: {form} came back:\n{text}");
            assert!(
                !text
                    .to_ascii_lowercase()
                    .contains(&form.to_ascii_lowercase()),
                "{http}: {form} came back in another case:\n{text}"
            );
        }
        let out = e.curl(&ica, "api.test", "/v1/gzip", &["-i", http]);
        let text = out.text();
        assert!(
            text.contains(" 502") && text.contains("unscannable_response"),
            "{http}: {text}"
        );
    }
    let rec = e.proxy.wait_record(|r| r["path"] == "/v1/enc");
    assert_eq!(rec["secret_reflected"], "api", "{rec}");
    let rec = e.proxy.wait_record(|r| r["path"] == "/v1/gzip");
    assert_eq!(rec["reason"], "unscannable_response", "{rec}");
    assert_eq!(rec["status"], 502, "{rec}");
}

/// A brokered host that redirects to another host: the client follows (resending its own
/// `Authorization`, which holds only the placeholder), and the other host gets no secret —
/// the proxy injects per request and per host, and never follows redirects itself.
#[test]
fn a_redirect_from_a_bound_host_carries_no_credential_to_the_next_host() {
    let e = env();
    let api = e.placeholder("api");
    let auth = format!("Authorization: Bearer {api}");
    let both = e.both_cas();
    let out = e.curl(
        &both.display().to_string(),
        "api.test",
        "/v1/redirect/mixed.test",
        &["-L", "--location-trusted", "-H", &auth],
    );
    assert_eq!(out.code, 0, "{} {}", out.text(), out.stderr);
    let seen = e.upstream.seen();
    let first = seen
        .iter()
        .find(|s| s.2 == "/v1/redirect/mixed.test")
        .unwrap();
    assert_eq!(
        first.4,
        format!("Bearer {SECRET_API}"),
        "the bound host got its secret"
    );
    let landing = seen
        .iter()
        .find(|s| s.2 == "/v1/landing")
        .expect("the client followed the redirect");
    assert_eq!(landing.0, "mixed.test");
    assert!(
        !landing.4.contains(SECRET_API),
        "the secret followed the redirect: {landing:?}"
    );
    assert_eq!(landing.4, format!("Bearer {api}"));
}

/// Review 7d C1: the bound host redirects to a host the proxy only relays by SNI with the
/// secret in the `Location`. The scrubber used to rewrite it to the placeholder, which the
/// client then carried to that host unseen (a placeholder names a credential and must not
/// travel). Now a `Location` gets a redaction that is no placeholder.
#[test]
fn a_secret_in_a_location_never_becomes_a_placeholder_on_the_next_host() {
    let e = env();
    let api = e.placeholder("api");
    let auth = format!("Authorization: Bearer {api}");
    let both = e.both_cas();
    let out = e.curl(
        &both.display().to_string(),
        "api.test",
        "/v1/redirect-token/mixed.test",
        &["-L", "-H", &auth],
    );
    assert_eq!(out.code, 0, "{} {}", out.text(), out.stderr);
    let seen = e.upstream.seen();
    let landing = seen
        .iter()
        .find(|s| s.0 == "mixed.test" && s.2.starts_with("/v1/landing/"))
        .expect("the client followed the redirect");
    assert!(
        !landing.2.contains(SECRET_API) && !landing.2.contains(&api),
        "the secret or its placeholder followed the redirect: {landing:?}"
    );
    assert!(
        landing.2.starts_with("/v1/landing/redacted-"),
        "{landing:?}"
    );
    // The same with Python's `requests`, which follows redirects by default.
    let script = format!(
        "import requests; r = requests.get('https://api.test:{port}/v1/redirect-token/mixed.test', proxies={{'https': 'http://{px}'}}, verify='{both}'); print(r.status_code)",
        port = e.upstream.addr.port(),
        px = e.proxy.proxy,
        both = both.display(),
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let landings: Vec<_> = e
        .upstream
        .seen()
        .into_iter()
        .filter(|s| s.0 == "mixed.test" && s.2.starts_with("/v1/landing/"))
        .collect();
    assert_eq!(landings.len(), 2, "{landings:?}");
    assert!(
        landings
            .iter()
            .all(|l| !l.2.contains(&api) && !l.2.contains(SECRET_API)),
        "{landings:?}"
    );
    let rec = e
        .proxy
        .wait_record(|r| r["path"] == "/v1/redirect-token/mixed.test");
    assert_eq!(rec["secret_reflected"], "api", "{rec}");
}

/// In report mode a request the check would refuse goes upstream, reported, and without any
/// credential.
#[test]
fn report_mode_never_injects() {
    let e = env_full(SandboxSpec::report);
    let api = e.placeholder("api");
    let auth = format!("Authorization: Bearer {api}");
    let out = e.curl(&e.ica(), "api.test", "/admin/x", &["-H", &auth]);
    assert!(out.text().contains("ok /admin/x"), "{}", out.text());
    let seen = e.upstream.seen();
    let got = seen.iter().find(|s| s.2 == "/admin/x").unwrap();
    assert_eq!(got.4, format!("Bearer {api}"), "the secret was injected");
    let rec = e.proxy.wait_record(|r| r["path"] == "/admin/x");
    assert_eq!(rec["decision"], "report", "{rec}");
    assert_eq!(rec["reason"], "http_not_allowed", "{rec}");
    // An allowed request still gets it.
    e.curl(&e.ica(), "api.test", "/v1/ok", &["-H", &auth]);
    let seen = e.upstream.seen();
    assert_eq!(
        seen.iter().find(|s| s.2 == "/v1/ok").unwrap().4,
        format!("Bearer {SECRET_API}")
    );
}

/// A reload that narrows `network.http` applies from the next request of an open keep-alive
/// connection, and the policy version changes with it.
#[test]
fn narrowed_http_rules_apply_to_open_connections() {
    let e = env();
    let port = e.upstream.addr.port();
    let mut tls = keep_alive_after_one_request(&e);
    let before = e.proxy.wait_record(|r| r["path"] == "/v1/keep")["policy_version"].clone();
    let d = e.dir.path();
    let narrowed = around(d, &e.upstream_ca, "")
        .sandbox(agent(port, &HOSTS, &HTTP.replace("[GET, POST]", "[POST]")))
        .yaml(&d.join("audit.jsonl"));
    std::fs::write(d.join("proxy.yaml"), narrowed).unwrap();
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN));
    assert_eq!(status, 200, "{body}");
    let text = roundtrip(
        &mut tls,
        format!("GET /v1/after HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").as_bytes(),
    );
    assert!(
        text.starts_with("HTTP/1.1 403") && text.contains("http_not_allowed"),
        "{text}"
    );
    assert!(e.upstream.seen().iter().all(|s| s.2 != "/v1/after"));
    let after = e.proxy.wait_record(|r| r["path"] == "/v1/after")["policy_version"].clone();
    assert_ne!(before, after);
}

/// The wave-2 form `replace_placeholder: true` is refused with a message naming the new one.
#[test]
fn replace_anywhere_is_refused_at_load() {
    let e = env();
    let old = e.yaml.replace(
        "replace_placeholder: { headers: [X-Api-Key, Authorization] }",
        "replace_placeholder: true",
    );
    assert_ne!(old, e.yaml);
    std::fs::write(e.dir.path().join("old.yaml"), old).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["validate", "--config"])
        .arg(e.dir.path().join("old.yaml"))
        .env("OTHER_SECRET", "x")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("{ headers: [Authorization] }"), "{err}");
}

/// The leaf presented for a terminated host carries key usage digitalSignature and EKU
/// serverAuth; `ca init --permit` makes a CA with name constraints.
#[test]
fn leaves_are_server_certificates_and_a_ca_can_be_name_constrained() {
    let e = env();
    let port = e.upstream.addr.port();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -proxy {} -connect api.test:{port} -servername api.test -showcerts </dev/null 2>/dev/null | openssl x509 -noout -ext keyUsage,extendedKeyUsage",
            e.proxy.proxy
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Digital Signature"), "{text}");
    assert!(text.contains("TLS Web Server Authentication"), "{text}");

    let dir = e.dir.path().join("constrained");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["ca", "init"])
        .arg(&dir)
        .args(["--permit", "example.com", "--permit", "api.test"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "nameConstraints", "-in"])
        .arg(dir.join("ca.crt"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("DNS:example.com") && text.contains("DNS:api.test"),
        "{text}"
    );
    // A bad domain is a clear error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["ca", "init"])
        .arg(e.dir.path().join("bad"))
        .args(["--permit", "not a domain"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// The proxy picks the suite of the leg it serves a terminated host on: AES-128-GCM (SHA-256)
/// for a client that lists AES-256 first, and still AES-256 for one that offers nothing else.
#[test]
fn the_served_leg_picks_aes_128_and_still_accepts_aes_256_alone() {
    let e = env();
    let port = e.upstream.addr.port();
    let cipher = |suites: &str| {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -proxy {} -connect api.test:{port} -servername api.test -tls1_3 -ciphersuites {suites} </dev/null 2>&1",
                e.proxy.proxy
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .find(|l| l.contains("Cipher is"))
            .map(str::to_string);
        line.unwrap_or_else(|| panic!("no handshake: {text}"))
    };
    let both = cipher("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256");
    assert!(both.contains("TLS_AES_128_GCM_SHA256"), "{both}");
    let alone = cipher("TLS_AES_256_GCM_SHA384");
    assert!(alone.contains("TLS_AES_256_GCM_SHA384"), "{alone}");
}

/// Review rounds B and C on HTTP/2 (C1e, C7) against an upstream that speaks h2: a body on GET
/// or DELETE to an MCP path, and a GraphQL body sent as a form (which graphene-django reads by
/// its `query` field), are refused on HTTP/2 streams as on HTTP/1.1 — nothing reaches the
/// upstream — while a JSON query passes on h2.
#[test]
fn http2_bodies_on_get_and_graphql_forms_are_refused_before_they_leave() {
    let e = env_rules(
        r#"[{ host: api.test, paths: [/mcp], protocol: mcp, tools: [search] }, { host: api.test, paths: [/gql], protocol: graphql, operations: [query] }]"#,
    );
    let ica = e.ica();
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_all","arguments":{}}}"#;
    let h2 = ["--http2", "-w", "\n%{http_code} %{http_version}"];
    for method in ["GET", "DELETE"] {
        let mut args = h2.to_vec();
        args.extend([
            "-X",
            method,
            "-H",
            "content-type: application/json",
            "--data-binary",
            call,
        ]);
        let text = e.curl(&ica, "api.test", "/mcp", &args).text();
        assert!(text.ends_with("403 2"), "{method}: {text}");
        assert!(text.contains("http_not_allowed"), "{method}: {text}");
    }
    let smuggle = r#"{"query":"{ viewer }","variables":{"x":"&query=mutation+{+deleteRepository(id:1)+{+ok+}+}&"}}"#;
    for ct in [
        "application/x-www-form-urlencoded",
        "application/x-www-form-urlencoded; charset=utf-8",
        "text/plain",
    ] {
        let header = format!("content-type: {ct}");
        let mut args = h2.to_vec();
        args.extend(["-H", &header, "--data-binary", smuggle]);
        let text = e.curl(&ica, "api.test", "/gql", &args).text();
        assert!(text.ends_with("403 2"), "{ct}: {text}");
        assert!(text.contains("graphql_not_allowed"), "{ct}: {text}");
    }
    let mut args = h2.to_vec();
    args.extend([
        "-H",
        "content-type: application/json",
        "--data-binary",
        r#"{"query":"{ viewer }"}"#,
    ]);
    let text = e.curl(&ica, "api.test", "/gql", &args).text();
    assert!(text.ends_with("200 2"), "{text}");
    let seen: Vec<String> = e.upstream.seen().into_iter().map(|s| s.2).collect();
    assert_eq!(seen, ["/gql"], "only the JSON query reached the upstream");
}

/// Security review round A, A35: 20 HTTP/2 streams on one terminated connection were all
/// served against `requests_per_day: 3`. Each request is now reserved against the quota —
/// checked and counted at once — so exactly 3 streams are served and 17 refused.
#[test]
fn parallel_h2_streams_spend_a_request_quota_exactly() {
    let e = env_full(|s| s.limits("{ requests_per_day: 3 }"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let statuses = rt.block_on(async {
        let send = h2_through(&e).await;
        let port = e.upstream.addr.port();
        let streams = (0..20).map(|i| {
            let mut send = send.clone();
            async move {
                let req = http::Request::get(format!("https://api.test:{port}/v1/q{i}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                send.ready().await.unwrap();
                send.send_request(req).await.unwrap().status().as_u16()
            }
        });
        futures_util::future::join_all(streams).await
    });
    let served = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((served, refused), (3, 17), "{statuses:?}");
}
