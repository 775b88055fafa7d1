//! What a binding means for one terminated tunnel's host, worked out once per binding: its
//! `network.http` rules, its credentials as kinds, their scrubber, and the minting
//! credentials whose token endpoint it is.

use std::sync::{Arc, Mutex};

use super::super::credential::{self, Bound, MintCx};
use super::super::scrub::Scrubber;
use crate::config::credentials::CredentialKind;
use crate::config::Binding;
use crate::policy::http_rules::HttpRule;

/// What a binding means for this tunnel's host, worked out once per binding (a reload makes
/// a new binding, and the next request a new `Prepared`).
pub(super) struct Prepared {
    pub(super) binding: Arc<Binding>,
    /// The policy version it was made under.
    pub(super) version: Arc<str>,
    /// The `network.http` rules for this host.
    pub(super) rules: Vec<HttpRule>,
    /// The credentials bound here, each as its kind handles it.
    pub(super) bound: Vec<Bound>,
    /// The scrubber of the secrets bound here (none: no secret), built once.
    pub(super) scrubber: Option<Arc<Scrubber>>,
    /// When a credential here is minted (or its answers sealed): the scrubber as of the
    /// minter generation it knew (a new token is a new secret: the next request rebuilds it).
    /// `None` otherwise, so the common case takes no lock.
    pub(super) minted_scrubber: Option<Mutex<(u64, Option<Arc<Scrubber>>)>>,
    /// This host is the token endpoint of these minting credentials (name, path): the
    /// sandbox's own calls there have their answers sealed ([`crate::intercept::sealed`]).
    pub(super) sealing: Vec<(String, String)>,
    /// Every rule here matches any path (no glob, git or protocol): an encoded `/` cannot
    /// reach a path a rule would refuse.
    pub(super) any_path: bool,
}

impl Prepared {
    pub(super) fn new(binding: Arc<Binding>, host: &str, cx: &MintCx, version: Arc<str>) -> Self {
        let rules: Vec<HttpRule> = binding
            .network
            .http
            .iter()
            .filter(|r| r.host.matches(host))
            .cloned()
            .collect();
        let any_path = !rules.is_empty()
            && rules
                .iter()
                .all(|r| r.paths.is_empty() && r.git.is_empty() && r.protocol.is_none());
        let mut bound: Vec<Bound> = binding
            .credentials
            .iter()
            .filter(|c| c.bound_to(host))
            .map(|c| credential::bound(c, binding.id.as_str(), cx))
            .collect();
        // The sandbox's identity token, for the hosts it names: a kind like the others.
        let identity = binding.identity_token.clone().filter(|t| t.bound_to(host));
        if let (Some(token), Some(issuer)) = (identity, cx.issuer.clone()) {
            bound.push(Bound {
                name: "sandbox-identity".into(),
                placeholder: String::new(),
                kind: Box::new(crate::intercept::identity::IdentityKind {
                    issuer,
                    sandbox: binding.id.to_string(),
                    aud: host.to_string(),
                    version: version.clone(),
                    token,
                }),
            });
        }
        let sealing: Vec<(String, String)> = binding
            .credentials
            .iter()
            .filter_map(|c| match &c.kind {
                CredentialKind::Minted(m) => m
                    .token_endpoint()
                    .filter(|(h, _)| h.eq_ignore_ascii_case(host))
                    .map(|(_, path)| (c.name.clone(), path)),
                _ => None,
            })
            .collect();
        let minted = binding
            .credentials
            .iter()
            .any(|c| c.bound_to(host) && matches!(c.kind, CredentialKind::Minted(_)));
        let scrubber = Scrubber::new(bound.iter()).map(Arc::new);
        let minted_scrubber = (minted || !sealing.is_empty())
            .then(|| Mutex::new((cx.minter.generation(), scrubber.clone())));
        Prepared {
            binding,
            version,
            rules,
            bound,
            scrubber,
            minted_scrubber,
            sealing,
            any_path,
        }
    }

    /// The scrubber of the secrets bound here as they are now (minted tokens included).
    pub(super) fn scrubber(&self, cx: &MintCx) -> Option<Arc<Scrubber>> {
        let Some(minted) = &self.minted_scrubber else {
            return self.scrubber.clone();
        };
        let Ok(mut s) = minted.lock() else {
            return Scrubber::new(self.bound.iter()).map(Arc::new);
        };
        let now = cx.minter.generation();
        if s.0 != now {
            *s = (now, Scrubber::new(self.bound.iter()).map(Arc::new));
        }
        s.1.clone()
    }

    /// The sandbox and credential whose token endpoint `path` is here (its answer is sealed).
    pub(super) fn seal_of(&self, path: &str) -> Option<(String, String)> {
        self.sealing
            .iter()
            .find(|(_, p)| p == path)
            .map(|(name, _)| (self.binding.id.to_string(), name.clone()))
    }
}
