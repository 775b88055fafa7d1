//! Configuration errors: each names the file, the line when known, the sandbox and the field,
//! and never echoes a secret. Loading collects every error and fails once.

use std::fmt;
use std::sync::Arc;

/// One problem in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the problem is in.
    pub file: Arc<str>,
    /// 1-based line, when it could be found.
    pub line: Option<usize>,
    /// The sandbox id, when the problem is inside a sandbox binding or block.
    pub sandbox: Option<String>,
    /// Dotted path of the field (`policy.network.egress[2]`).
    pub field: String,
    /// What is wrong and, where possible, what to write instead.
    pub message: String,
    /// A typed error code where AIP-36 names one (`sandbox_ref_unresolvable`).
    pub code: Option<&'static str>,
}

impl ConfigError {
    /// A problem with a whole file (no sandbox, no field), at `line` when known.
    pub fn in_file(file: Arc<str>, line: Option<usize>, message: impl Into<String>) -> Self {
        ConfigError {
            file,
            line,
            sandbox: None,
            field: String::new(),
            message: message.into(),
            code: None,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        if let Some(s) = &self.sandbox {
            write!(f, "sandbox {s}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        if let Some(code) = self.code {
            write!(f, "{code}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Collects errors for one file, with the file's text for line lookups.
pub(crate) struct Sink<'a> {
    pub file: Arc<str>,
    pub text: &'a str,
    pub errors: &'a mut Vec<ConfigError>,
    /// Byte offset of each line's start, so lookups do not rescan the file.
    starts: Vec<usize>,
}

impl<'a> Sink<'a> {
    pub fn new(file: Arc<str>, text: &'a str, errors: &'a mut Vec<ConfigError>) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Sink {
            file,
            text,
            errors,
            starts,
        }
    }

    /// First 1-based line at or after `after_line` that contains `needle`.
    pub fn locate(&self, needle: &str, after_line: usize) -> Option<usize> {
        if needle.is_empty() {
            return None;
        }
        let first = after_line.saturating_sub(1);
        let from = *self.starts.get(first)?;
        let at = self.text[from..].find(needle)? + from;
        Some(self.starts.partition_point(|s| *s <= at))
    }

    /// Record an error about a top-level setting (no sandbox), located by `hint`.
    pub fn top(
        &mut self,
        field: impl Into<String>,
        message: impl Into<String>,
        hint: Option<&str>,
    ) {
        self.push(None, field, message, hint, 1);
    }

    /// Record an error. `hint` is a string expected on the offending line (a key or an entry),
    /// searched from `after_line` on.
    pub fn push(
        &mut self,
        sandbox: Option<&str>,
        field: impl Into<String>,
        message: impl Into<String>,
        hint: Option<&str>,
        after_line: usize,
    ) {
        let line = hint.and_then(|h| self.locate(h, after_line));
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line,
            sandbox: sandbox.map(str::to_string),
            field: field.into(),
            message: message.into(),
            code: None,
        });
    }
}

/// Remove quoted values from a serde message: `invalid type: string "sk-…"` must not echo
/// what may be a secret. Field names (in backticks) stay.
pub(crate) fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut in_quote = false;
    for c in message.chars() {
        if c == '"' {
            if in_quote {
                out.push_str("\"…\"");
            }
            in_quote = !in_quote;
            continue;
        }
        if !in_quote {
            out.push(c);
        }
    }
    if in_quote {
        out.push_str("\"…");
    }
    out
}

/// The field named in a serde message (`unknown field `foo`, expected …` → `foo`).
pub(crate) fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.split("unknown field `").nth(1)?;
    rest.split('`').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_quoted_values() {
        assert_eq!(
            redact("invalid type: string \"sk-live-123\", expected a boolean"),
            "invalid type: string \"…\", expected a boolean"
        );
        assert_eq!(redact("unknown field `tokn`"), "unknown field `tokn`");
        assert_eq!(redact("open \"abc"), "open \"…");
    }

    #[test]
    fn locates_lines() {
        let text = "a: 1\nsandboxes:\n  - id: x\n    bad: 2\n  - id: y\n    bad: 3\n";
        let mut errors = Vec::new();
        let sink = Sink::new("t".into(), text, &mut errors);
        assert_eq!(sink.locate("bad:", 1), Some(4));
        assert_eq!(sink.locate("bad:", 5), Some(6));
        assert_eq!(sink.locate("a: 1", 1), Some(1));
        assert_eq!(sink.locate("zzz", 1), None);
        assert_eq!(sink.locate("bad:", 99), None);
        assert_eq!(
            unknown_field("unknown field `bad`, expected one of `a`"),
            Some("bad")
        );
    }

    #[test]
    fn display_names_file_line_sandbox_field() {
        let e = ConfigError {
            file: "config/proxy.yaml".into(),
            line: Some(12),
            sandbox: Some("demo".into()),
            field: "policy.network.egress[2]".into(),
            message: "boom".into(),
            code: None,
        };
        assert_eq!(
            e.to_string(),
            "config/proxy.yaml:12: sandbox demo: policy.network.egress[2]: boom"
        );
    }
}
