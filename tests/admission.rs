//! Every listener goes through the same admission: the admin listener and DNS over TCP hold
//! at most `unidentified_per_source` connections per address, close a connection that says
//! nothing within `first_byte_ms`, count refusals per listener, and (DNS over TCP) close a
//! connection idle after its queries like any relay — while the proxy listener's own places
//! are untouched.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

const YAML: &str = "admission: { unidentified_per_source: 3, first_byte_ms: 800 }\ndefaults: { timeouts: { header_ms: 1500 } }\ndns: { servers: [\"127.0.0.1:9\"], hosts: { ok.test: [127.0.0.5] } }\nsandboxes:\n  - { id: local, sources: [127.0.0.0/8], policy: { provider: local, config: {}, network: { egress: [ok.test] } } }\n";

fn start(dir: &std::path::Path) -> Proxy {
    let audit = dir.join("audit.jsonl");
    let config = dir.join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0, dns: 127.0.0.1:0 }}\naudit: {{ path: {} }}\n{YAML}",
            audit.display()
        ),
    )
    .unwrap();
    Proxy::start_with(config, audit, &[])
}

/// Whether the proxy closes `s` within 10 s (EOF or reset) without sending anything.
fn closed_silently(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Hold `n` silent connections to `addr`.
fn hold(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

fn metric(p: &Proxy, line_start: &str) -> u64 {
    let (_, text) = p.admin_get("/metrics");
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// Waits until the held connections were closed by the proxy (first_byte_ms).
fn all_closed(held: &mut [TcpStream]) {
    for s in held.iter_mut() {
        assert!(closed_silently(s), "a silent connection was kept open");
    }
}

#[test]
fn the_admin_listener_caps_each_source_and_closes_silent_connections() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path());
    assert_eq!(p.admin_get("/healthz").0, 200);
    let mut held = hold(p.admin, 3);
    // Give the proxy time to admit the three (they are accepted in order).
    std::thread::sleep(Duration::from_millis(100));
    let mut fourth = TcpStream::connect(p.admin).unwrap();
    fourth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        closed_silently(&mut fourth),
        "a 4th connection from one address was served"
    );
    // The proxy listener's places are its own: a CONNECT from the same address still works.
    let mut c = TcpStream::connect(p.proxy).unwrap();
    c.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        .unwrap();
    let head = read_head(&mut c);
    assert!(
        head.starts_with(b"HTTP/1.1 "),
        "{}",
        String::from_utf8_lossy(&head)
    );
    // Silent ones are closed at first_byte_ms; then the admin listener answers again.
    all_closed(&mut held);
    let (status, _) = eventually(Duration::from_secs(5), "admin answers again", || {
        let r = p.admin_get("/healthz");
        (r.0 == 200).then_some(r)
    });
    assert_eq!(status, 200);
    assert!(
        metric(
            &p,
            "egress_admission_refused_total{listener=\"admin\",why=\"unidentified\"}"
        ) >= 1
    );
    assert!(
        metric(
            &p,
            "egress_admission_refused_total{listener=\"admin\",why=\"silent\"}"
        ) >= 3
    );
}

fn tcp_query(s: &mut TcpStream, id: u16, name: &str) -> Option<u8> {
    let q = dns_query(id, name, 1);
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut reply).ok()?;
    assert_eq!(u16::from_be_bytes([reply[0], reply[1]]), id);
    dns_rcode(&reply)
}

#[test]
fn dns_over_tcp_caps_each_source_closes_silent_and_idle_connections() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path());
    let dns = p.dns.expect("the DNS listener is on");
    // A working connection answers several queries in order.
    let mut ok = TcpStream::connect(dns).unwrap();
    assert_eq!(tcp_query(&mut ok, 1, "ok.test"), Some(0));
    assert_eq!(tcp_query(&mut ok, 2, "ok.test"), Some(0));
    // Then, idle for header_ms, it is closed like any relay.
    let t = Instant::now();
    assert!(
        closed_silently(&mut ok),
        "an idle DNS-over-TCP connection was kept"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1000),
        "closed before the idle timeout"
    );

    let mut held = hold(dns, 3);
    std::thread::sleep(Duration::from_millis(100));
    let mut fourth = TcpStream::connect(dns).unwrap();
    assert_eq!(
        tcp_query(&mut fourth, 3, "ok.test"),
        None,
        "a 4th connection was served"
    );
    all_closed(&mut held);
    let mut again = eventually(Duration::from_secs(5), "DNS over TCP answers again", || {
        let mut s = TcpStream::connect(dns).ok()?;
        (tcp_query(&mut s, 4, "ok.test") == Some(0)).then_some(s)
    });
    // A frame that is not a DNS message closes the connection; the listener keeps serving.
    again.write_all(&[0, 20]).unwrap();
    again.write_all(&[0xff; 20]).unwrap();
    assert!(closed_silently(&mut again));
    assert_eq!(dig(dns, &["+tcp", "ok.test", "A"]).status, "NOERROR");
    assert!(
        metric(
            &p,
            "egress_admission_refused_total{listener=\"dns\",why=\"unidentified\"}"
        ) >= 1
    );
}
