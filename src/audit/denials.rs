//! Each sandbox's latest refusals, kept from the records as they are written: what an agent
//! reads at `GET http://egress-proxy.local/v1/denials` to know what it would have to ask for.
//! Bounded twice: [`PER_SANDBOX`] refusals for each sandbox, and [`SANDBOXES`] sandboxes (the
//! one refused longest ago makes room), so a flood of refusals costs a fixed amount of memory.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;

use crate::audit::record::{rfc3339, Record};

/// Refusals kept per sandbox.
pub const PER_SANDBOX: usize = 32;
/// Sandboxes with refusals kept.
pub const SANDBOXES: usize = 4096;

/// One refusal as the sandbox sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Denial {
    /// When (RFC 3339).
    pub ts: String,
    /// The host asked for.
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// How the connection came (`connect`, `http`, `https`, `socks5`, `transparent`, `dns`).
    pub mode: &'static str,
    /// The refusal's reason.
    pub reason: &'static str,
    /// The rule that refused it, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The refusal's detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One sandbox's refusals and when its last one came.
type Kept = (SystemTime, VecDeque<Denial>);

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Denials {
    by_sandbox: Mutex<HashMap<Box<str>, Kept>>,
}

impl Denials {
    /// Keep `r` if it is a sandbox's refusal of a target.
    pub fn note(&self, r: &Record) {
        let (Some(sb), Some(target)) = (&r.sandbox, &r.target) else {
            return;
        };
        let now = SystemTime::now();
        let denial = Denial {
            ts: rfc3339(now),
            host: target.host.to_string(),
            port: target.port,
            mode: r.mode.as_str(),
            reason: r.reason.code(),
            rule: r.rule.as_ref().map(|x| x.text.clone()),
            detail: r.detail.as_ref().map(|d| d.to_string()),
        };
        let Ok(mut map) = self.by_sandbox.lock() else {
            return;
        };
        if !map.contains_key(sb.as_str()) && map.len() >= SANDBOXES {
            let oldest = map
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                map.remove(&k);
            }
        }
        let (at, list) = map
            .entry(sb.as_str().into())
            .or_insert_with(|| (now, VecDeque::new()));
        *at = now;
        if list.len() >= PER_SANDBOX {
            list.pop_front();
        }
        list.push_back(denial);
    }

    /// Sandbox `id`'s refusals, newest first.
    pub fn of(&self, id: &str) -> Vec<Denial> {
        let Ok(map) = self.by_sandbox.lock() else {
            return Vec::new();
        };
        map.get(id)
            .map(|(_, l)| l.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}
