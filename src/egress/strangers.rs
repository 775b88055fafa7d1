//! DNS queries from addresses no sandbox has: the table. Each costs a `REFUSED` and nothing more: no
//! record of its own (an unidentified flood of ~18k queries/s would otherwise write ~10 MB/s
//! of audit log and push the queue into backpressure for everyone). Instead each source's
//! refusals are summed and written as one record per source every `admission.dns_summary_s`
//! (`count`, `dropped`, `first_ts`, `last_ts`). Beyond `admission.
//! dns_queries_per_second_per_source` (burst: twice that) a source's queries are dropped
//! unanswered, so the listener is no amplifier either. The table is bounded: sources beyond
//! it are summed under one record for the unspecified address. The records are written by
//! [`crate::dns::strangers`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::audit::record::{rfc3339, Summed};
use crate::egress::limits::{Admit, TokenBucket};

/// Sources tracked at once.
const MAX_SOURCES: usize = 16_384;
/// Where sources beyond the table are summed.
const OVERFLOW: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// What to do with an unidentified query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Answer `REFUSED`.
    Refuse,
    /// Over the source's rate: no answer at all.
    Drop,
}

struct Entry {
    bucket: TokenBucket,
    count: u64,
    dropped: u64,
    first: SystemTime,
    last: SystemTime,
    /// Last query, to forget sources that went quiet.
    seen: Instant,
}

/// The per-source sums and rates of unidentified DNS clients.
pub struct Strangers {
    rate: f64,
    origin: Instant,
    table: Mutex<HashMap<IpAddr, Entry>>,
}

impl Strangers {
    pub fn new(rate: f64) -> Arc<Self> {
        Arc::new(Strangers {
            rate,
            origin: Instant::now(),
            table: Mutex::new(HashMap::new()),
        })
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Count one refused query from `source`; whether to answer it.
    pub fn refused(&self, source: IpAddr) -> Answer {
        let now = self.now();
        let at = SystemTime::now();
        let Ok(mut t) = self.table.lock() else {
            return Answer::Drop;
        };
        let key = if t.len() >= MAX_SOURCES && !t.contains_key(&source) {
            OVERFLOW
        } else {
            source
        };
        let rate = self.rate;
        let e = t.entry(key).or_insert_with(|| Entry {
            bucket: TokenBucket::new(rate, (2.0 * rate).max(1.0), now),
            count: 0,
            dropped: 0,
            first: at,
            last: at,
            seen: Instant::now(),
        });
        if e.count == 0 {
            e.first = at;
        }
        e.count += 1;
        e.last = at;
        e.seen = Instant::now();
        match e.bucket.check(now, 1.0) {
            Admit::Admit => Answer::Refuse,
            _ => {
                e.dropped += 1;
                Answer::Drop
            }
        }
    }

    /// Take the sums of the period: one per source that asked; sources quiet for a minute are
    /// forgotten.
    pub fn drain(&self) -> Vec<(IpAddr, Summed)> {
        let Ok(mut t) = self.table.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (ip, e) in t.iter_mut() {
            if e.count > 0 {
                out.push((
                    *ip,
                    Summed {
                        count: e.count,
                        dropped: e.dropped,
                        first: rfc3339(e.first).into(),
                        last: rfc3339(e.last).into(),
                    },
                ));
                e.count = 0;
                e.dropped = 0;
            }
        }
        t.retain(|_, e| e.count > 0 || e.seen.elapsed() < Duration::from_secs(60));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_summed_rated_and_bounded() {
        let s = Strangers::new(10.0);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let answers: Vec<_> = (0..1000).map(|_| s.refused(a)).collect();
        let answered = answers.iter().filter(|x| **x == Answer::Refuse).count();
        assert!((20..=25).contains(&answered), "{answered} answered");
        let sums = s.drain();
        assert_eq!(sums.len(), 1);
        assert_eq!(sums[0].1.count, 1000);
        assert_eq!(sums[0].1.dropped as usize, 1000 - answered);
        assert!(s.drain().is_empty(), "a period is written once");
        for i in 0..(MAX_SOURCES as u32 + 10) {
            s.refused(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
        }
        assert!(s.drain().len() <= MAX_SOURCES + 1);
    }
}
