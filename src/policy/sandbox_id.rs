//! `SandboxId`: a sandbox's id, checked once where it enters (config file, admin API, state
//! file, credentials) so that nothing downstream can hold an invalid one. Cheap to clone (an
//! `Arc<str>`): records, metrics and limiters share one allocation per sandbox.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// `[a-z0-9][a-z0-9_.-]{0,62}`
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(Arc<str>);

/// The text is not a valid sandbox id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a valid sandbox id ([a-z0-9][a-z0-9_.-]{{0,62}})")]
pub struct InvalidSandboxId(pub String);

impl SandboxId {
    /// An id, if `text` is a valid one.
    pub fn new(text: &str) -> Result<Self, InvalidSandboxId> {
        if is_valid(text) {
            Ok(SandboxId(text.into()))
        } else {
            // Echo at most a short, printable prefix of what was sent.
            let shown: String = text
                .chars()
                .take(64)
                .map(|c| if c.is_ascii_graphic() { c } else { '?' })
                .collect();
            Err(InvalidSandboxId(shown))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `[a-z0-9][a-z0-9_.-]{0,62}`
pub fn is_valid(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_.-".contains(c))
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::ops::Deref for SandboxId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<String> for SandboxId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Borrow<str> for SandboxId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SandboxId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for SandboxId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SandboxId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl Serialize for SandboxId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_ids_are_constructed() {
        for ok in ["a", "0", "demo", "agent-42", "a.b_c-d", &"a".repeat(63)] {
            assert_eq!(SandboxId::new(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            "-a",
            "_a",
            "A",
            "a b",
            "a/b",
            "é",
            &"a".repeat(64),
            "a\n",
        ] {
            assert!(SandboxId::new(bad).is_err(), "{bad:?}");
        }
        let e = SandboxId::new("bad\u{7}id").unwrap_err();
        assert_eq!(e.0, "bad?id");
    }
}
