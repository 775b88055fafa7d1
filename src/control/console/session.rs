//! Who is signed in to the console: sign-in with the admin token, a user's own token or the
//! client certificate the TLS admin listener verified; then a session cookie (`HttpOnly`,
//! `SameSite=Strict`, `Secure` on TLS, `Path=/ui/`, bounded lifetime) whose value is random
//! and kept here only as its SHA-256; each session has its own CSRF token, which every form
//! that changes something carries and which is compared in constant time. At most
//! [`MAX_SESSIONS`] live at once (the oldest is closed for a new one).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::console::{ConsoleConfig, Credential, Role, ADMIN_PRINCIPAL};

/// The cookie's name.
pub const COOKIE: &str = "egress_console";
/// Sessions alive at once, at most.
pub const MAX_SESSIONS: usize = 1024;

/// A signed-in person: the name approval records carry, and the role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user's name (`admin` for the admin token).
    pub name: String,
    /// What the user may do.
    pub role: Role,
    /// How the user signed in: `token` or `certificate`.
    pub how: &'static str,
}

impl Principal {
    /// What an approval record says of the answerer (never the token).
    pub fn credential(&self) -> String {
        format!(
            "console {} ({}, {})",
            self.name,
            self.role.as_str(),
            self.how
        )
    }
}

/// One session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who.
    pub principal: Principal,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// When it ends.
    pub expires: Instant,
}

impl Session {
    /// Whether `presented` is this session's CSRF token.
    pub fn csrf_ok(&self, presented: Option<&str>) -> bool {
        let Some(p) = presented else { return false };
        p.len() == self.csrf.len() && bool::from(p.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// The live sessions, by the SHA-256 of their cookie.
pub struct Sessions {
    ttl: Duration,
    map: Mutex<HashMap<[u8; 32], Session>>,
}

/// `n` random bytes as hex, from the system's generator.
fn random_hex(n: usize) -> Option<String> {
    let mut b = vec![0u8; n];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).ok()?;
    Some(hex::encode(b))
}

impl Sessions {
    /// No sessions; each will last `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Sessions {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// A new session for `principal`: the cookie's value, or `None` when no random bytes
    /// could be had.
    pub fn open(&self, principal: Principal) -> Option<String> {
        let id = random_hex(32)?;
        let session = Session {
            principal,
            csrf: random_hex(32)?,
            expires: Instant::now() + self.ttl,
        };
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS {
            let oldest = map.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k);
            if let Some(k) = oldest {
                map.remove(&k);
            }
        }
        map.insert(Sha256::digest(id.as_bytes()).into(), session);
        Some(id)
    }

    /// The session a `Cookie` header names, while it lasts.
    pub fn find(&self, cookie_header: Option<&str>) -> Option<(String, Session)> {
        let id = cookie_value(cookie_header?)?;
        let key: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some(s) if s.expires > Instant::now() => Some((id.to_string(), s.clone())),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// End the session of cookie `id`.
    pub fn close(&self, id: &str) {
        let key: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&key);
    }

    /// The `Set-Cookie` of a new session.
    pub fn set_cookie(&self, id: &str, tls: bool) -> String {
        let secure = if tls { "; Secure" } else { "" };
        format!(
            "{COOKIE}={id}; Path=/ui/; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
            self.ttl.as_secs()
        )
    }
}

/// The `Set-Cookie` that removes the session cookie.
pub fn clear_cookie(tls: bool) -> String {
    let secure = if tls { "; Secure" } else { "" };
    format!("{COOKIE}=; Path=/ui/; Max-Age=0; HttpOnly; SameSite=Strict{secure}")
}

/// The session cookie's value in a `Cookie` header (64 hex digits, else nothing).
fn cookie_value(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, v)| *k == COOKIE && v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|(_, v)| v)
}

/// Who signs in with `token` (the admin token, or a user's) or with the verified client
/// certificate `certificate` (`certificate SUBJECT`, as the admin listener names it).
pub fn sign_in(
    cfg: &ConsoleConfig,
    admin_token: Option<&[u8; 32]>,
    token: Option<&str>,
    certificate: Option<&str>,
) -> Option<Principal> {
    if let Some(t) = token.map(str::trim).filter(|t| !t.is_empty()) {
        let presented: [u8; 32] = Sha256::digest(t.as_bytes()).into();
        if admin_token.is_some_and(|a| bool::from(a.ct_eq(&presented))) {
            return Some(Principal {
                name: ADMIN_PRINCIPAL.into(),
                role: Role::Approver,
                how: "token",
            });
        }
        // Every user's digest is compared: the time taken says nothing of which matched.
        let mut found = None;
        for u in &cfg.users {
            if let Credential::TokenSha256(d) = &u.credential {
                if bool::from(d.ct_eq(&presented)) && found.is_none() {
                    found = Some(u);
                }
            }
        }
        return found.map(|u| Principal {
            name: u.name.clone(),
            role: u.role,
            how: "token",
        });
    }
    let subject = normal_subject(certificate?.strip_prefix("certificate ")?);
    cfg.users
        .iter()
        .find(
            |u| matches!(&u.credential, Credential::Certificate(s) if normal_subject(s) == subject),
        )
        .map(|u| Principal {
            name: u.name.clone(),
            role: u.role,
            how: "certificate",
        })
}

/// A subject with the spaces around its separators dropped (`CN=a, O=b` is `CN=a,O=b`).
fn normal_subject(s: &str) -> String {
    s.split(',').map(|p| p.trim()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::console::ConsoleUser;

    fn cfg() -> ConsoleConfig {
        ConsoleConfig {
            enabled: true,
            session_ttl: Duration::from_secs(60),
            users: vec![
                ConsoleUser {
                    name: "vera".into(),
                    role: Role::Viewer,
                    credential: Credential::TokenSha256(
                        Sha256::digest(b"vera-token-0123456789").into(),
                    ),
                },
                ConsoleUser {
                    name: "alice".into(),
                    role: Role::Approver,
                    credential: Credential::Certificate("CN=alice,O=sec".into()),
                },
            ],
        }
    }

    #[test]
    fn sign_in_knows_the_admin_token_each_users_token_and_certificate() {
        let admin: [u8; 32] = Sha256::digest(b"the-admin-token").into();
        let c = cfg();
        let who = |t: Option<&str>, cert: Option<&str>| sign_in(&c, Some(&admin), t, cert);
        assert_eq!(who(Some("the-admin-token"), None).unwrap().name, "admin");
        let vera = who(Some(" vera-token-0123456789\n"), None).unwrap();
        assert_eq!((vera.name.as_str(), vera.role), ("vera", Role::Viewer));
        let alice = who(None, Some("certificate CN=alice, O=sec")).unwrap();
        assert_eq!((alice.role, alice.how), (Role::Approver, "certificate"));
        assert!(who(Some("wrong"), None).is_none());
        assert!(who(None, Some("certificate CN=mallory")).is_none());
        // A subject alone (not from the listener's verified certificate) is nothing.
        assert!(who(None, Some("CN=alice,O=sec")).is_none());
        assert!(who(Some(""), None).is_none());
    }

    #[test]
    fn a_session_is_found_by_its_cookie_until_it_ends_and_checks_its_csrf() {
        let s = Sessions::new(Duration::from_secs(60));
        let p = Principal {
            name: "vera".into(),
            role: Role::Viewer,
            how: "token",
        };
        let id = s.open(p.clone()).unwrap();
        let header = format!("other=1; {COOKIE}={id}");
        let (_, found) = s.find(Some(&header)).unwrap();
        assert_eq!(found.principal, p);
        assert!(found.csrf_ok(Some(&found.csrf.clone())));
        assert!(!found.csrf_ok(None));
        assert!(!found.csrf_ok(Some("0")));
        assert!(s
            .find(Some(&format!("{COOKIE}={}", "0".repeat(64))))
            .is_none());
        assert!(s.find(Some("egress_console=<script>")).is_none());
        assert!(s
            .set_cookie(&id, true)
            .ends_with("HttpOnly; SameSite=Strict; Secure"));
        s.close(&id);
        assert!(s.find(Some(&header)).is_none());
        let short = Sessions::new(Duration::ZERO);
        let id = short.open(p).unwrap();
        assert!(short.find(Some(&format!("{COOKIE}={id}"))).is_none());
    }

    #[test]
    fn sessions_are_bounded() {
        let s = Sessions::new(Duration::from_secs(60));
        let p = Principal {
            name: "vera".into(),
            role: Role::Viewer,
            how: "token",
        };
        let first = s.open(p.clone()).unwrap();
        for _ in 0..MAX_SESSIONS {
            s.open(p.clone()).unwrap();
        }
        assert!(s.map.lock().unwrap().len() <= MAX_SESSIONS);
        assert!(s.find(Some(&format!("{COOKIE}={first}"))).is_none());
    }
}
