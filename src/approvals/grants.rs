//! Grants made elsewhere or ended early: those kept in `state_dir` or written by another
//! replica are adopted ([`Desk::adopt`]), those removed elsewhere forgotten
//! ([`Desk::forget`]), a `once` grant spent here is removed from the other replicas, and an
//! operator may revoke one before its end ([`Desk::revoke`]).

use crate::policy::cause::caused;
use std::time::SystemTime;

use super::stored::{self, StoredGrant};
use super::{refused, request, Desk, DeskError, Inner, Request, State, Who};
use crate::approvals::error::{store, ApprovalError};
use crate::policy::granted::GrantKind;
use crate::policy::sandbox_id::SandboxId;

impl Desk {
    /// Revoke the grant of approved request `id` before its end: the set is published
    /// without it (the exchanges it allowed are cut), on every replica.
    pub fn revoke(&self, id: &str, who: Who) -> Result<Request, DeskError> {
        let by = who.by;
        let mut inner = self.lock();
        let grant = inner.grants.iter().find_map(|(sid, l)| {
            l.iter()
                .find(|g| &*g.id == id)
                .map(|g| (sid.clone(), g.clone()))
        });
        let r = match (inner.requests.get_mut(id), grant) {
            (Some(r), Some(_)) if r.state == State::Approved => {
                r.state = State::Revoked;
                r.answered_by = Some(by);
                r.approver = Some(who.approver());
                r.deadline = None;
                r.clone()
            }
            (Some(r), _) => {
                let state = r.state.as_str();
                return Err(refused(
                    409,
                    format!("request {id} is {state}: only an approved one has a grant to revoke"),
                ));
            }
            // A grant kept across a restart (its request was not): revoked all the same.
            (None, Some((sandbox, g))) => Request {
                approver: Some(who.approver()),
                ..revoked_without_request(sandbox, &g, by)
            },
            (None, None) => return Err(refused(404, format!("no request or grant {id}"))),
        };
        if let Some(list) = inner.grants.get_mut(&r.sandbox) {
            // A spent `once` grant for the same destination stays (until its end) and would
            // answer the next refusal: it names this revocation (clients review F4).
            if let Some(gone) = list.iter().find(|g| &*g.id == id).cloned() {
                for g in list
                    .iter()
                    .filter(|g| g.kind == GrantKind::Once && g.used())
                {
                    if g.same_destination(&gone) {
                        g.note_revoked(id);
                    }
                }
            }
            list.retain(|g| &*g.id != id);
        }
        self.publish(&inner, &r.sandbox);
        self.save(&inner);
        if let Some(remote) = self.remote.get() {
            remote.delete(r.sandbox.as_str(), id);
        }
        drop(inner);
        self.record(&r, "revoked", &who, None);
        self.share_request(&r, None);
        self.changed.send_modify(|n| *n += 1);
        Ok(r)
    }

    /// Sandbox `sid` was removed (a DELETE here or on another replica): its grants go with it
    /// — from memory, `state_dir` and etcd, each with a `revoked` record by `deletion` — and
    /// its pending requests expire, so an id registered again starts with none (security
    /// review A05: a new tenant of the id was served by the old one's grants).
    pub fn sandbox_removed(&self, sid: &SandboxId) {
        const BY: &str = "deletion";
        let mut inner = self.lock();
        let gone = inner.grants.remove(sid).unwrap_or_default();
        let mut ended: Vec<(Request, &'static str)> = Vec::new();
        for r in inner.requests.values_mut().filter(|r| &r.sandbox == sid) {
            let step = match r.state {
                State::Pending => State::Expired,
                State::Approved => State::Revoked,
                _ => continue,
            };
            r.state = step;
            r.answered_by.get_or_insert(BY);
            r.deadline = None;
            ended.push((r.clone(), step.as_str()));
        }
        for g in &gone {
            if !ended.iter().any(|(r, _)| *r.id == *g.id) {
                ended.push((revoked_without_request(sid.clone(), g, BY), "revoked"));
            }
        }
        if !gone.is_empty() {
            self.publish(&inner, sid);
            self.save(&inner);
            if let Some(remote) = self.remote.get() {
                for g in &gone {
                    remote.delete(sid.as_str(), &g.id);
                }
            }
        }
        drop(inner);
        for (r, step) in &ended {
            self.record(r, step, &BY.into(), None);
        }
        if !ended.is_empty() {
            tracing::info!(sandbox = %sid, grants = gone.len(), requests = ended.len(), "grants and requests of a removed sandbox ended");
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Grants kept in `state_dir` (at start): those not expired are in force again.
    pub fn restore(&self) -> Result<usize, ApprovalError> {
        let Some(path) = &self.store else {
            return Ok(0);
        };
        let mut grants = stored::load(path)?;
        // The journal is newer than the file: a grant spent there is spent.
        if let Some(journal) = &self.journal {
            let spent = journal
                .read()
                .map_err(|e| store(caused(journal.path().display().to_string(), e)))?;
            for g in &mut grants {
                g.used |= spent.contains(&g.id);
            }
        }
        let n = self.adopt(grants);
        // `grants.json` now says what the journal said (written before any listener runs).
        if let Some(journal) = &self.journal {
            let saved = stored::save(path, &super::stored_all(&self.lock()));
            if let Err(e) = saved.and_then(|()| journal.clear()) {
                tracing::warn!(error = %e, "grants.spent is kept; it is read again at the next start");
            }
        }
        Ok(n)
    }

    /// Take grants made elsewhere (the state dir, another replica); returns how many.
    pub fn adopt(&self, grants: Vec<StoredGrant>) -> usize {
        let now = SystemTime::now();
        let mut inner = self.lock();
        let mut touched = Vec::new();
        let mut n = 0;
        for s in grants {
            let (Ok(sid), Some(g)) = (SandboxId::new(&s.sandbox), s.entry(self.journal())) else {
                tracing::warn!(grant = %s.id, "a kept grant does not parse; skipped");
                continue;
            };
            if g.expires.is_some_and(|e| e <= now) {
                continue;
            }
            let list = inner.grants.entry(sid.clone()).or_default();
            match list.iter().position(|x| x.id == g.id) {
                // Already here (this replica's own write, read back): keep the one in force,
                // and what it knows of its use.
                Some(i) => {
                    if g.used() {
                        list[i].mark_used();
                    }
                    continue;
                }
                None => list.push(g),
            }
            n += 1;
            if !touched.contains(&sid) {
                touched.push(sid);
            }
        }
        for sid in &touched {
            self.publish(&inner, sid);
        }
        if n > 0 {
            self.save(&inner);
        }
        n
    }

    /// A grant removed elsewhere (another replica's revocation, an etcd lease that ended).
    /// A `once` grant used here stays until its own expiry: its exchange is not cut.
    pub fn forget(&self, sandbox: &str, id: &str) {
        let mut inner = self.lock();
        let Ok(sid) = SandboxId::new(sandbox) else {
            return;
        };
        let Some(list) = inner.grants.get_mut(&sid) else {
            return;
        };
        let before = list.len();
        list.retain(|g| &*g.id != id || (g.kind == GrantKind::Once && g.used()));
        if list.len() != before {
            self.publish(&inner, &sid);
            self.save(&inner);
        }
    }

    /// A `once` grant spent here is removed from the other replicas (through etcd), so that
    /// they refuse the exchange it allowed too; it stays here until its expiry.
    pub(super) fn share_spent(&self, inner: &mut Inner) {
        let Some(remote) = self.remote.get() else {
            return;
        };
        let Inner { grants, spent, .. } = inner;
        spent.retain(|id| grants.values().flatten().any(|g| &g.id == id));
        for (sid, list) in grants.iter() {
            for g in list {
                if g.kind == GrantKind::Once && g.used() && spent.insert(g.id.clone()) {
                    remote.delete(sid.as_str(), &g.id);
                }
            }
        }
    }
}

/// The request a grant kept without its request (restored from `state_dir` or etcd) is
/// recorded as when it is revoked.
fn revoked_without_request(
    sandbox: SandboxId,
    g: &crate::policy::granted::GrantEntry,
    by: &'static str,
) -> Request {
    Request {
        id: g.id.to_string(),
        sandbox,
        asked: request::Asked {
            target: crate::policy::target::Target {
                host: g.host.clone(),
                port: g.port,
            },
            methods: g.methods.clone(),
            paths: g.paths.clone(),
            reason: String::new(),
        },
        state: State::Revoked,
        created: SystemTime::now(),
        deadline: None,
        answered_by: Some(by),
        approver: None,
        grant: Some(g.kind),
        note: None,
        checks: Vec::new(),
    }
}
