//! Kept upstream connections of terminated tunnels, with the real binary, curl and a TLS
//! origin that numbers its TLS sessions: a sandbox's next tunnel to the host is served on the
//! upstream TLS connection its last one left (no second handshake); another sandbox, another
//! credential, or the same sandbox after its secret was rotated never is; a reload that
//! stops allowing the host resets the kept connection; `upstream_keepalive.idle_ms: 0` keeps
//! none. With none kept, a sandbox resumes its own TLS sessions with the origin, never
//! another sandbox's, nor those of its own binding before a reload replaced it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;

/// An HTTPS origin (HTTP/1.1, keep-alive) that numbers its TLS sessions and answers each
/// request with `session <n> auth=<digest of Authorization>` (a digest: the proxy scrubs a
/// reflected secret) — `/v1/echo` with `Authorization` as it came (what scrubbing reads); it
/// notes every session that ends.
struct TlsOrigin {
    port: u16,
    sessions: Arc<AtomicUsize>,
    ended: Arc<Mutex<Vec<usize>>>,
    /// When set, a connection's second request is met with a close (no answer): an origin
    /// whose keep-alive timeout fired as the request arrived.
    drop_kept: Arc<AtomicBool>,
    /// Connections that ended without a TLS session (accepted, then closed silent).
    unused: Arc<AtomicUsize>,
    /// Sessions whose handshake resumed an earlier one (a ticket the origin issued).
    resumed: Arc<Mutex<Vec<usize>>>,
    /// Requests to `/hold` waiting for [`TlsOrigin::release`].
    holding: Arc<AtomicUsize>,
    release: tokio::sync::watch::Sender<bool>,
    ca: TestCa,
    _rt: tokio::runtime::Runtime,
}

impl TlsOrigin {
    fn start(dir: &std::path::Path) -> TlsOrigin {
        Self::start_with(dir, &[b"http/1.1"])
    }

    /// An origin offering `alpn` (HTTP/2 served when the client picks `h2`).
    fn start_with(dir: &std::path::Path, alpn: &[&[u8]]) -> TlsOrigin {
        let ca = TestCa::generate(dir);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(ca.server_config(alpn)));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let sessions = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(Mutex::new(Vec::new()));
        let drop_kept = Arc::new(AtomicBool::new(false));
        let unused = Arc::new(AtomicUsize::new(0));
        let resumed = Arc::new(Mutex::new(Vec::new()));
        let holding = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let (s, e, dk, u, r, h) = (
            sessions.clone(),
            ended.clone(),
            drop_kept.clone(),
            unused.clone(),
            resumed.clone(),
            holding.clone(),
        );
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, s, e, dk, u, r, h, rel) = (
                    acceptor.clone(),
                    s.clone(),
                    e.clone(),
                    dk.clone(),
                    u.clone(),
                    r.clone(),
                    h.clone(),
                    released.clone(),
                );
                tokio::spawn(async move {
                    // A connection the proxy dialled and did not need closes here, unnumbered.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        u.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    let n = s.fetch_add(1, Ordering::SeqCst) + 1;
                    let kind = tls.get_ref().1.handshake_kind();
                    if kind == Some(tokio_rustls::rustls::HandshakeKind::Resumed) {
                        r.lock().unwrap().push(n);
                    }
                    let served = Arc::new(AtomicUsize::new(0));
                    let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                        let again = served.fetch_add(1, Ordering::SeqCst) > 0;
                        let close = again && dk.load(Ordering::SeqCst);
                        let auth = req
                            .headers()
                            .get("authorization")
                            .and_then(|v: &http::HeaderValue| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let hold = req.uri().path() == "/hold";
                        let body = match req.uri().path() {
                            "/v1/echo" => format!("session {n} echo={auth}"),
                            "/hold" => format!("session {n} held"),
                            _ => format!("session {n} auth={}", digest(&auth)),
                        };
                        let (h, mut rel) = (h.clone(), rel.clone());
                        async move {
                            if close {
                                return Err("closed as the request arrived");
                            }
                            if hold {
                                h.fetch_add(1, Ordering::SeqCst);
                                let _ = rel.wait_for(|go| *go).await;
                            }
                            Ok(http::Response::new(Full::new(Bytes::from(body))))
                        }
                    });
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let io = hyper_util::rt::TokioIo::new(tls);
                    let _ = match h2 {
                        true => {
                            let exec = hyper_util::rt::TokioExecutor::new();
                            hyper::server::conn::http2::Builder::new(exec)
                                .serve_connection(io, svc)
                                .await
                        }
                        false => {
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, svc)
                                .await
                        }
                    };
                    e.lock().unwrap().push(n);
                });
            }
        });
        TlsOrigin {
            port,
            sessions,
            ended,
            drop_kept,
            unused,
            resumed,
            holding,
            release,
            ca,
            _rt: rt,
        }
    }

    fn sessions(&self) -> usize {
        self.sessions.load(Ordering::SeqCst)
    }

    fn ended(&self) -> Vec<usize> {
        self.ended.lock().unwrap().clone()
    }

    fn resumed(&self) -> Vec<usize> {
        self.resumed.lock().unwrap().clone()
    }

    fn holding(&self) -> usize {
        self.holding.load(Ordering::SeqCst)
    }

    /// Answer every `/hold` request, now and from now on.
    fn release(&self) {
        self.release.send_replace(true);
    }
}

/// The first 8 hex digits of `auth`'s SHA-256.
fn digest(auth: &str) -> String {
    sha(auth)[..8].to_string()
}

/// What the origin answers session `n` for a request that carried `secret`.
fn answer(n: usize, secret: &str) -> String {
    format!("session {n} auth={}", digest(&format!("Bearer {secret}")))
}

const ADMIN: &str = "admin-token-terminated-keepalive";

struct Env {
    dir: tempfile::TempDir,
    origin: TlsOrigin,
    proxy: Proxy,
    /// Whether curl offers HTTP/2 (the origin offers it too).
    h2: bool,
}

/// Sandboxes `a` and `b` (tokens `tok-a`, `tok-b`), each with a credential bound to
/// `api.test` (secret files `a.secret`, `b.secret`), under `keepalive` (the
/// `upstream_keepalive` flow map).
fn env(keepalive: &str) -> Env {
    env_with(keepalive, |c| c)
}

/// [`env`] with more configuration.
fn env_with(keepalive: &str, more: impl FnOnce(ProxyConfig) -> ProxyConfig) -> Env {
    env_on(false, keepalive, more)
}

/// [`env`] with an origin that speaks HTTP/2, and curl offering it.
fn env_h2(keepalive: &str) -> Env {
    env_on(true, keepalive, |c| c)
}

fn env_on(h2: bool, keepalive: &str, more: impl FnOnce(ProxyConfig) -> ProxyConfig) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca_init(&d.join("ica"));
    let origin = match h2 {
        true => TlsOrigin::start_with(d, &[b"h2", b"http/1.1"]),
        false => TlsOrigin::start(d),
    };
    std::fs::write(d.join("admin.token"), ADMIN).unwrap();
    std::fs::write(d.join("a.secret"), "secret-of-a\n").unwrap();
    std::fs::write(d.join("b.secret"), "secret-of-b\n").unwrap();
    let proxy = more(config(d, &origin, keepalive, true)).start(d);
    Env {
        dir,
        origin,
        proxy,
        h2,
    }
}

fn config(d: &std::path::Path, origin: &TlsOrigin, keepalive: &str, allow_a: bool) -> ProxyConfig {
    let port = origin.port;
    let credential = |file: &str| {
        format!(
            "{{ name: api, hosts: [api.test], inject: {{ header: Authorization, format: \"Bearer {{secret}}\" }}, source: {{ file: {} }} }}",
            d.join(file).display()
        )
    };
    let mut a = SandboxSpec::new("a")
        .token("tok-a")
        .credential(&credential("a.secret"));
    if allow_a {
        a = a.allow(&format!("api.test:{port}"));
    }
    let b = SandboxSpec::new("b")
        .token("tok-b")
        .allow(&format!("api.test:{port}"))
        .credential(&credential("b.secret"));
    ProxyConfig::new()
        .admin_token_file(&d.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&d.join("ica"), &origin.ca.ca_pem)
        .intercept_option("upstream_keepalive", keepalive)
        .sandbox(a)
        .sandbox(b)
}

impl Env {
    /// One request through a new CONNECT tunnel as `sandbox`; the body, once the tunnel's
    /// record is written (its upstream connection is kept, or closed, by then).
    fn get(&self, sandbox: &str) -> String {
        self.get_with(sandbox, &[])
    }

    /// [`Env::get`] with more curl arguments.
    fn get_with(&self, sandbox: &str, extra: &[&str]) -> String {
        self.get_path(sandbox, "/v1/x", extra)
    }

    /// [`Env::get_with`] for `path`.
    fn get_path(&self, sandbox: &str, path: &str, extra: &[&str]) -> String {
        let before = self.tunnels();
        let mut args = self.curl_args(sandbox, path);
        let url = args.pop().unwrap();
        args.extend(extra.iter().map(|a| a.to_string()));
        args.push(url);
        let out = curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        eventually(Duration::from_secs(15), "the tunnel's record", || {
            (self.tunnels() > before).then_some(())
        });
        out.text()
    }

    /// curl's arguments for a request to `path` through a new tunnel as `sandbox` (the URL
    /// last).
    fn curl_args(&self, sandbox: &str, path: &str) -> Vec<String> {
        let version = if self.h2 { "--http2" } else { "--http1.1" };
        let ica = self.dir.path().join("ica/ca.crt");
        vec![
            version.to_string(),
            "-x".to_string(),
            format!("http://{sandbox}:tok-{sandbox}@{}", self.proxy.proxy),
            "--cacert".to_string(),
            ica.display().to_string(),
            format!("https://api.test:{}{path}", self.origin.port),
        ]
    }

    /// A request to `/hold` through a new tunnel as `sandbox`, once the origin holds it; the
    /// body, when it is released.
    fn hold(&self, sandbox: &str) -> std::thread::JoinHandle<String> {
        let holding = self.origin.holding();
        let args = self.curl_args(sandbox, "/hold");
        let held = std::thread::spawn(move || {
            curl(&args.iter().map(String::as_str).collect::<Vec<_>>()).text()
        });
        eventually(
            Duration::from_secs(15),
            "the request held at the origin",
            || (self.origin.holding() > holding).then_some(()),
        );
        held
    }

    /// Tunnels recorded as ended.
    fn tunnels(&self) -> usize {
        let records = self.proxy.audit_records();
        records
            .iter()
            .filter(|r| r["event"] == "end" && r["mode"] == "connect")
            .count()
    }

    fn reload(&self) {
        let (status, body) = admin_req(self.proxy.admin, "POST", "/v1/reload", "", Some(ADMIN));
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn a_sandboxs_next_tunnel_reuses_its_upstream_tls_connection_and_no_other_sandbox_does() {
    let e = env("{ idle_ms: 60000 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    // The next tunnel of `a`, a new client connection: the same upstream TLS session.
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    let reused = e.proxy.wait_record(|r| {
        r["mode"] == "connect"
            && (r["detail"].as_str()).is_some_and(|d| d.contains("on a kept upstream connection"))
    });
    assert_eq!(reused["sandbox"], "a");
    // `Connection: close` is about the client's connection: the upstream one stays open.
    let close = ["-H", "Connection: close"];
    assert_eq!(e.get_with("a", &close), answer(1, "secret-of-a"));
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert_eq!(e.origin.sessions(), 1);
    // `b` gets the same host, with its own credential, on a session of its own.
    assert_eq!(e.get("b"), answer(2, "secret-of-b"));
    assert_eq!(e.get("b"), answer(2, "secret-of-b"));
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert_eq!(e.origin.sessions(), 2);
    assert!(e.origin.ended().is_empty(), "{:?}", e.origin.ended());
}

#[test]
fn a_rotated_secret_retires_the_kept_connection() {
    let e = env("{ idle_ms: 60000 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    std::fs::write(e.dir.path().join("a.secret"), "rotated-secret\n").unwrap();
    e.reload();
    // The connection opened for the old secret is closed by the reload's sweep...
    eventually(Duration::from_secs(15), "session 1 closed", || {
        e.origin.ended().contains(&1).then_some(())
    });
    // ...and the next tunnel opens its own, with a full handshake: a new binding (a rotated
    // secret, a sandbox registered again under its name) resumes nothing of the old one's.
    assert_eq!(e.get("a"), answer(2, "rotated-secret"));
    assert_eq!(e.origin.sessions(), 2);
    assert!(e.origin.resumed().is_empty(), "{:?}", e.origin.resumed());
}

#[test]
fn a_reload_that_stops_allowing_the_host_resets_its_kept_connection() {
    let e = env("{ idle_ms: 60000 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert_eq!(e.get("b"), answer(2, "secret-of-b"));
    let narrowed = config(e.dir.path(), &e.origin, "{ idle_ms: 60000 }", false);
    std::fs::write(&e.proxy.config, narrowed.yaml(&e.proxy.audit)).unwrap();
    e.reload();
    eventually(Duration::from_secs(15), "a's kept session closed", || {
        e.origin.ended().contains(&1).then_some(())
    });
    // `b` is still allowed: its kept connection serves its next tunnel.
    assert_eq!(e.get("b"), answer(2, "secret-of-b"));
    assert_eq!(e.origin.ended(), vec![1]);
    // And `a` is refused before anything reaches the origin.
    let px = format!("http://a:tok-a@{}", e.proxy.proxy);
    let url = format!("https://api.test:{}/v1/x", e.origin.port);
    let ica = e.dir.path().join("ica/ca.crt");
    let out = curl(&["-x", &px, "--cacert", ica.to_str().unwrap(), &url]);
    assert!(out.stderr.contains("403"), "{}", out.stderr);
    assert_eq!(e.origin.sessions(), 2);
}

#[test]
fn idle_ms_zero_keeps_no_upstream_connection() {
    let e = env("{ idle_ms: 0 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert_eq!(e.get("a"), answer(2, "secret-of-a"));
    eventually(Duration::from_secs(15), "both sessions closed", || {
        (e.origin.ended().len() == 2).then_some(())
    });
}

/// An HTTP/2 upstream connection kept for a sandbox serves its tunnels side by side: while
/// one tunnel's request is held at the origin, the sandbox's next tunnel sends its own on the
/// same connection as another stream (no new TLS session); another sandbox's tunnel at the
/// same moment opens its own. Once both are done the connection is kept, not closed.
#[test]
fn an_http2_kept_connection_carries_a_sandboxs_tunnels_side_by_side_and_no_other_sandboxs() {
    let e = env_h2("{ idle_ms: 60000 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    let before = e.tunnels();
    let held = e.hold("a");
    // The held tunnel's connection is the pool's and its own: a's next tunnel shares it.
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert_eq!(e.origin.sessions(), 1);
    assert_eq!(e.get("b"), answer(2, "secret-of-b"));
    e.origin.release();
    assert_eq!(held.join().unwrap(), "session 1 held");
    eventually(Duration::from_secs(15), "the held tunnel's record", || {
        (e.tunnels() >= before + 3).then_some(())
    });
    // Kept, not closed, once no tunnel holds it; and still a's.
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert!(e.origin.ended().is_empty(), "{:?}", e.origin.ended());
    assert_eq!(e.origin.sessions(), 2);
}

/// A shared HTTP/2 connection in use is still revoked with the policy: a reload that stops
/// allowing the host for `a` resets it under the tunnel holding a request on it, which gets no
/// answer from the origin.
#[test]
fn a_revoking_reload_resets_a_shared_http2_connection_in_use() {
    let e = env_h2("{ idle_ms: 60000 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    let held = e.hold("a");
    let narrowed = config(e.dir.path(), &e.origin, "{ idle_ms: 60000 }", false);
    std::fs::write(&e.proxy.config, narrowed.yaml(&e.proxy.audit)).unwrap();
    e.reload();
    eventually(Duration::from_secs(15), "a's shared session closed", || {
        e.origin.ended().contains(&1).then_some(())
    });
    e.origin.release();
    assert!(
        !held.join().unwrap().contains("held"),
        "the held request was answered"
    );
}

/// With no connection kept, a sandbox's next tunnel still skips most of the upstream
/// handshake: it resumes the TLS session its last one had (no certificate chain to send and
/// verify). Another sandbox never resumes it: its first session to the host is a full
/// handshake, and its own next one resumes its own.
#[test]
fn a_sandbox_resumes_its_own_upstream_tls_sessions_and_no_other_sandboxs() {
    let e = env("{ idle_ms: 0 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    assert_eq!(e.get("a"), answer(2, "secret-of-a"));
    assert_eq!(
        e.origin.resumed(),
        vec![2],
        "a's second tunnel resumes its first session"
    );
    assert_eq!(e.get("b"), answer(3, "secret-of-b"));
    assert_eq!(
        e.origin.resumed(),
        vec![2],
        "b's first session is a full handshake"
    );
    assert_eq!(e.get("b"), answer(4, "secret-of-b"));
    assert_eq!(e.get("a"), answer(5, "secret-of-a"));
    assert_eq!(e.origin.resumed(), vec![2, 4, 5]);
}

/// The scrubber compiled for a sandbox's binding serves its next tunnels: each sandbox's
/// reflected secret is scrubbed with its own (never the other's, whichever tunnel came
/// first), and after a rotation the new secret is, from the next tunnel.
#[test]
fn each_tunnel_scrubs_its_own_sandboxs_secret_and_a_rotated_one() {
    let e = env("{ idle_ms: 60000 }");
    let echo = |sandbox: &str| e.get_path(sandbox, "/v1/echo", &[]);
    for _ in 0..2 {
        for (sandbox, secret) in [("a", "secret-of-a"), ("b", "secret-of-b")] {
            let got = echo(sandbox);
            assert!(got.contains("echo=Bearer "), "{got}");
            assert!(
                !got.contains(secret),
                "{sandbox} read its secret back: {got}"
            );
        }
    }
    std::fs::write(e.dir.path().join("a.secret"), "rotated-secret\n").unwrap();
    e.reload();
    eventually(Duration::from_secs(15), "the rotated secret in use", || {
        (e.get("a").ends_with(&digest("Bearer rotated-secret"))).then_some(())
    });
    let got = echo("a");
    assert!(got.contains("echo=Bearer "), "{got}");
    assert!(
        !got.contains("rotated-secret"),
        "a read its new secret back: {got}"
    );
}

/// The origin closes a kept connection as the next tunnel's request arrives (its keep-alive
/// timeout fired at that moment): the proxy sends the request again, once, on TLS opened over
/// the tunnel's own dialled connection — the client gets its answer, not a 502 — and does not
/// keep that connection for a later tunnel (the kept one's revocation switch would not cover
/// it). Fails with the connection taken and nothing held to send again on (502).
#[test]
fn a_kept_connection_the_origin_closes_under_a_request_is_replaced_not_a_502() {
    let e = env("{ idle_ms: 60000 }");
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    e.origin.drop_kept.store(true, Ordering::SeqCst);
    assert_eq!(e.get("a"), answer(2, "secret-of-a"));
    let again = e.proxy.wait_record(|r| {
        (r["detail"].as_str()).is_some_and(|d| d.contains("sent again on a new one"))
    });
    assert_eq!(again["sandbox"], "a");
    // Session 2 was not kept: the next tunnel opens session 3, and is answered on it.
    assert_eq!(e.get("a"), answer(3, "secret-of-a"));
    assert_eq!(e.origin.sessions(), 3);
    // A POST the origin received is never sent twice: on kept session 3 it is closed under,
    // and the client gets the failure; no session is opened to send it again.
    let posted = e.get_with("a", &["-d", "once"]);
    assert!(posted.contains("the upstream failed"), "{posted}");
    assert_eq!(e.origin.sessions(), 3);
}

/// A tunnel on a kept connection holds its own dialled socket as a spare only briefly: a
/// client that opens TLS and then sends nothing does not leave a silent connection at the
/// origin for as long as its tunnel lives (an origin that handshakes in its accept loop, or
/// counts connections per client, would pay for it). Before, the spare lived as long as the
/// tunnel: nothing closed at the origin while the client stayed.
#[test]
fn a_spare_socket_is_closed_while_its_tunnel_stays_open() {
    use std::io::Read;
    // A client may wait a minute before its first request.
    let e = env_with("{ idle_ms: 60000 }", |c| {
        c.defaults("timeouts", "{ header_ms: 60000 }")
    });
    assert_eq!(e.get("a"), answer(1, "secret-of-a"));
    let mut s = std::net::TcpStream::connect(e.proxy.proxy).unwrap();
    let target = format!("api.test:{}", e.origin.port);
    connect_on(&mut s, &target, Some(&basic("a", "tok-a")));
    let ica = e.dir.path().join("ica/ca.crt");
    let cfg = client_config(&ica, &[b"http/1.1"]);
    let name = rustls::pki_types::ServerName::try_from("api.test").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, s);
    // The handshake completes (the proxy took the kept session for this tunnel)...
    while tls.conn.is_handshaking() || tls.conn.wants_write() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    // ...and, the client silent, the spare is closed at the origin, unused, with the tunnel
    // still open.
    eventually(Duration::from_secs(20), "the spare closed", || {
        (e.origin.unused.load(Ordering::SeqCst) == 1).then_some(())
    });
    tls.sock
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut byte = [0u8; 1];
    // (Through TLS: the session tickets the proxy sent after the handshake are read there.)
    let read = tls.read(&mut byte);
    let waiting = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    assert!(
        read.as_ref().is_err_and(waiting),
        "the tunnel closed: {read:?}"
    );
    assert_eq!(e.origin.sessions(), 1);
}
