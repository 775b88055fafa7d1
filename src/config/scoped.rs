//! `network.scoped` as written: egress entries for some processes only (DESIGN §4,
//! "Attribution"). AIP-36 keeps `network.egress` a list of strings, so an entry with a scope
//! is a sibling list, each item naming its processes and its entries:
//! `scoped: [{ binaries: [/usr/bin/git], egress: ["github.com"] }]`.

use serde::{Deserialize, Serialize};

use super::block::BlockCtx;
use super::error::Sink;
use crate::policy::entry::parse_entry;
use crate::policy::process::Scope;
use crate::policy::ScopedSpec;

/// One `network.scoped` item as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawScoped {
    /// Executables (absolute paths or globs), matched against the connection's process and
    /// its ancestors as the kernel shows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binaries: Vec<String>,
    /// Command names the runtime vouches for (`sandbox~exec` credentials), globs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execs: Vec<String>,
    /// The entries, in the `network.egress` grammar.
    #[serde(default)]
    pub egress: Vec<String>,
}

/// Check the lists a scope is made of: at least one, executables absolute.
pub fn check_scope(binaries: &[String], execs: &[String]) -> Result<Option<Scope>, String> {
    if let Some(b) = binaries.iter().find(|b| !b.starts_with('/')) {
        return Err(format!(
            "`{b}`: binaries are absolute paths (or globs starting with `/`), as the kernel shows executables"
        ));
    }
    if let Some(e) = execs.iter().find(|e| e.is_empty() || e.contains('~')) {
        return Err(format!("`{e}`: an exec name is not empty and has no `~`"));
    }
    Scope::new(binaries, execs).map_err(|e| format!("a scope's glob does not compile: {e}"))
}

/// `network.scoped` parsed; `None` when anything in it is wrong (the errors are in `sink`).
pub(crate) fn parse(
    list: &[RawScoped],
    ctx: &BlockCtx<'_>,
    sink: &mut Sink<'_>,
) -> Option<Vec<ScopedSpec>> {
    let mut out = Vec::with_capacity(list.len());
    let mut ok = true;
    for (i, raw) in list.iter().enumerate() {
        let field = format!("network.scoped[{i}]");
        let scope = match check_scope(&raw.binaries, &raw.execs) {
            Ok(Some(s)) => s,
            Ok(None) => {
                let why = "a scoped entry names its processes: `binaries:` or `execs:` (without either, write the entries in network.egress)";
                ctx.err(sink, &field, why, Some("scoped:"));
                ok = false;
                continue;
            }
            Err(why) => {
                ctx.err(sink, &field, why, raw.binaries.first().map(String::as_str));
                ok = false;
                continue;
            }
        };
        if raw.egress.is_empty() {
            ctx.err(
                sink,
                &field,
                "`egress:` lists what the scope may reach",
                None,
            );
            ok = false;
        }
        let mut egress = Vec::with_capacity(raw.egress.len());
        for (j, text) in raw.egress.iter().enumerate() {
            match parse_entry(text) {
                Ok(e) => egress.push((text.clone(), e)),
                Err(e) => {
                    let field = format!("{field}.egress[{j}]");
                    ctx.err(sink, field, format!("`{text}`: {e}"), Some(text));
                    ok = false;
                }
            }
        }
        out.push(ScopedSpec { scope, egress });
    }
    ok.then_some(out)
}
