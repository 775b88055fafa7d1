//! `limits.per_process`: a daily [`Meter`] for each process of a sandbox — its vouched exec
//! (`sandbox~exec`), else the executable the kernel showed — made when the process first
//! connects, counted on top of the sandbox's own meter, so one runaway tool is refused and
//! cut while the sandbox's other processes go on. A connection with no attributed process
//! counts into the sandbox's meter only.
//!
//! Bounded twice, so a sandbox cannot escape its quotas by inventing names (security review
//! A09: 6 invented exec names × 3 requests passed a `per_process` limit of 3 18 times):
//! - every count of every process also counts into one sandbox-wide total of `processes`
//!   (default 16) times each quota, checked with the process's own — the most the sandbox's
//!   processes spend together, however many names they use;
//! - at most [`KEYS_MAX`] processes a sandbox have a meter of their own; the ones after share
//!   one (`(other processes)`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Meter;
use crate::config::ProcessQuota;
use crate::policy::process::Process;

/// The most processes of one sandbox metered apart.
pub const KEYS_MAX: usize = 256;
const OVERFLOW: &str = "(other processes)";
/// The key of the sandbox-wide total.
pub const TOTAL: &str = "(all processes)";

/// The meters of a sandbox's processes.
#[derive(Debug, Default)]
pub struct ProcessMeters {
    quota: Mutex<Option<ProcessQuota>>,
    meters: Mutex<HashMap<Arc<str>, Arc<Meter>>>,
    /// Every process's counts together, against `processes` times each quota.
    total: Arc<Meter>,
}

/// The key a process is metered under: its vouched exec, else its executable.
pub fn key_of(process: &Process) -> Option<&str> {
    process
        .vouched
        .as_ref()
        .map(|v| &*v.exec)
        .or_else(|| process.exe())
}

impl ProcessMeters {
    /// Meters with `quota` (none: nothing metered per process).
    pub fn new(quota: Option<ProcessQuota>) -> Self {
        let pm = ProcessMeters {
            quota: Mutex::new(None),
            meters: Mutex::default(),
            total: Arc::new(Meter::scoped(&format!("~{TOTAL}"))),
        };
        pm.configure(quota);
        pm
    }

    /// Whether a per-process quota is set.
    pub fn configured(&self) -> bool {
        self.quota.lock().is_ok_and(|q| q.is_some())
    }

    /// A new quota for every meter (none: they are dropped).
    pub fn configure(&self, quota: Option<ProcessQuota>) {
        if let Ok(mut q) = self.quota.lock() {
            *q = quota;
        }
        let (bytes, requests) = quota.map(|q| q.total()).unwrap_or_default();
        self.total.configure(bytes, requests);
        if let Ok(mut m) = self.meters.lock() {
            match quota {
                None => m.clear(),
                Some(q) => m
                    .values()
                    .for_each(|meter| meter.configure(q.bytes_per_day, q.requests_per_day)),
            }
        }
    }

    /// The meters an exchange of `process` counts into: its own (made on its first
    /// exchange) and the sandbox-wide total; none without a quota or a key.
    pub fn meters(&self, process: Option<&Process>) -> Vec<Arc<Meter>> {
        match self.by_key(process.and_then(key_of).unwrap_or_default()) {
            Some(own) => vec![own, self.total.clone()],
            None => Vec::new(),
        }
    }

    /// The meter of the process keyed `key` (made if new: a count restored after a restart,
    /// or shared by another replica, finds its meter before the process connects again).
    pub fn by_key(&self, key: &str) -> Option<Arc<Meter>> {
        let quota = (*self.quota.lock().ok()?)?;
        if key.is_empty() {
            return None;
        }
        if key == TOTAL {
            return Some(self.total.clone());
        }
        let mut meters = self.meters.lock().ok()?;
        let key: Arc<str> = match meters.len() < KEYS_MAX || meters.contains_key(key) {
            true => key.into(),
            false => OVERFLOW.into(),
        };
        let meter = meters.entry(key.clone()).or_insert_with(|| {
            let m = Meter::scoped(&format!("~{key}"));
            m.configure(quota.bytes_per_day, quota.requests_per_day);
            Arc::new(m)
        });
        Some(meter.clone())
    }

    /// Every meter with its process key, the total's last (none without a quota).
    pub fn keyed(&self) -> impl Iterator<Item = (Arc<str>, Arc<Meter>)> {
        let mut all: Vec<_> = self
            .meters
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        if self.configured() {
            all.push((TOTAL.into(), self.total.clone()));
        }
        all.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::process::Vouched;

    fn exec(name: &str) -> Process {
        Process {
            vouched: Some(Vouched {
                exec: name.into(),
                parent: None,
            }),
            observed: None,
        }
    }

    #[test]
    fn each_process_has_its_own_count_and_invented_names_share_one() {
        let q = ProcessQuota {
            bytes_per_day: None,
            requests_per_day: Some(2),
            processes: Some(2),
        };
        let pm = ProcessMeters::new(Some(q));
        let reserve = |name: &str| {
            let ms = pm.meters(Some(&exec(name)));
            assert_eq!(ms.len(), 2);
            ms.iter().all(|m| m.reserve().is_ok())
        };
        assert!(reserve("a") && reserve("a"));
        assert!(!reserve("a"), "a's own quota");
        assert!(reserve("b") && reserve("b"));
        // Two processes' worth spent: an invented third name gets nothing.
        assert!(!reserve("c"));
        assert!(pm.meters(None).is_empty());
        for i in 0..KEYS_MAX {
            let _ = pm.meters(Some(&exec(&format!("n{i}"))));
        }
        let x = pm.meters(Some(&exec("x")));
        let y = pm.meters(Some(&exec("y")));
        assert!(Arc::ptr_eq(&x[0], &y[0]));
        assert!(pm.keyed().any(|(k, _)| &*k == TOTAL));
        pm.configure(None);
        assert!(pm.meters(Some(&exec("a"))).is_empty());
    }
}
