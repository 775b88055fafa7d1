//! Needs root (`#[ignore]`d; `.ci/run` runs it): the proxy runs unprivileged, as the kit runs
//! it, under a tiny per-user pipe budget (`fs.pipe-user-pages-hard`, restored afterwards).
//! Tunnels whose client stops reading hold the few pipes there are; a new tunnel must still
//! work, copying through user space when no pipe can be had.

mod common;

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;

use common::*;

const HARD: &str = "/proc/sys/fs/pipe-user-pages-hard";

/// Restores the sysctl when the test ends, however it ends.
struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(HARD, &self.0);
    }
}

#[test]
#[ignore = "needs root (sysctl, setpriv)"]
fn a_new_tunnel_works_when_stalled_tunnels_hold_every_pipe() {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    assert!(root, "run as root: cargo test -- --include-ignored");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let origin = Origin::start(None);
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("proxy.yaml");
    let yaml = ProxyConfig::new()
        .dns_server("127.0.0.1:9")
        .host("big.test", "127.0.0.1")
        .guard_allow("127.0.0.1/32")
        .sandbox(
            SandboxSpec::new("demo")
                .source("127.0.0.0/8")
                .allow("big.test:*"),
        )
        .yaml(&audit);
    std::fs::write(&config, yaml).unwrap();
    // Two default-sized pipes (16 pages each) for the whole user.
    let before = std::fs::read_to_string(HARD).unwrap();
    let _restore = Restore(before);
    std::fs::write(HARD, "32").unwrap();
    let p = Proxy::start_wrapped(
        config,
        audit,
        &[],
        &[
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ],
    );
    let _stalled: Vec<TcpStream> = (0..4)
        .map(|_| stalled_download(p.proxy, &origin, None))
        .collect();
    origin.wait_big_stalled();
    let out = curl(&[
        "-p",
        "-x",
        &format!("http://{}", p.proxy),
        &format!("http://big.test:{}/big", origin.addr.port()),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.len(), BIG);
    assert!(out
        .stdout
        .iter()
        .enumerate()
        .all(|(i, b)| *b == big_byte(i)));
}
