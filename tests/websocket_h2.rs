//! WebSocket over HTTP/2 (RFC 8441 extended CONNECT) on a terminated host (issue 62): no
//! common client library speaks it, so both ends are written here with hyper's HTTP/2
//! (client and server, `enable_connect_protocol`) and `fastwebsockets` frames. The client
//! tunnels to the proxy with CONNECT, speaks TLS with ALPN `h2` to the proxy's terminated
//! certificate, and opens the socket with `:protocol websocket`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use fastwebsockets::{Frame, OpCode, Payload, Role, WebSocket};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Got = Arc<Mutex<Vec<String>>>;

/// An HTTP/2 origin offering extended CONNECT: each socket answers a text message with
/// `got:` and it, and a ping with a pong; what it received is kept in `got` (`ping:PAYLOAD`
/// for a ping).
async fn origin(ca: &TestCa, got: Got) -> u16 {
    let cfg = ca.server_config(&[b"h2"]);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let got = got.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |mut req: http::Request<hyper::body::Incoming>| {
                        let got = got.clone();
                        async move {
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let Ok(up) = on.await else { return };
                                let mut ws =
                                    WebSocket::after_handshake(TokioIo::new(up), Role::Server);
                                ws.set_auto_pong(false);
                                while let Ok(f) = ws.read_frame().await {
                                    if f.opcode == OpCode::Close {
                                        break;
                                    }
                                    if f.opcode == OpCode::Ping {
                                        let p = f.payload.to_vec();
                                        let seen = String::from_utf8_lossy(&p).to_string();
                                        got.lock().unwrap().push(format!("ping:{seen}"));
                                        let pong = Frame::pong(Payload::Owned(p));
                                        let _ = ws.write_frame(pong).await;
                                    }
                                    if f.opcode == OpCode::Text {
                                        let t = String::from_utf8(f.payload.to_vec()).unwrap();
                                        got.lock().unwrap().push(t.clone());
                                        let answer = format!("got:{t}");
                                        let _ = ws
                                            .write_frame(Frame::text(Payload::Owned(
                                                answer.into_bytes(),
                                            )))
                                            .await;
                                    }
                                }
                            });
                            Ok::<_, std::convert::Infallible>(http::Response::new(
                                Empty::<Bytes>::new(),
                            ))
                        }
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .enable_connect_protocol()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    port
}

/// CONNECT through the proxy to api.test, then TLS with ALPN `h2` trusting the interception
/// CA: an HTTP/2 connection to the terminated host.
async fn h2_to(
    proxy: std::net::SocketAddr,
    port: u16,
    ica: &std::path::Path,
) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let mut tcp = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let auth = basic("dev", "dev-secret");
    tcp.write_all(
        format!("CONNECT api.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let cfg = client_config(ica, &[b"h2"]);
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect("api.test".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// Open a socket on `path` with extended CONNECT: the status, and the socket when it is 200.
async fn open(
    send: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    port: u16,
    path: &str,
) -> (u16, Option<WebSocket<TokioIo<hyper::upgrade::Upgraded>>>) {
    let uri = format!("https://api.test:{port}{path}");
    // The server's SETTINGS (extended CONNECT enabled) arrive just after the handshake.
    let mut resp = None;
    for _ in 0..40 {
        send.ready().await.unwrap();
        let mut r = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(uri.as_str())
            .header("sec-websocket-version", "13")
            .body(Empty::new())
            .unwrap();
        r.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        match send.send_request(r).await {
            Ok(x) => {
                resp = Some(x);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let mut resp = resp.expect("an extended CONNECT was accepted for sending");
    let status = resp.status().as_u16();
    if status != 200 {
        return (status, None);
    }
    let up = hyper::upgrade::on(&mut resp).await.unwrap();
    (
        status,
        Some(WebSocket::after_handshake(TokioIo::new(up), Role::Client)),
    )
}

#[test]
fn extended_connect_on_http2_is_judged_per_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::generate(d);
    ca_init(&d.join("ica"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let got: Got = Arc::default();
    let port = rt.block_on(origin(&ca, got.clone()));
    let http = "[{ host: api.test, paths: [/socket], protocol: websocket, messages: { text: [\"hello*\"] } }, { host: api.test, paths: [/plain] }]";
    let proxy = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .intercept(&d.join("ica"), &ca.ca_pem)
        .sandbox(
            SandboxSpec::new("dev")
                .token("dev-secret")
                .allow(&format!("api.test:{port}"))
                .network("http", http),
        )
        .start(d);
    rt.block_on(async {
        let mut send = h2_to(proxy.proxy, port, &d.join("ica/ca.crt")).await;
        // No socket where no websocket rule allows one.
        let (status, _) = open(&mut send, port, "/plain").await;
        assert_eq!(status, 403);
        let (status, ws) = open(&mut send, port, "/socket").await;
        assert_eq!(status, 200);
        let mut ws = ws.unwrap();
        ws.write_frame(Frame::text(Payload::Owned(b"hello one".to_vec())))
            .await
            .unwrap();
        let f = ws.read_frame().await.unwrap();
        assert_eq!(&f.payload[..], b"got:hello one");
        // A ping's payload never reaches the origin, and the sandbox's pong matches its ping.
        ws.set_auto_pong(false);
        // The proxy ends its side after its close frame; the test reads it without answering.
        ws.set_auto_close(false);
        ws.write_frame(Frame::new(
            true,
            OpCode::Ping,
            None,
            Payload::Owned(b"exfil-1234".to_vec()),
        ))
        .await
        .unwrap();
        let f = ws.read_frame().await.unwrap();
        assert_eq!(f.opcode, OpCode::Pong);
        assert_eq!(&f.payload[..], b"exfil-1234");
        ws.write_frame(Frame::text(Payload::Owned(b"rm -rf".to_vec())))
            .await
            .unwrap();
        let f = ws.read_frame().await.unwrap();
        assert_eq!(f.opcode, OpCode::Close);
        assert_eq!(u16::from_be_bytes([f.payload[0], f.payload[1]]), 1008);
        // The connection serves other streams after the socket.
        let (status, _) = open(&mut send, port, "/plain").await;
        assert_eq!(status, 403);
    });
    assert_eq!(
        *got.lock().unwrap(),
        vec!["hello one".to_string(), "ping:".to_string()]
    );
    proxy.wait_record(|r| {
        r["reason"] == "websocket_not_allowed"
            && r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("message 2"))
    });
}
