//! Grants: permissions approved at run time (an access request answered by a person, a
//! webhook or the auto-approval rule, `crate::approvals`), each for one exact host and port.
//! A sandbox's grants sit in the policy set beside its compiled policy; [`PolicySet::decide`]
//! consults them only when the sandbox's own policy refused for want of a rule
//! (`no_rule_matched`, `port_not_allowed`): deny rules, `deny-all` mode, the address guard
//! and everything after the decision stay above every grant.
//!
//! A grant allows what a `network.egress` entry relying on `defaults.ports` allows: TLS or
//! HTTP the proxy can check, never opaque TCP. Grants with methods or paths hold only for
//! requests the proxy can read (forwarded plain HTTP); a tunnel is not allowed by them.
//!
//! [`PolicySet::decide`]: crate::sandboxes::set::PolicySet::decide

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::policy::ports::PortSet;
use crate::policy::target::{Host, Target};
use crate::policy::{ListKind, Rule, RuleSource};

/// How long a grant holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantKind {
    /// One exchange (then kept, used, until its expiry so that the exchange is not cut).
    Once,
    /// Until its expiry.
    Ttl,
    /// Until it is revoked.
    Permanent,
}

impl GrantKind {
    /// The name written in grants and records (`once`, `ttl`, `permanent`).
    pub fn as_str(self) -> &'static str {
        match self {
            GrantKind::Once => "once",
            GrantKind::Ttl => "ttl",
            GrantKind::Permanent => "permanent",
        }
    }
}

/// One grant as the data plane reads it.
#[derive(Debug)]
pub struct GrantEntry {
    /// The request it answers (`r-…`): the grant's name in records.
    pub id: Arc<str>,
    /// The host the grant allows (one name or address).
    pub host: Host,
    /// The port it allows.
    pub port: u16,
    /// Upper-case methods; empty: any.
    pub methods: Vec<String>,
    /// Path globs (`*` any run of characters); empty: any.
    pub paths: Vec<String>,
    /// How long it stands: one request, until a time, or permanently.
    pub kind: GrantKind,
    /// When it ends, for a `ttl` grant.
    pub expires: Option<SystemTime>,
    /// Who approved: `admin`, `webhook`, `auto`.
    pub approver: Arc<str>,
    /// A `once` grant's exchange has been admitted.
    used: AtomicBool,
    /// The rule records and refusals name.
    pub rule: Arc<Rule>,
    /// Where spending a `once` grant is recorded durably (the approvals desk's journal in
    /// `state_dir`); none: memory only.
    journal: Option<Arc<dyn SpendJournal>>,
    /// A later grant for the same destination that was revoked (its id), so that a refusal
    /// this spent `once` grant answers names the revocation, not only this older grant.
    revoked_after: std::sync::Mutex<Option<Arc<str>>>,
}

/// Where a `once` grant's spending is recorded before its exchange leaves, so that a restart
/// (even a kill) cannot give it back. Its I/O is the implementor's (`crate::approvals`).
pub trait SpendJournal: Send + Sync + std::fmt::Debug {
    /// Record durably that grant `id` was spent.
    fn spent(&self, id: &str) -> std::io::Result<()>;
}

/// Why a `once` grant could not be taken.
#[derive(Debug)]
pub enum NotTaken {
    /// Its one exchange was taken already.
    Used,
    /// Its spending could not be recorded durably: it counts as spent, and this exchange is
    /// refused too (a grant whose spent state is unknown serves no one).
    Unrecorded(std::io::Error),
}

impl GrantEntry {
    /// A grant of `kind` to `host:port`, within the request's scope (methods, paths).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sandbox: &str,
        id: &str,
        host: Host,
        port: u16,
        methods: Vec<String>,
        paths: Vec<String>,
        kind: GrantKind,
        expires: Option<SystemTime>,
        approver: &str,
    ) -> Self {
        let text = format!("{}:{port}", host_text(&host));
        let rule = Arc::new(Rule {
            text,
            ports: PortSet::from_ports(&[port]).unwrap_or_else(|_| PortSet::any()),
            source: RuleSource {
                file: format!("grant {id} ({} by {approver})", kind.as_str()).into(),
                sandbox: sandbox.into(),
                list: ListKind::Grant,
                index: 0,
            },
            allows_opaque: false,
        });
        GrantEntry {
            id: id.into(),
            host,
            port,
            methods,
            paths,
            kind,
            expires,
            approver: approver.into(),
            used: AtomicBool::new(false),
            rule,
            journal: None,
            revoked_after: std::sync::Mutex::new(None),
        }
    }

    /// Note that grant `id`, for the same destination, was revoked after this one.
    pub fn note_revoked(&self, id: &str) {
        if let Ok(mut r) = self.revoked_after.lock() {
            *r = Some(id.into());
        }
    }

    /// Why this spent grant refuses: the revocation of a later grant first, when there was one.
    pub fn spent_detail(&self) -> String {
        let revoked = self.revoked_after.lock().ok().and_then(|r| r.clone());
        match revoked {
            Some(r) => format!(
                "grant {r} was revoked (the other grant for this destination, {}, was for one exchange, and it was used)",
                self.id
            ),
            None => format!("grant {} was for one exchange, and it was used", self.id),
        }
    }

    /// Whether it is for the same destination as `other`.
    pub fn same_destination(&self, other: &GrantEntry) -> bool {
        self.host == other.host && self.port == other.port
    }

    /// Record its spending in `journal` (see [`GrantEntry::take`]).
    pub fn journaled(mut self, journal: Option<Arc<dyn SpendJournal>>) -> Self {
        self.journal = journal;
        self
    }

    /// Whether it limits methods or paths (then only readable requests are allowed by it).
    pub fn scoped(&self) -> bool {
        !self.methods.is_empty() || !self.paths.is_empty()
    }

    /// Whether a request with `method` and `path` is within its scope. A scoped grant holds
    /// only for a canonical path ([`crate::policy::http_rules::canonical_path`], as
    /// `network.http` rules): `/docs/../admin` is not under `/docs/*` for any origin that
    /// normalises it.
    pub fn allows_request(&self, method: &str, path: &str) -> bool {
        let canonical = || crate::policy::http_rules::canonical_path(path).is_ok();
        (!self.scoped() || canonical())
            && (self.methods.is_empty()
                || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method)))
            && (self.paths.is_empty() || self.paths.iter().any(|p| glob(p, path)))
    }

    /// Take a `once` grant's one exchange, recorded in its journal before this returns (every
    /// other kind is always taken). Refused when it was taken already, or when the journal
    /// could not record it (then it is spent all the same).
    pub fn take(&self) -> Result<(), NotTaken> {
        if self.kind != GrantKind::Once {
            return Ok(());
        }
        if self.used.swap(true, Ordering::AcqRel) {
            return Err(NotTaken::Used);
        }
        match &self.journal {
            Some(j) => j.spent(&self.id).map_err(NotTaken::Unrecorded),
            None => Ok(()),
        }
    }

    /// Whether its one exchange was taken (`once` only).
    pub fn used(&self) -> bool {
        self.used.load(Ordering::Acquire)
    }

    /// Mark a `once` grant used (restored or learnt from another replica).
    pub fn mark_used(&self) {
        self.used.store(true, Ordering::Release);
    }

    fn matches(&self, target: &Target, now: SystemTime) -> bool {
        self.port == target.port && self.host == target.host && self.expires.is_none_or(|e| now < e)
    }
}

/// The host as a grant's rule text writes it (IPv6 in brackets).
pub fn host_text(host: &Host) -> String {
    match host {
        Host::Name(n) => n.to_string(),
        Host::Ip(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
        Host::Ip(ip) => ip.to_string(),
    }
}

/// A path glob: `*` matches any run of characters (including `/`), everything else itself.
fn glob(pattern: &str, path: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = path.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// One sandbox's grants.
#[derive(Debug, Default)]
pub struct Granted {
    /// The grants in force, each shared with the exchanges it allowed.
    pub entries: Vec<Arc<GrantEntry>>,
}

impl Granted {
    /// The grant for `target` in force at `now`, if any: the first approved that is not a
    /// spent `once` grant; else a spent one (its own exchange still re-checks against it,
    /// and a new one is refused by [`crate::egress::grant_stage`] with the reason).
    pub fn find(&self, target: &Target, now: SystemTime) -> Option<&Arc<GrantEntry>> {
        let mut matching = self.entries.iter().filter(|g| g.matches(target, now));
        let first = matching.next()?;
        if !(first.kind == GrantKind::Once && first.used()) {
            return Some(first);
        }
        matching
            .find(|g| !(g.kind == GrantKind::Once && g.used()))
            .or(Some(first))
    }

    /// The grant named by `rule`, if `rule` is a grant's.
    pub fn by_rule(&self, rule: &Arc<Rule>) -> Option<&Arc<GrantEntry>> {
        self.entries.iter().find(|g| Arc::ptr_eq(&g.rule, rule))
    }

    /// Whether a grant in force names `name` (on any port): the DNS listener answers it.
    pub fn names(&self, name: &str, now: SystemTime) -> Option<&Arc<GrantEntry>> {
        self.entries.iter().find(|g| {
            matches!(&g.host, Host::Name(n) if &**n == name) && g.expires.is_none_or(|e| now < e)
        })
    }

    /// What decides about these grants, for the set's version.
    pub fn digest_text(&self) -> String {
        let mut s = String::new();
        for g in &self.entries {
            s.push_str(&format!(
                "{}|{}|{:?}|{:?}|{:?}|{:?}\n",
                g.id, g.rule.text, g.methods, g.paths, g.kind, g.expires
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(kind: GrantKind, expires: Option<SystemTime>) -> GrantEntry {
        GrantEntry::new(
            "sb",
            "r-1",
            Host::parse("api.example.com").unwrap(),
            443,
            vec![],
            vec![],
            kind,
            expires,
            "admin",
        )
    }

    #[test]
    fn a_grant_matches_its_host_and_port_only_until_it_expires() {
        let now = SystemTime::now();
        let g = Granted {
            entries: vec![Arc::new(entry(
                GrantKind::Ttl,
                Some(now + Duration::from_secs(10)),
            ))],
        };
        let t = Target::parse("api.example.com:443", None).unwrap();
        assert!(g.find(&t, now).is_some());
        assert!(g.find(&t, now + Duration::from_secs(11)).is_none());
        for other in [
            "api.example.com:8443",
            "x.api.example.com:443",
            "example.com:443",
        ] {
            assert!(
                g.find(&Target::parse(other, None).unwrap(), now).is_none(),
                "{other}"
            );
        }
    }

    #[test]
    fn a_once_grant_is_taken_once() {
        let g = entry(GrantKind::Once, None);
        assert!(g.take().is_ok());
        assert!(matches!(g.take(), Err(NotTaken::Used)));
        assert!(g.used());
        let t = entry(GrantKind::Ttl, None);
        assert!(t.take().is_ok() && t.take().is_ok());
    }

    #[test]
    fn a_scoped_grant_holds_only_for_canonical_paths() {
        let mut g = entry(GrantKind::Ttl, None);
        g.methods = vec!["GET".into()];
        g.paths = vec!["/docs/*".into()];
        assert!(g.allows_request("GET", "/docs/k"));
        for bad in [
            "/docs/../admin",
            "/docs/%2e%2e/admin",
            "/docs/..%2fadmin",
            "/docs/./../admin",
            "/docs/%2E%2E/%2E%2E/etc/passwd",
        ] {
            assert!(!g.allows_request("GET", bad), "{bad}");
        }
    }

    #[test]
    fn path_globs_and_methods_scope_a_request() {
        let mut g = entry(GrantKind::Ttl, None);
        g.methods = vec!["GET".into()];
        g.paths = vec!["/v1/*".into(), "/exact".into()];
        assert!(g.allows_request("GET", "/v1/items/3"));
        assert!(g.allows_request("get", "/exact"));
        assert!(!g.allows_request("GET", "/exact/more"));
        assert!(!g.allows_request("POST", "/v1/items"));
        assert!(!g.allows_request("GET", "/v2/items"));
        assert!(glob("/a*b*c", "/a-x-b-y-c"));
        assert!(!glob("/a*b*c", "/a-x-c"));
    }
}
