//! Access requests and the grants that answer them (issue 41). A sandbox that meets a refusal
//! asks, at `POST http://egress-proxy.local/v1/requests` ([`crate::listen::ask`]), for one
//! host and port; a person (the admin API, `egress-proxy approve`), the webhook or the
//! auto-approval rule answers; an approval is a grant ([`crate::policy::granted`]) that the
//! policy set carries for that sandbox until it expires, is kept in `state_dir` and shared
//! through etcd, so every replica enforces it. At its expiry the set is published without it,
//! and the live exchanges it allowed are cut like any revocation.
//!
//! The [`Desk`] holds it all in memory, bounded: pending requests per sandbox
//! (`approvals.max_pending`), requests per sandbox per minute (`approvals.per_minute`),
//! [`MAX_REQUESTS`] kept in all (answered ones leave first), reasons by length. Every step is
//! an audit record (`mode: "approval"`). Changes of grants reach the data plane through one
//! publisher (the controller's lock, so a reload never loses one).

mod answer;
pub mod auto;
mod error;
mod expiry;
mod grants;
pub mod request;
pub mod shared;
pub mod stored;
pub mod webhook;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use tokio::sync::watch;

use crate::audit::Sink;
use crate::config::approvals::ApprovalsConfig;
use crate::policy::granted::{GrantEntry, Granted};
use crate::policy::reason::Reason;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::Verdict;
use crate::sandboxes::set::{PolicySet, Sandbox};
pub use answer::{Answer, Who, MAX_NOTE, MAX_TTL_S};
pub use error::ApprovalError;
pub use request::{Request, State};
use stored::StoredGrant;

/// Requests kept in all, pending or answered (the oldest answered leave first).
pub const MAX_REQUESTS: usize = 4096;
/// Grants one sandbox may hold at once.
pub const MAX_GRANTS: usize = 64;
/// The longest `?wait=` of a long poll.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Publishes a sandbox's grants to the data plane (the controller, under its lock).
pub type Publisher = Box<dyn Fn(&SandboxId, Granted) + Send + Sync>;

/// Where grants are shared with other replicas (etcd).
pub trait Remote: Send + Sync {
    /// Share a grant with the other replicas.
    fn put(&self, grant: StoredGrant);
    /// Withdraw a grant from the other replicas.
    fn delete(&self, sandbox: &str, id: &str);
    /// Share a request's current step with the other replicas.
    fn put_request(&self, _request: shared::StoredRequest) {}
    /// Claim request `id` for an answer: `Ok(false)` when another replica answered it.
    fn claim(&self, _id: &str) -> shared::Claim {
        Box::pin(async { Ok(true) })
    }
    /// Give back a claim whose answer was refused.
    fn unclaim(&self, _id: &str) {}
}

/// What the desk answers when it will not take an access request or an answer (a cap, a
/// wrong state, a target never granted): the HTTP status and the sentence. An error of the
/// desk's API, not a refusal of traffic ([`crate::policy::refusal::Refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeskError {
    /// The HTTP status of the refusal.
    pub status: u16,
    /// Its message.
    pub message: String,
}

/// Whether `target` names, by address, one of the proxy's own listeners or its decider's or
/// webhook's (the guard's loop check): never grantable. A name is refused where it resolves.
fn own_address(
    guard: &crate::policy::guard::Guard,
    target: &crate::policy::target::Target,
) -> bool {
    use crate::policy::target::Host;
    let none = |_| std::iter::empty();
    matches!(target.host, Host::Ip(ip)
        if guard.check(ip, target.port, none) == crate::policy::guard::GuardVerdict::Loop)
}

/// Why a target a layer refuses (its `deny`, or outside its ceiling) is never granted.
fn beyond_layers(
    target: &crate::policy::target::Target,
    sb: &Sandbox,
    d: &crate::policy::Decision,
) -> String {
    let why = d.explain(&sb.binding.id, sb.policy.file(), target.port);
    format!("{target} cannot be granted: {why}")
}

/// Why a target is refused at ask and at approval whatever the approver says.
fn never_grantable(target: &crate::policy::target::Target) -> String {
    format!("{target} is the proxy's own listener, its decider's or its webhook's address: never grantable")
}

fn refused(status: u16, message: impl Into<String>) -> DeskError {
    DeskError {
        status,
        message: message.into(),
    }
}

/// See the module documentation.
pub struct Desk {
    /// `approvals:` in force (a reload replaces it).
    cfg: arc_swap::ArcSwap<ApprovalsConfig>,
    sink: Sink,
    policy: watch::Receiver<Arc<PolicySet>>,
    inner: Mutex<Inner>,
    /// Bumped at every change of a request (long polls wait on it).
    changed: watch::Sender<u64>,
    publisher: OnceLock<Publisher>,
    remote: OnceLock<Arc<dyn Remote>>,
    /// `state_dir/grants.json`, when there is a `state_dir`.
    store: Option<PathBuf>,
    /// `state_dir/grants.spent`, when there is a `state_dir`.
    journal: Option<Arc<stored::SpentFile>>,
    /// The expiry thread, woken by every other use of the desk when it sleeps with nothing
    /// due ([`Desk::tick`]).
    ticker: OnceLock<std::thread::Thread>,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    requests: HashMap<String, Request>,
    /// Request ids in creation order.
    order: VecDeque<String>,
    grants: BTreeMap<SandboxId, Vec<Arc<GrantEntry>>>,
    /// Requests per sandbox in the current minute.
    asked: HashMap<SandboxId, (Instant, u32)>,
    /// Spent `once` grants already removed from the other replicas.
    spent: std::collections::HashSet<Arc<str>>,
    /// Requests another replica asked (their steps are recorded there).
    adopted: std::collections::HashSet<String>,
}

impl Desk {
    /// A desk with these settings, the grants file in `state_dir` when one is set.
    pub fn new(
        cfg: ApprovalsConfig,
        sink: Sink,
        policy: watch::Receiver<Arc<PolicySet>>,
        state_dir: Option<&std::path::Path>,
    ) -> Arc<Desk> {
        Arc::new(Desk {
            cfg: arc_swap::ArcSwap::from_pointee(cfg),
            sink,
            policy,
            inner: Mutex::new(Inner::default()),
            changed: watch::channel(0).0,
            publisher: OnceLock::new(),
            remote: OnceLock::new(),
            store: state_dir.map(stored::path_in),
            journal: state_dir.map(|d| Arc::new(stored::SpentFile::in_dir(d))),
            ticker: OnceLock::new(),
        })
    }

    /// `approvals:` in force.
    pub fn cfg(&self) -> Arc<ApprovalsConfig> {
        self.cfg.load_full()
    }

    /// Put a reloaded `approvals:` in force (bounds, auto-approval, the webhook and its
    /// secret apply to the next request).
    pub fn set_cfg(&self, cfg: ApprovalsConfig) {
        self.cfg.store(Arc::new(cfg));
    }

    /// Set who publishes grants (once, at start).
    pub fn set_publisher(&self, p: Publisher) {
        let _ = self.publisher.set(p);
    }

    /// Share grants through `remote` (once, at start).
    pub fn set_remote(&self, r: Arc<dyn Remote>) {
        let _ = self.remote.set(r);
    }

    /// A new request from sandbox `sb` (identified by its connection, never by the body).
    pub fn ask(
        &self,
        sb: &Sandbox,
        terminated: bool,
        body: &[u8],
        (client, identity): (SocketAddr, crate::egress::identity::Method),
    ) -> Result<Request, DeskError> {
        let cfg = self.cfg();
        let asked =
            request::parse(body, cfg.reason_max).map_err(|m| refused(400, m.into_detail()))?;
        let set = self.policy.borrow().clone();
        if let Some(why) = ungrantable(sb, &set, &asked.target, terminated) {
            return Err(refused(409, why));
        }
        let sid = sb.binding.id.clone();
        let now = SystemTime::now();
        let request = {
            let mut inner = self.lock();
            inner.room_for(&sid, &cfg)?;
            inner.make_room()?;
            inner.seq += 1;
            let r = Request {
                id: request::new_id(inner.seq),
                sandbox: sid,
                asked,
                state: State::Pending,
                created: now,
                deadline: Some(now + cfg.pending_ttl),
                answered_by: None,
                approver: None,
                grant: None,
                note: None,
                checks: Vec::new(),
            };
            inner.order.push_back(r.id.clone());
            inner.requests.insert(r.id.clone(), r.clone());
            r
        };
        let who = Who {
            by: "sandbox",
            client: Some(client),
            credential: None,
            identity: Some(identity),
            principal: None,
        };
        self.record(&request, "requested", &who, None);
        self.share_request(&request, None);
        self.changed.send_modify(|n| *n += 1);
        Ok(request)
    }

    /// Answer request `id` (`who.by`: `admin`, `webhook`, `auto`).
    pub fn answer(
        &self,
        id: &str,
        answer: Answer,
        who: Who,
        checks: Vec<String>,
    ) -> Result<Request, DeskError> {
        let mut inner = self.lock();
        let r = inner
            .requests
            .get_mut(id)
            .ok_or_else(|| refused(404, format!("no request {id}")))?;
        if r.state != State::Pending {
            return Err(refused(
                409,
                format!("request {id} is {} already", r.state.as_str()),
            ));
        }
        // Checked before anything changes: an answer refused here leaves the request pending.
        let deadline = answer.deadline(SystemTime::now())?;
        if matches!(answer, Answer::Approve { .. }) {
            self.grantable(r)?;
        }
        r.answered_by = Some(who.by);
        r.approver = Some(who.approver());
        r.checks = checks;
        let grant = match answer {
            Answer::Deny { note } => {
                r.state = State::Denied;
                r.note = note;
                r.deadline = None;
                None
            }
            Answer::Approve { kind, note, .. } => {
                r.state = State::Approved;
                r.note = note;
                r.grant = Some(kind);
                r.deadline = deadline;
                let g = grant_of(r, kind, &who.approver());
                Some(Arc::new(g.journaled(self.journal())))
            }
        };
        let r = r.clone();
        if let Some(g) = &grant {
            let list = inner.grants.entry(r.sandbox.clone()).or_default();
            if list.len() >= MAX_GRANTS {
                list.remove(0);
            }
            list.push(g.clone());
            self.publish(&inner, &r.sandbox);
            self.save(&inner);
            if let Some(remote) = self.remote.get() {
                remote.put(StoredGrant::of(r.sandbox.as_str(), g));
            }
        }
        drop(inner);
        let step = if grant.is_some() {
            "approved"
        } else {
            "denied"
        };
        self.record(&r, step, &who, grant.as_ref().map(|g| g.rule.clone()));
        let stored = grant
            .as_ref()
            .map(|g| StoredGrant::of(r.sandbox.as_str(), g));
        self.share_request(&r, stored);
        self.changed.send_modify(|n| *n += 1);
        Ok(r)
    }

    /// Why request `r` cannot be approved now, if it cannot: its target is the proxy's own
    /// address, or beyond the layers as they are now (a ceiling may have narrowed since the
    /// request was made).
    fn grantable(&self, r: &Request) -> Result<(), DeskError> {
        let set = self.policy.borrow().clone();
        if own_address(&set.guard, &r.asked.target) {
            return Err(refused(409, never_grantable(&r.asked.target)));
        }
        let layered = set.get(r.sandbox.as_str()).and_then(|sb| {
            let d = sb.policy.layers_refuse(&r.asked.target)?;
            Some(beyond_layers(&r.asked.target, sb, &d))
        });
        match layered {
            Some(why) => Err(refused(409, why)),
            None => Ok(()),
        }
    }

    /// Request `id` as sandbox `sandbox` may see it (another sandbox's is not found).
    pub fn get(&self, sandbox: &str, id: &str) -> Option<Request> {
        let inner = self.lock();
        inner
            .requests
            .get(id)
            .filter(|r| r.sandbox.as_str() == sandbox)
            .cloned()
    }

    /// How many long polls ([`Desk::wait`]) are waiting now.
    pub fn long_polls(&self) -> usize {
        self.changed.receiver_count()
    }

    /// Like [`Desk::get`], waiting up to `wait` for it to leave `pending`.
    pub async fn wait(&self, sandbox: &str, id: &str, wait: Duration) -> Option<Request> {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        loop {
            let r = self.get(sandbox, id)?;
            if r.state != State::Pending {
                return Some(r);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Some(r),
            }
        }
    }

    /// `GET /v1/requests[?state=]` (admin), newest first.
    pub fn list(&self, state: Option<State>) -> Value {
        let inner = self.lock();
        let items: Vec<Value> = inner
            .order
            .iter()
            .rev()
            .filter_map(|id| inner.requests.get(id))
            .filter(|r| state.is_none_or(|s| r.state == s))
            .map(Request::view)
            .collect();
        json!({ "requests": items })
    }

    /// Keep what auto-approval found on a request it left pending.
    pub fn note_checks(&self, id: &str, checks: Vec<String>) {
        if let Some(r) = self.lock().requests.get_mut(id) {
            r.checks = checks;
        }
    }

    /// Request `id` for the admin API.
    pub fn find(&self, id: &str) -> Option<Request> {
        self.lock().requests.get(id).cloned()
    }

    /// Every grant in force, serialisable.
    pub fn grants(&self) -> Vec<StoredGrant> {
        stored_all(&self.lock())
    }

    /// `GET /v1/grants[?sandbox=]` (admin): every standing grant — approved here, by the
    /// webhook or auto-approval, on another replica, or restored from `state_dir` — with its
    /// scope, kind, end, approver and whether a `once` grant was spent; by sandbox, then id.
    /// Its id is what `revoke` takes.
    pub fn grant_list(&self, sandbox: Option<&str>) -> Value {
        let mut all = self.grants();
        all.retain(|g| sandbox.is_none_or(|s| g.sandbox == s));
        all.sort_by(|a, b| (&a.sandbox, &a.id).cmp(&(&b.sandbox, &b.id)));
        let items: Vec<Value> = all.iter().map(StoredGrant::view).collect();
        json!({ "grants": items })
    }

    /// Where this desk's `once` grants record their spending.
    fn journal(&self) -> Option<Arc<dyn crate::policy::granted::SpendJournal>> {
        self.journal
            .clone()
            .map(|j| j as Arc<dyn crate::policy::granted::SpendJournal>)
    }

    fn publish(&self, inner: &Inner, sid: &SandboxId) {
        let entries = inner.grants.get(sid).cloned().unwrap_or_default();
        if let Some(p) = self.publisher.get() {
            p(sid, Granted { entries });
        }
    }

    fn save(&self, inner: &Inner) {
        let Some(path) = &self.store else { return };
        if let Err(e) = stored::save(path, &stored_all(inner)) {
            tracing::error!(error = %e, path = %path.display(), "cannot keep grants in state_dir");
        }
    }
}

impl Inner {
    /// Whether sandbox `sid` may ask once more now (`approvals.per_minute`,
    /// `approvals.max_pending`); counts the request when it may.
    fn room_for(&mut self, sid: &SandboxId, cfg: &ApprovalsConfig) -> Result<(), DeskError> {
        let pending = self
            .requests
            .values()
            .filter(|r| r.sandbox == *sid && r.state == State::Pending)
            .count();
        let window = self.asked.entry(sid.clone()).or_insert((Instant::now(), 0));
        if window.0.elapsed() >= Duration::from_secs(60) {
            *window = (Instant::now(), 0);
        }
        if window.1 >= cfg.per_minute {
            return Err(refused(
                429,
                format!(
                    "sandbox {sid} made {} requests this minute (approvals.per_minute)",
                    cfg.per_minute
                ),
            ));
        }
        if pending >= cfg.max_pending {
            return Err(refused(
                429,
                format!("sandbox {sid} has {pending} requests waiting (approvals.max_pending)"),
            ));
        }
        window.1 += 1;
        Ok(())
    }

    /// Make room for one more request: drop the oldest answered one; refuse when every kept
    /// request is pending.
    fn make_room(&mut self) -> Result<(), DeskError> {
        if self.requests.len() < MAX_REQUESTS {
            return Ok(());
        }
        let old = self.order.iter().position(|id| {
            self.requests
                .get(id)
                .is_none_or(|r| r.state != State::Pending)
        });
        match old {
            Some(i) => {
                if let Some(id) = self.order.remove(i) {
                    self.requests.remove(&id);
                }
                Ok(())
            }
            None => Err(refused(
                503,
                "the proxy holds as many pending requests as it keeps; try again later",
            )),
        }
    }
}

fn stored_all(inner: &Inner) -> Vec<StoredGrant> {
    inner
        .grants
        .iter()
        .flat_map(|(sid, l)| l.iter().map(|g| StoredGrant::of(sid.as_str(), g)))
        .collect()
}

/// The grant an approved request `r` becomes: what it asked for, for as long as it was given.
fn grant_of(r: &Request, kind: crate::policy::granted::GrantKind, approver: &str) -> GrantEntry {
    let a = &r.asked;
    GrantEntry::new(
        r.sandbox.as_str(),
        &r.id,
        a.target.host.clone(),
        a.target.port,
        a.methods.clone(),
        a.paths.clone(),
        kind,
        r.deadline,
        approver,
    )
}

/// Why `target` can never be granted to `sb`, if it cannot: the proxy's own addresses, beyond
/// the sandbox's layers, denied by its own rules, already allowed, or a host whose requests
/// the proxy terminates (its rules stay as written).
fn ungrantable(
    sb: &Sandbox,
    set: &crate::sandboxes::set::PolicySet,
    target: &crate::policy::target::Target,
    terminated: bool,
) -> Option<String> {
    if own_address(&set.guard, target) {
        return Some(never_grantable(target));
    }
    if let Some(d) = sb.policy.layers_refuse(target) {
        return Some(beyond_layers(target, sb, &d));
    }
    let own = sb.policy.decide(target, None, &set.guard);
    let explain = || (own.decision).explain(&sb.binding.id, sb.policy.file(), target.port);
    match own.decision.reason {
        Reason::DeniedByRule | Reason::DenyAllMode => {
            return Some(format!("{target} cannot be granted: {}", explain()))
        }
        _ if own.decision.verdict == Verdict::Allow => {
            return Some(format!("{target} is already allowed: {}", explain()))
        }
        _ => {}
    }
    terminated.then(|| format!("{} is a host whose requests the proxy terminates (a credential or an HTTP rule): its rules stay as written, no grant widens them", target.host))
}
