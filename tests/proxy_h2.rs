//! HTTP/2 to the proxy (`listen.proxy_tls` negotiates `h2` with ALPN): two CONNECT tunnels
//! (RFC 9113 §8.5) and a forwarded request on one connection, each identified, decided and
//! recorded alone; a reload that revokes one tunnel resets that stream and its sibling keeps
//! running. The client is hyper's HTTP/2 client over rustls: Debian 12's curl (7.88) has no
//! `--proxy-http2` (it came in curl 8.1).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The TLS listener (`server.pem` in the test's directory), the test names on loopback and
/// sandbox `s` (token `h2-token`) reaching `egress`.
fn config(egress: &[&str]) -> ProxyConfig {
    let s = egress
        .iter()
        .fold(SandboxSpec::new("s").token("h2-token"), |s, e| s.allow(e));
    ProxyConfig::new()
        .listen_at(
            "proxy_tls",
            "{ addr: 127.0.0.1:0, cert_file: server.pem, key_file: server.key }",
        )
        .dns_server("127.0.0.1:9")
        .host("api.test", "127.0.0.1")
        .host("rev.test", "127.0.0.1")
        .host("denied.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(s)
}

fn proxy_auth() -> String {
    basic("s", "h2-token")
}

/// Open a CONNECT stream to `authority`: the status, and the tunnel when it is 200.
async fn tunnel(
    sender: &mut SendRequest<Empty<Bytes>>,
    authority: &str,
) -> (u16, Option<TokioIo<hyper::upgrade::Upgraded>>) {
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(authority)
        .header("proxy-authorization", proxy_auth())
        .body(Empty::new())
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    if status != 200 {
        return (status, None);
    }
    let up = hyper::upgrade::on(resp).await.unwrap();
    (status, Some(TokioIo::new(up)))
}

/// Start a slow download through a tunnel; count what arrives until the stream ends.
fn download(
    mut t: TokioIo<hyper::upgrade::Upgraded>,
    host: &str,
) -> (
    Arc<std::sync::atomic::AtomicU64>,
    tokio::task::JoinHandle<Instant>,
) {
    let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = got.clone();
    let request = format!("GET /slow HTTP/1.1\r\nHost: {host}\r\n\r\n");
    let task = tokio::spawn(async move {
        t.write_all(request.as_bytes()).await.unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match t.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(n) => {
                    counter.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    });
    (got, task)
}

#[test]
fn two_tunnels_and_a_request_on_one_h2_connection_and_revoking_one_leaves_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let roots = proxy_certificate(dir.path());
    let origin = Origin::start(None);
    let op = origin.addr.port();
    let proxy = config(&["api.test:*", "rev.test:*"]).start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(scenario(dir.path(), roots, op, &proxy));
}

async fn scenario(dir: &Path, roots: rustls::RootCertStore, op: u16, proxy: &Proxy) {
    let mut h2 = connect_h2(proxy.proxy_tls.expect("proxy_tls"), roots).await;

    // Two tunnels on the one connection.
    let (status, rev) = tunnel(&mut h2, &format!("rev.test:{op}")).await;
    assert_eq!(status, 200);
    let (status, api) = tunnel(&mut h2, &format!("api.test:{op}")).await;
    assert_eq!(status, 200);
    let (rev_got, rev_done) = download(rev.unwrap(), "rev.test");
    let (api_got, api_done) = download(api.unwrap(), "api.test");

    // A forwarded request and a denied tunnel on the same connection, alongside.
    let req = http::Request::builder()
        .uri(format!("http://api.test:{op}/hello"))
        .header("proxy-authorization", proxy_auth())
        .body(Empty::new())
        .unwrap();
    h2.ready().await.unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).starts_with("hello from origin /hello"));
    let (status, _) = tunnel(&mut h2, &format!("denied.test:{op}")).await;
    assert_eq!(status, 403, "a denied stream is refused alone");
    // A slow forwarded download from rev.test, also on this connection.
    let req = http::Request::builder()
        .uri(format!("http://rev.test:{op}/slow"))
        .header("proxy-authorization", proxy_auth())
        .body(Empty::new())
        .unwrap();
    h2.ready().await.unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let fwd_got = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let fwd_done = {
        let got = fwd_got.clone();
        let mut body = resp.into_body();
        tokio::spawn(async move {
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => {
                        let n = f.data_ref().map(|d| d.len()).unwrap_or(0);
                        got.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(_) => return "reset",
                }
            }
            "ended"
        })
    };

    // Both downloads are moving.
    let moving =
        |got: &std::sync::atomic::AtomicU64| got.load(std::sync::atomic::Ordering::SeqCst) >= 2048;
    eventually_async(Duration::from_secs(10), "the downloads to start", || {
        let all = moving(&rev_got) && moving(&api_got) && moving(&fwd_got);
        std::future::ready(all.then_some(()))
    })
    .await;

    // Revoke rev.test: its stream ends at once, api.test's keeps going on the same connection.
    let narrowed = config(&["api.test:*"]).yaml(&dir.join("audit.jsonl"));
    std::fs::write(dir.join("proxy.yaml"), narrowed).unwrap();
    let reloaded = Instant::now();
    unsafe_free_kill(proxy.child.id(), "HUP");
    let ended = tokio::time::timeout(Duration::from_secs(10), rev_done)
        .await
        .expect("the revoked stream ended")
        .unwrap();
    assert!(ended.duration_since(reloaded) < Duration::from_secs(10));
    // The forwarded download from rev.test ends too (its stream reset, not completed).
    let how = tokio::time::timeout(Duration::from_secs(10), fwd_done)
        .await
        .expect("the revoked forwarded stream ended")
        .unwrap();
    assert!(
        fwd_got.load(std::sync::atomic::Ordering::SeqCst) < 614_400,
        "the revoked download completed ({how})"
    );
    let at_cut = api_got.load(std::sync::atomic::Ordering::SeqCst);
    // The sibling stream moves on after the cut.
    eventually_async(
        Duration::from_secs(10),
        "api.test's stream to keep going",
        || {
            let now = api_got.load(std::sync::atomic::Ordering::SeqCst);
            std::future::ready((now > at_cut + 2048).then_some(()))
        },
    )
    .await;
    assert!(!api_done.is_finished(), "the sibling tunnel ended");

    // The records: one per stream, the same client connection, rev.test revoked.
    let rev = proxy.wait_record(|r| r["target_host"] == "rev.test");
    assert_eq!(rev["close"], "revoked", "{rev}");
    let denied = proxy.wait_record(|r| r["target_host"] == "denied.test");
    assert_eq!(denied["decision"], "deny", "{denied}");
    let fwd = proxy.wait_record(|r| {
        r["path"] == "/hello" || (r["mode"] == "http" && r["target_host"] == "api.test")
    });
    assert_eq!(rev["client"], denied["client"], "one connection");
    assert_eq!(rev["client"], fwd["client"], "one connection");
    assert_eq!(rev["sandbox"], "s");
    // A new stream after the reload: rev.test is refused, api.test still allowed.
    let (status, _) = tunnel(&mut h2, &format!("rev.test:{op}")).await;
    assert_eq!(status, 403);
    api_done.abort();
}

/// An HTTP/2 connection on which no stream starts for `idle_ms` is told to go away (GOAWAY):
/// it cannot hold its place unused, while a tunnel still open on it runs to its end.
#[test]
fn an_h2_connection_that_starts_no_stream_for_idle_ms_goes_away_and_open_tunnels_finish() {
    let dir = tempfile::tempdir().unwrap();
    let roots = proxy_certificate(dir.path());
    let origin = Origin::start(None);
    let op = origin.addr.port();
    let proxy = config(&["api.test:*"])
        .defaults("timeouts", "{ idle_ms: 1000 }")
        .start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut h2 = connect_h2(proxy.proxy_tls.expect("proxy_tls"), roots).await;
        let (status, t) = tunnel(&mut h2, &format!("api.test:{op}")).await;
        assert_eq!(status, 200);
        let (got, done) = download(t.unwrap(), "api.test");
        // No new stream for 2.5 × idle_ms: the connection takes no more.
        let_time_pass_async(
            Duration::from_millis(2500),
            "2.5 × idle_ms without a stream",
        )
        .await;
        let req = http::Request::builder()
            .uri(format!("http://api.test:{op}/late"))
            .header("proxy-authorization", proxy_auth())
            .body(Empty::new())
            .unwrap();
        let late = match h2.ready().await {
            Err(_) => true,
            Ok(()) => h2.send_request(req).await.is_err(),
        };
        assert!(late, "a stream started on a connection idle past idle_ms");
        // The tunnel (never idle: the origin sends every 100 ms) still moves.
        let before = got.load(std::sync::atomic::Ordering::SeqCst);
        eventually_async(
            Duration::from_secs(10),
            "the open tunnel to move after the GOAWAY",
            || {
                std::future::ready(
                    (got.load(std::sync::atomic::Ordering::SeqCst) > before).then_some(()),
                )
            },
        )
        .await;
        assert!(!done.is_finished());
        done.abort();
    });
}

/// Each HTTP/2 stream takes a place under the global `max_connections`, as an HTTP/1.1
/// connection does: with `max_connections: 4`, one connection (one place) carries three
/// tunnels, the fourth stream gets `429 connection_limit`, and so does an HTTP/1.1 CONNECT
/// from elsewhere; a tunnel that ends gives its place back.
#[test]
fn each_h2_stream_takes_a_place_under_the_global_cap() {
    let dir = tempfile::tempdir().unwrap();
    let roots = proxy_certificate(dir.path());
    let origin = Origin::start(None);
    let op = origin.addr.port();
    let proxy = config(&["api.test:*"])
        .raw("max_connections: 4")
        .start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut h2 = connect_h2(proxy.proxy_tls.expect("proxy_tls"), roots).await;
        let mut open = Vec::new();
        let mut statuses = Vec::new();
        for _ in 0..6 {
            let (status, t) = tunnel(&mut h2, &format!("api.test:{op}")).await;
            statuses.push(status);
            open.extend(t);
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
        // Another client's HTTP/1.1 CONNECT: the cap is full.
        let plain = proxy.proxy;
        let auth = proxy_auth();
        let head = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(plain).unwrap();
            use std::io::Write;
            write!(
                s,
                "CONNECT api.test:{op} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"
            )
            .unwrap();
            String::from_utf8_lossy(&read_head(&mut s)).into_owned()
        })
        .await
        .unwrap();
        assert!(head.starts_with("HTTP/1.1 429"), "{head}");
        // One tunnel ends: its place comes back.
        drop(open.pop());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, t) = tunnel(&mut h2, &format!("api.test:{op}")).await;
            if status == 200 {
                open.extend(t);
                break;
            }
            assert!(Instant::now() < deadline, "the place never came back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let rec = proxy.wait_record(|r| r["reason"] == "connection_limit");
    assert_eq!(rec["decision"], "deny", "{rec}");
}

/// A minimal HTTP/2 client that writes frames by hand, for what no well-behaved client sends.
mod raw {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
    use tokio_rustls::client::TlsStream;

    pub type Reader = ReadHalf<TlsStream<tokio::net::TcpStream>>;
    pub type Writer = WriteHalf<TlsStream<tokio::net::TcpStream>>;

    pub const HEADERS: u8 = 1;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const GOAWAY: u8 = 7;
    pub const WINDOW_UPDATE: u8 = 8;

    pub fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[ty, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// An HPACK header block of literal fields without indexing (names and values < 127).
    pub fn block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (n, v) in fields {
            b.push(0x00);
            b.push(n.len() as u8);
            b.extend_from_slice(n.as_bytes());
            b.push(v.len() as u8);
            b.extend_from_slice(v.as_bytes());
        }
        b
    }

    /// HEADERS with END_HEADERS on `stream`.
    pub fn headers(stream: u32, fields: &[(&str, &str)]) -> Vec<u8> {
        frame(HEADERS, 0x4, stream, &block(fields))
    }

    pub async fn read_frame(r: &mut Reader) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        r.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], stream, payload))
    }

    /// TLS with ALPN h2 to `addr`, the preface and an empty SETTINGS sent, the server's
    /// SETTINGS read and acknowledged: (reader, writer, the server's settings).
    pub async fn connect(
        addr: std::net::SocketAddr,
        roots: rustls::RootCertStore,
    ) -> (Reader, Writer, Vec<(u16, u32)>) {
        let tls = super::tls_h2(addr, roots).await;
        let (mut r, mut w) = tokio::io::split(tls);
        w.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        w.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        let mut settings = Vec::new();
        loop {
            let (ty, flags, _, p) = read_frame(&mut r).await.expect("the server's SETTINGS");
            if ty == SETTINGS && flags & 1 == 0 {
                for s in p.chunks(6) {
                    settings.push((
                        u16::from_be_bytes([s[0], s[1]]),
                        u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                    ));
                }
                break;
            }
        }
        w.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
        (r, w, settings)
    }
}

/// A TCP listener on loopback that counts the connections it accepts.
fn counting_listener() -> (u16, Arc<std::sync::atomic::AtomicU64>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        for s in l.incoming().map_while(Result::ok) {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            kept.push(s);
        }
    });
    (port, n)
}

/// Extended CONNECT (RFC 8441 / 9220: `:protocol` `websocket`, `connect-udp`, `connect-ip`)
/// is not offered (no SETTINGS_ENABLE_CONNECT_PROTOCOL) and a stream that sends `:protocol`
/// anyway is reset: no rule can allow what the proxy cannot check, and nothing is dialled.
#[test]
fn extended_connect_is_not_offered_and_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let roots = proxy_certificate(dir.path());
    let (port, accepted) = counting_listener();
    let proxy = config(&["api.test:*"]).start(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        let (mut r, mut w, settings) = raw::connect(proxy.proxy_tls.unwrap(), roots).await;
        assert!(
            !settings.iter().any(|(id, v)| *id == 8 && *v != 0),
            "extended CONNECT offered: {settings:?}"
        );
        let authority = format!("api.test:{port}");
        let auth = proxy_auth();
        for (i, protocol) in ["websocket", "connect-udp", "connect-ip"]
            .iter()
            .enumerate()
        {
            let stream = 2 * i as u32 + 1;
            let fields = [
                (":method", "CONNECT"),
                (":protocol", *protocol),
                (":scheme", "https"),
                (":path", "/"),
                (":authority", authority.as_str()),
                ("proxy-authorization", auth.as_str()),
            ];
            w.write_all(&raw::headers(stream, &fields)).await.unwrap();
            let refused = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let Some((ty, _, s, p)) = raw::read_frame(&mut r).await else {
                        return false; // the connection closed: not a refusal of this stream
                    };
                    match ty {
                        raw::RST_STREAM if s == stream => return true,
                        raw::GOAWAY => return false,
                        // `:status 200` is HPACK's static entry 8 (0x88).
                        raw::HEADERS if s == stream => return p.first() != Some(&0x88),
                        _ => {}
                    }
                }
            })
            .await
            .expect("an answer to the :protocol stream");
            assert!(refused, "{protocol}: the stream was accepted");
        }
    });
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a :protocol stream was dialled"
    );
}

/// MadeYouReset (CVE-2025-8671): a client makes the server reset its streams itself (here a
/// WINDOW_UPDATE that overflows each new stream's window, a stream error), so the resets do
/// not count as the client's while the requests already reached the server. The proxy's
/// HTTP/2 layer counts them: past its limit the connection gets GOAWAY ENHANCE_YOUR_CALM,
/// and the proxy goes on serving others.
#[test]
fn made_you_reset_ends_the_connection_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let roots = proxy_certificate(dir.path());
    let (port, _accepted) = counting_listener();
    let proxy = config(&["api.test:*"]).start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let r2 = roots.clone();
    let calm = rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        let (mut r, mut w, _) = raw::connect(proxy.proxy_tls.unwrap(), roots).await;
        let reader = tokio::spawn(async move {
            while let Some((ty, _, _, p)) = raw::read_frame(&mut r).await {
                if ty == raw::GOAWAY {
                    return Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
                }
            }
            None
        });
        let authority = format!("api.test:{port}");
        let auth = proxy_auth();
        for i in 0..1500u32 {
            let stream = 2 * i + 1;
            let fields = [
                (":method", "CONNECT"),
                (":authority", authority.as_str()),
                ("proxy-authorization", auth.as_str()),
            ];
            let mut out = raw::headers(stream, &fields);
            // The stream's send window pushed past 2^31-1: a stream error the server answers
            // with its own RST_STREAM (FLOW_CONTROL_ERROR), after the request reached it.
            let overflow = 0x7fff_ffffu32.to_be_bytes();
            out.extend(raw::frame(raw::WINDOW_UPDATE, 0, stream, &overflow));
            if w.write_all(&out).await.is_err() {
                break;
            }
        }
        tokio::time::timeout(Duration::from_secs(15), reader)
            .await
            .expect("the connection ends")
            .unwrap()
    });
    assert_eq!(calm, Some(0xb), "GOAWAY ENHANCE_YOUR_CALM");
    // Everyone else is still served.
    assert_eq!(proxy.admin_get("/healthz").0, 200);
    let origin = Origin::start(None);
    rt.block_on(async {
        let mut h2 = connect_h2(proxy.proxy_tls.unwrap(), r2).await;
        let (status, _t) = tunnel(&mut h2, &format!("api.test:{}", origin.addr.port())).await;
        assert_eq!(status, 200);
    });
}
