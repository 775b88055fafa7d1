//! DNS on loopback: a slow upstream server the proxy resolves with, raw queries, and `dig`.

#![allow(dead_code)]

use super::*;

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
                    super::let_time_pass(delay, "a slow DNS server's delay");
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
///
/// From a source port chosen here: `dig` sets `SO_REUSEPORT` on its socket, so as the same
/// user as a proxy under test the kernel may give it, as its ephemeral port, the port of a
/// DNS listener (`SO_REUSEPORT` too) — even the one it asks, and then its connected socket
/// receives its own query back. A port a plain socket was just given is held by no such
/// group.
pub fn dig(server: SocketAddr, args: &[&str]) -> Dig {
    let source = std::net::UdpSocket::bind((server.ip(), 0))
        .and_then(|s| s.local_addr())
        .expect("a free UDP port for dig");
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args(["-b", &format!("{}#{}", source.ip(), source.port())])
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
