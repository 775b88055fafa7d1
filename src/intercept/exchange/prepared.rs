//! What a binding means for one terminated tunnel's host, worked out once per binding: its
//! `network.http` rules, its credentials as kinds, their scrubber, and the minting
//! credentials whose token endpoint it is.

use std::sync::{Arc, Mutex};

use super::super::credential::{self, Bound, MintCx};
use super::super::scrub::Scrubber;
use crate::config::credentials::CredentialKind;
use crate::config::Binding;
use crate::pipeline::head::HostRules;

/// What a binding means for this tunnel's host, worked out once per binding (a reload makes
/// a new binding, and the next request a new `Prepared`).
pub(super) struct Prepared {
    pub(super) binding: Arc<Binding>,
    /// The policy version it was made under.
    pub(super) version: Arc<str>,
    /// The `network.http` rules for this host, as the pipeline's head phase reads them.
    pub(super) rules: HostRules,
    /// Whether this host is judged per request ([`crate::pipeline::judged_per_request`]);
    /// `false`: its plain-HTTP requests are served one by one for a phase that applies to
    /// every host (`dlp`), and the head phase has no rule to read, as on the forwarded path.
    pub(super) judged: bool,
    /// The credentials bound here, each as its kind handles it.
    pub(super) bound: Vec<Bound>,
    /// The scrubber of the secrets bound here (none: no secret), built once.
    pub(super) scrubber: Option<Arc<Scrubber>>,
    /// When a credential here is minted (or its answers sealed): the scrubber as of the
    /// minter generation it knew (a new token is a new secret: the next request rebuilds it).
    /// `None` otherwise, so the common case takes no lock.
    pub(super) minted_scrubber: Option<Mutex<(u64, Option<Arc<Scrubber>>)>>,
    /// The header the sandbox's identity token is put in here, when one is.
    identity_header: Option<http::HeaderName>,
    /// This host is the token endpoint of these minting credentials (name, path): the
    /// sandbox's own calls there have their answers sealed ([`crate::intercept::sealed`]).
    pub(super) sealing: Vec<(String, String)>,
    /// The sandbox's `network.egress` compiled (enforced), for the domains of provider-run
    /// web tools: made on first use (`None`: it did not compile).
    egress: std::sync::OnceLock<Option<crate::policy::CompiledPolicy>>,
}

/// The name the sandbox's identity token goes by among the credentials bound to a host.
const IDENTITY: &str = "sandbox-identity";

impl Prepared {
    pub(super) fn new(
        binding: Arc<Binding>,
        (host, process): (&str, Option<&crate::policy::process::Process>),
        cx: &MintCx,
        version: Arc<str>,
    ) -> Self {
        let rules = HostRules::of(&binding, host, process);
        let judged = crate::pipeline::judged_per_request(&binding, host);
        let mut bound: Vec<Bound> = binding
            .credentials
            .iter()
            .filter(|c| c.bound_to(host))
            .map(|c| credential::bound(c, binding.id.as_str(), cx))
            .collect();
        // The sandbox's identity token, for the hosts it names: a kind like the others.
        let identity = binding.identity_token.clone().filter(|t| t.bound_to(host));
        let mut identity_header = None;
        if let (Some(token), Some(issuer)) = (identity, cx.issuer.clone()) {
            identity_header = Some(token.header.clone());
            bound.push(Bound {
                name: IDENTITY.into(),
                placeholder: String::new(),
                kind: Box::new(crate::intercept::identity_token::IdentityKind {
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
        // Minted secrets change under one binding: their scrubber is rebuilt per token, not
        // kept with the binding's.
        let changing = minted || !sealing.is_empty();
        let scrubber = match changing {
            true => Scrubber::new(bound.iter()).map(Arc::new),
            false => cx
                .scrubbers
                .get_or_build(&binding, host, || Scrubber::new(bound.iter()).map(Arc::new)),
        };
        let minted_scrubber =
            changing.then(|| Mutex::new((cx.minter.generation(), scrubber.clone())));
        Prepared {
            binding,
            version,
            rules,
            judged,
            bound,
            scrubber,
            minted_scrubber,
            identity_header,
            sealing,
            egress: std::sync::OnceLock::new(),
        }
    }

    /// The sandbox's `network.egress`, compiled once (enforced, any port).
    pub(super) fn compiled_egress(&self) -> Option<&crate::policy::CompiledPolicy> {
        self.egress
            .get_or_init(|| {
                let b = &self.binding;
                crate::policy::CompiledPolicy::compile(
                    b.id.as_str(),
                    &b.policy_file,
                    &b.network,
                    crate::policy::Enforcement::Enforce,
                    &crate::policy::ports::PortSet::any(),
                )
                .ok()
            })
            .as_ref()
    }

    /// [`Prepared::scrubber`] for the answer to `headers` (a request about to be sent): with
    /// the identity token the proxy put on it, if it put one, so the sandbox never reads its
    /// own token back (an origin that reflects headers).
    pub(super) fn scrubber_for(
        &self,
        cx: &MintCx,
        headers: &http::HeaderMap,
    ) -> Option<Arc<Scrubber>> {
        let token = self
            .identity_header
            .as_ref()
            .and_then(|h| headers.get(h))
            .map(http::HeaderValue::as_bytes);
        match token {
            None => self.scrubber(cx),
            Some(t) => {
                let minted = [(IDENTITY, t)];
                Scrubber::with_minted(self.bound.iter(), &minted).map(Arc::new)
            }
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

    /// The sandbox and credential whose token endpoint `path` is here (its answer is sealed):
    /// compared as routers read paths ([`route_form`]), not byte for byte — `/token/`,
    /// `/TOKEN` and `//token` reach the same handler on common routers.
    pub(super) fn seal_of(&self, path: &str) -> Option<(String, String)> {
        if self.sealing.is_empty() {
            // No token endpoint bound here: nothing to put the path in route form for.
            return None;
        }
        let asked = route_form(path);
        self.sealing
            .iter()
            .find(|(_, p)| route_form(p) == asked)
            .map(|(name, _)| (self.binding.id.to_string(), name.clone()))
    }
}

/// A path as the most lenient common router matches it: percent-decoded, ASCII lower case,
/// empty segments (a trailing or doubled `/`) and `;params` dropped. Dot segments never get
/// here: the pipeline's head phase refused them.
fn route_form(path: &str) -> Vec<Vec<u8>> {
    path.split('/')
        .map(|seg| seg.split(';').next().unwrap_or(seg))
        .filter(|seg| !seg.is_empty())
        .map(|seg| crate::policy::http_rules::percent_decode(seg).to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::route_form;

    #[test]
    fn token_paths_are_compared_as_routers_read_them() {
        let token = route_form("/oauth/token");
        for same in [
            "/oauth/token",
            "/oauth/token/",
            "/OAUTH/Token",
            "//oauth//token",
            "/oauth/%74oken",
            "/oauth/token;x=1",
        ] {
            assert_eq!(route_form(same), token, "{same}");
        }
        for other in ["/oauth/tokens", "/oauth", "/oauth/token/x"] {
            assert_ne!(route_form(other), token, "{other}");
        }
    }
}
