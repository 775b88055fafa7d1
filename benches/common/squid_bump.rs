//! Squid with ssl-bump, the peer of a terminating (brokering) proxy for `benches/intercept.rs
//! --squid`: it terminates every CONNECT with a certificate it makes from the same CA as
//! egress-proxy's interception CA, verifies the upstream against the same upstream CA, and
//! forwards the requests on kept upstream connections. Debian's `squid-openssl` (the `squid`
//! package is built without ssl-bump): `apt-get install squid-openssl`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's `squid-openssl` keeps its certificate generator.
const CERTGEN: &str = "/usr/lib/squid/security_file_certgen";

/// A running Squid; killed (with its workers) on drop.
pub struct Squid {
    child: Child,
    pub port: u16,
    log: std::path::PathBuf,
}

impl Drop for Squid {
    fn drop(&mut self) {
        // What Squid said, for a run that went wrong (stderr; the JSON line is on stdout).
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        eprintln!("squid cache.log (last lines): {tail:?}");
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its helpers (certificate generators) go with the process group's leader.
        let _ = Command::new("pkill")
            .args(["-f", "security_file_certgen"])
            .status();
    }
}

/// Start Squid in `dir` on `port`: ssl-bump with `ca_cert`/`ca_key`, upstreams verified
/// against `upstream_ca`, `hosts` resolved to 127.0.0.1. `None` (with why) when Squid or its
/// ssl-bump support is not installed.
pub fn start(
    dir: &Path,
    port: u16,
    ca: (&Path, &Path),
    upstream_ca: &Path,
    hosts: &[&str],
) -> Result<Squid, String> {
    if !Path::new(CERTGEN).exists() {
        return Err(format!(
            "{CERTGEN} is missing: apt-get install squid-openssl"
        ));
    }
    let work = dir.join("squid");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    // Squid runs as `proxy`: it must read the CA and write its state.
    let bundle = work.join("bump.pem");
    let pem = [ca.0, ca.1]
        .iter()
        .map(|p| std::fs::read_to_string(p).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?
        .join("\n");
    std::fs::write(&bundle, pem).map_err(|e| e.to_string())?;
    std::fs::copy(upstream_ca, work.join("upstream.pem")).map_err(|e| e.to_string())?;
    let host_lines: String = hosts.iter().map(|h| format!("127.0.0.1 {h}\n")).collect();
    std::fs::write(work.join("hosts"), host_lines).map_err(|e| e.to_string())?;
    let db = work.join("ssl_db");
    let ok = Command::new(CERTGEN)
        .args(["-c", "-s"])
        .arg(&db)
        .args(["-M", "16MB"])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?
        .success();
    if !ok {
        return Err("security_file_certgen -c failed".into());
    }
    let w = work.display();
    // `DONT_VERIFY_PEER`: Squid's OpenSSL refuses the bench's rcgen-made upstream chain (503 on
    // every request), so the peer is spared the verification egress-proxy does: this only
    // flatters Squid.
    let conf = format!(
        "http_port 127.0.0.1:{port} ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=16MB tls-cert={w}/bump.pem\n\
         sslcrtd_program {CERTGEN} -s {w}/ssl_db -M 16MB\n\
         sslcrtd_children 4 startup=2\n\
         ssl_bump bump all\n\
         tls_outgoing_options cafile={w}/upstream.pem flags=DONT_VERIFY_PEER\n\
         acl localnet src 127.0.0.0/8\n\
         http_access allow localnet\n\
         http_access deny all\n\
         hosts_file {w}/hosts\n\
         dns_nameservers 127.0.0.1\n\
         cache deny all\n\
         cache_mem 8 MB\n\
         access_log none\n\
         cache_store_log none\n\
         cache_log {w}/cache.log\n\
         pid_filename {w}/squid.pid\n\
         coredump_dir {w}\n\
         shutdown_lifetime 0 seconds\n\
         max_filedescriptors 65536\n"
    );
    std::fs::write(work.join("squid.conf"), conf).map_err(|e| e.to_string())?;
    let _ = Command::new("chown")
        .args(["-R", "proxy:proxy"])
        .arg(&work)
        .status();
    let _ = Command::new("chmod").args(["755"]).arg(dir).status();
    let child = Command::new("squid")
        .args(["-N", "-f"])
        .arg(work.join("squid.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("squid: {e}"))?;
    let squid = Squid {
        child,
        port,
        log: work.join("cache.log"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(work.join("cache.log")).unwrap_or_default();
            return Err(format!("squid did not listen: {log}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(squid)
}
