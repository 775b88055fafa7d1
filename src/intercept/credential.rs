//! Credentials as kinds behind one trait. A binding's `credentials[]` describe (config); here
//! each becomes a [`Bound`] credential of its [`Kind`], which says the three things a
//! terminated exchange asks of it, in the exchange's fixed order:
//! 1. [`Kind::misuse`] — before anything: is the sandbox's placeholder somewhere this kind
//!    does not take it (a refusal, `credential_misuse`);
//! 2. [`Kind::apply`] — after the request was allowed: put the secret on it;
//! 3. [`Kind::secrets`] — what the response scrubber looks for (and replaces with the
//!    placeholder).
//!
//! The kinds: [`Header`] (set a header to a format with the secret) and [`Replace`] (replace
//! the placeholder inside named headers, Basic auth decoded). A signing or minting kind (AWS
//! SigV4, OAuth2) is one more implementation; [`bound`] is the one place that maps a
//! configured credential to its kind.

use http::{HeaderMap, HeaderName, HeaderValue, Uri};

use super::placeholder;
use crate::config::credentials::{Credential, Inject};

/// What a kind of credential does on a terminated exchange.
pub trait Kind: Send + Sync {
    /// Why the request (`uri`, `headers`) carries `placeholder` where this kind does not take
    /// it; `None` when it does not.
    fn misuse(&self, uri: &Uri, headers: &HeaderMap, placeholder: &str) -> Option<String>;
    /// Put the credential on the request's headers; whether it was used.
    fn apply(&self, headers: &mut HeaderMap, placeholder: &str) -> bool;
    /// The secret values a response must never carry back.
    fn secrets(&self) -> Vec<&[u8]>;
}

/// A credential bound to the host being terminated.
pub struct Bound {
    pub name: String,
    /// What the sandbox holds instead of the secret.
    pub placeholder: String,
    pub kind: Box<dyn Kind>,
}

/// The kind of a configured credential.
pub fn bound(c: &Credential) -> Bound {
    let kind: Box<dyn Kind> = match &c.inject {
        Inject::Header { name, format } => Box::new(Header::new(name, format, c.secret.expose())),
        Inject::ReplacePlaceholder { headers } => Box::new(Replace {
            headers: headers.clone(),
            secret: c.secret.expose().to_string(),
        }),
    };
    Bound {
        name: c.name.clone(),
        placeholder: c.placeholder.clone(),
        kind,
    }
}

/// Whether `uri` or a header other than `allowed` carries `placeholder`.
pub fn carries_outside(
    uri: &Uri,
    headers: &HeaderMap,
    placeholder: &str,
    allowed: &[HeaderName],
) -> bool {
    let in_uri = uri
        .path_and_query()
        .is_some_and(|pq| placeholder::contains(pq.as_str().as_bytes(), placeholder.as_bytes()));
    in_uri
        || headers
            .iter()
            .any(|(n, v)| !allowed.contains(n) && placeholder::carried(n, v, placeholder))
}

/// `inject: { header, format }`: the header is set (overwriting what the client sent) to the
/// format with `{secret}` replaced. The sandbox need not send the placeholder at all.
pub struct Header {
    name: HeaderName,
    /// Built once; `None` when the formatted secret is not a valid header value.
    value: Option<HeaderValue>,
    secret: String,
}

impl Header {
    fn new(name: &HeaderName, format: &str, secret: &str) -> Self {
        let value = HeaderValue::from_str(&format.replace("{secret}", secret))
            .ok()
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        Header {
            name: name.clone(),
            value,
            secret: secret.to_string(),
        }
    }
}

impl Kind for Header {
    fn misuse(&self, _: &Uri, _: &HeaderMap, _: &str) -> Option<String> {
        None
    }

    fn apply(&self, headers: &mut HeaderMap, _: &str) -> bool {
        let Some(v) = &self.value else {
            return false;
        };
        headers.insert(self.name.clone(), v.clone());
        true
    }

    fn secrets(&self) -> Vec<&[u8]> {
        vec![self.secret.as_bytes()]
    }
}

/// `inject: { replace_placeholder: { headers } }`: the placeholder is replaced in these
/// headers only (in `Authorization: Basic`, inside the decoded user or password); anywhere
/// else it is misuse.
pub struct Replace {
    headers: Vec<HeaderName>,
    secret: String,
}

impl Kind for Replace {
    fn misuse(&self, uri: &Uri, headers: &HeaderMap, placeholder: &str) -> Option<String> {
        carries_outside(uri, headers, placeholder, &self.headers).then(|| {
            let names: Vec<&str> = self.headers.iter().map(|h| h.as_str()).collect();
            format!(
                "replaced only in {}; it is elsewhere in the request",
                names.join(", ")
            )
        })
    }

    fn apply(&self, headers: &mut HeaderMap, placeholder: &str) -> bool {
        let mut found = false;
        for name in &self.headers {
            let replaced: Vec<HeaderValue> = headers
                .get_all(name)
                .iter()
                .map(|v| {
                    placeholder::replaced(name, v, placeholder, &self.secret)
                        .inspect(|_| found = true)
                        .unwrap_or_else(|| v.clone())
                })
                .collect();
            if replaced.is_empty() {
                continue;
            }
            headers.remove(name);
            for v in replaced {
                headers.append(name.clone(), v);
            }
        }
        found
    }

    fn secrets(&self) -> Vec<&[u8]> {
        vec![self.secret.as_bytes()]
    }
}
