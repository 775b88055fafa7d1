//! Which sandbox a connection belongs to (DESIGN §4), tried in order — the first method that
//! applies decides, and a failed credential never falls through to a weaker method:
//! 1. `Proxy-Authorization: Basic` or a SOCKS5 username/password (RFC 1929) (user = sandbox
//!    id, password = token; SHA-256 compared in constant time), 2. the client's source address in a sandbox's `sources`, 3. the
//!    listener's `default_sandbox`, 4. nothing → `auth_required` (407 with a challenge).
//!
//! Tokens are never stored, logged or echoed: only their digests are compared.
//!
//! The user may carry a sub-identity the runtime vouches for (DESIGN §4, "Attribution"):
//! `sandbox~exec` or `sandbox~parent~exec` (for an agent harness, the tool call's id and tool
//! name), with the sandbox's own token. A malformed one is a failed authentication, never a
//! fall-through to the sandbox alone.

use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::policy::process::Vouched;
use crate::policy::Reason;
use crate::sandboxes::set::{PolicySet, Sandbox};

pub use crate::audit::record::Method;

/// The sandbox and how it was found.
#[derive(Debug, Clone)]
pub struct Identified {
    pub sandbox: Arc<Sandbox>,
    pub method: Method,
    /// What was presented, so the identity can be checked again under a later policy.
    pub proof: Proof,
    /// The command the runtime named in the credential's user (`sandbox~exec`), if any.
    pub vouched: Option<Vouched>,
}

/// How a connection proved which sandbox it belongs to; it stays valid only while a policy
/// set would still identify it the same way ([`Proof::still_identifies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// A verified client certificate named the sandbox (valid while the sandbox exists).
    Certificate,
    /// The SHA-256 of the token presented in `Proxy-Authorization`.
    Token([u8; 32]),
    /// The client's source address matched the sandbox's `sources`.
    Source(IpAddr),
    /// No credential and no source match: the listener's default sandbox.
    Default(IpAddr),
}

impl Proof {
    /// Whether `set` would still identify this client as `sandbox` (a rotated token, a moved
    /// `sources` range or a new sandbox claiming the address end the identity).
    pub fn still_identifies(&self, set: &PolicySet, sandbox: &str) -> bool {
        let Some(sb) = set.get(sandbox) else {
            return false;
        };
        match self {
            Proof::Certificate => true,
            Proof::Token(presented) => sb
                .binding
                .token_sha256
                .is_some_and(|expected| bool::from(presented.ct_eq(&expected))),
            Proof::Source(ip) => set.by_source(*ip).is_some_and(|s| s.binding.id == sandbox),
            Proof::Default(ip) => set.by_source(*ip).is_none(),
        }
    }
}

/// A connection no sandbox could be found for: the reason (`auth_required`, `auth_failed`,
/// `unknown_sandbox`) and the method tried, nothing more — the claimed id is not echoed into
/// labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unidentified {
    pub reason: Reason,
    pub method: Method,
}

/// Identify a connection by the sandbox id its verified client certificate names: a
/// configured sandbox, or a refusal (never a fall-through to a weaker method).
pub fn by_certificate(set: &PolicySet, named: Option<&str>) -> Result<Identified, Unidentified> {
    let refused = Unidentified {
        reason: Reason::UnknownSandbox,
        method: Method::Certificate,
    };
    let sandbox = named.and_then(|id| set.get(id)).ok_or(refused)?;
    Ok(Identified {
        sandbox: sandbox.clone(),
        method: Method::Certificate,
        proof: Proof::Certificate,
        vouched: None,
    })
}

/// A sandbox id and token, as a client presented them.
#[derive(Debug, Clone, Copy)]
pub enum Credentials<'a> {
    /// A raw `Proxy-Authorization` header value (`Basic base64(id:token)`).
    Header(&'a [u8]),
    /// A SOCKS5 username and password (RFC 1929), as sent.
    Login { user: &'a [u8], password: &'a [u8] },
}

/// Identify a connection by what it presented, if anything, then its source address.
pub fn identify(
    set: &PolicySet,
    credentials: Option<Credentials<'_>>,
    client: IpAddr,
    default_sandbox: Option<&str>,
) -> Result<Identified, Unidentified> {
    if let Some(credentials) = credentials {
        let refused = |reason| Unidentified {
            reason,
            method: Method::Token,
        };
        let (user, token) = match credentials {
            Credentials::Header(value) => parse_basic(value),
            Credentials::Login { user, password } => std::str::from_utf8(user)
                .ok()
                .zip(std::str::from_utf8(password).ok())
                .map(|(u, p)| (u.to_string(), p.to_string())),
        }
        .ok_or(refused(Reason::AuthFailed))?;
        let (user, vouched) = split_vouched(&user).ok_or(refused(Reason::AuthFailed))?;
        let sandbox = set.get(user).ok_or(refused(Reason::UnknownSandbox))?;
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let ok = match &sandbox.binding.token_sha256 {
            Some(expected) => bool::from(presented.ct_eq(expected)),
            None => false,
        };
        return if ok {
            Ok(Identified {
                sandbox: sandbox.clone(),
                method: Method::Token,
                proof: Proof::Token(presented),
                vouched,
            })
        } else {
            Err(refused(Reason::AuthFailed))
        };
    }
    if let Some(sandbox) = set.by_source(client) {
        return Ok(Identified {
            sandbox: sandbox.clone(),
            method: Method::Source,
            proof: Proof::Source(client),
            vouched: None,
        });
    }
    if let Some(id) = default_sandbox {
        if let Some(sandbox) = set.get(id) {
            return Ok(Identified {
                sandbox: sandbox.clone(),
                method: Method::Default,
                proof: Proof::Default(client),
                vouched: None,
            });
        }
    }
    Err(Unidentified {
        reason: Reason::AuthRequired,
        method: Method::None,
    })
}

/// The longest exec name, and the most names a chain may have.
const EXEC_MAX: usize = 128;
const CHAIN_MAX: usize = 8;

/// `sandbox~parent~exec` → (`sandbox`, the vouched exec); a plain id → (id, none). `None`
/// for a malformed chain: an empty name, too long or too many, or a byte outside
/// `[A-Za-z0-9._@/-]` (no `:`, which ends the user in Basic authentication).
fn split_vouched(user: &str) -> Option<(&str, Option<Vouched>)> {
    let Some((sandbox, chain)) = user.split_once('~') else {
        return Some((user, None));
    };
    let names: Vec<&str> = chain.split('~').collect();
    let valid = |n: &&str| {
        !n.is_empty()
            && n.len() <= EXEC_MAX
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._@/-".contains(&b))
    };
    if names.len() > CHAIN_MAX || !names.iter().all(valid) {
        return None;
    }
    let (exec, parents) = names.split_last()?;
    let vouched = Vouched {
        exec: (*exec).into(),
        parent: (!parents.is_empty()).then(|| parents.join("~").into()),
    };
    Some((sandbox, Some(vouched)))
}

/// `Basic base64(user:password)` → (user, password). Anything else is `None`.
fn parse_basic(value: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use std::path::Path;

    fn set() -> PolicySet {
        let digest = hex::encode(Sha256::digest(b"tok-a"));
        let text = format!(
            "listen: {{ default_sandbox: side }}\nsandboxes:\n  - {{ id: a, auth: {{ token_sha256: {digest} }}, policy: {{ provider: local, config: {{}} }} }}\n  - {{ id: b, sources: [10.0.0.0/8], policy: {{ provider: local, config: {{}} }} }}\n  - {{ id: side, policy: {{ provider: local, config: {{}} }} }}\n"
        );
        let c = load_str(&text, "t", Path::new("."), None).unwrap();
        PolicySet::compile(&c, &[], vec![]).unwrap()
    }

    fn basic(user: &str, pass: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
        .into_bytes()
    }

    #[test]
    fn order_and_no_fallthrough() {
        let s = set();
        let src: IpAddr = "10.1.1.1".parse().unwrap();
        let other: IpAddr = "192.0.2.1".parse().unwrap();
        let id = identify(
            &s,
            Some(Credentials::Header(&basic("a", "tok-a"))),
            src,
            Some("side"),
        )
        .unwrap();
        assert_eq!(
            (id.sandbox.binding.id.as_str(), id.method),
            ("a", Method::Token)
        );
        // A wrong token does not fall through to the source or the default.
        assert_eq!(
            identify(
                &s,
                Some(Credentials::Header(&basic("a", "nope"))),
                src,
                Some("side")
            )
            .unwrap_err()
            .reason,
            Reason::AuthFailed
        );
        assert_eq!(
            identify(
                &s,
                Some(Credentials::Header(&basic("ghost", "x"))),
                src,
                None
            )
            .unwrap_err()
            .reason,
            Reason::UnknownSandbox
        );
        // A sandbox without a token cannot be claimed with credentials.
        assert_eq!(
            identify(&s, Some(Credentials::Header(&basic("b", ""))), src, None)
                .unwrap_err()
                .reason,
            Reason::AuthFailed
        );
        assert_eq!(
            identify(&s, Some(Credentials::Header(b"Bearer xyz")), src, None)
                .unwrap_err()
                .reason,
            Reason::AuthFailed
        );
        assert_eq!(
            identify(&s, Some(Credentials::Header(b"Basic !!!")), src, None)
                .unwrap_err()
                .reason,
            Reason::AuthFailed
        );
        let id = identify(&s, None, src, Some("side")).unwrap();
        assert_eq!(
            (id.sandbox.binding.id.as_str(), id.method),
            ("b", Method::Source)
        );
        let id = identify(&s, None, other, Some("side")).unwrap();
        assert_eq!(
            (id.sandbox.binding.id.as_str(), id.method),
            ("side", Method::Default)
        );
        assert_eq!(
            identify(&s, None, other, None).unwrap_err().reason,
            Reason::AuthRequired
        );
    }

    /// A SOCKS5 login is the same id and token, judged the same way.
    #[test]
    fn a_socks_login_is_an_id_and_token() {
        let s = set();
        let src: IpAddr = "10.1.1.1".parse().unwrap();
        let login = |user: &'static str, password: &'static str| {
            Some(Credentials::Login {
                user: user.as_bytes(),
                password: password.as_bytes(),
            })
        };
        let id = identify(&s, login("a", "tok-a"), src, None).unwrap();
        assert_eq!(id.method, Method::Token);
        let reason = |c| identify(&s, c, src, Some("side")).unwrap_err().reason;
        assert_eq!(reason(login("a", "nope")), Reason::AuthFailed);
        assert_eq!(reason(login("ghost", "x")), Reason::UnknownSandbox);
        let bad = Some(Credentials::Login {
            user: b"a",
            password: b"\xff",
        });
        assert_eq!(reason(bad), Reason::AuthFailed);
    }

    /// `sandbox~exec` names a command the runtime vouches for, with the sandbox's own token;
    /// a malformed chain fails authentication instead of falling back to the sandbox.
    #[test]
    fn a_vouched_exec_rides_on_the_sandbox_token() {
        let s = set();
        let src: IpAddr = "192.0.2.1".parse().unwrap();
        let who = |user: &str, token: &str| {
            identify(
                &s,
                Some(Credentials::Header(&basic(user, token))),
                src,
                None,
            )
        };
        let id = who("a~agent~call_7.web_fetch", "tok-a").unwrap();
        assert_eq!(id.sandbox.binding.id.as_str(), "a");
        let v = id.vouched.unwrap();
        assert_eq!(
            (&*v.exec, v.parent.as_deref()),
            ("call_7.web_fetch", Some("agent"))
        );
        assert!(who("a", "tok-a").unwrap().vouched.is_none());
        assert_eq!(who("a~x", "nope").unwrap_err().reason, Reason::AuthFailed);
        for bad in ["a~", "a~~x", "a~x y", "a~1~2~3~4~5~6~7~8~9"] {
            assert_eq!(
                who(bad, "tok-a").unwrap_err().reason,
                Reason::AuthFailed,
                "{bad}"
            );
        }
        assert_eq!(
            who(&format!("a~{}", "x".repeat(129)), "tok-a")
                .unwrap_err()
                .reason,
            Reason::AuthFailed
        );
        assert_eq!(
            who("ghost~x", "tok-a").unwrap_err().reason,
            Reason::UnknownSandbox
        );
    }
}
