//! The real `egress-proxy` binary, started on `127.0.0.1:0` with a config the test wrote,
//! its audit records and admin listener; stopped on drop.

#![allow(dead_code)]

use super::*;

/// The real proxy binary, running.
pub struct Proxy {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub transparent: Option<SocketAddr>,
    /// The DNS listener (UDP and TCP), when `listen.dns` is set.
    pub dns: Option<SocketAddr>,
    /// The TLS proxy listener, when `listen.proxy_tls` is set.
    pub proxy_tls: Option<SocketAddr>,
    /// The SOCKS5 listener, when `listen.socks5` is set.
    pub socks5: Option<SocketAddr>,
    pub audit: PathBuf,
    pub config: PathBuf,
    pub child: Child,
    pub stderr: Arc<Mutex<Vec<String>>>,
    /// The proxy's stdout when a test asked for it to be a pipe nobody reads.
    pub stdout_unread: Option<std::process::ChildStdout>,
}

impl Proxy {
    /// Start `egress-proxy run --config` on a file the test wrote (a configuration is built
    /// with `ProxyConfig`; this starts it again after a restart, or a file a test wrote on
    /// purpose).
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
            socks5: addr("socks5_addr"),
            audit,
            config,
            child,
            stderr: lines,
            stdout_unread,
        }
    }

    /// Every audit record written so far ("end" and "open"). A read that races the writer can
    /// end inside a batch being appended: a last line without its newline is not written yet
    /// and is left for the next read (every complete line must parse).
    pub fn audit_records(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.audit).unwrap_or_default();
        let written = text.rfind('\n').map_or("", |end| &text[..=end]);
        written
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
        within(Duration::from_millis(25), Duration::from_secs(15), || {
            (self.audit_records().into_iter()).find(|r| r["event"] == event && pred(r))
        })
        .unwrap_or_else(|| panic!("no matching {event} record in {:#?}", self.audit_records()))
    }

    /// Wait until a final record matching `pred` appears.
    pub fn wait_record(&self, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.wait_audit("end", pred)
    }

    /// The value of one series on `/metrics`: `series` is its name with its labels as rendered
    /// (`egress_admission_refused_total{listener="admin",why="silent"}`).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = self.admin_get("/metrics");
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    /// How many descriptors the proxy process holds now (`/proc/PID/fd`): a connection it
    /// accepted holds one, so a count that grew by `n` says it accepted `n` more.
    pub fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Wait until the proxy holds at least `n` descriptors more than `base` (it accepted that
    /// many connections).
    pub fn wait_accepted(&self, base: usize, n: usize) {
        assert!(
            self.accepted_within(base, n, Duration::from_secs(10)),
            "timed out waiting for the proxy to accept them"
        );
    }

    /// Whether the proxy comes to hold at least `n` descriptors more than `base` within
    /// `limit` (a cap may have refused one of them).
    pub fn accepted_within(&self, base: usize, n: usize, limit: Duration) -> bool {
        within(Duration::from_millis(20), limit, || {
            (self.descriptors() >= base + n).then_some(())
        })
        .is_some()
    }

    /// Wait until the proxy holds no more than `base` descriptors (it closed what it had
    /// accepted since).
    pub fn wait_released(&self, base: usize) {
        eventually(Duration::from_secs(10), "the proxy to close them", || {
            (self.descriptors() <= base).then_some(())
        });
    }

    /// GET a path on the admin listener: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path)
    }

    /// SIGTERM and wait.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        unsafe_free_kill(self.child.id(), "TERM");
        let stopped = within(Duration::from_millis(50), Duration::from_secs(30), || {
            self.child.try_wait().ok().flatten()
        });
        stopped.unwrap_or_else(|| {
            let _ = self.child.kill();
            panic!("proxy did not stop on SIGTERM")
        })
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
