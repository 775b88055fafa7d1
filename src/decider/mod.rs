//! The external decider (`decider:`; protocol in `docs/decider.md`): after the proxy's own
//! policy allowed an exchange — so it can only narrow — and before any credential is put on
//! it, the proxy asks. Host level at the verdict point ([`stage::DeciderStage`]: CONNECT
//! tunnels, transparent and SOCKS5 connections), and per request in the request pipeline's
//! decider phase ([`crate::pipeline::ask`], through [`Deciders`]' [`crate::pipeline::ask::Asker`]:
//! forwarded plain HTTP, plain HTTP served request by request in a tunnel, terminated
//! requests — after the rules, with the body when the decider asks for it, its header edits
//! made on every path). Both build their question with [`Question::new`] and consult through
//! [`Deciders::consult`]; one function sends it.
//!
//! Hard failure semantics: a decider that is down, slower than `timeout_ms`, busy past
//! `max_in_flight`, or that answers anything but a verdict this version defines gets
//! `on_error` (deny by default: `decider_unavailable`) — unless the failure is the asking
//! sandbox's own load (past its `max_in_flight_per_sandbox`, or failing while it holds that
//! whole share): that is refused whatever `on_error` says, so a sandbox cannot turn `allow`
//! into "no decider" by flooding it. Every verdict is in the record's `decider` field.

mod client;
mod error;
mod request;
pub mod stage;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::decider::{DeciderConfig, OnError};
use crate::config::Binding;
pub use error::DeciderError;
pub use wire::{Answer, Ask, Edits};

/// What asking came to.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The decider answered.
    Answer(Answer),
    /// No usable answer, and `on_error` is allow: the exchange proceeds (recorded).
    FailedOpen(String),
    /// No usable answer under `on_error: deny`.
    Failed(String),
}

/// The deciders of the process, one client (and its connections) per configuration.
#[derive(Default)]
pub struct Deciders {
    clients: Mutex<HashMap<DeciderConfig, Arc<client::Client>>>,
}

impl Deciders {
    /// The client of `cfg` (one per distinct configuration, kept across reloads).
    fn client(&self, cfg: &Arc<DeciderConfig>) -> Arc<client::Client> {
        let mut clients = match self.clients.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if let Some(c) = clients.get(&**cfg) {
            return c.clone();
        }
        let c = Arc::new(client::Client::new(cfg.clone()));
        clients.insert((**cfg).clone(), c.clone());
        c
    }

    /// Consult `cfg` about `q`, at the verdict point and per terminated request alike: asked
    /// once, and when it asks for the body and `body` can show it, asked again with up to
    /// `need_body_max` bytes of it (a second `need_body` is a failure). Where no body can be
    /// shown, `need_body` is the caller's to judge.
    pub async fn consult<S: Showable>(
        &self,
        cfg: &Arc<DeciderConfig>,
        q: &mut Question,
        mut body: Option<&mut S>,
    ) -> Outcome {
        loop {
            let o = self.ask(cfg, q).await;
            if o != Outcome::Answer(Answer::NeedBody) {
                return o;
            }
            let Some(b) = body.as_deref_mut() else {
                return o;
            };
            if q.ask.body.is_some() {
                return failed(cfg, "it asked for the body again after seeing it".into());
            }
            match b.show(cfg.need_body_max).await {
                Ok((shown, truncated)) => {
                    use base64::Engine;
                    q.ask.body = Some(wire::Body {
                        base64: base64::engine::general_purpose::STANDARD.encode(&shown),
                        bytes: shown.len(),
                        truncated,
                    });
                }
                // The body could not be read: nothing can be sent either.
                Err(why) => return Outcome::Failed(why.to_string()),
            }
        }
    }

    /// Ask `cfg` about `q` — the one place a decider is asked. Its credential header names are
    /// the decider's to neither see nor touch.
    async fn ask(&self, cfg: &Arc<DeciderConfig>, q: &Question) -> Outcome {
        let protected: Vec<&str> = q.protected.iter().map(String::as_str).collect();
        let (ask, protected) = (&q.ask, &protected[..]);
        let failed = |why: String| match cfg.on_error {
            OnError::Deny => Outcome::Failed(why),
            OnError::Allow => Outcome::FailedOpen(why),
        };
        let json = match serde_json::to_vec(ask) {
            Ok(j) => j,
            Err(e) => return failed(format!("encoding the ask: {e}")),
        };
        match self.client(cfg).post(&ask.sandbox, json).await {
            Ok(body) => match wire::read(&body, protected) {
                Ok(a) => Outcome::Answer(a),
                Err(why) => failed(why.to_string()),
            },
            // The sandbox's own load: refused whatever `on_error` says.
            Err(f) if f.own => Outcome::Failed(format!(
                "{} (the sandbox's own load: on_error does not apply)",
                f.why
            )),
            Err(f) => failed(f.why.to_string()),
        }
    }
}

/// `on_error`'s outcome for a decider that gave no usable answer.
fn failed(cfg: &DeciderConfig, why: String) -> Outcome {
    match cfg.on_error {
        OnError::Deny => Outcome::Failed(why),
        OnError::Allow => Outcome::FailedOpen(why),
    }
}

/// A request body a decider may be shown: up to `max` bytes of it and whether there is more;
/// the bytes shown are the bytes sent.
pub trait Showable {
    /// Up to `max` bytes of the body and whether there is more; the body stays sendable.
    fn show(
        &mut self,
        max: usize,
    ) -> impl std::future::Future<Output = Result<(bytes::Bytes, bool), DeciderError>> + Send;
}

/// No body to show (the verdict point: a tunnel or a forwarded request's head).
pub struct NoBody;

impl Showable for NoBody {
    async fn show(&mut self, _: usize) -> Result<(bytes::Bytes, bool), DeciderError> {
        Err(DeciderError::NoBody)
    }
}

/// An exchange as a decider is asked about it, built in one place for every caller.
pub struct Question {
    /// The ask, as sent.
    pub ask: Ask,
    /// The binding's credential header names.
    protected: Vec<String>,
}

/// What a question is about: the protocol (`connect`, `http`, `https`), the target, the
/// request's head when there is one, and the policy's decision and rule.
pub struct About<'a> {
    /// `connect`, `http` or `https`.
    pub protocol: &'static str,
    /// The target's host.
    pub host: String,
    /// The target's port.
    pub port: u16,
    /// The request's method, URI and headers, when there is a request.
    pub request: Option<(&'a http::Method, &'a http::Uri, &'a http::HeaderMap)>,
    /// What the policy decided (`allow`, `report`).
    pub decision: &'static str,
    /// The rule that allowed it, if one did.
    pub rule: Option<String>,
}

impl Question {
    /// The question about `about` for a sandbox bound by `b`: credentials (and headers carrying
    /// a placeholder) never in it.
    pub fn new(b: &Binding, about: About<'_>) -> Question {
        let protected = credential_headers(b);
        let ask = Ask {
            version: wire::VERSION,
            sandbox: b.id.to_string(),
            identity: identity(b),
            protocol: about.protocol,
            target: wire::Target {
                host: about.host,
                port: about.port,
            },
            method: about.request.map(|(m, _, _)| m.as_str().to_string()),
            path: about.request.map(|(_, u, _)| u.path().to_string()),
            headers: about
                .request
                .map(|(_, _, h)| visible_headers(h, b, &protected))
                .unwrap_or_default(),
            policy: wire::Policy {
                decision: about.decision,
                rule: about.rule,
            },
            body: None,
        };
        Question { ask, protected }
    }
}

/// How the binding's sandbox is identified, as the decider is told.
pub fn identity(b: &Binding) -> &'static str {
    match b.token_sha256 {
        Some(_) => "token",
        None => "source",
    }
}

/// The header names the binding's credentials use (never sent, never touched).
pub fn credential_headers(b: &Binding) -> Vec<String> {
    use crate::config::credentials::{CredentialKind, Inject};
    let mut out = Vec::new();
    for c in b.credentials.iter() {
        match &c.kind {
            CredentialKind::Static { inject, .. } => match inject {
                Inject::Header { name, .. } => out.push(name.as_str().to_string()),
                Inject::ReplacePlaceholder { headers } => {
                    out.extend(headers.iter().map(|h| h.as_str().to_string()))
                }
            },
            CredentialKind::Minted(m) => {
                if let Inject::Header { name, .. } = &m.inject {
                    out.push(name.as_str().to_string());
                }
            }
            CredentialKind::AwsSigV4(_) => {
                out.extend(["x-amz-date", "x-amz-content-sha256"].map(String::from))
            }
        }
    }
    out
}

/// The headers of a request as the decider sees them: lower-case names, repeated ones
/// joined, credentials (and anything carrying a placeholder) left out.
pub fn visible_headers(
    headers: &http::HeaderMap,
    b: &Binding,
    protected: &[String],
) -> std::collections::BTreeMap<String, String> {
    let mut out: std::collections::BTreeMap<String, String> = Default::default();
    for (n, v) in headers {
        let name = n.as_str();
        if wire::NEVER_SENT.contains(&name) || protected.iter().any(|p| p == name) {
            continue;
        }
        let carries = b
            .credentials
            .iter()
            .any(|c| memchr::memmem::find(v.as_bytes(), c.placeholder.as_bytes()).is_some());
        if carries {
            continue;
        }
        let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
        out.entry(name.to_string())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&value)
            })
            .or_insert(value);
    }
    out
}

/// The record's `decider` words for an outcome.
pub fn noted(o: &Outcome) -> String {
    match o {
        Outcome::Answer(Answer::Allow(e)) if e.is_empty() => "allow".into(),
        Outcome::Answer(Answer::Allow(e)) => format!(
            "allow (headers set: {}; removed: {})",
            e.set
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            e.remove
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Outcome::Answer(Answer::Deny { status, reason }) => format!("deny {status}: {reason}"),
        Outcome::Answer(Answer::NeedBody) => "need_body".into(),
        Outcome::FailedOpen(why) => format!("unavailable, allowed (on_error: allow): {why}"),
        Outcome::Failed(why) => format!("unavailable: {why}"),
    }
}
