//! Messages per second and latency per message over WebSocket: directly to a TLS echo origin,
//! and through the proxy terminating it with a `protocol: websocket` rule whose `messages`
//! judge each message as JSON-RPC (`ws.test`: every frame read, the message parsed and
//! judged, re-framed and sent on; the echo read and forwarded back). Each connection sends a
//! JSON-RPC `ping` and waits for its echo, over and over (one message in flight per
//! connection), for `--seconds`; the two paths alternate for `--rounds` rounds in one run.
//! Prints one JSON line: messages per second, p50/p99 round trip per message, and the proxy's
//! CPU per message.
//!
//! ```text
//! cargo build --release && cargo bench --bench websocket -- --connections 8 --seconds 5
//! cargo bench --bench websocket -- --bin /tmp/old/target/release/egress-proxy   # A/B
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use fastwebsockets::{Frame, OpCode, Payload, Role, WebSocket};
use http_body_util::Empty;
use tokio::io::AsyncWriteExt;

mod common;
use common::*;

const PING: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"seq":1}}"#;

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2).
fn accept(key: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(ctx.finish())
}

/// A TLS WebSocket origin that echoes every message.
async fn origin(cert: Vec<u8>, key: Vec<u8>) -> SocketAddr {
    let acceptor = tls::acceptor(cert, key);
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
                    |mut req: http::Request<hyper::body::Incoming>| async move {
                        let key = req
                            .headers()
                            .get("sec-websocket-key")
                            .map(|k| accept(k.as_bytes()))
                            .unwrap_or_default();
                        let on = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let Ok(up) = on.await else { return };
                            let mut ws = WebSocket::after_handshake(
                                hyper_util::rt::TokioIo::new(up),
                                Role::Server,
                            );
                            while let Ok(f) = ws.read_frame().await {
                                if f.opcode != OpCode::Text {
                                    break;
                                }
                                let echo = Frame::text(Payload::Owned(f.payload.to_vec()));
                                if ws.write_frame(echo).await.is_err() {
                                    break;
                                }
                            }
                        });
                        let resp = http::Response::builder()
                            .status(101)
                            .header("upgrade", "websocket")
                            .header("connection", "Upgrade")
                            .header("sec-websocket-accept", key)
                            .body(Empty::<Bytes>::new())
                            .expect("101");
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

/// Open a socket to ws.test on `port`: through `proxy` (CONNECT) when given, else directly;
/// TLS trusting `roots`, the upgrade written by hand.
async fn open(
    proxy: Option<SocketAddr>,
    port: u16,
    cfg: Arc<rustls::ClientConfig>,
) -> WebSocket<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut tls = tls::connect(proxy, "ws.test", port, cfg).await;
    tls.write_all(
        format!(
            "GET /socket HTTP/1.1\r\nHost: ws.test:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("upgrade");
    let head = tls::read_head(&mut tls).await;
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "the upgrade was refused: {}",
        String::from_utf8_lossy(&head)
    );
    WebSocket::after_handshake(tls, Role::Client)
}

/// Ping and wait for the echo until `until`; the round trips, in microseconds.
async fn client(
    proxy: Option<SocketAddr>,
    port: u16,
    cfg: Arc<rustls::ClientConfig>,
    until: Instant,
) -> Vec<u32> {
    let mut ws = open(proxy, port, cfg).await;
    let mut rtts = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        ws.write_frame(Frame::text(Payload::Borrowed(PING)))
            .await
            .expect("send");
        let f = ws.read_frame().await.expect("echo");
        assert_eq!(&f.payload[..], PING, "the echo is the message");
        rtts.push(t.elapsed().as_micros() as u32);
    }
    let _ = ws.write_frame(Frame::close(1000, b"")).await;
    rtts
}

fn main() {
    let conns: usize = arg("--connections", 8);
    let secs: u64 = arg("--seconds", 5);
    let rounds: usize = arg("--rounds", 3);
    let bin: PathBuf = arg(
        "--bin",
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/release/egress-proxy"
        )),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (cert, key, upstream_ca) = tls::upstream_pki("ws.test");
    let port = rt.block_on(origin(cert, key)).port();
    let dir = tempfile::tempdir().expect("dir");
    let out = std::process::Command::new(&bin)
        .args(["ca", "init"])
        .arg(dir.path().join("ica"))
        .output()
        .expect("ca init");
    assert!(out.status.success(), "ca init");
    std::fs::write(dir.path().join("uca.pem"), &upstream_ca).expect("uca");
    std::fs::write(
        dir.path().join("proxy.yaml"),
        format!(
            r#"listen: {{ proxy: 127.0.0.1:0, admin: null }}
audit: {{ path: /dev/null }}
dns: {{ servers: ["127.0.0.1:9"], hosts: {{ ws.test: [127.0.0.1] }} }}
defaults: {{ guard_allow_ranges: [127.0.0.1/32], limits: {{ max_connections: 100000, connections_per_second: 1000000, burst: 1000000 }} }}
tls_intercept: {{ ca_cert_file: ica/ca.crt, ca_key_file: ica/ca.key, upstream_ca_file: uca.pem }}
sandboxes:
  - id: bench
    sources: [127.0.0.1/32]
    policy:
      provider: local
      config: {{}}
      network:
        egress: ["ws.test:{port}"]
        http: [{{ host: ws.test, paths: [/socket], protocol: websocket, messages: {{ jsonrpc: {{ methods: [ping] }} }} }}]
"#
        ),
    )
    .expect("config");
    let Started {
        mut child, proxy, ..
    } = start_proxy(&bin, &dir.path().join("proxy.yaml"), &[]);
    let proxy = proxy.expect("proxy address");
    let ccfg = tls::client_config(dir.path(), &upstream_ca);
    let mut report = serde_json::Map::new();
    report.insert("connections".into(), serde_json::json!(conns));
    for round in 0..rounds {
        for (label, via) in [("direct", None), ("proxy", Some(proxy))] {
            let cpu_before = cpu_us(child.id()).unwrap_or(0);
            let until = Instant::now() + Duration::from_secs(secs);
            let mut rtts: Vec<u32> = rt.block_on(async {
                let tasks: Vec<_> = (0..conns)
                    .map(|_| tokio::spawn(client(via, port, ccfg.clone(), until)))
                    .collect();
                let mut all = Vec::new();
                for t in tasks {
                    all.extend(t.await.expect("client"));
                }
                all
            });
            rtts.sort_unstable();
            let n = rtts.len().max(1);
            let cpu = cpu_us(child.id()).unwrap_or(0).saturating_sub(cpu_before);
            let key = |k: &str| format!("{label}_round{round}_{k}");
            report.insert(key("msg_per_s"), serde_json::json!(n as u64 / secs));
            report.insert(
                key("p50_us"),
                serde_json::json!(tls::percentile(&rtts, 0.5)),
            );
            report.insert(
                key("p99_us"),
                serde_json::json!(tls::percentile(&rtts, 0.99)),
            );
            if via.is_some() {
                report.insert(
                    key("proxy_cpu_us_per_msg"),
                    serde_json::json!((cpu as f64 / n as f64 * 10.0).round() / 10.0),
                );
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    println!("{}", serde_json::Value::Object(report));
}
