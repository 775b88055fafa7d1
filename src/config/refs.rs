//! AIP-36 references: standalone `*.SANDBOX.md` files named by path (relative to the file
//! that names them) or by registry slug `@owner/slug`, looked up among the files found in
//! `sandbox_dirs`. Reading the named files is the only I/O.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_yaml::Value;

use super::block::{parse_block, BlockCtx, SandboxBlock};
use super::error::{ConfigError, Sink};
use crate::policy::NetworkSpec;

/// Standalone policies found in `sandbox_dirs`, by id.
#[derive(Debug, Default, PartialEq)]
pub struct PolicyIndex {
    by_id: HashMap<String, (SandboxBlock, NetworkSpec, Arc<str>)>,
}

/// How deep `sandbox_dirs` are searched.
const MAX_DEPTH: usize = 4;

/// Read and validate every `*.SANDBOX.md` under the given directories.
pub(crate) fn index_dirs(
    dirs: &[(String, PathBuf)],
    extra_providers: &[String],
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> PolicyIndex {
    let mut index = PolicyIndex::default();
    for (i, (written, dir)) in dirs.iter().enumerate() {
        let mut found = Vec::new();
        if let Err(e) = collect(dir, 0, &mut found) {
            sink.top(
                format!("sandbox_dirs[{i}]"),
                format!("cannot read directory {}: {e}", dir.display()),
                Some(written),
            );
            continue;
        }
        found.sort();
        for path in found {
            files.push(path.clone());
            match read_standalone(&path, extra_providers, warnings) {
                Ok((block, net, file)) => {
                    let id = block.id.clone().unwrap_or_default();
                    if let Some((_, _, other)) = index.by_id.get(&id) {
                        sink.errors.push(ConfigError {
                            file: file.clone(),
                            line: None,
                            sandbox: None,
                            field: "id".into(),
                            message: format!("id `{id}` is also used by {other}"),
                            code: None,
                        });
                        continue;
                    }
                    index.by_id.insert(id, (block, net, file));
                }
                Err(errs) => sink.errors.extend(errs),
            }
        }
    }
    index
}

fn collect(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let ft = entry.file_type()?;
        if ft.is_dir() && depth < MAX_DEPTH {
            collect(&path, depth + 1, out)?;
        } else if ft.is_file() && path.to_string_lossy().ends_with(".SANDBOX.md") {
            out.push(path);
        }
    }
    Ok(())
}

/// Parse one standalone SANDBOX.md file.
pub(crate) fn read_standalone(
    path: &Path,
    extra_providers: &[String],
    warnings: &mut Vec<String>,
) -> Result<(SandboxBlock, NetworkSpec, Arc<str>), Vec<ConfigError>> {
    let file: Arc<str> = path.display().to_string().into();
    let err =
        |line: Option<usize>, message: String| ConfigError::in_file(file.clone(), line, message);
    let text =
        std::fs::read_to_string(path).map_err(|e| vec![err(None, format!("cannot read: {e}"))])?;
    let (yaml, first_line) = frontmatter(&text).map_err(|m| vec![err(Some(1), m)])?;
    let value: Value = serde_yaml::from_str(yaml).map_err(|e| {
        vec![err(
            e.location().map(|l| l.line() + first_line - 1),
            format!(
                "frontmatter is not valid YAML: {}",
                super::error::redact(&e.to_string())
            ),
        )]
    })?;
    let mut errors = Vec::new();
    let mut sink = Sink::new(file.clone(), &text, &mut errors);
    let ctx = BlockCtx {
        sandbox: None,
        prefix: "",
        standalone: true,
        extra_providers,
        line: first_line,
    };
    match parse_block(value, &ctx, &mut sink, warnings) {
        Some((block, net)) if errors.is_empty() => Ok((block, net, file)),
        _ => Err(errors),
    }
}

/// Resolve a `ref`: `@owner/slug` through the index, anything else as a path relative to
/// `base_dir`. `Err(empty)` means "unresolvable"; `Err(errors)` means found but invalid.
pub(crate) fn resolve_ref(
    r: &str,
    base_dir: &Path,
    index: &PolicyIndex,
    extra_providers: &[String],
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Result<(SandboxBlock, NetworkSpec, Arc<str>), Vec<ConfigError>> {
    if r.starts_with('@') {
        return index
            .by_id
            .get(r)
            .map(|(b, n, f)| (b.clone(), n.clone(), f.clone()))
            .ok_or_else(Vec::new);
    }
    let path = if Path::new(r).is_absolute() {
        PathBuf::from(r)
    } else {
        base_dir.join(r)
    };
    if !path.is_file() {
        return Err(Vec::new());
    }
    files.push(path.clone());
    read_standalone(&path, extra_providers, warnings)
}

/// Split a standalone file into its YAML frontmatter and the line it starts on.
pub(crate) fn frontmatter(text: &str) -> Result<(&str, usize), String> {
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = body.split_inclusive('\n');
    match lines.next() {
        Some(first) if first.trim_end() == "---" => {}
        _ => {
            return Err("a SANDBOX.md file must start with a `---` line (YAML frontmatter)".into())
        }
    }
    let start = body.find('\n').map(|i| i + 1).unwrap_or(body.len());
    let mut offset = start;
    for line in lines {
        if line.trim_end() == "---" {
            return Ok((&body[start..offset], 2));
        }
        offset += line.len();
    }
    Err("frontmatter is not closed by a `---` line".into())
}

#[cfg(test)]
mod tests {
    use super::super::load;
    use super::frontmatter;

    const STANDALONE: &str = "---\nschema: sandbox/v1\nid: \"@acme/ci\"\nversion: 1.0.0\nprovider: local\nconfig: {}\nnetwork:\n  egress: [\"**.github.com\", \"*.githubusercontent.com\"]\n---\n\n# CI\n";

    #[test]
    fn refs_by_path_and_slug() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sb")).unwrap();
        std::fs::write(dir.path().join("sb/ci.SANDBOX.md"), STANDALONE).unwrap();
        let cfg = dir.path().join("proxy.yaml");
        std::fs::write(
            &cfg,
            "sandbox_dirs: [sb]\nsandboxes:\n  - id: a\n    policy: { ref: ./sb/ci.SANDBOX.md }\n  - id: b\n    policy: { ref: \"@acme/ci\" }\n  - id: c\n    policy: { ref: \"@acme/nope\" }\n",
        )
        .unwrap();
        let e = load(Some(&cfg)).unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert_eq!(e.0[0].code, Some("sandbox_ref_unresolvable"));
        assert_eq!(e.0[0].sandbox.as_deref(), Some("c"));
        assert_eq!(e.0[0].line, Some(8));
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("@acme/nope", "@acme/ci");
        std::fs::write(&cfg, text).unwrap();
        let c = load(Some(&cfg)).unwrap();
        assert_eq!(c.bindings.len(), 3);
        assert!(c.bindings[1].policy_file.ends_with("ci.SANDBOX.md"));
        assert_eq!(c.bindings[1].network.egress.len(), 2);
        assert!(c.files.iter().any(|f| f.ends_with("ci.SANDBOX.md")));
    }

    #[test]
    fn broken_standalone_files_are_reported_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.SANDBOX.md"), "---\nschema: sandbox/v1\nid: \"@a/b\"\nversion: 1.0.0\nprovider: local\nconfig: {}\nnetwork: { egress: [\"*\"] }\n---\n").unwrap();
        std::fs::write(dir.path().join("nofm.SANDBOX.md"), "# no frontmatter\n").unwrap();
        let cfg = dir.path().join("proxy.yaml");
        std::fs::write(&cfg, "sandbox_dirs: [.]\n").unwrap();
        let e = load(Some(&cfg)).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("bad.SANDBOX.md:7: network.egress[0]: `*`: `*` matches every host"),
            "{s}"
        );
        assert!(
            s.contains("nofm.SANDBOX.md:1: a SANDBOX.md file must start"),
            "{s}"
        );
    }

    #[test]
    fn frontmatter_split() {
        let (y, _) = frontmatter("---\nprovider: local\n---\n# hi\n").unwrap();
        assert_eq!(y, "provider: local\n");
        assert!(frontmatter("provider: local\n").is_err());
        assert!(frontmatter("---\nprovider: local\n").is_err());
    }
}
