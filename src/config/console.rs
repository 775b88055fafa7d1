//! `admin:` — the console on the admin listener (`docs/console.md`): off unless
//! `console: true`; who may sign in, and as what. The admin token always signs in, as the
//! principal `admin` with the approver role; each user listed here signs in with a token of
//! its own (`token_file`, kept as a SHA-256 digest) or a client certificate whose subject the
//! TLS admin listener verified (`certificate`).
//!
//! ```yaml
//! admin:
//!   console: true
//!   session_ttl_s: 28800            # a session's lifetime (60 s to 7 days)
//!   users:
//!     - { name: alice, role: approver, certificate: "CN=alice,O=security" }
//!     - { name: vera,  role: viewer,   token_file: vera.token }
//! ```

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml::Value;
use sha2::{Digest, Sha256};

use super::error::Sink;
use super::Secrets;

/// What a signed-in person may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read every page; change nothing.
    Viewer,
    /// Read, and answer access requests and revoke grants.
    Approver,
}

impl Role {
    /// `viewer` or `approver`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Approver => "approver",
        }
    }
}

/// How a console user proves who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// The subject of a client certificate, as the TLS admin listener shows it (`CN=…`).
    Certificate(String),
    /// The SHA-256 of the user's token.
    TokenSha256([u8; 32]),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Certificate(s) => write!(f, "certificate {s}"),
            Credential::TokenSha256(_) => f.write_str("token <redacted>"),
        }
    }
}

/// One person who may sign in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleUser {
    /// Shown on every page and written on every approval record.
    pub name: String,
    /// What the user may do.
    pub role: Role,
    /// How the user signs in.
    pub credential: Credential,
}

/// `admin:`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// `console: true`: `/ui/` is served.
    pub enabled: bool,
    /// A session ends this long after sign-in.
    pub session_ttl: Duration,
    /// Who may sign in besides the admin token.
    pub users: Vec<ConsoleUser>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: false,
            session_ttl: Duration::from_secs(DEFAULT_TTL_S),
            users: Vec::new(),
        }
    }
}

const DEFAULT_TTL_S: u64 = 8 * 3600;
const TTL_RANGE_S: std::ops::RangeInclusive<u64> = 60..=7 * 24 * 3600;
/// The admin token's principal: no user may take the name.
pub const ADMIN_PRINCIPAL: &str = "admin";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    #[serde(default)]
    console: bool,
    #[serde(default)]
    session_ttl_s: Option<u64>,
    #[serde(default)]
    users: Vec<RawUser>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    name: String,
    role: Role,
    #[serde(default)]
    certificate: Option<String>,
    #[serde(default)]
    token_file: Option<String>,
}

/// `admin:` read and checked; `rel` anchors `token_file`. A token file that cannot be read is
/// an error when the proxy runs and a warning for the review tools.
pub(super) fn resolve(
    raw: Option<Value>,
    rel: &dyn Fn(&str) -> std::path::PathBuf,
    secrets: Secrets,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) -> ConsoleConfig {
    let Some(raw) = raw else {
        return ConsoleConfig::default();
    };
    let raw: RawAdmin = match serde_yaml::from_value(raw) {
        Ok(r) => r,
        Err(e) => {
            sink.top("admin", e.to_string(), Some("admin:"));
            return ConsoleConfig::default();
        }
    };
    let ttl = raw.session_ttl_s.unwrap_or(DEFAULT_TTL_S);
    if !TTL_RANGE_S.contains(&ttl) {
        let why = format!("{ttl} is outside 60 to 604800 seconds");
        sink.top("admin.session_ttl_s", why, Some("session_ttl_s:"));
    }
    let mut users: Vec<ConsoleUser> = Vec::new();
    for (i, u) in raw.users.into_iter().enumerate() {
        let field = format!("admin.users[{i}]");
        if let Some(why) = bad_name(&u.name, &users) {
            sink.top(&field, why, Some(&u.name));
            continue;
        }
        let credential = match (u.certificate, u.token_file) {
            (Some(subject), None) if !subject.trim().is_empty() => {
                Credential::Certificate(subject.trim().to_string())
            }
            (None, Some(file)) => match token_digest(&rel(&file)) {
                Ok(d) => Credential::TokenSha256(d),
                // Only an absent file is the review tools' warning: a token `run` would refuse
                // for its length is refused by `validate` and `check` too.
                Err((TokenFault::Unreadable, why)) if secrets == Secrets::MayBeAbsent => {
                    warnings.push(format!("{field}.token_file: {why}"));
                    Credential::TokenSha256([0; 32])
                }
                Err((_, why)) => {
                    sink.top(format!("{field}.token_file"), why, Some(&file));
                    continue;
                }
            },
            _ => {
                let why = "give exactly one of `certificate` (a subject) and `token_file`";
                sink.top(&field, why, Some(&u.name));
                continue;
            }
        };
        users.push(ConsoleUser {
            name: u.name,
            role: u.role,
            credential,
        });
    }
    if !raw.console && !users.is_empty() {
        warnings.push("admin.users: listed, but the console is off (admin.console: false)".into());
    }
    ConsoleConfig {
        enabled: raw.console,
        session_ttl: Duration::from_secs(ttl.clamp(*TTL_RANGE_S.start(), *TTL_RANGE_S.end())),
        users,
    }
}

/// Whether `name` can name a console user: 1 to 64 letters, digits, `.`, `_`, `-`, `@`.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
}

/// Why `name` cannot name a user: the grammar, the admin's own name, or a second use.
fn bad_name(name: &str, users: &[ConsoleUser]) -> Option<String> {
    if !valid_name(name) {
        return Some(format!(
            "name `{name}`: 1 to 64 letters, digits, `.`, `_`, `-` or `@`"
        ));
    }
    if name == ADMIN_PRINCIPAL {
        return Some("the name `admin` is the admin token's".into());
    }
    users
        .iter()
        .any(|u| u.name == name)
        .then(|| format!("the name `{name}` is given twice"))
}

/// What is wrong with a user's token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenFault {
    /// It cannot be read (perhaps not there yet where the config is reviewed).
    Unreadable,
    /// It holds a token too short to keep anyone out.
    Short,
}

/// The SHA-256 of the token in `path` (surrounding whitespace dropped); a token shorter than 16
/// characters is refused (it would be guessed).
fn token_digest(path: &Path) -> Result<[u8; 32], (TokenFault, String)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let why = format!("cannot read {}: {e}", path.display());
        (TokenFault::Unreadable, why)
    })?;
    let token = text.trim();
    if token.len() < 16 {
        let why = format!(
            "{} holds fewer than 16 characters: use a long random token",
            path.display()
        );
        return Err((TokenFault::Short, why));
    }
    Ok(Sha256::digest(token.as_bytes()).into())
}

#[cfg(test)]
mod tests {
    use super::super::load_str;
    use super::*;

    fn load(dir: &Path, admin: &str) -> Result<ConsoleConfig, String> {
        let text = format!("admin_token_file: admin.token\nadmin:\n{admin}");
        load_str(&text, "proxy.yaml", dir, None)
            .map(|c| c.console)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn users_sign_in_by_token_file_or_certificate_and_bad_entries_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("admin.token"), "the-admin-token-0123456789").unwrap();
        std::fs::write(d.join("vera.token"), "vera-token-0123456789\n").unwrap();
        std::fs::write(d.join("short.token"), "short").unwrap();
        let ok = load(
            d,
            "  console: true\n  users:\n    - { name: vera, role: viewer, token_file: vera.token }\n    - { name: alice, role: approver, certificate: \"CN=alice\" }\n",
        )
        .unwrap();
        assert!(ok.enabled);
        assert_eq!(ok.session_ttl, Duration::from_secs(DEFAULT_TTL_S));
        let digest: [u8; 32] = Sha256::digest(b"vera-token-0123456789").into();
        assert_eq!(ok.users[0].credential, Credential::TokenSha256(digest));
        assert_eq!(ok.users[1].role, Role::Approver);
        assert!(!format!("{:?}", ok.users[0]).contains("vera-token"));
        for (bad, says) in [
            ("  console: yes-please\n", "admin"),
            ("  console: true\n  session_ttl_s: 5\n", "session_ttl_s"),
            ("  users: [{ name: admin, role: viewer, certificate: CN=x }]\n", "admin token's"),
            ("  users: [{ name: a, role: viewer, certificate: CN=x, token_file: vera.token }]\n", "exactly one"),
            ("  users: [{ name: a, role: viewer }]\n", "exactly one"),
            ("  users: [{ name: a, role: root, certificate: CN=x }]\n", "admin"),
            ("  users: [{ name: a, role: viewer, token_file: short.token }]\n", "fewer than 16"),
            ("  users: [{ name: a, role: viewer, token_file: gone.token }]\n", "cannot read"),
            ("  users: [{ name: \"a b\", role: viewer, certificate: CN=x }]\n", "1 to 64"),
            ("  users: [{ name: a, role: viewer, certificate: CN=x }, { name: a, role: approver, certificate: CN=y }]\n", "twice"),
        ] {
            let e = load(d, bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        // Off by default, and without the section.
        assert!(!load(d, "  users: []\n").unwrap().enabled);
    }
}
