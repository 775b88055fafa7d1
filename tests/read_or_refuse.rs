//! Read it or refuse it (security review rounds 7a B1–B4, 7d T6, T7, S1, S8): no byte string
//! reaches a virtual host the policy does not name over CONNECT or SOCKS5. The origins are the
//! real servers that showed each hole — nginx (with and without `proxy_protocol`), Go net/http
//! and crypto/tls, Python http.server — each serving an `allowed.test` and a `forbidden.test`
//! virtual host on one address. Every case is first sent to the origin directly, to prove the
//! origin reads it as a request for `forbidden.test`; then through the proxy, under an entry
//! that names its port and under one declared opaque (`tcp://`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// The real origins, stopped on drop.
struct Origins {
    nginx: u16,
    nginx_pp: u16,
    go_plain: u16,
    go_tls: u16,
    python: u16,
    ca: TestCa,
    _children: Vec<KillOnDrop>,
    _python: ScriptOrigin,
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx with two name-based virtual hosts on one port, and the same on a port that expects a
/// PROXY protocol header.
fn nginx(dir: &Path) -> (u16, u16, KillOnDrop) {
    let (plain, pp) = (free_port(), free_port());
    // allowed.test is the default server: a request nginx cannot place lands there.
    let vhosts = |port: u16, how: &str, client: &str| {
        ["allowed.test", "forbidden.test"]
            .iter()
            .map(|name| {
                let default = if *name == "allowed.test" { " default_server" } else { "" };
                format!(
                    "server {{ listen 127.0.0.1:{port}{how}{default}; server_name {name}; location / {{ return 200 \"vhost={name} method=$request_method from={client}\\n\"; }} }}\n"
                )
            })
            .collect::<String>()
    };
    let conf = format!(
        "user root;\nworker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\nhttp {{\naccess_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\nfastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n{}{}}}\n",
        vhosts(plain, "", "$remote_addr"),
        vhosts(pp, " proxy_protocol", "$proxy_protocol_addr"),
        d = dir.display(),
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new("nginx")
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx (tests/run installs nginx-light)");
    let child = KillOnDrop(child);
    for port in [plain, pp] {
        eventually(Duration::from_secs(10), "nginx to listen", || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
    }
    (plain, pp, child)
}

/// `tests/data/vhosts`, built with the machine's Go: a plain and a TLS port.
fn go(dir: &Path, ca: &TestCa) -> (u16, u16, KillOnDrop) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vhosts");
    let bin = dir.join("vhosts");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("go (tests/run installs golang-go)");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut child = Command::new(&bin)
        .arg(&ca.cert_pem)
        .arg(&ca.key_pem)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let mut ports = line.split_whitespace().map(|p| p.parse::<u16>().unwrap());
    let (plain, tls) = (ports.next().unwrap(), ports.next().unwrap());
    (plain, tls, KillOnDrop(child))
}

fn origins(dir: &Path) -> Origins {
    let ca = TestCa::generate(dir);
    let (nginx, nginx_pp, n) = nginx(dir);
    let (go_plain, go_tls, g) = go(dir, &ca);
    let python = ScriptOrigin::start("vhosts_http.py", &[]);
    Origins {
        nginx,
        nginx_pp,
        go_plain,
        go_tls,
        python: python.port,
        ca,
        _children: vec![n, g],
        _python: python,
    }
}

/// The proxy: `allowed.test` on each origin port by a port-named entry, `opaque.test` (the
/// same address) on each by a `tcp://` entry; `refuse_ech`; CONNECT and SOCKS5.
fn proxy(dir: &Path, o: &Origins) -> Proxy {
    let ports = [o.nginx, o.nginx_pp, o.go_plain, o.go_tls, o.python];
    let mut sandbox = SandboxSpec::new("s").source("127.0.0.0/8");
    for port in ports {
        sandbox = sandbox
            .allow(&format!("allowed.test:{port}"))
            .allow(&format!("tcp://opaque.test:{port}"));
    }
    ProxyConfig::new()
        .socks5()
        .dns_server("127.0.0.1:9")
        .host("allowed.test", "127.0.0.1")
        .host("opaque.test", "127.0.0.1")
        .host("forbidden.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .defaults("refuse_ech", "true")
        .defaults("timeouts", "{ header_ms: 1500 }")
        .sandbox(sandbox)
        .start(dir)
}

/// How a test client reaches a target.
#[derive(Clone, Copy, Debug)]
enum Via {
    Direct,
    Connect(SocketAddr),
    Socks5(SocketAddr),
}

/// A stream to `name:port`, through `via`.
fn open(via: Via, name: &str, port: u16) -> TcpStream {
    let mut s = match via {
        Via::Direct => TcpStream::connect(("127.0.0.1", port)).unwrap(),
        Via::Connect(p) | Via::Socks5(p) => TcpStream::connect(p).unwrap(),
    };
    s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    match via {
        Via::Direct => {}
        Via::Connect(_) => connect_on(&mut s, &format!("{name}:{port}"), None),
        Via::Socks5(_) => socks5_on(&mut s, name, port),
    }
    s
}

/// A SOCKS5 `CONNECT` by name, without a login (the source address identifies).
fn socks5_on(s: &mut TcpStream, name: &str, port: u16) {
    s.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0]);
    let mut req = vec![5, 1, 0, 3, name.len() as u8];
    req.extend_from_slice(name.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 0, "SOCKS5 reply {reply:?}");
}

/// Send `bytes` and read what comes back until the peer closes or goes quiet.
fn exchange(mut s: TcpStream, bytes: &[u8]) -> String {
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// PROXY protocol v2, TCP over IPv4, from 6.6.6.6:1234 to 127.0.0.1:80.
fn proxy_v2() -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c".to_vec();
    h.extend_from_slice(&[6, 6, 6, 6, 127, 0, 0, 1, 0x04, 0xd2, 0, 80]);
    h
}

const FORBIDDEN: &str = "vhost=forbidden.test";

/// Round 7a B1–B4: what the origins read as a request for `forbidden.test`, by port.
fn plain_cases(o: &Origins) -> Vec<(&'static str, u16, Vec<u8>)> {
    let get = b"GET / HTTP/1.1\r\nHost: forbidden.test\r\nConnection: close\r\n\r\n".to_vec();
    vec![
        (
            "M-SEARCH to nginx",
            o.nginx,
            b"M-SEARCH / HTTP/1.1\r\nHost: forbidden.test\r\nConnection: close\r\n\r\n".to_vec(),
        ),
        (
            "GET_X to nginx",
            o.nginx,
            b"GET_X / HTTP/1.1\r\nHost: forbidden.test\r\nConnection: close\r\n\r\n".to_vec(),
        ),
        (
            "GET1 and a pipelined DELETE to Go",
            o.go_plain,
            b"GET1 / HTTP/1.1\r\nHost: forbidden.test\r\n\r\nDELETE /admin HTTP/1.1\r\nHost: forbidden.test\r\nConnection: close\r\n\r\n".to_vec(),
        ),
        (
            "GET! to Go",
            o.go_plain,
            b"GET! / HTTP/1.1\r\nHost: forbidden.test\r\nConnection: close\r\n\r\n".to_vec(),
        ),
        (
            "a tab after the method to Python",
            o.python,
            b"GET\t/ HTTP/1.1\r\nHost: forbidden.test\r\nConnection: close\r\n\r\n".to_vec(),
        ),
        (
            "PROXY v2 then GET to nginx with proxy_protocol",
            o.nginx_pp,
            [proxy_v2(), get.clone()].concat(),
        ),
        (
            "PROXY v1 then GET to nginx with proxy_protocol",
            o.nginx_pp,
            [b"PROXY TCP4 6.6.6.6 127.0.0.1 1234 80\r\n".to_vec(), get].concat(),
        ),
    ]
}

#[test]
fn no_request_reaches_a_virtual_host_the_policy_does_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let o = origins(dir.path());
    let p = proxy(dir.path(), &o);
    let socks = p.socks5.expect("listen.socks5");
    for (what, port, bytes) in plain_cases(&o) {
        let direct = exchange(open(Via::Direct, "", port), &bytes);
        assert!(
            direct.contains(FORBIDDEN),
            "{what}: the origin itself does not read it: {direct}"
        );
        for via in [Via::Connect(p.proxy), Via::Socks5(socks)] {
            for name in ["allowed.test", "opaque.test"] {
                let got = exchange(open(via, name, port), &bytes);
                assert!(
                    !got.contains(FORBIDDEN),
                    "{what} via {via:?} to {name}:{port} reached the forbidden virtual host: {got}"
                );
            }
        }
    }
    // Each was refused and recorded as such: read and judged by its Host, or not read. Four
    // read, three not; each over two listeners and two entries.
    let recs = eventually(Duration::from_secs(10), "a record per case", || {
        let recs = p.audit_records();
        let refused = |reason: &str| {
            recs.iter()
                .filter(|r| r["event"] == "end" && r["reason"] == reason)
                .count()
        };
        (refused("host_mismatch") == 4 * 4 && refused("unrecognised_protocol") == 3 * 4)
            .then_some(recs)
    });
    let pp = recs
        .iter()
        .find(|r| {
            r["reason"] == "unrecognised_protocol"
                && r["detail"].as_str().unwrap_or("").contains("PROXY")
        })
        .expect("a PROXY header refusal says so");
    assert_eq!(pp["decision"], "deny", "{pp}");
}

/// What the reader now takes for HTTP is read, not merely refused: the same methods with the
/// allowed name reach the allowed virtual host, by the method the origin saw.
#[test]
fn token_methods_are_read_and_judged_by_their_host() {
    let dir = tempfile::tempdir().unwrap();
    let o = origins(dir.path());
    let p = proxy(dir.path(), &o);
    for (method, port) in [
        ("M-SEARCH", o.nginx),
        ("GET_X", o.nginx),
        ("GET1", o.go_plain),
        ("GET!", o.go_plain),
    ] {
        let req = format!("{method} / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n");
        let got = exchange(
            open(Via::Connect(p.proxy), "allowed.test", port),
            req.as_bytes(),
        );
        assert!(
            got.contains(&format!("vhost=allowed.test method={method}")),
            "{method}: {got}"
        );
    }
}

/// How a test client bends its first flight (round 7d T6, T7).
#[derive(Clone, Copy, Debug)]
enum Bend {
    /// A TLS warning alert record before the ClientHello (Go skips it).
    AlertFirst,
    /// The hello's record version bytes set to these (Go reads any on a first record).
    RecordVersion([u8; 2]),
}

/// A stream that bends the first bytes a TLS client writes.
struct Bent {
    inner: TcpStream,
    bend: Option<Bend>,
}

impl Read for Bent {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Write for Bent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.bend.take() {
            None => self.inner.write(buf),
            Some(Bend::AlertFirst) => {
                self.inner.write_all(&[21, 3, 1, 0, 2, 1, 90])?;
                self.inner.write_all(buf)?;
                Ok(buf.len())
            }
            Some(Bend::RecordVersion(v)) => {
                let mut out = buf.to_vec();
                let mut at = 0;
                while at + 5 <= out.len() {
                    out[at + 1..at + 3].copy_from_slice(&v);
                    at += 5 + usize::from(u16::from_be_bytes([out[at + 3], out[at + 4]]));
                }
                self.inner.write_all(&out)?;
                Ok(buf.len())
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A rustls client for `sni` over `stream` with its first flight bent; `GET /`, and what came
/// back (empty when the handshake failed).
fn bent_tls_get(stream: TcpStream, sni: &str, bend: Bend, ca: &TestCa) -> String {
    let cfg = client_config(&ca.ca_pem, &[]);
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut tls = rustls::StreamOwned::new(
        conn,
        Bent {
            inner: stream,
            bend: Some(bend),
        },
    );
    let req = format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    if tls.write_all(req.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Round 7d T6, T7: a ClientHello for `forbidden.test` after a warning alert, or in a record
/// whose version is 0x0200 or 0x0000, is read by Go's crypto/tls — and was relayed unread by
/// the proxy as "another protocol". Refused now on every entry.
#[test]
fn tls_first_flights_a_server_reads_are_judged_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = origins(dir.path());
    let p = proxy(dir.path(), &o);
    let socks = p.socks5.expect("listen.socks5");
    for bend in [
        Bend::AlertFirst,
        Bend::RecordVersion([2, 0]),
        Bend::RecordVersion([0, 0]),
    ] {
        let direct = bent_tls_get(
            open(Via::Direct, "", o.go_tls),
            "forbidden.test",
            bend,
            &o.ca,
        );
        assert!(
            direct.contains(FORBIDDEN),
            "{bend:?}: Go does not read it: {direct:?}"
        );
        for via in [Via::Connect(p.proxy), Via::Socks5(socks)] {
            for name in ["allowed.test", "opaque.test"] {
                let got = bent_tls_get(open(via, name, o.go_tls), "forbidden.test", bend, &o.ca);
                assert!(
                    !got.contains(FORBIDDEN),
                    "{bend:?} via {via:?} to {name} reached the forbidden virtual host: {got}"
                );
            }
        }
    }
    // The record version is read whatever it says: the hello is judged by its SNI.
    let judged = p.audit_records();
    assert!(
        judged
            .iter()
            .any(|r| r["reason"] == "sni_mismatch" && r["decision"] == "deny"),
        "{judged:#?}"
    );
    assert!(
        judged.iter().any(|r| r["reason"] == "unrecognised_protocol"
            && r["detail"]
                .as_str()
                .unwrap_or("")
                .contains("not a handshake")),
        "{judged:#?}"
    );
}

/// Round 7d S1 and S8: an SSLv2-format hello is refused, and `refuse_ech` knows the ECH
/// drafts' and ESNI's code points, not only the final one.
#[test]
fn sslv2_hellos_and_draft_ech_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = origins(dir.path());
    let p = proxy(dir.path(), &o);
    let sslv2 = [
        0x80, 0x2e, 1, 3, 1, 0, 0x15, 0, 0, 0, 0x10, 0, 0, 0x39, 0, 0, 0x38, 0, 0, 0x35, 0, 0,
        0x16, 0, 0, 0x13, 0, 0, 0x0a, 0x07, 0, 0xc0, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
        0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
    ];
    let direct = exchange(open(Via::Direct, "", o.go_tls), &sslv2);
    assert!(
        !direct.is_empty(),
        "Go answers an SSLv2 hello (with an alert)"
    );
    let got = exchange(open(Via::Connect(p.proxy), "opaque.test", o.go_tls), &sslv2);
    assert!(got.is_empty(), "{got:?}");
    p.wait_record(|r| {
        r["reason"] == "unrecognised_protocol"
            && r["detail"].as_str().unwrap_or("").contains("SSLv2")
    });
    for code in [0xfe08_u16, 0xfe0a, 0xfe0d, 0xffce] {
        let hello = tls_hello::client_hello("allowed.test", &[(code, vec![0; 8])]);
        let got = exchange(
            open(Via::Connect(p.proxy), "allowed.test", o.go_tls),
            &hello,
        );
        assert!(got.is_empty(), "{code:#x}: the origin answered {got:?}");
    }
    eventually(Duration::from_secs(10), "four ECH refusals", || {
        let ech = p
            .audit_records()
            .into_iter()
            .filter(|r| {
                r["reason"] == "protocol_not_allowed"
                    && r["detail"]
                        .as_str()
                        .unwrap_or("")
                        .contains("Encrypted Client Hello")
            })
            .count();
        (ech == 4).then_some(())
    });
}
