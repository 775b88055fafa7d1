//! Time to first token and tokens per second of a streamed LLM answer: directly to a TLS
//! origin that answers `POST /v1/chat/completions` with an OpenAI-shaped event stream (`--chunks`
//! events, one every `--chunk-us`, then the usage chunk and `[DONE]`), and through the proxy
//! terminating it with a brokered key, a `protocol: openai` rule (model judged, body read) and a
//! `tokens_per_day` budget (the call reserved, its answer tapped for usage, settled at the end).
//! The two paths alternate for `--rounds` rounds in one run; each runs `--streams` calls,
//! `--concurrency` at a time, one connection each; a third path (`plain`) goes through a
//! second proxy with the same key and a plain method rule, so that what reading the calls
//! costs is told apart from terminating them; a fourth (`cold`) goes through a third proxy
//! like the first that keeps no upstream connection (`upstream_keepalive.idle_ms: 0`), so
//! that every call pays the upstream handshakes. Prints one JSON line: time to first token
//! (from the request's last byte written to the first event's first byte) p50/p99, added
//! latency p50/p99 against direct, tokens per second per stream, and the proxy's CPU per call.
//!
//! ```text
//! cargo build --release && cargo bench --bench inference_stream -- --streams 200 --rounds 3
//! cargo bench --bench inference_stream -- --bin /tmp/old/target/release/egress-proxy   # A/B
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::*;

const SECRET: &str = "sk-bench-0123456789";

/// The event stream: `chunks` content events `pause` apart, the usage chunk, `[DONE]`.
fn events(chunks: usize, pause: Duration) -> StreamBody<tokio_stream_like::Rx> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        for i in 0..chunks {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            let e = format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n"
            );
            if tx.send(Ok(Frame::data(Bytes::from(e)))).await.is_err() {
                return;
            }
        }
        let usage = format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{{\"prompt_tokens\":20,\"completion_tokens\":{chunks},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n", 20 + chunks);
        let _ = tx.send(Ok(Frame::data(Bytes::from(usage)))).await;
    });
    StreamBody::new(tokio_stream_like::Rx(rx))
}

/// A receiver as a stream of frames (what `StreamBody` reads).
mod tokio_stream_like {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use hyper::body::Frame;

    type Item = Result<Frame<Bytes>, std::convert::Infallible>;

    pub struct Rx(pub tokio::sync::mpsc::Receiver<Item>);

    impl futures_util::Stream for Rx {
        type Item = Item;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
            self.0.poll_recv(cx)
        }
    }
}

/// The TLS origin: every request read whole, answered with the event stream (requests
/// without the brokered key get 401).
async fn origin(cert: Vec<u8>, key: Vec<u8>, chunks: usize, pause: Duration) -> SocketAddr {
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
                    move |req: http::Request<hyper::body::Incoming>| async move {
                        use http_body_util::BodyExt;
                        let keyed = req
                            .headers()
                            .get("authorization")
                            .is_some_and(|v| v.as_bytes() == format!("Bearer {SECRET}").as_bytes());
                        let _ = req.into_body().collect().await;
                        let resp = http::Response::builder()
                            .status(if keyed { 200 } else { 401 })
                            .header("content-type", "text/event-stream")
                            .body(events(if keyed { chunks } else { 0 }, pause))
                            .expect("response");
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// One streamed call: (time to first token, tokens per second after it), in µs and tokens/s.
async fn call(
    proxy: Option<SocketAddr>,
    port: u16,
    cfg: Arc<rustls::ClientConfig>,
    chunks: usize,
) -> (u32, f64) {
    let mut s = tls::connect(proxy, "llm.test", port, cfg).await;
    let body = r#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"messages":[{"role":"user","content":"Say something."}]}"#;
    // Direct, the client sends the key itself; through the proxy, the placeholder is replaced.
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: llm.test:{port}\r\nAuthorization: Bearer {SECRET}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("request");
    let sent = Instant::now();
    let head = tls::read_head(&mut s).await;
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "the call was refused: {}",
        String::from_utf8_lossy(&head)
    );
    let mut buf = vec![0u8; 16 * 1024];
    let mut seen = Vec::new();
    let mut first = None;
    loop {
        let n = s.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if first.is_none() && seen.windows(5).any(|w| w == b"data:") {
            first = Some(sent.elapsed());
        }
        if seen.windows(12).any(|w| w == b"data: [DONE]") {
            break;
        }
    }
    let first = first.expect("no event arrived");
    let rest = sent.elapsed().saturating_sub(first).as_secs_f64();
    let tps = if rest > 0.0 {
        chunks as f64 / rest
    } else {
        0.0
    };
    (first.as_micros() as u32, tps)
}

/// The proxy's configuration: the inference rule with a budget (`inference`), or the same
/// host and key with a plain method rule and no budget (`plain`: the A/B of reading the calls);
/// upstream connections kept between tunnels unless `cold`.
fn config(port: u16, inference: bool, cold: bool) -> String {
    let keep = if cold { "0" } else { "4000" };
    let (limits, rule) = match inference {
        true => (
            "{ tokens_per_day: 1000000000000 }",
            r#"{ host: llm.test, protocol: openai, models: ["gpt-4o-mini*"] }"#,
        ),
        false => ("{}", "{ host: llm.test, methods: [POST] }"),
    };
    format!(
        r#"listen: {{ proxy: 127.0.0.1:0, admin: null }}
audit: {{ path: /dev/null }}
admission: {{ accepts_per_second_per_source: 1000000, accept_burst_per_source: 1000000 }}
dns: {{ servers: ["127.0.0.1:9"], hosts: {{ llm.test: [127.0.0.1] }} }}
defaults: {{ guard_allow_ranges: [127.0.0.1/32], limits: {{ max_connections: 100000, connections_per_second: 1000000, burst: 1000000 }} }}
tls_intercept: {{ ca_cert_file: ica/ca.crt, ca_key_file: ica/ca.key, upstream_ca_file: uca.pem, upstream_keepalive: {{ idle_ms: {keep} }} }}
sandboxes:
  - id: bench
    sources: [127.0.0.1/32]
    limits: {limits}
    credentials:
      - {{ name: llm, hosts: [llm.test], inject: {{ header: Authorization, format: "Bearer {{secret}}" }}, source: {{ env: BENCH_LLM_KEY }} }}
    policy:
      provider: local
      config: {{}}
      network:
        egress: ["llm.test:{port}"]
        http: [{rule}]
"#
    )
}

fn main() {
    let streams: usize = arg("--streams", 200);
    let concurrency: usize = arg("--concurrency", 4);
    let rounds: usize = arg("--rounds", 3);
    let chunks: usize = arg("--chunks", 20);
    let pause = Duration::from_micros(arg("--chunk-us", 2000));
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
    let (cert, key, upstream_ca) = tls::upstream_pki("llm.test");
    let port = rt.block_on(origin(cert, key, chunks, pause)).port();
    let dir = tempfile::tempdir().expect("dir");
    let out = std::process::Command::new(&bin)
        .args(["ca", "init"])
        .arg(dir.path().join("ica"))
        .output()
        .expect("ca init");
    assert!(out.status.success(), "ca init");
    std::fs::write(dir.path().join("uca.pem"), &upstream_ca).expect("uca");
    let start = |name: &str, inference: bool, cold: bool| {
        let path = dir.path().join(name);
        std::fs::write(&path, config(port, inference, cold)).expect("config");
        let s = start_proxy(&bin, &path, &[("BENCH_LLM_KEY", SECRET)]);
        let addr = s.proxy.expect("proxy address");
        (s.child, addr)
    };
    let (mut reading, proxy) = start("inference.yaml", true, false);
    let (mut plain, plain_addr) = start("plain.yaml", false, false);
    let (mut cold, cold_addr) = start("cold.yaml", true, true);
    let ccfg = tls::client_config(dir.path(), &upstream_ca);
    let mut report = serde_json::Map::new();
    report.insert("streams".into(), serde_json::json!(streams));
    report.insert("chunks".into(), serde_json::json!(chunks));
    let run = |via: Option<SocketAddr>| {
        rt.block_on(async {
            let sem = Arc::new(tokio::sync::Semaphore::new(concurrency));
            let tasks: Vec<_> = (0..streams)
                .map(|_| {
                    let (sem, cfg) = (sem.clone(), ccfg.clone());
                    tokio::spawn(async move {
                        let _permit = sem.acquire_owned().await.expect("permit");
                        call(via, port, cfg, chunks).await
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("call"));
            }
            out
        })
    };
    for round in 0..rounds {
        let mut direct_p = (0, 0);
        for (label, via) in [
            ("direct", None),
            ("plain", Some(plain_addr)),
            ("proxy", Some(proxy)),
            ("cold", Some(cold_addr)),
        ] {
            let pid = match label {
                "plain" => plain.id(),
                "cold" => cold.id(),
                _ => reading.id(),
            };
            let cpu_before = cpu_us(pid).unwrap_or(0);
            let got = run(via);
            let cpu = cpu_us(pid).unwrap_or(0).saturating_sub(cpu_before);
            let mut ttft: Vec<u32> = got.iter().map(|g| g.0).collect();
            ttft.sort_unstable();
            let tps = got.iter().map(|g| g.1).sum::<f64>() / got.len().max(1) as f64;
            let (p50, p99) = (tls::percentile(&ttft, 0.5), tls::percentile(&ttft, 0.99));
            let key = |k: &str| format!("{label}_round{round}_{k}");
            report.insert(key("ttft_p50_us"), serde_json::json!(p50));
            report.insert(key("ttft_p99_us"), serde_json::json!(p99));
            report.insert(key("tokens_per_s"), serde_json::json!(tps.round()));
            match via {
                None => direct_p = (p50, p99),
                Some(_) => {
                    report.insert(
                        key("added_p50_us"),
                        serde_json::json!(i64::from(p50) - i64::from(direct_p.0)),
                    );
                    report.insert(
                        key("added_p99_us"),
                        serde_json::json!(i64::from(p99) - i64::from(direct_p.1)),
                    );
                    report.insert(
                        key("proxy_cpu_us_per_call"),
                        serde_json::json!(cpu / streams.max(1) as u64),
                    );
                }
            }
        }
    }
    for c in [&mut reading, &mut plain, &mut cold] {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!("{}", serde_json::Value::Object(report));
}
