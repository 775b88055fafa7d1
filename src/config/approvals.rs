//! `approvals:` — how access requests from sandboxes are bounded and who may answer them
//! besides an operator with the admin token: a webhook, and auto-approval for patterns the
//! operator lists (see `crate::approvals`). Without the section, requests are accepted with
//! the default bounds and wait for a person.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::Sink;
use super::Secrets;
use crate::policy::entry::{parse_entry, Entry};

/// `approvals:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApprovals {
    #[serde(default)]
    max_pending: Option<usize>,
    #[serde(default)]
    per_minute: Option<u32>,
    #[serde(default)]
    reason_max: Option<usize>,
    #[serde(default)]
    pending_ttl_s: Option<u64>,
    #[serde(default)]
    auto: Vec<String>,
    #[serde(default)]
    auto_ttl_s: Option<u64>,
    #[serde(default)]
    webhook: Option<RawWebhook>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    url: String,
    secret_file: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// `approvals:`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalsConfig {
    /// Pending requests one sandbox may have at once (429 beyond).
    pub max_pending: usize,
    /// Requests one sandbox may make per minute (429 beyond).
    pub per_minute: u32,
    /// Longest `reason`, in bytes (400 beyond).
    pub reason_max: usize,
    /// How long a request waits for an answer before it is `expired`.
    pub pending_ttl: Duration,
    /// `approvals.auto`: `network.egress`-style patterns granted without a person.
    pub auto: Vec<(String, Entry)>,
    /// The longest grant auto-approval gives (and the one it gives).
    pub auto_ttl: Duration,
    /// `approvals.webhook`: where new requests are sent, if anywhere.
    pub webhook: Option<Webhook>,
}

/// `approvals.webhook`: every request is sent there, signed.
#[derive(Clone, PartialEq)]
pub struct Webhook {
    /// `http://` or `https://` (verified with the public roots).
    pub url: http::Uri,
    /// The HMAC-SHA256 key, read from `secret_file` at load.
    pub secret: Vec<u8>,
    /// The file holding the HMAC secret.
    pub secret_file: PathBuf,
    /// How long a reply is waited for.
    pub timeout: Duration,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            max_pending: 8,
            per_minute: 10,
            reason_max: 500,
            pending_ttl: Duration::from_secs(3600),
            auto: Vec::new(),
            auto_ttl: Duration::from_secs(600),
            webhook: None,
        }
    }
}

/// Validate `approvals:`; every problem goes to `sink`.
pub(super) fn resolve_approvals(
    raw: RawApprovals,
    rel: &dyn Fn(&str) -> PathBuf,
    secrets: Secrets,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) -> ApprovalsConfig {
    let d = ApprovalsConfig::default();
    let field = |f: &str| format!("approvals.{f}");
    let mut auto = Vec::new();
    for (i, text) in raw.auto.iter().enumerate() {
        match parse_entry(text) {
            Ok(e) => auto.push((text.clone(), e)),
            Err(e) => sink.top(field(&format!("auto[{i}]")), e.to_string(), Some(text)),
        }
    }
    let positive = |v: Option<u64>, name: &str, sink: &mut Sink<'_>| -> Option<u64> {
        if v == Some(0) {
            sink.top(field(name), "must be at least 1", Some(name));
        }
        v
    };
    let webhook = raw
        .webhook
        .and_then(|w| webhook(w, rel, secrets, sink, warnings));
    ApprovalsConfig {
        max_pending: raw.max_pending.unwrap_or(d.max_pending).max(1),
        per_minute: raw.per_minute.unwrap_or(d.per_minute).max(1),
        reason_max: raw.reason_max.unwrap_or(d.reason_max).clamp(1, 4096),
        pending_ttl: positive(raw.pending_ttl_s, "pending_ttl_s", sink)
            .map_or(d.pending_ttl, Duration::from_secs),
        auto,
        auto_ttl: positive(raw.auto_ttl_s, "auto_ttl_s", sink)
            .map_or(d.auto_ttl, Duration::from_secs),
        webhook,
    }
}

/// `approvals.webhook`: its URL and the secret it signs with; `None` when the URL is wrong.
fn webhook(
    w: RawWebhook,
    rel: &dyn Fn(&str) -> PathBuf,
    secrets: Secrets,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) -> Option<Webhook> {
    let field = |f: &str| format!("approvals.{f}");
    let url = match w.url.parse::<http::Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => u,
        _ => {
            sink.top(
                field("webhook.url"),
                "must be an http:// or https:// URL",
                Some("url"),
            );
            return None;
        }
    };
    let path = rel(&w.secret_file);
    let secret = match std::fs::read(&path) {
        Ok(s) if !s.trim_ascii().is_empty() => s.trim_ascii().to_vec(),
        Ok(_) => {
            sink.top(
                field("webhook.secret_file"),
                "is empty",
                Some("secret_file"),
            );
            Vec::new()
        }
        Err(e) if secrets == Secrets::MayBeAbsent => {
            warnings.push(format!(
                "approvals.webhook.secret_file {}: {e}",
                path.display()
            ));
            Vec::new()
        }
        Err(e) => {
            sink.top(
                field("webhook.secret_file"),
                format!("cannot read {}: {e}", path.display()),
                Some("secret_file"),
            );
            Vec::new()
        }
    };
    Some(Webhook {
        url,
        secret,
        secret_file: path,
        timeout: Duration::from_millis(w.timeout_ms.unwrap_or(5_000).max(1)),
    })
}
