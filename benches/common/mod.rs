//! What the benches share: numbers from the command line, the proxy binary started on a
//! configuration (its bound addresses read from its `listening` log line), resident memory,
//! free ports.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

pub mod squid_bump;
pub mod tls;

/// `--name VALUE` from the command line, or `default`.
pub fn arg<T: FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of process `pid`, KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running proxy and the addresses it bound.
pub struct Started {
    pub child: Child,
    pub proxy: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
}

/// Start `bin run --config config` (with `env`), wait (60 s at most) for its `listening` line
/// and keep draining its log.
pub fn start_proxy(bin: &Path, config: &Path, env: &[(&str, &str)]) -> Started {
    let mut child = Command::new(bin)
        .args(["run", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} (cargo build --release first): {e}", bin.display()));
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("\"listening\"") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the proxy did not start");
    let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    let addr = |k: &str| v["fields"][k].as_str().and_then(|s| s.parse().ok());
    Started {
        proxy: addr("proxy_addr"),
        admin: addr("admin_addr"),
        child,
    }
}

/// CPU time (user + system) process `pid` has used so far, in microseconds (`/proc/PID/stat`;
/// instruction counters are not available on every VM, this is).
pub fn cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    let hz = 100u64;
    Some(ticks * 1_000_000 / hz)
}
