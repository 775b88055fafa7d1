//! A real single-member etcd (Debian's `etcd-server`), plain or with TLS, killed on drop.

#![allow(dead_code)]

use super::*;

/// A real single-member etcd (Debian's `etcd-server`) on loopback ports with a temporary data
/// directory; killed on drop.
pub struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    data: PathBuf,
    child: Option<Child>,
    /// This member's name, unique on the machine: the health check asks for it, so another
    /// test's etcd that took the port first is never mistaken for this one.
    name: String,
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
            name: unique_name(),
            tls,
        };
        // A port picked free can be taken before etcd binds it (parallel tests connect from
        // ephemeral ports): etcd then exits at once, and it is started again on other ports.
        for _ in 0..5 {
            match e.try_spawn(e.client_port) {
                Ok(()) => return e,
                Err(Start::Exited) => {
                    let _ = std::fs::remove_dir_all(&e.data);
                    e.client_port = free_port();
                    e.peer_port = free_port();
                }
                Err(Start::Unhealthy) => panic!("etcd did not become healthy: {}", e.log_tail()),
            }
        }
        panic!("etcd exited at start five times: {}", e.log_tail())
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
        match self.try_spawn(client_port) {
            Ok(()) => {}
            Err(Start::Exited) => panic!("etcd exited at start: {}", self.log_tail()),
            Err(Start::Unhealthy) => panic!("etcd did not become healthy: {}", self.log_tail()),
        }
    }

    /// The end of what etcd wrote to stderr (its log, kept beside its data directory).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.data.with_extension("log")).unwrap_or_default();
        let start = log.len().saturating_sub(1500);
        log.get(start..).unwrap_or(&log).to_string()
    }

    /// [`Etcd::spawn`], saying why it did not come up.
    fn try_spawn(&mut self, client_port: u16) -> Result<(), Start> {
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
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("{}={peer}", self.name)])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.data.with_extension("log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // Healthy, and this member: a port picked free can be bound by another test's
            // etcd, whose health would otherwise pass for this one's.
            let ok = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(self.ctl_tls())
                .args(["--endpoints", &client, "member", "list"])
                .stderr(Stdio::null())
                .output()
                .map(|o| {
                    o.status.success() && String::from_utf8_lossy(&o.stdout).contains(&self.name)
                })
                .unwrap_or(false)
                && Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(self.ctl_tls())
                    .args(["--endpoints", &client, "endpoint", "health"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited {
                self.child = None;
                return Err(Start::Exited);
            }
            if Instant::now() >= deadline {
                return Err(Start::Unhealthy);
            }
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

/// A member name no other etcd on this machine has: the process and a counter.
fn unique_name() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t{}x{n}", std::process::id())
}

/// Why a member did not come up.
#[derive(Debug)]
enum Start {
    /// It exited (a port it was given was taken meanwhile).
    Exited,
    /// It ran but never answered `member list` with its name and `endpoint health` within 20 s.
    Unhealthy,
}
