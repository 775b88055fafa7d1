//! Test harness: a test CA and origin servers (HTTPS and HTTP) on loopback, the real
//! `egress-proxy` binary started on `127.0.0.1:0` with a config written by the test, and
//! real `curl`. Everything it starts it stops (Drop). By role: `ca`, `origin`, `proxy`,
//! `client`, `dns`, `etcd`, `h2`, `openapi`, `pki`, `tls_hello`; `eventually` waits on a condition.
// Each test file uses a part of the harness: the rest is unused in its crate.
#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;

use sha2::{Digest, Sha256};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod builder;
mod ca;
mod client;
mod dns;
mod etcd;
mod h2;
pub mod openapi;
mod origin;
mod pki;
mod proxy;
pub mod tls_hello;

pub use builder::*;
pub use ca::*;
pub use client::*;
pub use dns::*;
pub use etcd::*;
pub use h2::*;
pub use origin::*;
pub use pki::*;
pub use proxy::*;

/// Poll `f` every 20 ms until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_every(Duration::from_millis(20), limit, what, f)
}

/// [`eventually`], polling every `period`: for a condition whose poll costs something (it sends
/// a request, reads a large file).
pub fn eventually_every<T>(
    period: Duration,
    limit: Duration,
    what: &str,
    f: impl FnMut() -> Option<T>,
) -> T {
    within(period, limit, f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Poll `f` every `period` until it returns `Some`; `None` once `limit` has passed (for a
/// caller whose failure says more than "timed out").
pub fn within<T>(period: Duration, limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(period);
    }
}

/// [`eventually`] in async code: poll the future `f` makes every 20 ms until it yields `Some`.
pub async fn eventually_async<T, F: std::future::Future<Output = Option<T>>>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A measurement once it has settled: read every `period` until two readings in a row are
/// equal (or the last reading at `limit`: a quantity that never settles is judged as it is).
pub fn steady<T: PartialEq>(
    period: Duration,
    limit: Duration,
    mut measure: impl FnMut() -> T,
) -> T {
    let deadline = Instant::now() + limit;
    let mut last = measure();
    loop {
        std::thread::sleep(period);
        let now = measure();
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Let `d` pass on the clock because what is tested is about time: a TTL or an idle timeout
/// running out, a bound a promise names ("within 500 ms"), the pace of a slow peer. Never to
/// wait for something to happen — that is [`eventually`] with the event as its condition.
/// `why` says which time it is, for the reader.
pub fn let_time_pass(d: Duration, _why: &str) {
    std::thread::sleep(d);
}

/// [`let_time_pass`] in async code.
pub async fn let_time_pass_async(d: Duration, _why: &str) {
    tokio::time::sleep(d).await;
}

/// `egress-proxy simulate --json --config CANDIDATE TRAIL`: its exit status and report.
#[allow(dead_code)]
pub fn simulate(
    candidate: &std::path::Path,
    trail: &std::path::Path,
) -> (Option<i32>, serde_json::Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["simulate", "--json", "--config"])
        .arg(candidate)
        .arg(trail)
        .output()
        .expect("egress-proxy simulate");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), report)
}
