//! Control-plane benchmark (the fleet-scale issue's budgets): how fast the proxy restarts with
//! N registered sandboxes, how much memory each costs, and how many `PUT /v1/sandboxes/{id}`
//! per second one keep-alive client gets with N already registered.
//!
//! ```text
//! cargo build --release && cargo bench --bench control_plane -- --registered 10000 --puts 200 --reloads 5
//! ```
//! It starts `target/release/egress-proxy` itself (a temporary config with an admin token and
//! a `state_dir` holding N state files with 4-entry policies), waits for `/readyz`, reads the
//! proxy's RSS, then sends PUTs of new 4-entry sandboxes on one keep-alive connection, then
//! `--reloads` times edits one file-defined sandbox and `POST /v1/reload`s (median time).
//! One JSON line of results on stdout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn binding(i: usize) -> String {
    let digest = hex::encode(Sha256::digest(format!("token-{i}").as_bytes()));
    format!(
        r#"{{"auth": {{"token_sha256": "{digest}"}}, "policy": {{"provider": "local", "config": {{}}, "network": {{"egress": ["api.example.com", "*.github.com", "10.0.0.0/8:5432", "h{i}.example.org"]}}}}}}"#
    )
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One request on a keep-alive connection; returns the status.
fn request(s: &mut BufReader<TcpStream>, method: &str, path: &str, body: &str, token: &str) -> u16 {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.get_mut().write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let mut status_line = String::new();
    if s.read_line(&mut status_line).is_err() {
        return 0;
    }
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).is_err() || line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut rest = vec![0u8; length];
    let _ = s.read_exact(&mut rest);
    status
}

fn main() {
    let registered = arg("--registered", 10_000);
    let puts = arg("--puts", 200);
    let reloads = arg("--reloads", 0);
    let dir = tempfile::tempdir().expect("temporary directory");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    for i in 0..registered {
        std::fs::write(state.join(format!("sb-{i}.json")), binding(i)).expect("state file");
    }
    let token = "control-plane-bench-token";
    std::fs::write(dir.path().join("admin.token"), token).expect("token");
    let config = dir.path().join("proxy.yaml");
    let write_config = |host: &str| {
        std::fs::write(
            &config,
            format!(
                "listen: {{ proxy: 127.0.0.1:0, admin: 127.0.0.1:0 }}\naudit: {{ path: /dev/null }}\nadmin_token_file: {}\nstate_dir: {}\nsandboxes:\n  - {{ id: edited, policy: {{ provider: local, config: {{}}, network: {{ egress: [{host}] }} }} }}\n",
                dir.path().join("admin.token").display(),
                state.display()
            ),
        )
        .expect("config");
    };
    write_config("a.example.com");
    let started = Instant::now();
    let mut child = Command::new("target/release/egress-proxy")
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("target/release/egress-proxy (cargo build --release first)");
    let stderr = child.stderr.take().expect("stderr");
    let mut admin: Option<SocketAddr> = None;
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("\"listening\"") {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            admin = v["fields"]["admin_addr"]
                .as_str()
                .and_then(|a| a.parse().ok());
            break;
        }
    }
    // Keep draining the proxy's log.
    std::thread::spawn(move || lines.for_each(drop));
    let ready = started.elapsed();
    let Some(admin) = admin else {
        eprintln!("the proxy did not start");
        let _ = child.kill();
        std::process::exit(1);
    };
    std::thread::sleep(Duration::from_millis(300));
    let rss = rss_kib(child.id());
    let stream = TcpStream::connect(admin).expect("admin");
    let _ = stream.set_nodelay(true);
    let mut s = BufReader::new(stream);
    let t = Instant::now();
    let mut ok = 0;
    for i in 0..puts {
        let id = registered + i;
        let status = request(
            &mut s,
            "PUT",
            &format!("/v1/sandboxes/sb-{id}"),
            &binding(id),
            token,
        );
        if i == 0 && status != 201 {
            eprintln!("first PUT answered {status}");
        }
        if status == 201 {
            ok += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let mut reload_ms = Vec::new();
    for i in 0..reloads {
        write_config(&format!("r{i}.example.com"));
        let t = Instant::now();
        let status = request(&mut s, "POST", "/v1/reload", "", token);
        if status != 200 {
            eprintln!("reload answered {status}");
        }
        reload_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    reload_ms.sort_by(f64::total_cmp);
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "{}",
        serde_json::json!({
            "registered": registered,
            "ready_s": (ready.as_secs_f64() * 1000.0).round() / 1000.0,
            "rss_kib": rss,
            "kib_per_sandbox": if registered > 0 { ((rss as f64 / registered as f64) * 100.0).round() / 100.0 } else { 0.0 },
            "puts": puts,
            "puts_ok": ok,
            "puts_per_sec": (puts as f64 / secs).round(),
            "reloads": reloads,
            "reload_median_ms": reload_ms.get(reload_ms.len() / 2).map(|m| m.round()),
        })
    );
}
