//! Secrets never travel in clear: plain HTTP to a host a credential or the identity token is
//! bound to (or a minting credential's token endpoint) is refused on every path, and so is a
//! plain-HTTP request that carries a placeholder — before anything is dialled when the
//! request is forwarded ([`InClear`], a verdict stage).

use crate::config::Binding;
use crate::egress::verdict::{Judgement, Point, Stage};
use crate::policy::reason::Reason;
use crate::policy::refusal::Refusal;

use super::placeholder;

/// Why plain HTTP of `binding` to `host` cannot be served, on every path (forwarded, or in a
/// CONNECT, SOCKS5 or transparent tunnel): a credential is bound to it (a secret never
/// travels in clear), it is a minting credential's token endpoint (its answers are sealed),
/// or it gets the sandbox's identity token (the token never travels in clear). `None`: its
/// requests are judged in clear.
pub fn secret_in_clear(binding: &Binding, host: &str) -> Option<String> {
    for c in binding.credentials.iter() {
        if c.bound_to(host) {
            return Some(format!(
                "credential {} is bound to {host}: requests to it must use https (a secret never travels in clear)",
                c.name
            ));
        }
        if c.token_host(host) {
            return Some(format!(
                "{host} is the token endpoint of credential {}: requests to it must use https (its answers are sealed)",
                c.name
            ));
        }
    }
    binding
        .identity_token
        .as_ref()
        .filter(|t| t.bound_to(host))
        .map(|_| format!("{host} gets the sandbox's identity token: requests to it must use https (the token never travels in clear)"))
}

/// Why a plain-HTTP request of `binding` to `host` must be refused for its credentials:
/// [`secret_in_clear`] (a credential or the identity token is bound to the host, or it is a
/// token endpoint), or the request (`uri`, `headers`) carries a placeholder. `None`: nothing
/// to do with credentials.
pub fn plain_http_misuse(
    binding: &Binding,
    host: &str,
    uri: &http::Uri,
    headers: &http::HeaderMap,
) -> Option<String> {
    if let Some(why) = secret_in_clear(binding, host) {
        return Some(why);
    }
    for c in binding.credentials.iter() {
        let p = c.placeholder.as_bytes();
        let in_uri = uri
            .path_and_query()
            .is_some_and(|pq| placeholder::contains(pq.as_str().as_bytes(), p));
        let in_headers = headers
            .iter()
            .any(|(n, v)| placeholder::carried(n, v, &c.placeholder));
        if in_uri || in_headers {
            return Some(format!(
                "the request carries the placeholder of credential {}, which is not bound to {host}",
                c.name
            ));
        }
    }
    None
}

/// The verdict stage that keeps credentials out of clear text: a forwarded plain-HTTP
/// request to a host a credential is bound to, or carrying a placeholder, is refused
/// (`credential_misuse`) before anything is dialled.
pub struct InClear;

impl Stage for InClear {
    fn name(&self) -> &'static str {
        "credentials in clear"
    }

    fn judge(&self, at: &Point<'_>) -> Judgement {
        let Some((uri, headers)) = at.request else {
            return Judgement::Pass;
        };
        let host = at.target.host.to_string();
        match plain_http_misuse(&at.sandbox.binding, &host, uri, headers) {
            None => Judgement::Pass,
            Some(detail) => Judgement::Refuse(Refusal::new(Reason::CredentialMisuse, detail)),
        }
    }
}
