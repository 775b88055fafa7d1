//! Which process inside a sandbox made a connection, as far as the proxy can say, and the
//! scopes (`binaries:`, `execs:`) that narrow an entry to some processes.
//!
//! Two sources, each only as strong as it says (DESIGN §4):
//! - **vouched**: the runtime's credential named the command (`Proxy-Authorization` user
//!   `sandbox~exec`); as strong as the runtime keeps that credential from other processes;
//! - **observed**: the proxy shares a kernel with the sandbox and mapped the peer socket to
//!   the process holding it (`crate::egress::attribution`); or it says why it could not.
//!
//! A scope admits a connection only on what was established: a connection whose process is
//! unknown never matches a scoped entry (fail closed).

use std::fmt;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// Who inside the sandbox made a connection: what the runtime vouched for, what the kernel
/// showed, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Process {
    /// Named by the runtime's credential.
    pub vouched: Option<Vouched>,
    /// Seen on the host (only when attribution by observation is on).
    pub observed: Option<Observed>,
}

/// A command the runtime named in the sandbox's credential (`sandbox~parent~exec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vouched {
    /// The command (for an agent harness: the tool call's id and tool name).
    pub exec: Arc<str>,
    /// What ran it, outermost first, joined with `~` (none for a top-level command).
    pub parent: Option<Arc<str>>,
}

/// What the kernel showed of the process at the other end of the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The process holding the peer socket.
    Seen(Arc<Seen>),
    /// It could not be named, and why (never guessed).
    Unknown {
        /// The socket's owner, when the kernel found the socket.
        uid: Option<u32>,
        /// Why no process is named.
        why: &'static str,
    },
}

/// A process the kernel showed holding the peer socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Its pid (in the proxy's PID namespace).
    pub pid: u32,
    /// Its executable, resolved (not a symlink).
    pub exe: Arc<str>,
    /// Its ancestors' executables, parent first (up to pid 1, which is left out).
    pub ancestors: Vec<Arc<str>>,
    /// Its cgroup (the unified hierarchy's path).
    pub cgroup: Option<Arc<str>>,
    /// The socket's owner.
    pub uid: u32,
}

impl Process {
    /// The executable the kernel showed, if it showed one.
    pub fn exe(&self) -> Option<&str> {
        match &self.observed {
            Some(Observed::Seen(s)) => Some(&s.exe),
            _ => None,
        }
    }

    /// `vouched`, `observed` or `vouched+observed` (the record's `process.source`).
    pub fn source(&self) -> &'static str {
        match (&self.vouched, &self.observed) {
            (Some(_), Some(_)) => "vouched+observed",
            (Some(_), None) => "vouched",
            _ => "observed",
        }
    }
}

impl fmt::Display for Process {
    /// One phrase for a refusal: `exec call_1.fetch, /usr/bin/python3.11 (pid 42)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(v) = &self.vouched {
            parts.push(format!("exec {}", v.exec));
        }
        match &self.observed {
            Some(Observed::Seen(s)) if s.pid == 0 => parts.push(s.exe.to_string()),
            Some(Observed::Seen(s)) => parts.push(format!("{} (pid {})", s.exe, s.pid)),
            Some(Observed::Unknown { why, .. }) => parts.push(format!("process unknown: {why}")),
            None => {}
        }
        if parts.is_empty() {
            return f.write_str("no process attributed");
        }
        f.write_str(&parts.join(", "))
    }
}

/// The processes an entry is for: executables (matched against the process's own, and with
/// `children` any ancestor's), vouched command names, or both (then both must match).
#[derive(Debug, Clone)]
pub struct Scope {
    binaries: Vec<String>,
    execs: Vec<String>,
    /// Whatever a named executable starts is in the scope too (`children: true`). Off by
    /// default: `git -c alias.x='!python3 …' x` would pass python through a git scope
    /// (security review A05).
    children: bool,
    binary_set: GlobSet,
    exec_set: GlobSet,
}

impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.binaries == other.binaries
            && self.execs == other.execs
            && self.children == other.children
    }
}

impl Scope {
    /// A scope of these globs: in `binaries` `*` stays within one path segment and `**`
    /// crosses them; `execs` are plain globs; `children`: an ancestor's executable counts as
    /// the process's. `None` when both lists are empty.
    pub fn new(
        binaries: &[String],
        execs: &[String],
        children: bool,
    ) -> Result<Option<Self>, globset::Error> {
        if binaries.is_empty() && execs.is_empty() {
            return Ok(None);
        }
        let set = |globs: &[String], separator: bool| -> Result<GlobSet, globset::Error> {
            let mut b = GlobSetBuilder::new();
            for g in globs {
                b.add(GlobBuilder::new(g).literal_separator(separator).build()?);
            }
            b.build()
        };
        Ok(Some(Scope {
            binary_set: set(binaries, true)?,
            exec_set: set(execs, false)?,
            binaries: binaries.to_vec(),
            execs: execs.to_vec(),
            children,
        }))
    }

    /// Whether a connection of `process` is in this scope. Unknown is never in it.
    pub fn admits(&self, process: Option<&Process>) -> bool {
        let Some(p) = process else {
            return false;
        };
        let binaries = self.binaries.is_empty()
            || matches!(&p.observed, Some(Observed::Seen(s))
                if self.binary_set.is_match(&*s.exe)
                    || (self.children
                        && s.ancestors.iter().any(|a| self.binary_set.is_match(&**a))));
        let execs = self.execs.is_empty()
            || p.vouched
                .as_ref()
                .is_some_and(|v| self.exec_set.is_match(&*v.exec));
        binaries && execs
    }

    /// The executables written.
    pub fn binaries(&self) -> &[String] {
        &self.binaries
    }

    /// The vouched command names written.
    pub fn execs(&self) -> &[String] {
        &self.execs
    }

    /// Whether what the executables start is in the scope too.
    pub fn children(&self) -> bool {
        self.children
    }
}

impl fmt::Display for Scope {
    /// `binaries [/usr/bin/git]`, `execs [*.web_fetch]`, or both.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.binaries.is_empty() {
            let and = if self.children {
                " and what they start"
            } else {
                ""
            };
            parts.push(format!("binaries [{}]{and}", self.binaries.join(", ")));
        }
        if !self.execs.is_empty() {
            parts.push(format!("execs [{}]", self.execs.join(", ")));
        }
        f.write_str(&parts.join(" and "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(exe: &str, ancestors: &[&str]) -> Process {
        Process {
            vouched: None,
            observed: Some(Observed::Seen(Arc::new(Seen {
                pid: 7,
                exe: exe.into(),
                ancestors: ancestors.iter().map(|a| Arc::from(*a)).collect(),
                cgroup: None,
                uid: 0,
            }))),
        }
    }

    #[test]
    fn binaries_match_the_process_or_with_children_an_ancestor_and_unknown_never() {
        let s = Scope::new(&["/usr/bin/curl".into()], &[], true)
            .unwrap()
            .unwrap();
        assert!(s.admits(Some(&seen("/usr/bin/curl", &[]))));
        assert!(s.admits(Some(&seen("/usr/bin/python3", &["/usr/bin/curl"]))));
        assert!(!s.admits(Some(&seen("/usr/bin/python3", &["/usr/bin/bash"]))));
        let own = Scope::new(&["/usr/bin/git".into()], &[], false)
            .unwrap()
            .unwrap();
        assert!(own.admits(Some(&seen("/usr/bin/git", &["/usr/bin/bash"]))));
        assert!(!own.admits(Some(&seen("/usr/bin/python3", &["/usr/bin/git"]))));
        assert!(!s.admits(None));
        let unknown = Process {
            vouched: None,
            observed: Some(Observed::Unknown {
                uid: Some(0),
                why: "gone",
            }),
        };
        assert!(!s.admits(Some(&unknown)));
        let glob = Scope::new(&["/usr/bin/*".into()], &[], false)
            .unwrap()
            .unwrap();
        assert!(glob.admits(Some(&seen("/usr/bin/git", &[]))));
        assert!(!glob.admits(Some(&seen("/usr/bin/x/git", &[]))));
    }

    #[test]
    fn execs_match_the_vouched_name_and_both_lists_must_match() {
        let vouched = |exec: &str| Process {
            vouched: Some(Vouched {
                exec: exec.into(),
                parent: None,
            }),
            observed: None,
        };
        let s = Scope::new(&[], &["*.web_fetch".into()], false)
            .unwrap()
            .unwrap();
        assert!(s.admits(Some(&vouched("call_1.web_fetch"))));
        assert!(!s.admits(Some(&vouched("call_1.shell"))));
        assert!(!s.admits(Some(&seen("/usr/bin/curl", &[]))));
        let both = Scope::new(&["/usr/bin/curl".into()], &["tool".into()], false)
            .unwrap()
            .unwrap();
        assert!(!both.admits(Some(&vouched("tool"))));
        let mut p = seen("/usr/bin/curl", &[]);
        p.vouched = vouched("tool").vouched;
        assert!(both.admits(Some(&p)));
        assert!(Scope::new(&[], &[], false).unwrap().is_none());
    }
}
