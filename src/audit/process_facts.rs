//! The record's `process` block (DESIGN §7): which process inside the sandbox made the
//! connection, and how the proxy knows — `vouched` by the runtime's credential, `observed`
//! through the kernel, or both; an observed process that could not be named says why.

use serde::Serialize;

use crate::policy::process::{Observed, Process};

/// The `process` block as it is written.
#[derive(Debug, Serialize)]
pub struct ProcessFacts<'a> {
    /// `vouched`, `observed` or `vouched+observed`.
    pub source: &'static str,
    /// The vouched command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<&'a str>,
    /// What ran it, as vouched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<&'a str>,
    /// The observed executable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<&'a str>,
    /// Its ancestors' executables, parent first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<&'a str>,
    /// Its pid, in the proxy's PID namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The socket owner's uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Its cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<&'a str>,
    /// Observation found no process: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<&'a str>,
}

impl<'a> ProcessFacts<'a> {
    /// The block of `p`.
    pub fn of(p: &'a Process) -> Self {
        let mut f = ProcessFacts {
            source: p.source(),
            exec: p.vouched.as_ref().map(|v| &*v.exec),
            parent: p.vouched.as_ref().and_then(|v| v.parent.as_deref()),
            exe: None,
            ancestors: Vec::new(),
            pid: None,
            uid: None,
            cgroup: None,
            unknown: None,
        };
        match &p.observed {
            Some(Observed::Seen(s)) => {
                f.exe = Some(&s.exe);
                f.ancestors = s.ancestors.iter().map(|a| &**a).collect();
                f.pid = Some(s.pid);
                f.uid = Some(s.uid);
                f.cgroup = s.cgroup.as_deref();
            }
            Some(Observed::Unknown { uid, why }) => {
                f.uid = *uid;
                f.unknown = Some(why);
            }
            None => {}
        }
        f
    }
}
