//! Test harness: a test CA and origin servers (HTTPS and HTTP) on loopback, the real
//! `egress-proxy` binary started on `127.0.0.1:0` with a config written by the test, and
//! real `curl`. Everything it starts it stops (Drop).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;

pub mod openapi;
pub mod tls_hello;
use sha2::{Digest, Sha256};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Names the test certificate is valid for (the origins answer to all of them).
pub const CERT_NAMES: &[&str] = &[
    "api.test",
    "big.test",
    "slow.test",
    "private.test",
    "meta.test",
    "denied.test",
    "port.test",
    "report.test",
    "other.test",
    "gone.test",
    "rev.test",
    "mixed.test",
];

/// Hex SHA-256 of a token, as `token_sha256` wants it.
pub fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A `Proxy-Authorization: Basic` value.
pub fn basic(user: &str, pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

/// A test CA and a server certificate signed by it, written to `dir`.
pub struct TestCa {
    pub ca_pem: PathBuf,
    /// The server certificate and its key, as PEM files (for servers configured by path).
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

impl TestCa {
    pub fn generate(dir: &Path) -> TestCa {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "egress-proxy test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(CERT_NAMES.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        let cert_pem = dir.join("test-origin.pem");
        std::fs::write(&cert_pem, cert.pem()).unwrap();
        let key_pem = dir.join("test-origin.key");
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        TestCa {
            ca_pem,
            cert_pem,
            key_pem,
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }
}

impl TestCa {
    /// A TLS server configuration presenting the test certificate, offering `alpn`.
    pub fn server_config(&self, alpn: &[&[u8]]) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![rustls::pki_types::CertificateDer::from(
                    self.cert_der.clone(),
                )],
                rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
            )
            .unwrap();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        cfg
    }
}

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
        let counter = (received.clone(), big_sent.clone());
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
            _rt: rt,
        }
    }
}

async fn serve_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    (received, big_sent): (Arc<AtomicU64>, Arc<AtomicU64>),
) {
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
                big_sent.fetch_add(n as u64, Ordering::SeqCst);
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
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        "/upload" => {
            // Count the body (what followed the head in this read, then the rest) to EOF or
            // Content-Length.
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

    /// After a cut: let bytes already handed to the kernel land (300 ms), then check that
    /// nothing more reaches `/upload` for `quiet`. Returns what had arrived.
    pub fn assert_nothing_more_arrives(&self, quiet: Duration) -> u64 {
        std::thread::sleep(Duration::from_millis(300));
        let at_cut = self.received.load(Ordering::SeqCst);
        std::thread::sleep(quiet);
        assert_eq!(
            self.received.load(Ordering::SeqCst),
            at_cut,
            "upload bytes kept reaching the origin after the cut"
        );
        at_cut
    }
}

/// The real proxy binary, running.
pub struct Proxy {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub transparent: Option<SocketAddr>,
    /// The DNS listener (UDP and TCP), when `listen.dns` is set.
    pub dns: Option<SocketAddr>,
    /// The TLS proxy listener, when `listen.proxy_tls` is set.
    pub proxy_tls: Option<SocketAddr>,
    pub audit: PathBuf,
    pub config: PathBuf,
    pub child: Child,
    pub stderr: Arc<Mutex<Vec<String>>>,
    /// The proxy's stdout when a test asked for it to be a pipe nobody reads.
    pub stdout_unread: Option<std::process::ChildStdout>,
}

impl Proxy {
    /// Start `egress-proxy run --config` with `yaml`, where the test's config should leave
    /// `listen` to this function (it sets 127.0.0.1:0 for proxy and admin) and `audit` too.
    pub fn start(dir: &Path, yaml: &str) -> Proxy {
        let audit = dir.join("audit.jsonl");
        let config = dir.join("proxy.yaml");
        let full = format!(
            "listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0 }}\naudit: {{ path: {} }}\n{yaml}",
            audit.display()
        );
        std::fs::write(&config, full).unwrap();
        Self::start_with(config, audit, &[])
    }

    pub fn start_with(config: PathBuf, audit: PathBuf, env: &[(&str, &str)]) -> Proxy {
        Self::start_wrapped(config, audit, env, &[])
    }

    /// Start with stdout (the audit log, `audit.path: "-"`) a pipe that is never read.
    pub fn start_stdout_unread(config: PathBuf) -> Proxy {
        Self::spawn(config, PathBuf::from("/dev/null"), &[], &[], true)
    }

    /// Start the binary under a wrapper command (`ip netns exec NS setpriv ...`).
    pub fn start_wrapped(
        config: PathBuf,
        audit: PathBuf,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Proxy {
        Self::spawn(config, audit, env, wrapper, false)
    }

    fn spawn(
        config: PathBuf,
        audit: PathBuf,
        env: &[(&str, &str)],
        wrapper: &[&str],
        stdout_pipe: bool,
    ) -> Proxy {
        let bin = env!("CARGO_BIN_EXE_egress-proxy");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(["run", "--config"])
            .arg(&config)
            .stdout(if stdout_pipe {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start egress-proxy");
        let stdout_unread = child.stdout.take();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("\"listening\"") {
                        let _ = tx.send(line.clone());
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("proxy did not start: {:?}", lines.lock().unwrap());
            }
        };
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let f = &v["fields"];
        let addr = |k: &str| f[k].as_str().and_then(|s| s.parse().ok());
        Proxy {
            proxy: addr("proxy_addr").unwrap_or_else(|| "0.0.0.0:0".parse().unwrap()),
            admin: addr("admin_addr").unwrap_or_else(|| "0.0.0.0:0".parse().unwrap()),
            transparent: addr("transparent_addr"),
            dns: addr("dns_addr"),
            proxy_tls: addr("proxy_tls_addr"),
            audit,
            config,
            child,
            stderr: lines,
            stdout_unread,
        }
    }

    /// Every audit record written so far ("end" and "open").
    pub fn audit_records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad audit line {l:?}: {e}"))
            })
            .collect()
    }

    /// Wait (up to 15 s) until a record of `event` (`open` or `end`) matching `pred` appears.
    pub fn wait_audit(
        &self,
        event: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(r) = self
                .audit_records()
                .into_iter()
                .find(|r| r["event"] == event && pred(r))
            {
                return r;
            }
            if Instant::now() > deadline {
                panic!("no matching {event} record in {:#?}", self.audit_records());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Wait until a final record matching `pred` appears.
    pub fn wait_record(&self, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.wait_audit("end", pred)
    }

    /// GET a path on the admin listener: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path)
    }

    /// SIGTERM and wait.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        unsafe_free_kill(self.child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("proxy did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

/// Send a signal with the `kill` command (keeps the tests free of `unsafe`).
pub fn unsafe_free_kill(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `egress-proxy ca init DIR`: an interception CA (`DIR/ca.crt`, `DIR/ca.key`) for
/// `tls_intercept`.
pub fn ca_init(dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["ca", "init"])
        .arg(dir)
        .output()
        .expect("the egress-proxy binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A minimal HTTP/1.1 GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    admin_req(addr, "GET", path, "", None)
}

/// Send raw bytes to `addr`, read until close or timeout: the response text.
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Output of one curl run.
pub struct CurlOut {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl CurlOut {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Run curl with `args`; `-sS` and a 30 s cap are added.
pub fn curl(args: &[&str]) -> CurlOut {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--noproxy", ""])
        .args(args)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .output()
        .expect("curl is installed (.ci/run installs it)");
    CurlOut {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// An HTTP/1.1 request to the admin listener: (status, body).
pub fn admin_req(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let (status, headers) = openapi::parse_head(head);
    // No answer at all (a refused connection) has nothing to check.
    if status != 0 {
        openapi::conform(&openapi::Exchange {
            method,
            target: path,
            status,
            headers: &headers,
            body,
        });
    }
    (status, body.to_string())
}

/// One admin request on a keep-alive connection (as a runtime sends them); returns the
/// status and leaves the connection ready for the next request.
pub fn keep_alive_request(
    s: &mut BufReader<TcpStream>,
    method: &str,
    path: &str,
    body: &str,
    token: &str,
) -> u16 {
    // One write: a request split across writes would wait on Nagle and delayed ACKs.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.get_mut().write_all(request.as_bytes()).unwrap();
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap();
            }
        }
        head.push_str(&line);
    }
    let mut rest = vec![0u8; length];
    s.read_exact(&mut rest).unwrap();
    let (status, headers) = openapi::parse_head(head.trim_end());
    openapi::conform(&openapi::Exchange {
        method,
        target: path,
        status,
        headers: &headers,
        body: &String::from_utf8_lossy(&rest),
    });
    status
}

/// A DNS server on 127.0.0.1 (UDP) that answers A queries for the names it knows after
/// `delay` (AAAA and other types: no records; unknown names: NXDOMAIN). Counts the queries
/// it received. Enough of RFC 1035 for a resolver to accept the answers, nothing more.
pub struct SlowDns {
    pub addr: SocketAddr,
    pub queries: Arc<AtomicU64>,
}

impl SlowDns {
    pub fn start(delay: Duration, names: &[(&str, Ipv4Addr)]) -> SlowDns {
        Self::start_with_cnames(delay, names, &[])
    }

    /// Like [`SlowDns::start`], plus `cnames`: (alias, target) pairs answered as a CNAME and,
    /// for A queries, the target's address.
    pub fn start_with_cnames(
        delay: Duration,
        names: &[(&str, Ipv4Addr)],
        cnames: &[(&str, &str)],
    ) -> SlowDns {
        let cnames: HashMap<String, String> = cnames
            .iter()
            .map(|(a, t)| (a.to_string(), t.to_string()))
            .collect();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = sock.local_addr().unwrap();
        let names: HashMap<String, Ipv4Addr> =
            names.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        let queries = Arc::new(AtomicU64::new(0));
        let count = queries.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                count.fetch_add(1, Ordering::SeqCst);
                let Some(reply) = dns_answer(&buf[..n], &names, &cnames) else {
                    continue;
                };
                let sock = sock.try_clone().unwrap();
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let _ = sock.send_to(&reply, from);
                });
            }
        });
        SlowDns { addr, queries }
    }
}

/// `name` as DNS labels (uncompressed).
fn dns_name(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out
}

/// A query for `name` of type `qtype` with id `id` (recursion desired, no EDNS).
pub fn dns_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(&dns_name(name));
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    q
}

/// The response code of a DNS response (low four bits of byte 3).
pub fn dns_rcode(reply: &[u8]) -> Option<u8> {
    reply.get(3).map(|b| b & 0x0f)
}

/// The reply to one query, or `None` when it is not one.
fn dns_answer(
    q: &[u8],
    names: &HashMap<String, Ipv4Addr>,
    cnames: &HashMap<String, String>,
) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = q.get(12..i + 4)?;
    let name = labels.join(".");
    let alias = cnames.get(&name);
    let final_name = alias.unwrap_or(&name);
    let answer = names.get(final_name).filter(|_| qtype == 1);
    let exists = names.contains_key(&name) || alias.is_some();
    let rcode = if exists { 0 } else { 3 };
    let count = u8::from(alias.is_some()) + u8::from(answer.is_some());
    let mut r = Vec::with_capacity(96);
    r.extend_from_slice(&q[0..2]);
    r.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1, 0, count, 0, 0, 0, 0]);
    r.extend_from_slice(question);
    if let Some(target) = alias {
        let rdata = dns_name(target);
        r.extend_from_slice(&[0xc0, 0x0c, 0, 5, 0, 1, 0, 0, 0, 60]);
        r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        r.extend_from_slice(&rdata);
    }
    if let Some(ip) = answer {
        match alias {
            Some(target) => r.extend_from_slice(&dns_name(target)),
            None => r.extend_from_slice(&[0xc0, 0x0c]),
        }
        r.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}

/// What `dig` said: status, answer records (name, ttl, type, value), the Extended DNS Error
/// text if any, and the whole output.
#[derive(Debug)]
pub struct Dig {
    pub status: String,
    pub answers: Vec<(String, u32, String, String)>,
    pub ede: Option<String>,
    pub raw: String,
}

/// Ask `server` with `dig` (one try, 5 s): `args` are the name, the type and any options.
pub fn dig(server: SocketAddr, args: &[&str]) -> Dig {
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args(["+tries=1", "+time=5", "+noall", "+comments", "+answer"])
        .args(args)
        .output()
        .expect("dig (dnsutils) is installed");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = raw
        .split("status: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or("")
        .to_string();
    let ede = raw
        .lines()
        .find(|l| l.starts_with("; EDE:"))
        .map(str::to_string);
    let answers = raw
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5).then(|| {
                (
                    f[0].to_string(),
                    f[1].parse().unwrap_or(u32::MAX),
                    f[3].to_string(),
                    f[4..].join(" "),
                )
            })
        })
        .collect();
    Dig {
        status,
        answers,
        ede,
        raw,
    }
}

/// Read a response head (through the blank line) byte by byte, leaving the rest unread.
pub fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    head
}

/// Send `CONNECT target` on `s` (with `Proxy-Authorization: auth` when given) and assert the
/// proxy answered 200; the tunnel is open when this returns.
pub fn connect_on(s: &mut TcpStream, target: &str, auth: Option<&str>) {
    let auth = auth
        .map(|a| format!("Proxy-Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"
    )
    .unwrap();
    let head = read_head(s);
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
}

/// A CONNECT tunnel through `proxy` to the plain-HTTP `origin`'s `/big` (as `big.test`, with
/// `Proxy-Authorization: auth` when given) whose client never reads on its own: its receive
/// buffer is 4 KiB, so the proxy's writes towards it block soon. The caller decides whether
/// (and how slowly) to read.
pub fn stalled_download(proxy: SocketAddr, origin: &Origin, auth: Option<&str>) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut s = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(proxy).await.unwrap().into_std().unwrap()
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_on(&mut s, &format!("big.test:{}", origin.addr.port()), auth);
    s.write_all(b"GET /big HTTP/1.1\r\nHost: big.test\r\n\r\n")
        .unwrap();
    s
}

/// A free loopback TCP port (bound and released: a tiny race, acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real single-member etcd (Debian's `etcd-server`) on loopback ports with a temporary data
/// directory; killed on drop.
pub struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    data: PathBuf,
    child: Option<Child>,
    /// Serve clients over TLS and require client certificates.
    pub tls: Option<EtcdTlsFiles>,
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
pub struct EtcdTlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl EtcdTlsFiles {
    /// Generate them in `dir` (file names prefixed with `tag`).
    pub fn generate(dir: &Path, tag: &str) -> EtcdTlsFiles {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{tag} etcd CA"));
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let write = |name: &str, text: String| {
            let p = dir.join(format!("{tag}-{name}"));
            std::fs::write(&p, text).unwrap();
            p
        };
        let server_key = KeyPair::generate().unwrap();
        let mut sp = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        sp.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let server = sp.signed_by(&server_key, &ca, &ca_key).unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
        cp.distinguished_name
            .push(rcgen::DnType::CommonName, "egress-proxy");
        let client = cp.signed_by(&client_key, &ca, &ca_key).unwrap();
        EtcdTlsFiles {
            ca: write("ca.pem", ca.pem()),
            server_cert: write("server.pem", server.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.pem", client.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
        }
    }
}

impl Etcd {
    /// Start etcd; panics when etcd or etcdctl is not installed (the etcd tests are
    /// `#[ignore]`d for machines without it, and `.ci/run` installs it and runs them).
    pub fn start(dir: &Path) -> Etcd {
        Self::start_with(dir, None)
    }

    /// The same, serving clients over TLS with client certificates required.
    pub fn start_with(dir: &Path, tls: Option<EtcdTlsFiles>) -> Etcd {
        for tool in ["etcd", "etcdctl"] {
            let found = Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok();
            assert!(
                found,
                "{tool} is not installed: apt-get install etcd-server etcd-client"
            );
        }
        let mut e = Etcd {
            client_port: free_port(),
            peer_port: free_port(),
            data: dir.join("etcd-data"),
            child: None,
            tls,
        };
        e.spawn(e.client_port);
        e
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The `etcdctl` TLS flags, when etcd serves TLS.
    fn ctl_tls(&self) -> Vec<String> {
        match &self.tls {
            Some(t) => vec![
                format!("--cacert={}", t.ca.display()),
                format!("--cert={}", t.client_cert.display()),
                format!("--key={}", t.client_key.display()),
            ],
            None => Vec::new(),
        }
    }

    /// (Re)start the member, serving clients on `client_port`, and wait until it is healthy.
    pub fn spawn(&mut self, client_port: u16) {
        let client = format!("{}://127.0.0.1:{client_port}", self.scheme());
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new("etcd");
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", "t", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(self.ctl_tls())
                .args(["--endpoints", &client, "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Freeze (`SIGSTOP`) or thaw (`SIGCONT`) the member: its sockets stay open, nothing
    /// answers.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "kill {sig} etcd");
        }
    }

    /// Kill the member (as a crash would) and wait for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `etcdctl ARGS` against the member on `port`; panics unless it succeeds.
    pub fn ctl_on(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(self.ctl_tls())
            .args([
                "--endpoints",
                &format!("{}://127.0.0.1:{port}", self.scheme()),
            ])
            .args(args)
            .output()
            .expect("etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `etcdctl ARGS` against the member.
    pub fn ctl(&self, args: &[&str]) -> String {
        self.ctl_on(self.client_port, args)
    }

    /// `etcdctl put KEY` with the value on standard input (values too large for an argument).
    pub fn put_stdin(&self, key: &str, value: &[u8]) {
        use std::io::Write as _;
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(self.ctl_tls())
            .args([
                "--endpoints",
                &format!("{}://127.0.0.1:{}", self.scheme(), self.client_port),
                "put",
                key,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("etcdctl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(value)
            .expect("write the value");
        assert!(
            child.wait().expect("etcdctl").success(),
            "etcdctl put {key}"
        );
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Poll `f` every 20 ms until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
