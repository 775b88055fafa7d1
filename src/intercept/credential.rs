//! Credentials as kinds behind one trait. A binding's `credentials[]` describe (config); here
//! each becomes a [`Bound`] credential of its [`Kind`], which says what a terminated exchange
//! asks of it, in the exchange's fixed order:
//! 1. [`Kind::misuse`] — before anything: is the sandbox's placeholder somewhere this kind
//!    does not take it, or the request signed in a way it cannot sign again (a refusal,
//!    `credential_misuse`);
//! 2. [`Kind::reads_body`] — whether the body must be read whole first (a SigV4 request that
//!    declares no payload hash is signed over its body);
//! 3. [`Kind::apply`] — after the request was allowed and its authority written, as it will
//!    be sent: put the credential on it (a minting kind may mint first; when it cannot, the
//!    request is refused `credential_unavailable`, never sent without it);
//! 4. [`Kind::secrets`] — what the response scrubber looks for (and replaces with the
//!    placeholder), minted tokens included.
//!
//! The kinds: [`Header`] (set a header to a format with the secret), [`Replace`] (replace the
//! placeholder inside named headers, Basic auth decoded), [`super::sigv4::AwsSigV4`] (sign
//! again with the real keys) and [`Minted`] (a token minted by [`super::minter`]); [`bound`]
//! is the one place that maps a configured credential to its kind.

use std::sync::Arc;

use base64::Engine;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};

use super::exchange::UpBody;
use super::minter::{Minter, Slot};
use super::placeholder;
use super::sigv4::AwsSigV4;
use crate::config::credentials::{Credential, CredentialKind, Inject};
use crate::egress::resolve::Resolver;
use crate::intercept::credential_error::{sign, CredentialError};

/// What a kind of credential does on a terminated exchange.
#[async_trait::async_trait]
pub trait Kind: Send + Sync {
    /// Why the request (`uri`, `headers`) carries `placeholder` where this kind does not take
    /// it, or cannot be given this credential; `None` when it can.
    fn misuse(&self, uri: &Uri, headers: &HeaderMap, placeholder: &str) -> Option<String>;
    /// The refusal's sentence for a [`Kind::misuse`] of credential `name`: about its
    /// placeholder, unless the kind has none the sandbox holds.
    fn misuse_sentence(&self, name: &str, why: String) -> String {
        format!("the placeholder of credential {name} is {why}")
    }
    /// Whether the body must be read whole before [`Kind::apply`].
    fn reads_body(&self, _uri: &Uri, _headers: &HeaderMap) -> bool {
        false
    }
    /// Put the credential on the request (authority written, as it will be sent): whether it
    /// was used; `Err` why it could not be had (`credential_unavailable`).
    async fn apply(
        &self,
        req: &mut Request<UpBody>,
        placeholder: &str,
    ) -> Result<bool, CredentialError>;
    /// The secret values a response must never carry back.
    fn secrets(&self) -> Vec<Vec<u8>>;
    /// The secret that replaces the placeholder inside the sandbox's WebSocket text messages
    /// (only the `replace_placeholder` kind: the others put their secret in headers).
    fn message_secret(&self) -> Option<&str> {
        None
    }
}

/// A credential bound to the host being terminated.
pub struct Bound {
    /// The credential's name (records, refusals).
    pub name: String,
    /// What the sandbox holds instead of the secret.
    pub placeholder: String,
    /// What it does to a request.
    pub kind: Box<dyn Kind>,
}

/// What minting kinds need: the process's tokens and the proxy's resolver.
#[derive(Clone)]
pub struct MintCx {
    /// The token cache and the minting client.
    pub minter: Arc<Minter>,
    /// The resolver token endpoints are looked up with.
    pub resolver: Arc<Resolver>,
    /// The external deciders (the exchange asks them per request).
    pub deciders: Arc<crate::decider::Deciders>,
    /// Where the sandbox's flow labels are kept (the exchange judges and arms per request).
    pub flows: Arc<crate::pipeline::flow::Ledger>,
    /// The signer of identity tokens.
    pub issuer: Option<Arc<super::identity_token::Issuer>>,
    /// The scrubbers compiled per binding and host, shared by the tunnels
    /// ([`super::scrub::Compiled`]).
    pub scrubbers: Arc<super::scrub::Compiled>,
}

#[cfg(test)]
impl MintCx {
    /// A context whose resolver knows no name and whose TLS trusts the public roots.
    pub fn for_tests() -> MintCx {
        let cfg = crate::config::DnsConfig {
            servers: vec!["127.0.0.1:9".parse().unwrap()],
            hosts: Default::default(),
            timeout: std::time::Duration::from_millis(100),
            address_rule_zones: Vec::new(),
            max_answer_ttl: std::time::Duration::from_secs(60),
            answer_grace: std::time::Duration::from_secs(60),
            pass_types: Vec::new(),
            self_address: None,
        };
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        MintCx {
            minter: Arc::new(Minter::new(Arc::new(tls))),
            resolver: Arc::new(Resolver::new(&cfg).0),
            deciders: Default::default(),
            flows: Default::default(),
            issuer: None,
            scrubbers: Default::default(),
        }
    }
}

/// The kind of a configured credential of `sandbox`.
pub fn bound(c: &Credential, sandbox: &str, cx: &MintCx) -> Bound {
    let kind: Box<dyn Kind> = match &c.kind {
        CredentialKind::Static { inject, secret } => match inject {
            Inject::Header { name, format } => Box::new(Header::new(name, format, secret.expose())),
            Inject::ReplacePlaceholder { headers } => Box::new(Replace {
                headers: headers.clone(),
                secret: secret.expose().to_string(),
            }),
        },
        CredentialKind::AwsSigV4(keys) => Box::new(Resign(AwsSigV4::new(keys.clone()))),
        CredentialKind::Minted(m) => {
            let (header, format) = match &m.inject {
                Inject::Header { name, format } => (name.clone(), format.clone()),
                Inject::ReplacePlaceholder { .. } => {
                    (http::header::AUTHORIZATION, "Bearer {secret}".into())
                }
            };
            Box::new(Minted {
                sandbox: sandbox.to_string(),
                name: c.name.clone(),
                slot: cx.minter.slot(sandbox, c, m),
                cx: cx.clone(),
                header,
                format,
                git_basic: matches!(
                    m.how,
                    crate::config::credential_kinds::Mint::GithubApp { .. }
                ),
            })
        }
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

#[async_trait::async_trait]
impl Kind for Header {
    fn misuse(&self, _: &Uri, _: &HeaderMap, _: &str) -> Option<String> {
        None
    }

    async fn apply(&self, req: &mut Request<UpBody>, _: &str) -> Result<bool, CredentialError> {
        let Some(v) = &self.value else {
            return Ok(false);
        };
        req.headers_mut().insert(self.name.clone(), v.clone());
        Ok(true)
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        vec![self.secret.as_bytes().to_vec()]
    }
}

/// `inject: { replace_placeholder: { headers } }`: the placeholder is replaced in these
/// headers only (in `Authorization: Basic`, inside the decoded user or password); anywhere
/// else it is misuse.
pub struct Replace {
    headers: Vec<HeaderName>,
    secret: String,
}

#[async_trait::async_trait]
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

    async fn apply(
        &self,
        req: &mut Request<UpBody>,
        placeholder: &str,
    ) -> Result<bool, CredentialError> {
        let headers = req.headers_mut();
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
        Ok(found)
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        vec![self.secret.as_bytes().to_vec()]
    }

    fn message_secret(&self) -> Option<&str> {
        Some(&self.secret)
    }
}

/// `kind: aws_sigv4` behind the trait ([`AwsSigV4`] does the work).
struct Resign(AwsSigV4);

#[async_trait::async_trait]
impl Kind for Resign {
    fn misuse(&self, uri: &Uri, headers: &HeaderMap, placeholder: &str) -> Option<String> {
        self.0.misuse(uri, headers, placeholder)
    }

    fn reads_body(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        self.0.reads_body(uri, headers)
    }

    async fn apply(&self, req: &mut Request<UpBody>, _: &str) -> Result<bool, CredentialError> {
        let whole = req.body().bytes().cloned();
        match self.0.resign(req, whole.as_deref())? {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(mut chunks)) => {
                let body = std::mem::replace(req.body_mut(), UpBody::Whole(None));
                *req.body_mut() = match body {
                    UpBody::Whole(Some(b)) => {
                        let out = chunks.push(&b)?;
                        if !chunks.finished() {
                            return Err(sign("the aws-chunked body ended before its final chunk"));
                        }
                        UpBody::whole(out)
                    }
                    // Streamed, scanned by DLP or prefixed: signed again as it streams.
                    other => UpBody::Resigned(Box::new(other), Box::new(chunks)),
                };
                Ok(true)
            }
        }
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        self.0.secrets()
    }
}

/// `kind: oauth2` and `kind: github_app`: the token minted for this sandbox goes in the
/// header (`Authorization: Bearer` unless `inject` says otherwise); for a GitHub App, git's
/// smart-HTTP requests get it as the Basic-auth password (`x-access-token:TOKEN`), as git
/// over HTTPS takes it.
pub struct Minted {
    sandbox: String,
    name: String,
    slot: Arc<Slot>,
    cx: MintCx,
    header: HeaderName,
    format: String,
    git_basic: bool,
}

#[async_trait::async_trait]
impl Kind for Minted {
    /// A sealed token ([`super::sealed`]) anywhere in the request must be one sealed for this
    /// sandbox and credential, still live, and in the credential's header.
    fn misuse(&self, uri: &Uri, headers: &HeaderMap, _: &str) -> Option<String> {
        let in_uri = uri
            .path_and_query()
            .is_some_and(|pq| super::sealed::find(pq.as_str().as_bytes()).is_some());
        if in_uri {
            return Some("a sealed token in the URL (it is redeemed only in its header)".into());
        }
        for (n, v) in headers {
            let Some(sealed) = super::sealed::find(v.as_bytes()) else {
                continue;
            };
            if *n != self.header {
                return Some(format!(
                    "a sealed token in {n} (it is redeemed only in {})",
                    self.header
                ));
            }
            match self
                .cx
                .minter
                .sealed
                .redeem(&self.sandbox, &self.name, sealed)
            {
                Ok(_) => {}
                Err(super::sealed::Unsealed::Elsewhere) => {
                    return Some("a sealed token of another sandbox or credential".into())
                }
                Err(super::sealed::Unsealed::Unknown) => {
                    return Some("a sealed token that is unknown or has expired".into())
                }
            }
        }
        None
    }

    async fn apply(&self, req: &mut Request<UpBody>, _: &str) -> Result<bool, CredentialError> {
        let sealed = req
            .headers()
            .get(&self.header)
            .and_then(|v| super::sealed::find(v.as_bytes()))
            .and_then(|s| {
                self.cx
                    .minter
                    .sealed
                    .redeem(&self.sandbox, &self.name, s)
                    .ok()
            });
        let token = match sealed {
            Some(t) => t,
            None => self.slot.token(&self.cx.minter, &self.cx.resolver).await?,
        };
        let git = self.git_basic
            && crate::policy::http_rules::git_request(
                req.method().as_str(),
                req.uri().path(),
                req.uri().query(),
            )
            .is_some();
        let value = match git {
            true => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("x-access-token:{}", token.expose()))
            ),
            false => self.format.replace("{secret}", token.expose()),
        };
        let mut v = HeaderValue::from_str(&value).map_err(|_| {
            CredentialError::Write("the minted token is not a valid header value".into())
        })?;
        v.set_sensitive(true);
        req.headers_mut().insert(self.header.clone(), v);
        Ok(true)
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        let sealed = self.cx.minter.sealed.tokens_of(&self.sandbox, &self.name);
        self.slot
            .current()
            .into_iter()
            .chain(sealed)
            .map(|t| t.expose().as_bytes().to_vec())
            .collect()
    }
}
