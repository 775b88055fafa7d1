//! `decider:` — an external decider the proxy asks after its own policy allowed an exchange
//! (top level, or the same key in a sandbox entry, which takes precedence) — and `dlp:`, the
//! built-in scanner of request bodies to terminated hosts (a sandbox entry's key). What they
//! do is [`crate::decider`]'s and `crate::pipeline::dlp`'s; here they are validated.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// Where the decider listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeciderUrl {
    /// `http://host:port/path` (loopback or a trusted network: the protocol is not
    /// encrypted).
    Http {
        /// `host:port`.
        authority: String,
        /// The path asked.
        path: String,
    },
    /// `unix:/path/to/socket` (HTTP/1.1 over it, path `/`), or `unix:/sock:/path`.
    Unix {
        /// The socket's path.
        socket: String,
        /// The HTTP path asked.
        path: String,
    },
}

impl DeciderUrl {
    /// The addresses a sandbox could reach this decider at, when its URL names them (an IP
    /// literal, or `localhost`); a name is protected where it resolves, at dial time.
    pub fn addresses(&self) -> Vec<std::net::SocketAddr> {
        match self {
            DeciderUrl::Http { authority, .. } => authority_addresses(authority),
            DeciderUrl::Unix { .. } => Vec::new(),
        }
    }
}

/// The socket addresses `host:port` names without a lookup (port 80 when none is given).
pub fn authority_addresses(authority: &str) -> Vec<std::net::SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let Ok(a) = authority.parse::<http::uri::Authority>() else {
        return Vec::new();
    };
    let port = a.port_u16().unwrap_or(80);
    let host = a.host().trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) if host.eq_ignore_ascii_case("localhost") => vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
        ],
        Err(_) => Vec::new(),
    }
}

/// The HMAC key of the deciders' questions (never shown).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DeciderSecret(pub Arc<[u8]>);

impl std::fmt::Debug for DeciderSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What a failed decider means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Refuse the exchange.
    Deny,
    /// Let it through (recorded).
    Allow,
}

/// A decider, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeciderConfig {
    /// Where the decider listens.
    pub url: DeciderUrl,
    /// For the whole answer (each ask of a `need_body` exchange has its own).
    pub timeout: Duration,
    /// The most body bytes sent when the decider asks for the body.
    pub need_body_max: usize,
    /// What a failure to answer does.
    pub on_error: OnError,
    /// Asks in flight at once, across the process; past it an ask is a failure.
    pub max_in_flight: usize,
    /// The key every question is signed with (`decider.secret_file`, top level; every
    /// decider's questions are signed with it), so a decider can tell the proxy's questions
    /// from forged ones.
    pub secret: Option<DeciderSecret>,
    /// Asks in flight at once for one sandbox (its share): past it an ask is refused whatever
    /// `on_error` says, and so is one that fails while its sandbox is at its share — a
    /// sandbox cannot make the decider fail open, or take the permits its neighbours need.
    pub max_in_flight_per_sandbox: usize,
}

/// `decider:` as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawDecider {
    /// `url`.
    pub url: String,
    /// `timeout_ms`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `need_body_max`.
    #[serde(default)]
    pub need_body_max: Option<u64>,
    /// `on_error`: `deny` or `allow`.
    #[serde(default)]
    pub on_error: Option<String>,
    /// `max_in_flight`.
    #[serde(default)]
    pub max_in_flight: Option<u64>,
    /// `max_in_flight_per_sandbox`.
    #[serde(default)]
    pub max_in_flight_per_sandbox: Option<u64>,
    /// Top level only: the file holding the key questions are signed with.
    #[serde(default)]
    pub secret_file: Option<String>,
}

/// The top-level decider's `secret_file`, read into `d` (errors name the file).
pub(super) fn read_secret(
    d: Option<&mut Arc<DeciderConfig>>,
    raw: &RawDecider,
    rel: &dyn Fn(&str) -> std::path::PathBuf,
    errors: &mut Vec<String>,
) {
    let (Some(d), Some(f)) = (d, &raw.secret_file) else {
        return;
    };
    match std::fs::read(rel(f)) {
        Ok(key) if !key.trim_ascii().is_empty() => {
            let key: Arc<[u8]> = key.trim_ascii().into();
            Arc::make_mut(d).secret = Some(DeciderSecret(key));
        }
        Ok(_) => errors.push(format!("decider.secret_file {f}: empty")),
        Err(e) => errors.push(format!("decider.secret_file {f}: {e}")),
    }
}

/// What `validate` says of a top-level decider under `on_error: allow`: whom `allow` covers.
pub fn allow_warning(d: Option<&DeciderConfig>) -> Option<String> {
    let d = d.filter(|d| d.on_error == OnError::Allow)?;
    Some(format!(
        "decider.on_error: allow lets an exchange through only when the decider fails for reasons not the sandbox's own (refused connection, down, a broken answer); a sandbox past its share ({} of {} asks in flight), or busy or slow while it holds its whole share, is refused",
        d.max_in_flight_per_sandbox, d.max_in_flight
    ))
}

/// Validate `decider:`; errors say which key.
pub fn resolve_decider(raw: &RawDecider, errors: &mut Vec<String>) -> Option<Arc<DeciderConfig>> {
    let url = decider_url(&raw.url, errors)?;
    let on_error = match raw.on_error.as_deref() {
        None | Some("deny") => OnError::Deny,
        Some("allow") => OnError::Allow,
        Some(o) => {
            errors.push(format!("decider.on_error `{o}`: deny or allow"));
            return None;
        }
    };
    let timeout_ms = raw.timeout_ms.unwrap_or(500);
    if !(1..=60_000).contains(&timeout_ms) {
        errors.push("decider.timeout_ms: 1 to 60000".into());
        return None;
    }
    let need_body_max = raw.need_body_max.unwrap_or(64 * 1024);
    if need_body_max > 16 << 20 {
        errors.push("decider.need_body_max: at most 16 MiB".into());
        return None;
    }
    let max_in_flight = raw.max_in_flight.unwrap_or(256);
    if !(1..=100_000).contains(&max_in_flight) {
        errors.push("decider.max_in_flight: 1 to 100000".into());
        return None;
    }
    // A quarter of the pool by default: four sandboxes at their share leave none for a fifth
    // only when the pool is that small.
    let per_sandbox = raw
        .max_in_flight_per_sandbox
        .unwrap_or((max_in_flight / 4).max(1));
    if !(1..=max_in_flight).contains(&per_sandbox) {
        errors.push(format!(
            "decider.max_in_flight_per_sandbox: 1 to max_in_flight ({max_in_flight})"
        ));
        return None;
    }
    Some(Arc::new(DeciderConfig {
        url,
        timeout: Duration::from_millis(timeout_ms),
        need_body_max: usize::try_from(need_body_max).unwrap_or(usize::MAX),
        on_error,
        max_in_flight: usize::try_from(max_in_flight).unwrap_or(usize::MAX),
        max_in_flight_per_sandbox: usize::try_from(per_sandbox).unwrap_or(usize::MAX),
        secret: None,
    }))
}

/// `decider.url`: `http://host:port/path` or `unix:/socket[:/path]`.
fn decider_url(url: &str, errors: &mut Vec<String>) -> Option<DeciderUrl> {
    if let Some(rest) = url.strip_prefix("unix:") {
        let (socket, path) = match rest.split_once(":/") {
            Some((s, p)) => (s.to_string(), format!("/{p}")),
            None => (rest.to_string(), "/".to_string()),
        };
        if !socket.starts_with('/') {
            errors.push(format!("decider.url `{}`: unix:/absolute/socket", url));
            return None;
        }
        Some(DeciderUrl::Unix { socket, path })
    } else {
        match url.parse::<http::Uri>() {
            Ok(u) if u.scheme_str() == Some("http") && u.authority().is_some() => {
                Some(DeciderUrl::Http {
                    authority: u.authority().map(|a| a.to_string()).unwrap_or_default(),
                    path: u
                        .path_and_query()
                        .map(|p| p.to_string())
                        .unwrap_or("/".into()),
                })
            }
            _ => {
                errors.push(format!(
                    "decider.url `{}`: http://host:port/path or unix:/socket",
                    url
                ));
                None
            }
        }
    }
}

/// What a DLP rule does on a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlpAction {
    /// The request is cut (`dlp_blocked`).
    Deny,
    /// Recorded only.
    Report,
}

/// One named pattern.
#[derive(Debug, Clone)]
pub struct DlpRule {
    /// The rule's name (records).
    pub name: String,
    /// What it matches.
    pub pattern: regex::bytes::Regex,
    /// What a match does.
    pub action: DlpAction,
}

/// `dlp:` of a sandbox, resolved.
#[derive(Debug, Clone)]
pub struct DlpConfig {
    /// The named rules.
    pub rules: Vec<DlpRule>,
    /// The high-entropy token detector: tokens at least `min_length` long whose Shannon
    /// entropy is at least `bits_per_char`.
    pub entropy: Option<(usize, f64, DlpAction)>,
    /// Bytes of each request body scanned.
    pub max_bytes: u64,
}

impl PartialEq for DlpConfig {
    fn eq(&self, o: &Self) -> bool {
        self.max_bytes == o.max_bytes
            && self.entropy == o.entropy
            && self.rules.len() == o.rules.len()
            && self.rules.iter().zip(&o.rules).all(|(a, b)| {
                a.name == b.name && a.action == b.action && a.pattern.as_str() == b.pattern.as_str()
            })
    }
}

/// `dlp:` as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawDlp {
    /// `rules`.
    #[serde(default)]
    pub rules: Vec<RawDlpRule>,
    /// `entropy`: the high-entropy token detector.
    #[serde(default)]
    pub entropy: Option<RawEntropy>,
    /// `max_bytes`: how much of a body is scanned.
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// A DLP rule as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawDlpRule {
    /// `name`.
    pub name: String,
    /// `pattern` (a regular expression).
    pub pattern: String,
    /// `action`: `deny` or `report`.
    #[serde(default)]
    pub action: Option<String>,
}

/// `entropy:` as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawEntropy {
    /// `min_length`: the shortest token judged.
    #[serde(default)]
    pub min_length: Option<u64>,
    /// `bits_per_char`: the entropy at or above which it matches.
    #[serde(default)]
    pub bits_per_char: Option<f64>,
    /// `action`: `deny` or `report`.
    #[serde(default)]
    pub action: Option<String>,
}

fn action(a: Option<&str>, at: &str, errors: &mut Vec<String>) -> DlpAction {
    match a {
        None | Some("deny") => DlpAction::Deny,
        Some("report") => DlpAction::Report,
        Some(o) => {
            errors.push(format!("{at}.action `{o}`: deny or report"));
            DlpAction::Deny
        }
    }
}

/// Validate `dlp:`.
pub fn resolve_dlp(raw: &RawDlp, errors: &mut Vec<String>) -> Option<Arc<DlpConfig>> {
    let before = errors.len();
    let mut rules = Vec::new();
    for (i, r) in raw.rules.iter().enumerate() {
        let at = format!("dlp.rules[{i}]");
        if r.name.is_empty() || r.name.len() > 64 {
            errors.push(format!("{at}.name: 1 to 64 characters"));
        }
        let pattern = regex::bytes::RegexBuilder::new(&r.pattern)
            .size_limit(1 << 20)
            .build();
        match pattern {
            Ok(pattern) => rules.push(DlpRule {
                name: r.name.clone(),
                pattern,
                action: action(r.action.as_deref(), &at, errors),
            }),
            Err(e) => errors.push(format!("{at}.pattern: {e}")),
        }
    }
    let entropy = raw.entropy.as_ref().map(|e| {
        (
            usize::try_from(e.min_length.unwrap_or(32))
                .unwrap_or(32)
                .clamp(8, 4096),
            e.bits_per_char.unwrap_or(4.5),
            action(e.action.as_deref(), "dlp.entropy", errors),
        )
    });
    (errors.len() == before).then(|| {
        Arc::new(DlpConfig {
            rules,
            entropy,
            max_bytes: raw.max_bytes.unwrap_or(1 << 20),
        })
    })
}

/// What narrows or marks a sandbox's exchanges beyond its policy.
pub(super) type Guards = (
    Option<Arc<DeciderConfig>>,
    Option<Arc<DlpConfig>>,
    Option<Arc<super::identity_token::IdentityToken>>,
);

/// A sandbox's decider (its own, else the top-level one), body scanner and identity token;
/// errors go to `sink` at the sandbox's line.
pub(super) fn of_binding(
    raw: &super::raw::RawBinding,
    defaults: &super::Defaults,
    (sb, line): (Option<&str>, usize),
    sink: &mut super::error::Sink<'_>,
) -> Guards {
    let mut errors = Vec::new();
    let decider = match &raw.decider {
        Some(d) if d.secret_file.is_some() => {
            errors.push("decider.secret_file: set it on the top-level decider (every decider's questions are signed with it)".into());
            None
        }
        Some(d) => resolve_decider(d, &mut errors).map(|mut own| {
            // Signed with the top-level key, like every question.
            Arc::make_mut(&mut own).secret =
                defaults.decider.as_ref().and_then(|t| t.secret.clone());
            own
        }),
        None => defaults.decider.clone(),
    };
    let dlp = raw.dlp.as_ref().and_then(|d| resolve_dlp(d, &mut errors));
    let identity = raw
        .identity_token
        .as_ref()
        .and_then(|t| super::identity_token::resolve_token(t, &mut errors));
    for e in errors {
        sink.push(sb, "decider/dlp/identity_token", e, None, line);
    }
    (decider, dlp, identity)
}
