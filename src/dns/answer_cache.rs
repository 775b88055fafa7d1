//! Allowed answers served again, per UDP receive loop: the same query (every byte after the
//! id: flags, question as spelt, EDNS) from a sandbox, under the same policy generation,
//! within [`LIFE`] of an answer that came from the resolver's cache, gets the same bytes with
//! its own id — without parsing the message, asking the resolver or encoding again. Each
//! repeat still passes what every query passes: identified by its source, under its
//! sandbox's query rate, refused nothing-recorded when the audit log is saturated, and
//! written as its own record (a copy of the first one's, with its own id and client).
//!
//! What it never does: serve across sandboxes (the sandbox is in the key), outlive a policy
//! change (the generation is: a reload or a registration publishes a new one, and the next
//! query is decided anew), or keep a refusal, a failure or an empty answer. The TTLs it
//! repeats are at most [`LIFE`] older than the resolver's. Bounded at [`MAX_ENTRIES`] per
//! loop; one loop's cache is its own (no lock on the hot path).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::audit::record::{DnsFacts, Record};
use crate::audit::AuditGuard;
use crate::config::AuditDns;
use crate::dns::listener::{Answered, Asker, DnsListener};
use crate::dns::wire::HEADER;
use crate::egress::identity::Identified;
use crate::policy::sandbox_id::SandboxId;
use crate::sandboxes::set::PolicySet;

/// How long an answer is served again.
pub const LIFE: Duration = Duration::from_secs(1);
/// Answers kept per receive loop.
pub const MAX_ENTRIES: usize = 4096;

/// One loop's kept answers, by a hash of (sandbox, generation, query after its id); the
/// entry holds them all, so a hash collision is a miss, never a wrong answer.
#[derive(Default)]
pub struct AnswerCache {
    map: HashMap<u64, Kept>,
    hasher: RandomState,
}

struct Kept {
    sandbox: SandboxId,
    generation: u64,
    /// The query after its id.
    query: Box<[u8]>,
    /// The answer after its id.
    answer: Box<[u8]>,
    until: Instant,
    /// The first query's record (without its DNS facts), copied for each repeat.
    record: Record,
    /// Its DNS facts, copied for each repeat (the name and the answers shared, not copied).
    facts: DnsFacts,
}

impl AnswerCache {
    fn key(&self, sandbox: &str, generation: u64, query: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        sandbox.hash(&mut h);
        generation.hash(&mut h);
        query.hash(&mut h);
        h.finish()
    }

    /// The answer to `datagram` from `src`, appended to `out`, if it is a repeat of a kept one
    /// (and its record is on its way); else `Err`, to decide it the full way — with who asks
    /// when it was looked up here, so that a query is identified once.
    pub fn serve(
        &mut self,
        handler: &DnsListener,
        datagram: &[u8],
        src: SocketAddr,
        out: &mut Vec<u8>,
    ) -> Result<(), Option<Asker>> {
        // A response (QR) is never answered, and only a standard query (opcode 0) is kept.
        if self.map.is_empty() || datagram.len() <= HEADER || datagram[2] & 0xf8 != 0 {
            return Err(None);
        }
        let shared = &handler.shared;
        let set = shared.policy.load();
        let default = shared.settings.default_sandbox.as_deref();
        let who = crate::egress::admit::query_asker(&set, default, src.ip());
        let answer = match &who {
            Ok(w) => self.repeat(handler, w, &set, datagram, src, out),
            Err(_) => None,
        };
        answer.ok_or(Some(Asker { set, who }))
    }

    /// The kept answer to `datagram`, if it is a repeat `who` may be served now.
    fn repeat(
        &mut self,
        handler: &DnsListener,
        who: &Identified,
        set: &PolicySet,
        datagram: &[u8],
        src: SocketAddr,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        let shared = &handler.shared;
        let sandbox = &who.sandbox.binding.id;
        let generation = set.generation();
        let query = &datagram[2..];
        let kept = self.map.get(&self.key(sandbox, generation, query))?;
        if kept.sandbox != *sandbox
            || kept.generation != generation
            || *kept.query != *query
            || kept.until <= Instant::now()
        {
            return None;
        }
        // As every query: nothing answered that cannot be recorded, and the sandbox's rate
        // (a refusal is left to the full way, which records it).
        let over_rate = || {
            crate::egress::admit::query_rate(
                &shared.limiters,
                shared.metrics(),
                &who.sandbox,
                false,
            )
            .is_err()
        };
        if shared.sink.log.unavailable().is_some() || over_rate() {
            return None;
        }
        out.extend_from_slice(&datagram[..2]);
        out.extend_from_slice(&kept.answer);
        let mut record = kept.record.clone();
        record.conn_id = shared.next_conn_id();
        record.client = src;
        // Written (and counted) as it drops.
        drop(AuditGuard::query(
            shared.sink.clone(),
            record,
            kept.facts.clone(),
            shared.settings.audit_dns != AuditDns::Denied,
        ));
        Some(())
    }

    /// Drop the answers past their [`LIFE`] (the loop calls it every few seconds, so an idle
    /// loop does not keep a flood's answers); how many were dropped.
    pub fn expire(&mut self) -> usize {
        let now = Instant::now();
        let before = self.map.len();
        self.map.retain(|_, k| k.until > now);
        if self.map.capacity() > 64 && self.map.capacity() > 4 * self.map.len() {
            self.map.shrink_to_fit();
        }
        before - self.map.len()
    }

    /// Keep `answer` to `datagram`, allowed as `answered` says.
    pub fn keep(&mut self, datagram: &[u8], answer: &[u8], answered: Answered) {
        let Some(sandbox) = answered.record.sandbox.clone() else {
            return;
        };
        if datagram.len() <= HEADER || answer.len() <= HEADER {
            return;
        }
        let now = Instant::now();
        if self.map.len() >= MAX_ENTRIES {
            self.map.retain(|_, k| k.until > now);
            if self.map.len() >= MAX_ENTRIES {
                self.map.clear();
            }
        }
        let query = &datagram[2..];
        let key = self.key(&sandbox, answered.generation, query);
        let mut record = answered.record;
        let facts = record.dns.take().map(|f| *f).unwrap_or_default();
        self.map.insert(
            key,
            Kept {
                sandbox,
                generation: answered.generation,
                query: query.into(),
                answer: answer[2..].into(),
                until: now + LIFE,
                record,
                facts,
            },
        );
    }
}
