//! Requests per second through a terminated host (a credential bound to it: TLS terminated,
//! the header injected, the request checked and re-sent upstream, the response scrubbed)
//! versus a relayed one (the tunnel untouched), with the same HTTPS upstream, the same client
//! and keep-alive connections: HTTP/1.1, or HTTP/2 with `--h2` (`--streams` concurrent
//! streams per connection). Only 200 answers are counted; any other status aborts the run.
//! With `--mcp` it compares two terminated hosts instead, each sent the same MCP `tools/call`
//! POST and answered the same JSON-RPC result: one with only a path rule (`path.test`), one
//! with a `protocol: mcp` rule (`mcp.test`: the body read, parsed and judged, the JSON
//! response parsed and filtered).
//! With `--decider` it compares the static-header host asked through a sandbox without a
//! decider (`plain`, clients from 127.0.0.1) and one whose sandbox has a local decider that
//! allows everything (`decided`, from 127.0.0.2: asked for the tunnel and for every request),
//! then `plain` again while a third sandbox (127.0.0.3) keeps 32 tunnels waiting on a decider
//! that never answers (`plain_slow_neighbour`: what a slow decider costs other sandboxes).
//! With `--sigv4` it compares the static-header host (`bound.test`) with one bound to an
//! `aws_sigv4` credential (`aws.test`): each GET carries a SigV4 Authorization made once with
//! the sandbox's placeholder key id, which the proxy checks, strips and signs again with the
//! real keys on every request (the upstream does not verify; `tests/credential_kinds.rs`
//! does).
//!
//! With `--squid` it compares brokered HTTPS with a peer that does the same job: the
//! static-header host terminated by egress-proxy over HTTP/1.1 and over HTTP/2 (the same
//! connections, one stream each: the same concurrency), and Squid with ssl-bump
//! (`squid-openssl`, [`common::squid_bump`]) terminating the same CONNECTs with the same CA,
//! verifying the same upstream, over HTTP/1.1 (Squid speaks no HTTP/2 to clients).
//!
//! With `--protocols` it compares the static-header host terminated over HTTP/1.1 and over
//! HTTP/2 at the same concurrency (one stream per connection), as `--squid` does, without
//! the peer.
//!
//! With `--latency` (and `--rate`, requests per second over all connections) it measures how
//! long a request takes, paced well below saturation: straight to the upstream (`direct`: the
//! same TLS client, the same upstream, no proxy) and through the proxy to the static-header
//! host (`terminated`), and, to tell the hop from the inspection, through a tunnel the proxy
//! leaves untouched (`relayed`); with `--peer ADDR` (and `--peer-pid PID` for its CPU), also
//! through another proxy's CONNECT tunnel to the upstream's address (`peer_relayed`: the same
//! hop made by a peer). It prints p50 and p99 of each. A request is timed from its send to the end of its answer.
//!
//! ```text
//! cargo build --release && cargo bench --bench intercept -- --connections 8 --seconds 5
//! cargo bench --bench intercept -- --connections 8 --seconds 5 --squid
//! cargo bench --bench intercept -- --connections 4 --streams 8 --seconds 5 --h2
//! cargo bench --bench intercept -- --connections 8 --seconds 5 --mcp
//! cargo bench --bench intercept -- --connections 8 --seconds 5 --sigv4
//! cargo bench --bench intercept -- --connections 8 --seconds 5 --decider
//! cargo bench --bench intercept -- --connections 8 --seconds 5 --protocols
//! cargo bench --bench intercept -- --connections 8 --seconds 5 --latency --rate 1000
//! cargo bench --bench intercept -- --bin /tmp/old/target/release/egress-proxy   # A/B
//! cargo bench --bench intercept -- --mcp --only mcp.test   # one phase alone, to profile
//! ```
//! It makes its own CAs, starts `target/release/egress-proxy` and a hyper HTTPS upstream on
//! loopback, and prints one JSON line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::*;

/// An upstream CA and a server certificate for the bench names (DER), and the CA (PEM).
fn upstream_pki() -> (Vec<u8>, Vec<u8>, String) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(vec![
        "bound.test".into(),
        "relayed.test".into(),
        "path.test".into(),
        "mcp.test".into(),
        "aws.test".into(),
    ])
    .expect("params");
    p.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.signed_by(&key, &ca_cert, &ca_key).expect("leaf");
    (cert.der().to_vec(), key.serialize_der(), ca_cert.pem())
}

async fn upstream(cert: Vec<u8>, key: Vec<u8>) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls")
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(cert)],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
        )
        .expect("cert");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        if req.uri().path() == "/mcp" {
                            let _ = req.into_body().collect().await;
                            let resp = http::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(MCP_RESULT)))
                                .expect("resp");
                            return Ok::<_, std::convert::Infallible>(resp);
                        }
                        Ok(http::Response::new(Full::new(Bytes::from_static(b"ok\n"))))
                    },
                );
                let io = hyper_util::rt::TokioIo::new(tls);
                if io.inner().get_ref().1.alpn_protocol() == Some(b"h2") {
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
    addr
}

/// How a client connection speaks.
#[derive(Clone, Copy)]
struct Shape {
    h2: bool,
    /// Concurrent streams per connection (HTTP/2).
    streams: usize,
    /// Compare the path-rule host with the MCP-rule host.
    mcp: bool,
    /// The SigV4 Authorization (and its date) requests to `aws.test` carry (`--sigv4`).
    sigv4: Option<(&'static str, &'static str)>,
    /// Straight to the upstream, without the proxy (`--latency`'s `direct`).
    direct: bool,
    /// The CONNECT names the upstream's address, not the host (a peer that has not our names).
    by_address: bool,
    /// One request per this long on each connection, each timed into [`LATENCIES`]
    /// (`--latency`); else back to back, untimed.
    pace: Option<Duration>,
}

/// The times of the paced requests of the running phase, microseconds.
static LATENCIES: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Wait for the next request's slot when paced; returns when the request starts.
async fn slot(shape: Shape, next: &mut tokio::time::Instant) -> Instant {
    if let Some(pace) = shape.pace {
        tokio::time::sleep_until(*next).await;
        *next += pace;
    }
    Instant::now()
}

/// Record a paced request's time.
fn timed(shape: Shape, started: Instant) {
    if shape.pace.is_some() {
        let us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
        LATENCIES.lock().expect("latencies").push(us);
    }
}

/// The `q` quantile of `v` (sorted in place), microseconds.
fn quantile(v: &mut [u32], q: f64) -> u32 {
    v.sort_unstable();
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0)
}

/// The MCP call the `--mcp` hosts are sent, and the result they answer.
const MCP_CALL: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"q":"rust async runtimes"}}}"#;
const MCP_RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"found 3 results"}],"isError":false}}"#;

/// A GET as the sandbox sends it (the placeholder in Authorization); to the `--mcp` hosts, the
/// MCP call's POST.
fn request(uri: &str, host: Option<&str>, shape: Shape, aws: bool) -> http::Request<Full<Bytes>> {
    if let (true, Some((auth, date))) = (aws, shape.sigv4) {
        let mut b = http::Request::get(uri)
            .header("authorization", auth)
            .header("x-amz-date", date)
            .header(
                "x-amz-content-sha256",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            );
        if let Some(h) = host {
            b = b.header("host", h);
        }
        return b.body(Full::new(Bytes::new())).expect("req");
    }
    if shape.mcp {
        let mut b = http::Request::post(uri.replace("/v1/x", "/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(h) = host {
            b = b.header("host", h);
        }
        return b
            .body(Full::new(Bytes::from_static(MCP_CALL)))
            .expect("req");
    }
    let mut b = http::Request::get(uri).header("authorization", "Bearer placeholder");
    if let Some(h) = host {
        b = b.header("host", h);
    }
    b.body(Full::new(Bytes::new())).expect("req")
}

/// Count an answer; anything but 200 aborts the run (the bench measures answered requests).
async fn answered(resp: http::Response<hyper::body::Incoming>, count: &AtomicU64) {
    assert_eq!(
        resp.status(),
        200,
        "the bench must measure answered requests"
    );
    let _ = resp.into_body().collect().await;
    count.fetch_add(1, Ordering::Relaxed);
}

/// Keep-alive GETs through one tunnel to `host` until `until`, counted in `count`.
/// A connection to the proxy from `source` (each bench sandbox is a source address).
async fn dial(proxy: SocketAddr, source: std::net::IpAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(SocketAddr::new(source, 0)).expect("bind");
    sock.connect(proxy).await.expect("proxy")
}

/// A decider that allows everything, as fast as it can (`--decider`).
async fn allowing_decider() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(br#"{"verdict":"allow"}"#),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// A decider that accepts and never answers.
async fn silent_decider() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

/// Tunnels of the slow sandbox (127.0.0.3) to `host`, one after another until `until`,
/// each refused when its decider times out; counted in `refused`.
async fn slow_neighbour(
    proxy: SocketAddr,
    host: &str,
    port: u16,
    until: Instant,
    refused: Arc<AtomicU64>,
) {
    while Instant::now() < until {
        let mut tcp = dial(proxy, "127.0.0.3".parse().expect("ip")).await;
        let ask = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
        if tcp.write_all(ask.as_bytes()).await.is_err() {
            continue;
        }
        let mut head = [0u8; 12];
        if tcp.read_exact(&mut head).await.is_ok() && head.ends_with(b"503") {
            refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[allow(clippy::too_many_arguments)] // reason: the bench's one client, every knob a parameter
async fn client(
    proxy: SocketAddr,
    source: std::net::IpAddr,
    host: &'static str,
    port: u16,
    tls_cfg: Arc<rustls::ClientConfig>,
    shape: Shape,
    until: Instant,
    count: Arc<AtomicU64>,
) {
    let tcp = if shape.direct {
        let upstream = SocketAddr::from(([127, 0, 0, 1], port));
        let tcp = tokio::net::TcpStream::connect(upstream)
            .await
            .expect("upstream");
        tcp.set_nodelay(true).expect("nodelay");
        tcp
    } else {
        let target = if shape.by_address { "127.0.0.1" } else { host };
        tunnel(proxy, source, target, port).await
    };
    let tls = tokio_rustls::TlsConnector::from(tls_cfg)
        .connect(host.try_into().expect("name"), tcp)
        .await
        .expect("tls");
    let io = hyper_util::rt::TokioIo::new(tls);
    let authority = format!("{host}:{port}");
    if shape.h2 {
        let (send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .expect("h2");
        tokio::spawn(conn);
        let uri = format!("https://{authority}/v1/x");
        let tasks: Vec<_> = (0..shape.streams)
            .map(|_| {
                let send = send.clone();
                let (uri, count) = (uri.clone(), count.clone());
                tokio::spawn(async move {
                    let mut send = send;
                    while Instant::now() < until {
                        let resp = send
                            .send_request(request(&uri, None, shape, host == "aws.test"))
                            .await
                            .expect("request");
                        answered(resp, &count).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        return;
    }
    let (send, conn) = hyper::client::conn::http1::handshake(io).await.expect("h1");
    tokio::spawn(conn);
    let mut send = send;
    // Paced connections start spread over one pace, not all at once.
    let spread = shape
        .pace
        .map_or(Duration::ZERO, |p| p.mul_f64(clock_fraction()));
    let mut next = tokio::time::Instant::now() + spread;
    while Instant::now() < until {
        let started = slot(shape, &mut next).await;
        let resp = send
            .send_request(request(
                "/v1/x",
                Some(&authority),
                shape,
                host == "aws.test",
            ))
            .await
            .expect("request");
        answered(resp, &count).await;
        timed(shape, started);
    }
}

/// A number in [0, 1) from the clock (where in its pace a connection starts).
fn clock_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1_000_003) / 1_000_003.0
}

/// A tunnel through the proxy from `source` to `host:port`, its `200` read.
async fn tunnel(
    proxy: SocketAddr,
    source: std::net::IpAddr,
    host: &str,
    port: u16,
) -> tokio::net::TcpStream {
    let mut tcp = dial(proxy, source).await;
    tcp.set_nodelay(true).expect("nodelay");
    tcp.write_all(
        format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .expect("connect");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut b).await.expect("head");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tcp
}

/// The SigV4 Authorization of sandbox `bench`'s placeholder key id (derived, like the proxy
/// does, from the interception CA's key) for today's scope, and its `x-amz-date`.
fn sigv4_auth(ca_key: &std::path::Path) -> (&'static str, &'static str) {
    use sha2::Digest;
    let key = sha2::Sha256::digest(std::fs::read(ca_key).expect("ca key"));
    let key_id =
        egress_proxy::config::credential_kinds::aws_placeholder_key_id(&key, "bench", "aws");
    let now = time::OffsetDateTime::now_utc();
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let date = now.format(f).expect("date");
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential={key_id}/{}/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={}",
        &date[..8],
        "0".repeat(64)
    );
    (
        Box::leak(auth.into_boxed_str()),
        Box::leak(date.into_boxed_str()),
    )
}

fn main() {
    let conns = arg("--connections", 8);
    let secs = arg("--seconds", 5);
    let decider = std::env::args().any(|a| a == "--decider");
    let with_squid = std::env::args().any(|a| a == "--squid");
    let protocols = std::env::args().any(|a| a == "--protocols");
    let latency = std::env::args().any(|a| a == "--latency");
    let rate = arg("--rate", 1000u64).max(1);
    let peer: Option<SocketAddr> = std::env::args()
        .skip_while(|a| a != "--peer")
        .nth(1)
        .map(|a| a.parse().expect("--peer ADDR:PORT"));
    let peer_pid = arg("--peer-pid", 0u32);
    let mut shape = Shape {
        h2: std::env::args().any(|a| a == "--h2"),
        streams: arg("--streams", 1) as usize,
        mcp: std::env::args().any(|a| a == "--mcp"),
        sigv4: None,
        direct: false,
        by_address: false,
        pace: None,
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // `--bin PATH` runs another build (an A/B against the previous commit).
    let bin = arg("--bin", root.join("target/release/egress-proxy"));
    assert!(bin.exists(), "build first: cargo build --release");
    let dir = tempfile::tempdir().expect("tmp");
    let ok = Command::new(&bin)
        .args(["ca", "init"])
        .arg(dir.path().join("ica"))
        .stdout(Stdio::null())
        .status()
        .expect("ca init")
        .success();
    assert!(ok);
    if std::env::args().any(|a| a == "--sigv4") {
        shape.sigv4 = Some(sigv4_auth(&dir.path().join("ica/ca.key")));
    }
    for (f, v) in [
        ("aws.id", "AKIAREALKEY000000001"),
        ("aws.secret", "realSecretKey/0123456789abcdefghijklmnopq"),
    ] {
        std::fs::write(dir.path().join(f), v).expect("write");
    }
    let (cert, key, upstream_ca) = upstream_pki();
    std::fs::write(dir.path().join("uca.pem"), &upstream_ca).expect("write");
    std::fs::write(
        dir.path().join("secret"),
        "sk-bench-000000000000000000000000",
    )
    .expect("write");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let up = rt.block_on(upstream(cert, key));
    let port = up.port();
    let (allow_at, silent_at) =
        rt.block_on(async { (allowing_decider().await, silent_decider().await) });
    // One sandbox per source address; `decided` and `slow` differ from `plain` only by a decider.
    let sandbox = |id: &str, source: &str, decider: String| {
        format!(
            r#"  - id: {id}
    sources: [{source}/32]
{decider}    credentials:
      - {{ name: api, hosts: [bound.test], inject: {{ header: Authorization, format: "Bearer {{secret}}" }}, source: {{ file: secret }} }}
      - {{ name: aws, kind: aws_sigv4, hosts: [aws.test], source: {{ access_key_id_file: aws.id, secret_access_key_file: aws.secret }} }}
    policy:
      provider: local
      config: {{}}
      network:
        egress: ["bound.test:{port}", "relayed.test:{port}", "path.test:{port}", "mcp.test:{port}", "aws.test:{port}"]
        http:
          - {{ host: path.test, methods: [POST], paths: [/mcp] }}
          - {{ host: mcp.test, paths: [/mcp], protocol: mcp, tools: [search] }}
"#
        )
    };
    let plain = sandbox("bench", "127.0.0.1", String::new());
    let decided = sandbox(
        "decided",
        "127.0.0.2",
        format!("    decider: {{ url: \"http://{allow_at}/\", timeout_ms: 2000 }}\n"),
    );
    let slow = sandbox(
        "slow",
        "127.0.0.3",
        format!(
            "    decider: {{ url: \"http://{silent_at}/\", timeout_ms: 300, max_in_flight: 64 }}\n"
        ),
    );
    std::fs::write(
        dir.path().join("proxy.yaml"),
        format!(
            r#"listen: {{ proxy: 127.0.0.1:0, admin: null }}
audit: {{ path: /dev/null }}
dns: {{ servers: ["127.0.0.1:9"], hosts: {{ bound.test: [127.0.0.1], relayed.test: [127.0.0.1], path.test: [127.0.0.1], mcp.test: [127.0.0.1], aws.test: [127.0.0.1] }} }}
defaults: {{ guard_allow_ranges: [127.0.0.1/32], limits: {{ max_connections: 100000, connections_per_second: 1000000, burst: 1000000 }} }}
tls_intercept: {{ ca_cert_file: ica/ca.crt, ca_key_file: ica/ca.key, upstream_ca_file: uca.pem }}
sandboxes:
{plain}{decided}{slow}"#
        ),
    )
    .expect("config");
    let Started {
        mut child, proxy, ..
    } = start_proxy(&bin, &dir.path().join("proxy.yaml"), &[]);
    let proxy = proxy.expect("proxy address");
    let mut roots = rustls::RootCertStore::empty();
    for pem in [
        std::fs::read(dir.path().join("ica/ca.crt")).expect("ca"),
        upstream_ca.into_bytes(),
    ] {
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.expect("pem")).expect("root");
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut ccfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls")
        .with_root_certificates(roots)
        .with_no_client_auth();
    ccfg.alpn_protocols = if shape.h2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    let ccfg = Arc::new(ccfg);
    let mut out = serde_json::Map::new();
    out.insert(
        "protocol".into(),
        serde_json::json!(if shape.h2 { "h2" } else { "http/1.1" }),
    );
    // `--squid`: the peer, and an HTTP/2 client config beside the HTTP/1.1 one.
    let squid = with_squid.then(|| {
        let hosts = ["bound.test", "relayed.test"];
        let ica = (dir.path().join("ica/ca.crt"), dir.path().join("ica/ca.key"));
        common::squid_bump::start(
            dir.path(),
            free_port(),
            (&ica.0, &ica.1),
            &dir.path().join("uca.pem"),
            &hosts,
        )
        .unwrap_or_else(|e| panic!("squid ssl-bump: {e}"))
    });
    let h2_cfg = {
        let mut c = (*ccfg).clone();
        c.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(c)
    };
    let mut cpu_before = cpu_us(child.id()).unwrap_or(0);
    let mut peer_cpu_before = 0;
    for round in 0..3 {
        let one = "127.0.0.1".parse().expect("ip");
        let phases: Vec<(&str, &'static str, std::net::IpAddr, bool)> =
            match (shape.mcp, shape.sigv4.is_some(), decider) {
                _ if squid.is_some() => vec![
                    ("terminated_h1", "bound.test", one, false),
                    ("terminated_h2", "bound.test", one, false),
                    ("squid_bump_h1", "bound.test", one, false),
                ],
                _ if protocols => vec![
                    ("terminated_h1", "bound.test", one, false),
                    ("terminated_h2", "bound.test", one, false),
                ],
                _ if latency => {
                    let mut phases = vec![
                        ("direct", "bound.test", one, false),
                        ("relayed", "relayed.test", one, false),
                        ("terminated", "bound.test", one, false),
                    ];
                    if peer.is_some() {
                        phases.push(("peer_relayed", "relayed.test", one, false));
                    }
                    phases
                }
                (true, _, _) => vec![
                    ("path.test", "path.test", one, false),
                    ("mcp.test", "mcp.test", one, false),
                ],
                (_, true, _) => vec![
                    ("bound.test", "bound.test", one, false),
                    ("aws.test", "aws.test", one, false),
                ],
                (_, _, true) => vec![
                    ("plain", "bound.test", one, false),
                    (
                        "decided",
                        "bound.test",
                        "127.0.0.2".parse().expect("ip"),
                        false,
                    ),
                    ("plain_slow_neighbour", "bound.test", one, true),
                ],
                _ => vec![
                    ("bound.test", "bound.test", one, false),
                    ("relayed.test", "relayed.test", one, false),
                ],
            };
        // `--only LABEL` runs one phase alone (to profile it without its neighbours).
        let only = std::env::args().skip_while(|a| a != "--only").nth(1);
        let phases = phases
            .into_iter()
            .filter(|p| only.as_deref().is_none_or(|o| o == p.0));
        for (label, host, source, neighbour) in phases {
            let count = Arc::new(AtomicU64::new(0));
            let until = Instant::now() + Duration::from_secs(secs);
            let refused = Arc::new(AtomicU64::new(0));
            rt.block_on(async {
                let slow: Vec<_> = (0..if neighbour { 32 } else { 0 })
                    .map(|_| {
                        tokio::spawn(slow_neighbour(proxy, host, port, until, refused.clone()))
                    })
                    .collect();
                // The peer's phase goes through Squid; the HTTP/2 phase with one stream per
                // connection (the same concurrency as HTTP/1.1).
                let via = match (label, &squid, peer) {
                    ("squid_bump_h1", Some(s), _) => SocketAddr::from(([127, 0, 0, 1], s.port)),
                    ("peer_relayed", _, Some(p)) => p,
                    _ => proxy,
                };
                let (phase_shape, phase_cfg) = match label {
                    "terminated_h2" => (
                        Shape {
                            h2: true,
                            streams: 1,
                            ..shape
                        },
                        h2_cfg.clone(),
                    ),
                    "direct" | "relayed" | "terminated" | "peer_relayed" => (
                        Shape {
                            direct: label == "direct",
                            by_address: label == "peer_relayed",
                            pace: Some(Duration::from_secs(conns).div_f64(rate as f64)),
                            ..shape
                        },
                        ccfg.clone(),
                    ),
                    _ => (shape, ccfg.clone()),
                };
                let tasks: Vec<_> = (0..conns)
                    .map(|_| {
                        tokio::spawn(client(
                            via,
                            source,
                            host,
                            port,
                            phase_cfg.clone(),
                            phase_shape,
                            until,
                            count.clone(),
                        ))
                    })
                    .collect();
                for t in tasks.into_iter().chain(slow) {
                    let _ = t.await;
                }
            });
            if latency {
                let mut times = std::mem::take(&mut *LATENCIES.lock().expect("latencies"));
                for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
                    out.insert(
                        format!("{label}_round{round}_{name}_us"),
                        serde_json::json!(quantile(&mut times, q)),
                    );
                }
            }
            if neighbour {
                out.insert(
                    format!("{label}_round{round}_neighbour_refused"),
                    serde_json::json!(refused.load(Ordering::Relaxed)),
                );
            }
            let rps = count.load(Ordering::Relaxed) as f64 / secs as f64;
            let cpu = cpu_us(child.id()).unwrap_or(0);
            let mut used = cpu.saturating_sub(cpu_before);
            cpu_before = cpu;
            if label == "squid_bump_h1" {
                // Squid's own CPU (its main process; the certificate helpers are idle once
                // the one certificate is made).
                let s = squid_cpu();
                used = s.saturating_sub(peer_cpu_before);
                peer_cpu_before = s;
            } else if squid.is_some() {
                peer_cpu_before = squid_cpu();
            }
            if peer_pid != 0 {
                // The peer's CPU in its own phase; ours in the others.
                let p = cpu_us(peer_pid).unwrap_or(0);
                if label == "peer_relayed" {
                    used = p.saturating_sub(peer_cpu_before);
                }
                peer_cpu_before = p;
            }
            out.insert(
                format!("{label}_round{round}_proxy_cpu_us_per_req"),
                serde_json::json!(
                    (used as f64 / count.load(Ordering::Relaxed).max(1) as f64 * 10.0).round()
                        / 10.0
                ),
            );
            out.insert(
                format!("{label}_round{round}_req_per_s"),
                serde_json::json!(rps.round()),
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(squid);
    println!("{}", serde_json::Value::Object(out));
}

/// CPU time of the running `squid` processes (its worker does the work), microseconds.
fn squid_cpu() -> u64 {
    let out = Command::new("pgrep").args(["-x", "squid"]).output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter_map(cpu_us)
            .sum()
    })
    .unwrap_or(0)
}
