//! Why something failed, in words and by cause: what the proxy was doing (or what was wrong)
//! and the error of the layer below when there was one, shown as `what: cause` and kept as
//! [`std::error::Error::source`] (hyper's `Error { kind, cause }`). The stage enums of the
//! control plane and of credentials carry it, so no failure is flattened to a string.

/// What caused a failure: the error of the layer below, kept as the source (shared: a failed
/// mint is answered to every request until the retry).
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// Why a stage failed: what the proxy was doing (or what was wrong), and the error of the
/// layer below when there was one — shown as `what: cause`, kept as [`std::error::Error::source`].
#[derive(Debug, Clone)]
pub struct Why {
    what: String,
    cause: Option<Cause>,
    /// `what` says it all (the cause's messages in words of their own): shown alone.
    alone: bool,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Some(_) if self.alone => f.write_str(&self.what),
            Some(c) if self.what.is_empty() => write!(f, "{c}"),
            Some(c) => write!(f, "{}: {c}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for Why {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for Why {
    fn from(what: String) -> Self {
        Why {
            what,
            cause: None,
            alone: false,
        }
    }
}

impl From<&str> for Why {
    fn from(what: &str) -> Self {
        Why {
            what: what.to_string(),
            cause: None,
            alone: false,
        }
    }
}

/// `what` failed with `cause`.
pub fn caused(
    what: impl Into<String>,
    cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Why {
    Why {
        what: what.into(),
        cause: Some(Cause::from(cause.into())),
        alone: false,
    }
}

/// `cause`, shown as `words` (its several messages on one line, say), kept as the source.
pub fn worded(
    words: impl Into<String>,
    cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Why {
    Why {
        alone: true,
        ..caused(words, cause)
    }
}

/// `cause` alone: its words are the failure's.
pub fn of(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Why {
    caused(String::new(), cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_alone_reads_as_itself_and_stays_the_source() {
        let e = of(std::io::Error::other("etcd is down"));
        assert_eq!(e.to_string(), "etcd is down");
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "etcd is down");
        let words: Why = "no \"id\"".into();
        assert_eq!(words.to_string(), "no \"id\"");
        assert!(std::error::Error::source(&words).is_none());
        let worded = worded("a; b", std::io::Error::other("a\nb"));
        assert_eq!(worded.to_string(), "a; b");
        let source = std::error::Error::source(&worded).expect("a source");
        assert_eq!(source.to_string(), "a\nb");
    }
}
