//! Answers to access requests and who gave them: an [`Answer`] is checked the same way for
//! every answerer (the admin API, the webhook, auto-approval), and a [`Who`] — the answerer,
//! the client's address, the credential it used (a token's digest or a certificate's
//! subject, never the token) and how an asking sandbox was identified — is in every approval
//! record ([`Desk::record`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{refused, Desk, DeskError, Request};
use crate::audit::record::{rfc3339, ApprovalFacts, Record};
use crate::audit::{AuditGuard, Mode};
use crate::egress::identity::Method;
use crate::policy::granted::GrantKind;
use crate::policy::reason::Reason;
use crate::policy::Decision;

/// An answer to a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Approve: grant the request.
    Approve {
        /// The grant's kind (once, ttl, permanent).
        kind: GrantKind,
        /// For `ttl` (required) and `once` (optional; the default is an hour).
        ttl: Option<Duration>,
        /// The approver's note, kept with the grant.
        note: Option<String>,
    },
    /// Deny the request.
    Deny {
        /// The approver's note, shown to the agent.
        note: Option<String>,
    },
}

/// Longest grant `ttl_s` accepted from any answerer (30 days).
pub const MAX_TTL_S: u64 = 30 * 24 * 3600;
/// Longest note accepted from any answerer.
pub const MAX_NOTE: usize = 500;

impl Answer {
    /// An approval as an answerer (the admin API, the webhook) sends it, checked the same way
    /// for each: `ttl_s` within 1–[`MAX_TTL_S`] (no arithmetic on an untrusted number can
    /// overflow later), none on a permanent grant, a note within [`MAX_NOTE`] bytes.
    pub fn approve(
        kind: GrantKind,
        ttl_s: Option<u64>,
        note: Option<String>,
    ) -> Result<Answer, DeskError> {
        if ttl_s.is_some_and(|t| t == 0 || t > MAX_TTL_S) {
            return Err(refused(400, format!("ttl_s must be 1-{MAX_TTL_S}")));
        }
        // A `ttl` grant without `ttl_s` is refused by the desk, once the request is found.
        if kind == GrantKind::Permanent && ttl_s.is_some() {
            return Err(refused(400, "a permanent grant takes no ttl_s"));
        }
        Ok(Answer::Approve {
            kind,
            ttl: ttl_s.map(Duration::from_secs),
            note: checked_note(note)?,
        })
    }

    /// When the grant it makes ends (`None`: never, or no grant); no arithmetic on its `ttl`
    /// can overflow.
    pub(super) fn deadline(&self, now: SystemTime) -> Result<Option<SystemTime>, DeskError> {
        let Answer::Approve { kind, ttl, .. } = self else {
            return Ok(None);
        };
        let ttl = match (kind, ttl) {
            (GrantKind::Ttl, None) => return Err(refused(400, "a ttl grant needs ttl_s")),
            (GrantKind::Permanent, _) => None,
            (GrantKind::Once, None) => Some(Duration::from_secs(3600)),
            (_, t) => *t,
        };
        match ttl.map(|t| now.checked_add(t)) {
            Some(None) => Err(refused(400, format!("ttl_s must be 1-{MAX_TTL_S}"))),
            Some(Some(d)) => Ok(Some(d)),
            None => Ok(None),
        }
    }

    /// A denial, its note checked like an approval's.
    pub fn deny(note: Option<String>) -> Result<Answer, DeskError> {
        Ok(Answer::Deny {
            note: checked_note(note)?,
        })
    }
}

fn checked_note(note: Option<String>) -> Result<Option<String>, DeskError> {
    match note {
        Some(n) if n.len() > MAX_NOTE => Err(refused(
            400,
            format!("note is longer than {MAX_NOTE} bytes"),
        )),
        n => Ok(n),
    }
}

/// Who took a step: the answerer's name (`sandbox`, `admin`, `webhook`, `auto`, `expiry`,
/// `deletion`), and what is known of the client.
#[derive(Debug, Clone, Default)]
pub struct Who {
    /// How the answer came: `admin`, `webhook` or `auto`.
    pub by: &'static str,
    /// The client's address (the asking sandbox's, the admin's).
    pub client: Option<SocketAddr>,
    /// The credential the client used: `token sha256:…` (a digest's first bytes) or
    /// `certificate CN=…` — never a secret.
    pub credential: Option<Box<str>>,
    /// How an asking sandbox was identified.
    pub identity: Option<Method>,
    /// The signed-in person who answered in the console (`alice`), named on the grant.
    pub principal: Option<Box<str>>,
}

impl Who {
    /// The approver a grant names: how it came, and who, when a person signed in
    /// (`console alice`).
    pub fn approver(&self) -> String {
        match &self.principal {
            Some(p) => format!("{} {p}", self.by),
            None => self.by.to_string(),
        }
    }
}

impl From<&'static str> for Who {
    fn from(by: &'static str) -> Who {
        Who {
            by,
            ..Who::default()
        }
    }
}

impl Desk {
    /// Record that `who`'s answer to request `id` was refused, and why (step
    /// `answer_refused`, the reason as its `text`): the request stays pending, and whoever
    /// runs the answering service sees why in the trail, not only in the proxy's log.
    pub fn answer_refused(&self, id: &str, who: &Who, why: &str) {
        if let Some(mut r) = self.find(id) {
            r.note = Some(why.to_string());
            self.record(&r, "answer_refused", who, None);
        }
    }

    /// Write an approval record of step `step` of `r`, taken by `who`.
    pub(super) fn record(
        &self,
        r: &Request,
        step: &'static str,
        who: &Who,
        rule: Option<Arc<crate::policy::Rule>>,
    ) {
        let version = self.policy.borrow().version_arc();
        let client = who
            .client
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut rec = Record::new(0, client, Mode::Approval, version);
        rec.sandbox = Some(r.sandbox.clone());
        rec.target = Some(r.asked.target.clone());
        if let Some(m) = who.identity {
            rec.identity = m;
        }
        let d = match rule {
            Some(rule) => Decision::allow(Reason::GrantMatched, Some(rule)),
            None => Decision::deny(Reason::NoRuleMatched, None),
        };
        rec.verdict = d.verdict;
        rec.reason = d.reason;
        rec.rule = d.rule;
        rec.approval = Some(Box::new(ApprovalFacts {
            request: r.id.as_str().into(),
            step,
            by: who.by,
            credential: who.credential.clone(),
            grant: r
                .grant
                .map(GrantKind::as_str)
                .filter(|_| step == "approved"),
            expires: r.deadline.filter(|_| step == "approved").map(rfc3339),
            text: match step {
                "requested" => Some(r.asked.reason.as_str().into()),
                _ => r.note.as_deref().map(Into::into),
            },
            checks: r.checks.clone(),
        }));
        drop(AuditGuard::event(self.sink.clone(), rec));
    }
}
