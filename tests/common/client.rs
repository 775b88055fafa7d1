//! Clients a test drives the proxy with: raw HTTP and CONNECT, curl, admin requests, a
//! stalled download, a free port.

#![allow(dead_code)]

use super::*;

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

/// Run curl with `args` (the URL among them), its body thrown away: the response's status
/// code as curl writes it (`000` when none came).
pub fn http_code(args: &[&str]) -> String {
    let mut all = vec!["-o", "/dev/null", "-w", "%{http_code}"];
    all.extend_from_slice(args);
    curl(&all).text()
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

/// A loopback TCP port that refuses every connection for as long as this value lives: bound and
/// never listened on, so no other test's listener can take it meanwhile (a released port can be
/// reused by a parallel test, which then answers).
pub struct ClosedPort(socket2::Socket);

impl ClosedPort {
    /// Binds a fresh loopback port without listening on it.
    pub fn new() -> ClosedPort {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        ClosedPort(s)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.0.local_addr().unwrap().as_socket().unwrap().port()
    }
}

/// A free loopback TCP port (bound and released: a tiny race, acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
