//! Answers the DNS listener gave, remembered per sandbox as address → names until the
//! answer's TTL plus a grace period: a transparent connection that carries no name (SSH,
//! Postgres — mode `tcp`) to an address the sandbox obtained for `github.com` is then decided
//! as `github.com:port` by name rules.
//!
//! Only what the proxy itself answered is here, so a sandbox cannot plant a mapping: it can
//! only ask for names its policy already lets it resolve. Bounded: at most [`MAX_ENTRIES`]
//! addresses in all and [`NAMES_PER_ADDRESS`] names per address; when full, expired entries
//! are dropped first and, failing that, the new answer is not remembered (a connection
//! without a remembered name falls back to address rules: closed, not open).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::policy::sandbox_id::SandboxId;

/// How long past its TTL an answer still names its addresses: clients (the JVM, Go, glibc
/// with nscd) keep answers a little longer than they were told.
pub const GRACE: Duration = Duration::from_secs(60);
/// Addresses remembered across all sandboxes.
pub const MAX_ENTRIES: usize = 262_144;
/// Names remembered for one address of one sandbox (CDN addresses serve many names).
pub const NAMES_PER_ADDRESS: usize = 8;

/// The names one sandbox was given for one address, each with when it expires.
type Names = Vec<(Arc<str>, Instant)>;

/// The remembered answers.
#[derive(Debug, Default)]
pub struct DnsMemory {
    map: Mutex<HashMap<(SandboxId, IpAddr), Names>>,
}

impl DnsMemory {
    /// Remember that `sandbox` was told `name` has `addrs`, for `ttl` (plus [`GRACE`]).
    pub fn remember(&self, sandbox: &SandboxId, name: &str, addrs: &[IpAddr], ttl: Duration) {
        if addrs.is_empty() {
            return;
        }
        let now = Instant::now();
        let until = now + ttl + GRACE;
        let name: Arc<str> = name.into();
        let Ok(mut map) = self.map.lock() else {
            return;
        };
        if map.len() + addrs.len() > MAX_ENTRIES {
            map.retain(|_, names| {
                names.retain(|(_, t)| *t > now);
                !names.is_empty()
            });
        }
        for ip in addrs {
            let key = (sandbox.clone(), ip.to_canonical());
            if !map.contains_key(&key) && map.len() >= MAX_ENTRIES {
                continue;
            }
            let names = map.entry(key).or_default();
            names.retain(|(n, t)| *t > now && *n != name);
            if names.len() >= NAMES_PER_ADDRESS {
                // Drop the one that expires first.
                if let Some(i) = (0..names.len()).min_by_key(|i| names[*i].1) {
                    names.swap_remove(i);
                }
            }
            names.push((name.clone(), until));
        }
    }

    /// The names `sandbox` was given for `ip` that have not expired, newest first.
    pub fn names(&self, sandbox: &SandboxId, ip: IpAddr) -> Vec<Arc<str>> {
        let now = Instant::now();
        let Ok(map) = self.map.lock() else {
            return Vec::new();
        };
        let mut found: Names = map
            .get(&(sandbox.clone(), ip.to_canonical()))
            .map(|v| v.iter().filter(|(_, t)| *t > now).cloned().collect())
            .unwrap_or_default();
        found.sort_by_key(|e| std::cmp::Reverse(e.1));
        found.into_iter().map(|(n, _)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        SandboxId::new(s).unwrap()
    }

    #[test]
    fn per_sandbox_and_per_address() {
        let m = DnsMemory::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        m.remember(&id("s1"), "github.com", &[a], Duration::from_secs(30));
        assert_eq!(m.names(&id("s1"), a), vec![Arc::<str>::from("github.com")]);
        assert!(
            m.names(&id("s2"), a).is_empty(),
            "another sandbox was not told"
        );
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(
            m.names(&id("s1"), mapped).len(),
            1,
            "mapped form is the same"
        );
        // A second name for the same address is kept too; repeating one does not duplicate.
        m.remember(&id("s1"), "gist.github.com", &[a], Duration::from_secs(30));
        m.remember(&id("s1"), "github.com", &[a], Duration::from_secs(30));
        assert_eq!(m.names(&id("s1"), a).len(), 2);
    }

    #[test]
    fn bounded_names_per_address() {
        let m = DnsMemory::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        for i in 0..(NAMES_PER_ADDRESS + 5) {
            m.remember(
                &id("s"),
                &format!("n{i}.test"),
                &[a],
                Duration::from_secs(i as u64),
            );
        }
        let names = m.names(&id("s"), a);
        assert_eq!(names.len(), NAMES_PER_ADDRESS);
        assert_eq!(&*names[0], &format!("n{}.test", NAMES_PER_ADDRESS + 4));
    }
}
