//! Origin servers on loopback (HTTPS with the test CA, or plain HTTP): `/big`, `/slow`,
//! `/echo`, `/upload` and a greeting.

#![allow(dead_code)]

use super::*;

/// Size of the `/big` response.
pub const BIG: usize = 8 * 1024 * 1024;

/// The byte at offset `i` of `/big`.
pub fn big_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// An origin server on 127.0.0.1:0 (TLS when given a CA). Paths: `/big` (8 MiB), `/slow`
/// (1 KiB every 100 ms for a minute), `/echo` (echoes the request head), `/upload` (reads the
/// request body to its end, counting every byte in `received`), anything else a short
/// greeting.
pub struct Origin {
    pub addr: SocketAddr,
    /// Request-body bytes that reached `/upload`, over all requests.
    pub received: Arc<AtomicU64>,
    /// `/big` bytes handed to the kernel, over all requests.
    pub big_sent: Arc<AtomicU64>,
    /// `/slow` bytes handed to the kernel, over all requests.
    pub slow_sent: Arc<AtomicU64>,
    /// `/upload` requests begun and ended (their connection closed, cut or answered).
    uploads: Arc<(AtomicU64, AtomicU64)>,
    _rt: Arc<tokio::runtime::Runtime>,
}

impl Origin {
    pub fn start(tls: Option<&TestCa>) -> Origin {
        Self::start_on("127.0.0.1", tls)
    }

    /// Start on a given local address (a veth address in the netns tests).
    pub fn start_on(ip: &str, tls: Option<&TestCa>) -> Origin {
        let rt = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
        );
        let acceptor =
            tls.map(|ca| tokio_rustls::TlsAcceptor::from(Arc::new(ca.server_config(&[]))));
        let listener = rt.block_on(tokio::net::TcpListener::bind((ip, 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let big_sent = Arc::new(AtomicU64::new(0));
        let slow_sent = Arc::new(AtomicU64::new(0));
        let uploads = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let counter = Counters {
            received: received.clone(),
            big_sent: big_sent.clone(),
            slow_sent: slow_sent.clone(),
            uploads: uploads.clone(),
        };
        rt.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(s) = a.accept(stream).await {
                                serve_one(s, counter).await;
                            }
                        }
                        None => serve_one(stream, counter).await,
                    }
                });
            }
        });
        Origin {
            addr,
            received,
            big_sent,
            slow_sent,
            uploads,
            _rt: rt,
        }
    }
}

/// What an origin's connections count, shared with the test.
#[derive(Clone)]
struct Counters {
    received: Arc<AtomicU64>,
    big_sent: Arc<AtomicU64>,
    slow_sent: Arc<AtomicU64>,
    uploads: Arc<(AtomicU64, AtomicU64)>,
}

async fn serve_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, c: Counters) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 65536 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    match path.split('?').next().unwrap_or("/") {
        "/big" => {
            let hdr =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\nConnection: close\r\n\r\n");
            if s.write_all(hdr.as_bytes()).await.is_err() {
                return;
            }
            let chunk: Vec<u8> = (0..65536).map(big_byte).collect();
            // 65536 is not a multiple of 251, so write with the right phase.
            let mut sent = 0;
            while sent < BIG {
                let phase = sent % 251;
                let n = (BIG - sent).min(65536 - 251);
                if s.write_all(&chunk[phase..phase + n]).await.is_err() {
                    return;
                }
                sent += n;
                c.big_sent.fetch_add(n as u64, Ordering::SeqCst);
            }
        }
        "/slow" => {
            let hdr = "HTTP/1.1 200 OK\r\nContent-Length: 614400\r\nConnection: close\r\n\r\n";
            if s.write_all(hdr.as_bytes()).await.is_err() {
                return;
            }
            for _ in 0..600 {
                if s.write_all(&[b'.'; 1024]).await.is_err() || s.flush().await.is_err() {
                    return;
                }
                c.slow_sent.fetch_add(1024, Ordering::SeqCst);
                super::let_time_pass_async(Duration::from_millis(100), "a slow origin's pace")
                    .await;
            }
        }
        "/upload" => {
            c.uploads.0.fetch_add(1, Ordering::SeqCst);
            upload(&mut s, &text, &head, &c.received).await;
            c.uploads.1.fetch_add(1, Ordering::SeqCst);
        }
        "/echo" => {
            let body = text;
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        }
        _ => {
            let body = format!("hello from origin {path}\n");
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        }
    }
    let _ = s.shutdown().await;
}

/// `/upload`: count the body (what followed the head in its read, then the rest) to EOF or
/// Content-Length, then answer how much arrived.
async fn upload<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    text: &str,
    head: &[u8],
    received: &AtomicU64,
) {
    let mut buf = [0u8; 4096];
    let length: Option<u64> = text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())
            .flatten()
    });
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
    let mut got = (head.len() - end) as u64;
    received.fetch_add(got, Ordering::SeqCst);
    while length.is_none_or(|l| got < l) {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                got += n as u64;
                received.fetch_add(n as u64, Ordering::SeqCst);
            }
        }
    }
    let body = format!("received {got}\n");
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

impl Origin {
    /// Wait (15 s at most) until `/big` has handed at least `bytes` to the kernel: with a
    /// client that reads slowly or not at all, that many bytes are queued on their way.
    pub fn wait_big_sent(&self, bytes: u64) {
        eventually(Duration::from_secs(15), "the origin to send /big", || {
            (self.big_sent.load(Ordering::SeqCst) >= bytes).then_some(())
        });
    }

    /// Wait (15 s at most) until `/big` stops moving: nothing more handed to the kernel for
    /// 500 ms — every buffer between it and a client that does not read is full.
    pub fn wait_big_stalled(&self) {
        let mut last = (u64::MAX, Instant::now());
        eventually(
            Duration::from_secs(15),
            "the /big download to stall",
            || {
                let now = self.big_sent.load(Ordering::SeqCst);
                if now != last.0 || now == 0 {
                    last = (now, Instant::now());
                }
                (last.1.elapsed() >= Duration::from_millis(500)).then_some(())
            },
        );
    }

    /// After a cut: wait until every `/upload` the origin began has ended — its connection
    /// closed, so nothing more can arrive on it. Returns what had arrived.
    pub fn wait_uploads_ended(&self) -> u64 {
        eventually(
            Duration::from_secs(15),
            "the cut upload to end at the origin",
            || {
                let (begun, ended) = (&self.uploads.0, &self.uploads.1);
                (ended.load(Ordering::SeqCst) >= begun.load(Ordering::SeqCst)).then_some(())
            },
        );
        self.received.load(Ordering::SeqCst)
    }
}

/// An origin run by a Python script of `tests/data` (the git backend, the MCP server): the
/// port it prints on its first line, and the process, killed on drop.
pub struct ScriptOrigin {
    pub port: u16,
    child: std::process::Child,
}

impl Drop for ScriptOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ScriptOrigin {
    /// Start `python3 tests/data/SCRIPT ARGS…` (its stderr discarded) and read its port.
    pub fn start(script: &str, args: &[&std::ffi::OsStr]) -> ScriptOrigin {
        ScriptOrigin::try_start(script, args).unwrap_or_else(|| {
            panic!("{script} printed no port (are its Python packages installed? tests/run installs them)")
        })
    }

    /// [`ScriptOrigin::start`], or `None` when the script printed no port (it could not
    /// start: a fixed port it was given is taken, say).
    pub fn try_start(script: &str, args: &[&std::ffi::OsStr]) -> Option<ScriptOrigin> {
        use std::io::BufRead;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(script);
        let mut child = std::process::Command::new("python3")
            .arg(path)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the origin's first line");
        match line.trim().parse() {
            Ok(port) => Some(ScriptOrigin { port, child }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }
}

/// A plain-HTTP origin on `ip` that keeps its connections open: every request head it reads
/// (bodiless) is answered `hello from origin PATH` with a length, never `Connection: close`.
pub fn keepalive_origin(ip: &str) -> u16 {
    let l = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = std::io::Read::read(&mut s, &mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&got[..end]).to_string();
                        got.drain(..end + 4);
                        let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                        let body = format!("hello from origin {path}\n");
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if std::io::Write::write_all(&mut s, answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

/// What an [`AlpnOrigin`] was sent: (HTTP version, method, path, body bytes) per request.
pub type Seen = Arc<Mutex<Vec<(String, String, String, usize)>>>;

/// An HTTPS origin behind `ca`'s certificate speaking HTTP/2 or HTTP/1.1 (ALPN), as hyper
/// serves them: every request's body read to its end and answered `hello from origin PATH`.
/// What it was sent: (HTTP version, method, path, body bytes) per request.
pub struct AlpnOrigin {
    pub addr: SocketAddr,
    pub seen: Seen,
    _rt: tokio::runtime::Runtime,
}

impl AlpnOrigin {
    pub fn start(ca: &TestCa) -> AlpnOrigin {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let acceptor =
            tokio_rustls::TlsAcceptor::from(Arc::new(ca.server_config(&[b"h2", b"http/1.1"])));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let kept = seen.clone();
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, kept) = (acceptor.clone(), kept.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let kept = kept.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let n = body.collect().await.map_or(0, |b| b.to_bytes().len());
                                let path = parts.uri.path().to_string();
                                kept.lock().unwrap().push((
                                    format!("{:?}", parts.version),
                                    parts.method.to_string(),
                                    path.clone(),
                                    n,
                                ));
                                let body = format!("hello from origin {path}\n");
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from(body)),
                                ))
                            }
                        },
                    );
                    let io = hyper_util::rt::TokioIo::new(tls);
                    if h2 {
                        let b = hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        );
                        let _ = b.serve_connection(io, svc).await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, svc)
                            .await;
                    }
                });
            }
        });
        AlpnOrigin {
            addr,
            seen,
            _rt: rt,
        }
    }
}

/// A plain HTTP/1.1 origin on 127.0.0.1 that answers every request head `200 served`, on
/// kept connections too: its port, and how many requests reached it.
pub fn counting_origin() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let served = std::sync::Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let count = count.clone();
            std::thread::spawn(move || {
                let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        got.drain(..end + 4);
                        count.fetch_add(1, Ordering::SeqCst);
                        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nserved";
                        if s.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, served)
}
