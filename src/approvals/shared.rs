//! One desk for a fleet (issue 94): every request is written to etcd when it is asked and
//! at each later step (answered, expired, revoked), under `{prefix}requests/{id}`, and every
//! replica takes in what the others wrote ([`Desk::adopt_request`]) — so a request asked on
//! one replica is listed and answered on any, and the replica holding the sandbox's waiting
//! connection (`?wait=`) learns the answer from the watch.
//!
//! - **One answer**: an answer first claims the request in etcd (`{prefix}answers/{id}`,
//!   created only if absent), so two approvers on two replicas cannot both answer; the
//!   second gets 409. An answer the desk then refuses gives the claim back.
//! - **The grant travels with the answer**: an approved request carries its grant, adopted
//!   before the waiting connection is woken, so the sandbox's next attempt is allowed on the
//!   replica that told it so.
//! - **One record per step**: the replica that takes a step records it; a replica that
//!   adopts it does not (an adopted request's expiry is not recorded again).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::stored::{millis, StoredGrant};
use super::{refused, request, Answer, Desk, DeskError, Request, State, Who};
use crate::policy::granted::GrantKind;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::{Host, Target};

/// A claim's answer: whether this replica may answer (`Err`: the fleet cannot be asked).
pub type Claim = Pin<Box<dyn Future<Output = Result<bool, DeskError>> + Send>>;

/// A request as the fleet keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredRequest {
    id: String,
    sandbox: String,
    host: String,
    port: u16,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    reason: String,
    state: String,
    created_ms: u64,
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    answered_by: Option<String>,
    #[serde(default)]
    approver: Option<String>,
    #[serde(default)]
    grant: Option<GrantKind>,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    checks: Vec<String>,
    /// The grant an approval made.
    #[serde(default)]
    granted: Option<StoredGrant>,
}

impl StoredRequest {
    /// The stored form of `r` (with the grant it made, if approved).
    pub fn of(r: &Request, granted: Option<StoredGrant>) -> Self {
        let a = &r.asked;
        StoredRequest {
            id: r.id.clone(),
            sandbox: r.sandbox.as_str().to_string(),
            host: crate::policy::granted::host_text(&a.target.host)
                .trim_matches(['[', ']'])
                .to_string(),
            port: a.target.port,
            methods: a.methods.clone(),
            paths: a.paths.clone(),
            reason: a.reason.clone(),
            state: r.state.as_str().to_string(),
            created_ms: millis(r.created),
            deadline_ms: r.deadline.map(millis),
            answered_by: r.answered_by.map(str::to_string),
            approver: r.approver.clone(),
            grant: r.grant,
            note: r.note.clone(),
            checks: r.checks.clone(),
            granted,
        }
    }

    /// The request id (the key's last part).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its deadline (pending until then; a grant until its expiry), Unix milliseconds.
    pub fn deadline_ms(&self) -> Option<u64> {
        self.deadline_ms
    }

    /// The request it describes; `None` when a field does not parse (skipped, logged).
    fn request(&self) -> Option<Request> {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        Some(Request {
            id: request::valid_id(&self.id).then(|| self.id.clone())?,
            sandbox: SandboxId::new(&self.sandbox).ok()?,
            asked: request::Asked {
                target: Target {
                    host: Host::parse(&self.host).ok()?,
                    port: self.port,
                },
                methods: self.methods.clone(),
                paths: self.paths.clone(),
                reason: self.reason.clone(),
            },
            state: State::parse(&self.state)?,
            created: at(self.created_ms),
            deadline: self.deadline_ms.map(at),
            answered_by: self.answered_by.as_deref().map(by_name),
            approver: self.approver.clone(),
            grant: self.grant,
            note: self.note.clone(),
            checks: self.checks.clone(),
        })
    }
}

/// Whether a request in state `here` takes the step `to` another replica took.
fn moves_on(here: State, to: State) -> bool {
    match here {
        State::Pending => to != State::Pending,
        State::Approved => matches!(to, State::Revoked | State::Expired),
        _ => false,
    }
}

/// The `answered_by` names a replica writes (anything else: `another replica`).
fn by_name(s: &str) -> &'static str {
    const KNOWN: [&str; 7] = [
        "admin", "webhook", "auto", "console", "expiry", "deletion", "sandbox",
    ];
    KNOWN
        .into_iter()
        .find(|k| *k == s)
        .unwrap_or("another replica")
}

impl Desk {
    /// Share request `r`'s current step with the fleet (nothing without one).
    pub(super) fn share_request(&self, r: &Request, granted: Option<StoredGrant>) {
        if let Some(remote) = self.remote.get() {
            remote.put_request(StoredRequest::of(r, granted));
        }
    }

    /// Take in a request another replica wrote: a new one is listed here; a step it took
    /// (answered, expired, revoked) replaces a pending one — never the reverse. An approval's
    /// grant is adopted before anyone waiting is woken.
    pub fn adopt_request(&self, s: StoredRequest) {
        let Some(r) = s.request() else {
            tracing::warn!(request = %s.id, "a request in etcd does not parse; skipped");
            return;
        };
        if let (State::Approved, Some(g)) = (r.state, s.granted) {
            self.adopt(vec![g]);
        }
        let mut inner = self.lock();
        match inner.requests.get(&r.id) {
            // Forward only: pending to any end; an approval to its revocation or expiry.
            Some(here) if !moves_on(here.state, r.state) => return,
            Some(_) => {}
            None => {
                if inner.make_room().is_err() {
                    return;
                }
                inner.order.push_back(r.id.clone());
            }
        }
        inner.adopted.insert(r.id.clone());
        inner.requests.insert(r.id.clone(), r);
        drop(inner);
        self.changed.send_modify(|n| *n += 1);
    }
}

/// Answer request `id` once for the whole fleet: claimed in etcd first when the desk is
/// shared (409 when another replica answered it), then applied on a blocking thread (it
/// publishes through the controller's lock); a refused answer gives the claim back. The
/// admin API, the console, the webhook and auto-approval all answer through here.
pub async fn answer(
    desk: Arc<Desk>,
    id: String,
    answer: Answer,
    who: Who,
    checks: Vec<String>,
) -> Result<Request, DeskError> {
    let remote = desk.remote.get().cloned();
    if let Some(remote) = &remote {
        match desk.find(&id) {
            None => return Err(refused(404, format!("no request {id}"))),
            Some(r) if r.state != State::Pending => {
                let state = r.state.as_str();
                return Err(refused(409, format!("request {id} is {state} already")));
            }
            Some(_) => {}
        }
        if !remote.claim(&id).await? {
            let why = format!("request {id} was answered on another replica");
            return Err(refused(409, why));
        }
    }
    let step = {
        let (desk, id) = (desk.clone(), id.clone());
        tokio::task::spawn_blocking(move || desk.answer(&id, answer, who, checks)).await
    };
    let done = step.unwrap_or_else(|_| Err(refused(500, "the answer could not be applied")));
    if let (Err(_), Some(remote)) = (&done, &remote) {
        remote.unclaim(&id);
    }
    done
}
