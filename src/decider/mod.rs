//! The external decider (`decider:`; protocol in `docs/decider.md`): after the proxy's own
//! policy allowed an exchange — so it can only narrow — and before any credential is put on
//! it, the proxy asks. Host level at the verdict point ([`stage::DeciderStage`]: CONNECT
//! tunnels, transparent and SOCKS5 connections, forwarded plain-HTTP requests), and per
//! request inside terminated tunnels (the exchange asks, and only there can a decider ask
//! for the body or change headers).
//!
//! Hard failure semantics: a decider that is down, slower than `timeout_ms`, busy past
//! `max_in_flight`, or that answers anything but a verdict this version defines gets
//! `on_error` (deny by default: `decider_unavailable`). Every verdict is in the record's
//! `decider` field.

mod client;
pub mod stage;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::decider::{DeciderConfig, OnError};
use crate::config::Binding;
pub use wire::{Answer, Ask, Edits};

/// What asking came to.
#[derive(Debug, PartialEq)]
pub enum Outcome {
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

    /// Ask `cfg` about `ask`; `protected` are the binding's credential header names (the
    /// decider may not touch them).
    pub async fn ask(&self, cfg: &Arc<DeciderConfig>, ask: &Ask, protected: &[&str]) -> Outcome {
        let failed = |why: String| match cfg.on_error {
            OnError::Deny => Outcome::Failed(why),
            OnError::Allow => Outcome::FailedOpen(why),
        };
        let json = match serde_json::to_vec(ask) {
            Ok(j) => j,
            Err(e) => return failed(format!("encoding the ask: {e}")),
        };
        match self.client(cfg).post(json).await {
            Ok(body) => match wire::read(&body, protected) {
                Ok(a) => Outcome::Answer(a),
                Err(why) => failed(why),
            },
            Err(why) => failed(why),
        }
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
