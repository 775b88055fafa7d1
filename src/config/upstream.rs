//! `upstream_proxy:` — a parent proxy every allowed connection goes through, after this
//! proxy's own decision (the parent never widens policy): `{ url: "http://host:port" |
//! "https://host:port", auth: { username, password_file }, ca_file, bypass: [entries] }`, at
//! the top level and per sandbox (a sandbox's own parent, or `direct`, replaces the top-level
//! one for it). The password comes from a file, never inline, and is held only as the ready
//! `Proxy-Authorization` value, which no `Debug` or message ever shows. An `https://` parent
//! is verified against the public roots plus `ca_file`; the password then travels only
//! inside TLS.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::{CertificateDer, ServerName};

use crate::policy::entry::{parse_entry, Entry, HostPattern};

use base64::Engine;
use serde::Deserialize;

/// `upstream_proxy:` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamProxy {
    /// `url`: `http://` or `https://` parent.
    pub url: String,
    /// `auth`.
    #[serde(default)]
    pub auth: Option<RawParentAuth>,
    /// `ca_file`: the CA of an `https://` parent.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// `bypass`: destinations dialled directly.
    #[serde(default)]
    pub bypass: Vec<String>,
}

/// `upstream_proxy.auth` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParentAuth {
    /// The user name.
    pub username: String,
    /// The file holding the password.
    pub password_file: String,
}

/// A sandbox's `upstream_proxy` as written: its own parent, or `direct`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawSandboxParent {
    /// `direct`.
    Direct(String),
    /// A parent of its own.
    Via(RawUpstreamProxy),
}

/// Which parent a sandbox's exchanges go through.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ParentChoice {
    /// The top-level `upstream_proxy`, if any.
    #[default]
    Inherit,
    /// None: dialled directly even when a top-level parent is set.
    Direct,
    /// Its own parent.
    Via(std::sync::Arc<UpstreamProxy>),
}

impl ParentChoice {
    /// The parent for this sandbox, given the top-level one.
    pub fn pick<'a>(
        &'a self,
        top: Option<&'a std::sync::Arc<UpstreamProxy>>,
    ) -> Option<&'a std::sync::Arc<UpstreamProxy>> {
        match self {
            ParentChoice::Inherit => top,
            ParentChoice::Direct => None,
            ParentChoice::Via(p) => Some(p),
        }
    }
}

/// Resolve a sandbox's `upstream_proxy`.
pub fn resolve_choice(
    raw: &RawSandboxParent,
    read_file: super::files::ReadFile<'_>,
    secrets: super::Secrets,
    warnings: &mut Vec<String>,
) -> Result<ParentChoice, Vec<String>> {
    match raw {
        RawSandboxParent::Direct(s) if s == "direct" => Ok(ParentChoice::Direct),
        RawSandboxParent::Direct(s) => Err(vec![format!(
            "`{s}`: expected `direct` or {{ url, auth, bypass }}"
        )]),
        RawSandboxParent::Via(r) => resolve(r, read_file, secrets, warnings)
            .map(|p| ParentChoice::Via(std::sync::Arc::new(p))),
    }
}

/// The parent proxy, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamProxy {
    /// Its host (a name, resolved by this proxy's resolver, or an address).
    pub host: String,
    /// The parent's port.
    pub port: u16,
    /// `Proxy-Authorization` for it, if it needs one.
    pub authorization: Option<ParentAuthorization>,
    /// What is dialled directly instead.
    pub bypass: Vec<BypassEntry>,
    /// TLS to the parent (`https://`).
    pub tls: Option<ParentTls>,
}

/// TLS to an `https://` parent, as described: the name its certificate must be valid for and
/// `ca_file`'s certificates (besides the public roots). The client configuration made from it
/// is built once, at run time, by [`crate::egress::parent`], and kept in `runtime`.
#[derive(Clone)]
pub struct ParentTls {
    /// The name the parent's certificate must carry.
    pub name: ServerName<'static>,
    /// The CAs trusted for it.
    pub ca: Vec<CertificateDer<'static>>,
    /// `ca_file`'s content: what a reload compares.
    ca_pem: Option<String>,
    /// Filled by the egress side on first use; opaque here.
    pub runtime: Arc<OnceLock<Arc<dyn Any + Send + Sync>>>,
}

impl ParentTls {
    fn new(host: &str, ca_pem: Option<String>) -> Result<ParentTls, String> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| format!("url: `{host}` is not a name TLS can verify"))?;
        let ca = match &ca_pem {
            Some(pem) => {
                super::files::certificates(pem.as_bytes()).map_err(|e| format!("ca_file: {e}"))?
            }
            None => Vec::new(),
        };
        Ok(ParentTls {
            name,
            ca,
            ca_pem,
            runtime: Arc::default(),
        })
    }
}

impl PartialEq for ParentTls {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.ca_pem == other.ca_pem
    }
}

impl fmt::Debug for ParentTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParentTls")
            .field("name", &self.name)
            .field("ca_file", &self.ca_pem.is_some())
            .finish()
    }
}

impl UpstreamProxy {
    /// How messages and records name it: `host:port`, never its credentials.
    pub fn shown(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// One `bypass` entry: the grammar of `network.egress` (names, `*.`/`**.` suffixes, label
/// globs, addresses and ranges, `localhost`, optional ports), parsed; what it matches is
/// [`crate::egress::parent::bypassed`].
#[derive(Clone)]
pub struct BypassEntry {
    text: String,
    entry: Entry,
    /// A label glob, compiled (labels as path segments, so `*` stays within one label).
    glob: Option<globset::GlobMatcher>,
}

impl BypassEntry {
    fn parse(text: &str) -> Result<BypassEntry, String> {
        let entry = parse_entry(text).map_err(|e| format!("bypass: `{text}`: {e}"))?;
        let glob = match &entry.host {
            HostPattern::Glob { pattern, .. } => Some(
                globset::GlobBuilder::new(&pattern.replace('.', "/"))
                    .literal_separator(true)
                    .build()
                    .map_err(|e| format!("bypass: `{text}`: {e}"))?
                    .compile_matcher(),
            ),
            _ => None,
        };
        Ok(BypassEntry {
            text: text.to_string(),
            entry,
            glob,
        })
    }

    /// The entry, in `network.egress`'s grammar.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// A label glob's compiled form (labels as path segments).
    pub fn glob(&self) -> Option<&globset::GlobMatcher> {
        self.glob.as_ref()
    }
}

impl PartialEq for BypassEntry {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl fmt::Debug for BypassEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A ready `Proxy-Authorization` value (`Basic …`); shown as `<redacted>`.
#[derive(Clone, PartialEq)]
pub struct ParentAuthorization(String);

impl ParentAuthorization {
    /// The header value (never logged).
    pub fn value(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ParentAuthorization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Resolve `upstream_proxy`. `read_file` reads a file relative to the configuration; under
/// [`super::Secrets::MayBeAbsent`] an unreadable password file is a warning (review tools).
pub fn resolve(
    raw: &RawUpstreamProxy,
    read_file: super::files::ReadFile<'_>,
    secrets: super::Secrets,
    warnings: &mut Vec<String>,
) -> Result<UpstreamProxy, Vec<String>> {
    let mut errors = Vec::new();
    let (https, host, port) = parent_url(raw.url.trim(), &mut errors)?;
    let mut tls = None;
    match (&raw.ca_file, https) {
        (Some(_), false) => errors.push("ca_file: only for an https:// parent".into()),
        (ca_file, true) if !host.is_empty() => {
            let ca_pem = ca_pem(ca_file.as_deref(), read_file, secrets, warnings);
            match ca_pem.and_then(|pem| ParentTls::new(&host.to_ascii_lowercase(), pem)) {
                Ok(t) => tls = Some(t),
                Err(e) => errors.push(e),
            }
        }
        _ => {}
    }
    let mut bypass = Vec::new();
    for b in &raw.bypass {
        match BypassEntry::parse(b.trim()) {
            Ok(entry) => bypass.push(entry),
            Err(e) => errors.push(e),
        }
    }
    let authorization = raw
        .auth
        .as_ref()
        .and_then(|auth| authorization(auth, read_file, secrets, &mut errors, warnings));
    if errors.is_empty() {
        Ok(UpstreamProxy {
            host: host.to_ascii_lowercase(),
            port,
            authorization,
            bypass,
            tls,
        })
    } else {
        Err(errors)
    }
}

/// The parent's URL read: whether it is `https`, its host and port (an error for each part
/// that is wrong; `Err` when the scheme is not one of the two).
fn parent_url<'u>(
    url: &'u str,
    errors: &mut Vec<String>,
) -> Result<(bool, &'u str, u16), Vec<String>> {
    let (https, rest) = match url.split_once("://") {
        Some(("http", rest)) => (false, rest),
        Some(("https", rest)) => (true, rest),
        _ => {
            return Err(vec![format!(
                "url `{url}`: expected http://host:port or https://host:port"
            )])
        }
    };
    let authority = rest.trim_end_matches('/');
    if authority.contains('@') {
        errors.push("url: no credentials in the URL; use auth: { username, password_file }".into());
    }
    if authority.contains('/') || authority.contains('?') {
        errors.push(format!("url `{url}`: only http://host:port, no path"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse::<u16>().ok(),
        ),
        None => (authority, None),
    };
    let port = match port {
        Some(p) if p > 0 => p,
        _ => {
            errors.push(format!(
                "url `{url}`: give the parent's port (http://host:port)"
            ));
            0
        }
    };
    if host.is_empty() {
        errors.push(format!("url `{url}`: no host"));
    }
    Ok((https, host, port))
}

/// `ca_file`'s text, if given. Like every file a review tool may not see, an unreadable one
/// is a warning there and an error to run.
fn ca_pem(
    ca_file: Option<&str>,
    read_file: super::files::ReadFile<'_>,
    secrets: super::Secrets,
    warnings: &mut Vec<String>,
) -> Result<Option<String>, String> {
    match ca_file.map(read_file) {
        None => Ok(None),
        Some(Ok(pem)) => Ok(Some(pem)),
        Some(Err(e)) if secrets == super::Secrets::MayBeAbsent => {
            warnings.push(format!(
                "upstream_proxy: ca_file: {e}; {}",
                super::ABSENT_SECRET_NOTE
            ));
            Ok(None)
        }
        Some(Err(e)) => Err(format!("ca_file: {e}")),
    }
}

/// `upstream_proxy.auth`: the ready `Proxy-Authorization` value, from the username and the
/// password file. An unreadable file is an error, or under [`super::Secrets::MayBeAbsent`] a
/// warning.
fn authorization(
    auth: &RawParentAuth,
    read_file: super::files::ReadFile<'_>,
    secrets: super::Secrets,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<ParentAuthorization> {
    if auth.username.is_empty() || auth.username.contains(':') {
        errors.push("auth.username: not empty, no `:`".into());
    }
    match read_file(&auth.password_file) {
        Ok(p) => {
            let p = p.trim_end_matches(['\r', '\n']);
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{}:{p}", auth.username));
            Some(ParentAuthorization(format!("Basic {token}")))
        }
        Err(e) => {
            match secrets {
                super::Secrets::Required => errors.push(format!("auth.password_file: {e}")),
                super::Secrets::MayBeAbsent => warnings.push(format!(
                    "upstream_proxy: auth.password_file: {e}; {}",
                    super::ABSENT_SECRET_NOTE
                )),
            }
            None
        }
    }
}

#[cfg(test)]
mod tests;
