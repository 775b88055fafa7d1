//! Daily quota counts shared between replicas: every [`SYNC_EVERY`] a replica writes its own
//! counts of the day for each sandbox that counted anything under
//! `{prefix}usage/{day}/{key}/{replica}` (the key: the sandbox id, or `id@host` for a
//! `per_destination` entry) (a plain put: each replica owns its keys, so no
//! write ever races another), lists `{prefix}usage/{day}/` and gives each sandbox's meter the
//! sum of the *other* keys ([`crate::egress::quota::Meter::others`]).
//!
//! How exact that is: a replica sees what the others counted up to one sync interval (plus
//! etcd's round trip) late, so a sandbox served by several replicas can pass its quota by
//! what the other replicas moved in that time; what one replica moves itself is cut at once.
//! A replica's id is new at every start: a restarted replica's earlier key still counts for
//! the day (as another's), so the day's total survives a restart without a `state_dir`.
//! Keys carry a lease of [`LEASE_S`]: etcd forgets old days by itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions};
use serde::{Deserialize, Serialize};

use super::ControlPlane;
use crate::egress::handles::Handles;
use crate::egress::quota::{today, DayCount};

/// How often counts are written and read.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);
/// The lease of a day's keys (two days).
pub const LEASE_S: i64 = 2 * 86_400;

#[derive(Debug, Serialize, Deserialize)]
struct Value {
    bytes: u64,
    requests: u64,
    #[serde(default)]
    tokens: u64,
    /// Nano-dollars.
    #[serde(default)]
    cost: u64,
}

/// This replica's link: its id and the lease of the current day.
struct Sharer {
    replica: String,
    lease: Option<(u32, i64)>,
}

/// Share counts until the task is aborted (a failed round waits for the next).
pub async fn run(cp: Arc<ControlPlane>) {
    let mut me = Sharer {
        replica: format!("{:016x}", rand_id()),
        lease: None,
    };
    let mut tick = tokio::time::interval(SYNC_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(client) = cp.client.load_full() else {
            continue;
        };
        let mut client = (*client).clone();
        if let Err(e) = me.round(&cp, &mut client).await {
            tracing::debug!(error = %e, "sharing quota counts through etcd");
        }
    }
}

fn rand_id() -> u64 {
    let mut b = [0u8; 8];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        return u64::from(std::process::id());
    }
    u64::from_le_bytes(b)
}

impl Sharer {
    async fn lease(&mut self, client: &mut Client, day: u32) -> Result<i64, etcd_client::Error> {
        match self.lease {
            Some((d, id)) if d == day => Ok(id),
            _ => {
                let id = client.lease_grant(LEASE_S, None).await?.id();
                self.lease = Some((day, id));
                Ok(id)
            }
        }
    }

    async fn round(
        &mut self,
        cp: &ControlPlane,
        client: &mut Client,
    ) -> Result<(), etcd_client::Error> {
        let day = today();
        let limiters = &cp.shared.limiters;
        let counted = limiters.counts();
        let prefix = format!("{}usage/{day}/", cp.cfg.prefix);
        if !counted.is_empty() {
            let lease = self.lease(client, day).await?;
            for (sandbox, meter) in &counted {
                let c = meter.mine();
                if c.day != day {
                    continue;
                }
                let v = Value {
                    bytes: c.bytes,
                    requests: c.requests,
                    tokens: c.tokens,
                    cost: c.cost,
                };
                let key = format!("{prefix}{sandbox}/{}", self.replica);
                let body = serde_json::to_vec(&v).unwrap_or_default();
                client
                    .put(key, body, Some(PutOptions::new().with_lease(lease)))
                    .await?;
            }
        }
        let listed = client
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut others: HashMap<String, DayCount> = HashMap::new();
        for kv in listed.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            let Some((sandbox, replica)) = key
                .strip_prefix(prefix.as_str())
                .and_then(|r| r.rsplit_once('/'))
            else {
                continue;
            };
            if replica == self.replica {
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(kv.value()) else {
                continue;
            };
            let sum = others.entry(sandbox.to_string()).or_insert(DayCount {
                day,
                ..Default::default()
            });
            // Numbers from etcd are untrusted: saturate, never overflow.
            sum.bytes = sum.bytes.saturating_add(v.bytes);
            sum.requests = sum.requests.saturating_add(v.requests);
            sum.tokens = sum.tokens.saturating_add(v.tokens);
            sum.cost = sum.cost.saturating_add(v.cost);
        }
        let set = cp.shared.policy.load();
        for (key, count) in others {
            // Made now if this replica has not served the sandbox yet: its first exchange
            // here is then judged on the others' counts too.
            let id = key.split_once('@').map_or(key.as_str(), |(id, _)| id);
            if let Some(sb) = set.get(id) {
                sb.limiter(limiters);
            }
            if let Some(m) = limiters.meter_of(&key) {
                m.others(count);
            }
        }
        Ok(())
    }
}
