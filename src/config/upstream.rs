//! `upstream_proxy:` — a parent proxy every allowed connection goes through, after this
//! proxy's own decision (the parent never widens policy): `{ url: "http://host:port", auth:
//! { username, password_file }, bypass: [names] }`, at the top level and per sandbox (a
//! sandbox's own parent, or `direct`, replaces the top-level one for it). The password comes from a file, never
//! inline, and is held only as the ready `Proxy-Authorization` value, which no `Debug` or
//! message ever shows. `https://` parents are refused with a message (not supported yet).

use std::fmt;

use base64::Engine;
use serde::Deserialize;

/// `upstream_proxy:` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamProxy {
    pub url: String,
    #[serde(default)]
    pub auth: Option<RawParentAuth>,
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub bypass: Vec<String>,
}

/// `upstream_proxy.auth` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParentAuth {
    pub username: String,
    pub password_file: String,
}

/// A sandbox's `upstream_proxy` as written: its own parent, or `direct`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawSandboxParent {
    Direct(String),
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
    pub fn pick<'a>(&'a self, top: Option<&'a UpstreamProxy>) -> Option<&'a UpstreamProxy> {
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
    read_file: &dyn Fn(&str) -> Result<String, String>,
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
    pub port: u16,
    /// `Proxy-Authorization` for it, if it needs one.
    pub authorization: Option<ParentAuthorization>,
    /// Host names (exact, or `*.suffix`) dialled directly instead.
    pub bypass: Vec<String>,
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

    /// Whether `host` (normalised, lower case) is dialled directly.
    pub fn bypassed(&self, host: &str) -> bool {
        self.bypass.iter().any(|b| match b.strip_prefix("*.") {
            Some(suffix) => host
                .strip_suffix(suffix)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            None => b == host,
        })
    }
}

/// A ready `Proxy-Authorization` value (`Basic …`); shown as `<redacted>`.
#[derive(Clone, PartialEq)]
pub struct ParentAuthorization(String);

impl ParentAuthorization {
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
    read_file: &dyn Fn(&str) -> Result<String, String>,
    secrets: super::Secrets,
    warnings: &mut Vec<String>,
) -> Result<UpstreamProxy, Vec<String>> {
    let mut errors = Vec::new();
    let url = raw.url.trim();
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => {
            return Err(vec![
                "url: https:// parents are not supported yet; use the parent's http:// port".into(),
            ])
        }
        _ => return Err(vec![format!("url `{url}`: expected http://host:port")]),
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
    if raw.ca_file.is_some() {
        errors.push("ca_file: only for an https:// parent (not supported yet)".into());
    }
    let mut bypass = Vec::new();
    for b in &raw.bypass {
        let b = b.trim().trim_end_matches('.').to_ascii_lowercase();
        let name = b.strip_prefix("*.").unwrap_or(&b);
        let valid = !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            });
        if valid {
            bypass.push(b);
        } else {
            errors.push(format!(
                "bypass: `{b}` — a host name, or *.suffix (address rules are not supported here)"
            ));
        }
    }
    let authorization = match &raw.auth {
        None => None,
        Some(auth) => {
            if auth.username.is_empty() || auth.username.contains(':') {
                errors.push("auth.username: not empty, no `:`".into());
            }
            match read_file(&auth.password_file) {
                Ok(p) => {
                    let p = p.trim_end_matches(['\r', '\n']);
                    let token = base64::engine::general_purpose::STANDARD
                        .encode(format!("{}:{p}", auth.username));
                    Some(ParentAuthorization(format!("Basic {token}")))
                }
                Err(e) => match secrets {
                    super::Secrets::Required => {
                        errors.push(format!("auth.password_file: {e}"));
                        None
                    }
                    super::Secrets::MayBeAbsent => {
                        warnings.push(format!(
                            "upstream_proxy: auth.password_file: {e}; not needed to review the policy, but `run` refuses to start without it"
                        ));
                        None
                    }
                },
            }
        }
    };
    if errors.is_empty() {
        Ok(UpstreamProxy {
            host: host.to_ascii_lowercase(),
            port,
            authorization,
            bypass,
        })
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(url: &str) -> RawUpstreamProxy {
        RawUpstreamProxy {
            url: url.into(),
            auth: Some(RawParentAuth {
                username: "agent".into(),
                password_file: "pw".into(),
            }),
            ca_file: None,
            bypass: vec!["internal.test".into(), "*.corp.test".into()],
        }
    }

    fn read(_: &str) -> Result<String, String> {
        Ok("s3cret\n".into())
    }

    #[test]
    fn a_parent_resolves_and_never_shows_its_password() {
        let mut w = Vec::new();
        let p = resolve(
            &raw("http://Squid.test:3128"),
            &read,
            super::super::Secrets::Required,
            &mut w,
        )
        .unwrap();
        assert_eq!((p.host.as_str(), p.port), ("squid.test", 3128));
        let auth = p.authorization.clone().unwrap();
        assert_eq!(auth.value(), "Basic YWdlbnQ6czNjcmV0");
        assert!(!format!("{p:?}").contains("YWdlbnQ6czNjcmV0"));
        assert!(p.bypassed("internal.test") && p.bypassed("a.corp.test"));
        assert!(!p.bypassed("corp.test") && !p.bypassed("xcorp.test") && !p.bypassed("other.test"));
        assert_eq!(
            resolve(
                &raw("http://[::1]:8080"),
                &read,
                super::super::Secrets::Required,
                &mut w
            )
            .unwrap()
            .shown(),
            "[::1]:8080"
        );
    }

    #[test]
    fn bad_parents_are_refused_with_a_reason() {
        let mut w = Vec::new();
        for (url, why) in [
            ("https://squid.test:3128", "not supported"),
            ("socks5://squid.test:1080", "expected http"),
            ("http://user:pw@squid.test:3128", "no credentials"),
            ("http://squid.test", "port"),
            ("http://squid.test:3128/path", "no path"),
        ] {
            let e = resolve(&raw(url), &read, super::super::Secrets::Required, &mut w).unwrap_err();
            assert!(e.join(" ").contains(why), "{url}: {e:?}");
        }
        let missing = |_: &str| Err("cannot read pw: no such file".to_string());
        let e = resolve(
            &raw("http://squid.test:3128"),
            &missing,
            super::super::Secrets::Required,
            &mut w,
        )
        .unwrap_err();
        assert!(e[0].contains("password_file"), "{e:?}");
        assert!(resolve(
            &raw("http://squid.test:3128"),
            &missing,
            super::super::Secrets::MayBeAbsent,
            &mut w
        )
        .is_ok());
        assert_eq!(w.len(), 1);
    }
}
