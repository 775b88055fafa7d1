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
    /// Executables (absolute paths or globs), matched against the connection's process as the
    /// kernel shows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binaries: Vec<String>,
    /// Whatever those executables start is in the scope too (their descendants).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub children: bool,
    /// Command names the runtime vouches for (`sandbox~exec` credentials), globs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execs: Vec<String>,
    /// The entries, in the `network.egress` grammar.
    #[serde(default)]
    pub egress: Vec<String>,
}

/// Check the lists a scope is made of: at least one, executables absolute, `children` only
/// with executables.
pub fn check_scope(
    binaries: &[String],
    execs: &[String],
    children: bool,
) -> Result<Option<Scope>, String> {
    if children && binaries.is_empty() {
        return Err("`children: true` is about what `binaries:` start; name the binaries".into());
    }
    if let Some(b) = binaries.iter().find(|b| !b.starts_with('/')) {
        return Err(format!(
            "`{b}`: binaries are absolute paths (or globs starting with `/`), as the kernel shows executables"
        ));
    }
    if let Some(e) = execs.iter().find(|e| e.is_empty() || e.contains('~')) {
        return Err(format!("`{e}`: an exec name is not empty and has no `~`"));
    }
    Scope::new(binaries, execs, children)
        .map_err(|e| format!("a scope's glob does not compile: {e}"))
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
        let scope = match check_scope(&raw.binaries, &raw.execs, raw.children) {
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

/// Executables that run any code they are given as themselves (by file name, version digits
/// dropped: `python3.11` is `python`): a scope on one admits that code.
const INTERPRETERS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "busybox", "node", "deno", "bun", "perl", "ruby", "php",
    "python", "pypy", "lua", "tclsh",
];
/// Executables that start whatever they are told to (an alias, a hook, a script): with
/// `children: true` a scope on one admits anything.
const LAUNCHERS: &[&str] = &[
    "env", "xargs", "find", "make", "git", "ssh", "sudo", "npm", "npx", "uv", "pip", "cargo",
    "timeout", "nohup", "nice",
];

/// [`launcher_warnings`] for each scope of a network block: (`scoped` or `http`, the item's
/// scope) in order; `prefix` is the field path of the block.
pub fn scope_warnings<'a>(
    items: impl Iterator<Item = (&'static str, Option<&'a Scope>)>,
    prefix: &str,
    who: &str,
    warnings: &mut Vec<String>,
) {
    let mut index = std::collections::HashMap::new();
    for (list, scope) in items {
        let i = index.entry(list).or_insert(0usize);
        if let Some(scope) = scope {
            let field = format!("{prefix}network.{list}[{i}]");
            launcher_warnings(scope, &field, who, warnings);
        }
        *i += 1;
    }
}

/// What a scope's executables may let through beyond themselves (security review A05): a
/// warning for each launcher a scope names — interpreters run any script as themselves, and
/// with `children: true` a launcher passes everything it starts (`git -c alias.x='!python3 …'`).
pub fn launcher_warnings(scope: &Scope, field: &str, who: &str, warnings: &mut Vec<String>) {
    for b in scope.binaries() {
        let file = b.rsplit('/').next().unwrap_or(b);
        let stem = file.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
        let what = match (INTERPRETERS.contains(&stem), LAUNCHERS.contains(&stem)) {
            (false, false) => continue,
            (_, _) if scope.children() => "with `children: true` everything it starts passes (an alias, a hook, a script it runs) — drop `children` unless the tool's own children must reach these hosts",
            (true, _) => "it runs any code it is given as itself, so the scope admits that code too; scope the tool that needs the hosts, not its interpreter",
            (false, true) => continue,
        };
        warnings.push(format!(
            "{who}: {field}: `{b}` can launch arbitrary commands: {what}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warned(binary: &str, children: bool) -> Vec<String> {
        let scope = check_scope(&[binary.into()], &[], children)
            .unwrap()
            .unwrap();
        let mut w = Vec::new();
        launcher_warnings(&scope, "network.scoped[0]", "sandbox a", &mut w);
        w
    }

    #[test]
    fn interpreters_always_and_launchers_with_children_are_warned_about() {
        assert!(warned("/usr/bin/python3.11", false)[0].contains("as itself"));
        assert!(warned("/usr/bin/git", false).is_empty());
        assert!(warned("/usr/bin/git", true)[0].contains("everything it starts"));
        assert!(warned("/usr/bin/curl", true).is_empty());
        assert!(check_scope(&[], &["x".into()], true).is_err());
    }
}
