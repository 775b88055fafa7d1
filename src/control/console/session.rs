//! Who is signed in to the console: sign-in with the admin token, a user's own token or the
//! client certificate the TLS admin listener verified; then a session cookie (`HttpOnly`,
//! `SameSite=Strict`, `Secure` on TLS, bounded lifetime) whose value is random and kept here
//! only as its SHA-256.
//!
//! A cookie goes to every port of its host, so the cookie alone opens nothing: each session
//! also has a random **place**, `/ui/s/{place}/`, under which its pages live and to which the
//! cookie's `Path` is bound. A browser sends the cookie only to URLs under that path; a page
//! on another port of the console's host gets it only if it already knows the place, which
//! is never sent to another origin (`Referrer-Policy: same-origin`) and is checked here
//! beside the cookie. Each session has its own CSRF token too, compared in constant time.
//!
//! At most [`PER_USER`] sessions of one user live at once (the user's oldest is closed for a
//! new one: one user's sign-ins never end another's), [`MAX_SESSIONS`] in all (then sign-in
//! waits). Closing a session ends every stream it holds open ([`Session::ended`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::config::console::{ConsoleConfig, Credential, Role, ADMIN_PRINCIPAL};

/// The cookie's name.
pub const COOKIE: &str = "egress_console";
/// Sessions of one user alive at once, at most.
pub const PER_USER: usize = 16;
/// Sessions alive at once, at most, of all users (then a sign-in is refused, never someone
/// else's session closed).
pub const MAX_SESSIONS: usize = 16_384;

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
    /// Its place: its pages are under `/ui/s/{place}/`, and so is its cookie.
    pub place: String,
    /// When it ends.
    pub expires: Instant,
    /// Closed when the session is (sign-out, eviction, expiry seen by a sign-in).
    ended: watch::Receiver<()>,
}

impl Session {
    /// The path its pages live under, `/ui/s/{place}/`.
    pub fn base(&self) -> String {
        format!("/ui/s/{}/", self.place)
    }

    /// Resolves when the session has been closed.
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.ended.clone();
        async move { while rx.changed().await.is_ok() {} }
    }

    /// Whether `presented` is this session's CSRF token.
    pub fn csrf_ok(&self, presented: Option<&str>) -> bool {
        let Some(p) = presented else { return false };
        p.len() == self.csrf.len() && bool::from(p.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// The live sessions, by the SHA-256 of their cookie; each with the sender whose drop ends
/// its streams.
pub struct Sessions {
    ttl: Duration,
    map: Mutex<HashMap<[u8; 32], Live>>,
}

/// A live session, and the sender whose drop ends its streams.
type Live = (Session, watch::Sender<()>);

/// Why no session was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOpened {
    /// The system gave no random bytes.
    NoRandom,
    /// [`MAX_SESSIONS`] are open.
    Full,
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

    /// A new session for `principal`: its cookie's value and the session. The user's oldest
    /// session is closed when it has [`PER_USER`]; nobody else's ever is.
    pub fn open(&self, principal: Principal) -> Result<(String, Session), NotOpened> {
        let id = random_hex(32).ok_or(NotOpened::NoRandom)?;
        let (tx, ended) = watch::channel(());
        let session = Session {
            principal,
            csrf: random_hex(32).ok_or(NotOpened::NoRandom)?,
            place: random_hex(16).ok_or(NotOpened::NoRandom)?,
            expires: Instant::now() + self.ttl,
            ended,
        };
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, (s, _)| s.expires > now);
        let name = &session.principal.name;
        let mine = map.values().filter(|(s, _)| &s.principal.name == name);
        if mine.count() >= PER_USER {
            let oldest = map
                .iter()
                .filter(|(_, (s, _))| &s.principal.name == name)
                .min_by_key(|(_, (s, _))| s.expires)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                map.remove(&k);
            }
        }
        if map.len() >= MAX_SESSIONS {
            return Err(NotOpened::Full);
        }
        map.insert(Sha256::digest(id.as_bytes()).into(), (session.clone(), tx));
        Ok((id, session))
    }

    /// The session a `Cookie` header names, while it lasts, when `place` is its place.
    pub fn find(&self, cookie_header: Option<&str>, place: &str) -> Option<(String, Session)> {
        let id = cookie_value(cookie_header?)?;
        let key: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some((s, _)) if s.expires > Instant::now() => {
                let here = place.len() == s.place.len()
                    && bool::from(place.as_bytes().ct_eq(s.place.as_bytes()));
                here.then(|| (id.to_string(), s.clone()))
            }
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// End the session of cookie `id`, and every stream it holds open.
    pub fn close(&self, id: &str) {
        let key: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&key);
    }

    /// The `Set-Cookie` of a new session: sent back only under the session's place.
    pub fn set_cookie(&self, id: &str, session: &Session, tls: bool) -> String {
        let secure = if tls { "; Secure" } else { "" };
        format!(
            "{COOKIE}={id}; Path={}; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
            session.base(),
            self.ttl.as_secs()
        )
    }
}

/// The `Set-Cookie` that removes the cookie of `session`.
pub fn clear_cookie(session: &Session, tls: bool) -> String {
    let secure = if tls { "; Secure" } else { "" };
    let path = session.base();
    format!("{COOKIE}=; Path={path}; Max-Age=0; HttpOnly; SameSite=Strict{secure}")
}

/// Whether `s` can be a session's place (32 hex digits).
pub fn valid_place(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
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

    fn person(name: &str) -> Principal {
        Principal {
            name: name.into(),
            role: Role::Viewer,
            how: "token",
        }
    }

    #[tokio::test]
    async fn a_session_is_found_by_its_cookie_and_place_until_it_ends() {
        let s = Sessions::new(Duration::from_secs(60));
        let p = person("vera");
        let (id, opened) = s.open(p.clone()).unwrap();
        assert!(valid_place(&opened.place));
        let header = format!("other=1; {COOKIE}={id}");
        let (_, found) = s.find(Some(&header), &opened.place).unwrap();
        assert_eq!(found.principal, p);
        assert!(found.csrf_ok(Some(&found.csrf.clone())));
        assert!(!found.csrf_ok(None));
        assert!(!found.csrf_ok(Some("0")));
        // The cookie without its place is nothing: another port's page has only the cookie.
        assert!(s.find(Some(&header), &"0".repeat(32)).is_none());
        assert!(s.find(Some(&header), "").is_none());
        let zero = format!("{COOKIE}={}", "0".repeat(64));
        assert!(s.find(Some(&zero), &opened.place).is_none());
        assert!(s
            .find(Some("egress_console=<script>"), &opened.place)
            .is_none());
        let cookie = s.set_cookie(&id, &opened, true);
        assert!(
            cookie.contains(&format!("Path=/ui/s/{}/;", opened.place)),
            "{cookie}"
        );
        assert!(cookie.ends_with("HttpOnly; SameSite=Strict; Secure"));
        let ended = opened.ended();
        s.close(&id);
        assert!(s.find(Some(&header), &opened.place).is_none());
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("closing a session ends what waits on it");
        let short = Sessions::new(Duration::ZERO);
        let (id, opened) = short.open(p).unwrap();
        assert!(short
            .find(Some(&format!("{COOKIE}={id}")), &opened.place)
            .is_none());
    }

    #[test]
    fn one_users_sign_ins_close_only_that_users_sessions() {
        let s = Sessions::new(Duration::from_secs(60));
        let (alice, at) = s.open(person("alice")).unwrap();
        let (first, fp) = s.open(person("vera")).unwrap();
        for _ in 0..1025 {
            s.open(person("vera")).unwrap();
        }
        let map = s.map.lock().unwrap();
        let veras = map
            .values()
            .filter(|(v, _)| v.principal.name == "vera")
            .count();
        assert_eq!(veras, PER_USER);
        drop(map);
        assert!(s
            .find(Some(&format!("{COOKIE}={first}")), &fp.place)
            .is_none());
        let still = s.find(Some(&format!("{COOKIE}={alice}")), &at.place);
        assert_eq!(still.unwrap().1.principal.name, "alice");
    }
}
