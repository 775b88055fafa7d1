//! `limits.per_process`: a daily [`Meter`] for each process of a sandbox — its vouched exec
//! (`sandbox~exec`), else the executable the kernel showed — made when the process first
//! connects, counted on top of the sandbox's own meter, so one runaway tool is refused and
//! cut while the sandbox's other processes go on. A connection with no attributed process
//! counts into the sandbox's meter only.
//!
//! Bounded: at most [`KEYS_MAX`] processes a sandbox; the ones after share one meter
//! (`(other processes)`), so a sandbox cannot escape its quotas by inventing names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Meter;
use crate::config::ProcessQuota;
use crate::policy::process::Process;

/// The most processes of one sandbox metered apart.
pub const KEYS_MAX: usize = 256;
const OVERFLOW: &str = "(other processes)";

/// The meters of a sandbox's processes.
#[derive(Debug, Default)]
pub struct ProcessMeters {
    quota: Mutex<Option<ProcessQuota>>,
    meters: Mutex<HashMap<Arc<str>, Arc<Meter>>>,
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
        ProcessMeters {
            quota: Mutex::new(quota),
            meters: Mutex::default(),
        }
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
        if let Ok(mut m) = self.meters.lock() {
            match quota {
                None => m.clear(),
                Some(q) => m
                    .values()
                    .for_each(|meter| meter.configure(q.bytes_per_day, q.requests_per_day)),
            }
        }
    }

    /// The meter of `process` (made on its first exchange); none without a quota or a key.
    pub fn meter(&self, process: Option<&Process>) -> Option<Arc<Meter>> {
        self.by_key(process.and_then(key_of)?)
    }

    /// The meter of the process keyed `key` (made if new: a count restored after a restart,
    /// or shared by another replica, finds its meter before the process connects again).
    pub fn by_key(&self, key: &str) -> Option<Arc<Meter>> {
        let quota = (*self.quota.lock().ok()?)?;
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

    /// Every meter with its process key.
    pub fn keyed(&self) -> impl Iterator<Item = (Arc<str>, Arc<Meter>)> {
        let all: Vec<_> = self
            .meters
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
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
        };
        let pm = ProcessMeters::new(Some(q));
        let a = pm.meter(Some(&exec("a"))).unwrap();
        a.reserve().unwrap();
        a.reserve().unwrap();
        assert!(a.reserve().is_err());
        let b = pm.meter(Some(&exec("b"))).unwrap();
        assert!(b.reserve().is_ok());
        assert!(pm.meter(None).is_none());
        for i in 0..KEYS_MAX {
            let _ = pm.meter(Some(&exec(&format!("n{i}"))));
        }
        let x = pm.meter(Some(&exec("x"))).unwrap();
        let y = pm.meter(Some(&exec("y"))).unwrap();
        assert!(Arc::ptr_eq(&x, &y));
        pm.configure(None);
        assert!(pm.meter(Some(&exec("a"))).is_none());
    }
}
