//! Capability presets: `preset: NAME` in `network.http` stands for a fixed set of ordinary
//! rules and the `network.egress` entries they need, expanded here before anything is
//! compiled (so a preset can do nothing a written rule could not). `egress-proxy presets
//! [NAME]` prints each expansion as YAML; `docs/presets.md` lists them.

use super::http_rules::RawHttpRule;

/// A preset's expansion.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Preset {
    /// The entries the preset adds to `network.egress`.
    pub egress: Vec<String>,
    /// The HTTP rules it adds.
    pub http: Vec<RawHttpRule>,
}

/// Every preset, by name.
pub const NAMES: [&str; 7] = [
    "github-read-only",
    "pypi-install",
    "npm-install",
    "crates-install",
    "openai-inference",
    "anthropic-inference",
    "gemini-inference",
];

fn v(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// An ordinary rule: `methods` on `paths` (none: any path) of `host`.
fn plain(host: &str, methods: &[&str], paths: &[&str]) -> RawHttpRule {
    RawHttpRule {
        host: host.into(),
        methods: v(methods),
        paths: v(paths),
        ..RawHttpRule::default()
    }
}

/// A rule reading a provider's calls (`protocol: openai | anthropic | gemini`) on `paths`:
/// models, web tools and usage are read (any model; web tools bounded by the sandbox's
/// egress).
fn inference(host: &str, provider: &str, paths: &[&str]) -> RawHttpRule {
    RawHttpRule {
        host: host.into(),
        paths: v(paths),
        protocol: Some(provider.into()),
        ..RawHttpRule::default()
    }
}

const READ: &[&str] = &["GET", "HEAD"];

/// The preset called `name`.
pub fn expand(name: &str) -> Result<Preset, String> {
    let (egress, http) = match name {
        "github-read-only" => (
            v(&[
                "github.com:443",
                "api.github.com:443",
                "codeload.github.com:443",
                "raw.githubusercontent.com:443",
                "objects.githubusercontent.com:443",
                "media.githubusercontent.com:443",
            ]),
            vec![
                RawHttpRule {
                    host: "github.com".into(),
                    paths: v(&["/*/*"]),
                    git: v(&["fetch"]),
                    lfs: v(&["download"]),
                    ..RawHttpRule::default()
                },
                plain(
                    "github.com",
                    READ,
                    &[
                        "/*/*/archive/**",
                        "/*/*/releases/download/**",
                        "/*/*/raw/**",
                    ],
                ),
                plain("api.github.com", READ, &[]),
                RawHttpRule {
                    host: "api.github.com".into(),
                    paths: v(&["/graphql"]),
                    protocol: Some("graphql".into()),
                    operations: v(&["query"]),
                    ..RawHttpRule::default()
                },
                plain("codeload.github.com", READ, &[]),
                plain("raw.githubusercontent.com", READ, &[]),
                plain("objects.githubusercontent.com", READ, &[]),
                plain("media.githubusercontent.com", READ, &[]),
            ],
        ),
        "pypi-install" => (
            v(&["pypi.org:443", "files.pythonhosted.org:443"]),
            vec![
                plain(
                    "pypi.org",
                    READ,
                    &[
                        "/simple",
                        "/simple/",
                        "/simple/**",
                        "/pypi/*/json",
                        "/pypi/*/*/json",
                    ],
                ),
                plain("files.pythonhosted.org", READ, &["/packages/**"]),
            ],
        ),
        "npm-install" => (
            v(&["registry.npmjs.org:443"]),
            vec![plain("registry.npmjs.org", READ, &[])],
        ),
        "crates-install" => (
            v(&["index.crates.io:443", "static.crates.io:443"]),
            vec![
                plain("index.crates.io", READ, &[]),
                plain("static.crates.io", READ, &["/crates/**"]),
            ],
        ),
        "openai-inference" => (
            v(&["api.openai.com:443"]),
            vec![
                inference(
                    "api.openai.com",
                    "openai",
                    &[
                        "/v1/chat/completions",
                        "/v1/completions",
                        "/v1/embeddings",
                        "/v1/responses",
                        "/v1/moderations",
                    ],
                ),
                plain("api.openai.com", &["GET"], &["/v1/models", "/v1/models/*"]),
            ],
        ),
        "anthropic-inference" => (
            v(&["api.anthropic.com:443"]),
            vec![
                inference(
                    "api.anthropic.com",
                    "anthropic",
                    &["/v1/messages", "/v1/messages/count_tokens", "/v1/complete"],
                ),
                plain(
                    "api.anthropic.com",
                    &["GET"],
                    &["/v1/models", "/v1/models/*"],
                ),
            ],
        ),
        "gemini-inference" => (
            v(&["generativelanguage.googleapis.com:443"]),
            vec![
                inference(
                    "generativelanguage.googleapis.com",
                    "gemini",
                    &["/v1beta/models/*:*", "/v1/models/*:*"],
                ),
                plain(
                    "generativelanguage.googleapis.com",
                    &["GET"],
                    &[
                        "/v1beta/models",
                        "/v1beta/models/*",
                        "/v1/models",
                        "/v1/models/*",
                    ],
                ),
            ],
        ),
        other => {
            return Err(format!(
                "`{other}` is not a preset (one of: {})",
                NAMES.join(", ")
            ))
        }
    };
    Ok(Preset { egress, http })
}

/// `rules` with every preset entry replaced by its rules, and the egress entries the presets
/// add (those not already in `egress`).
pub fn expand_all(
    rules: &[RawHttpRule],
    egress: &[String],
) -> Result<(Vec<RawHttpRule>, Vec<String>), (usize, String)> {
    let mut out = Vec::with_capacity(rules.len());
    let mut added: Vec<String> = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let Some(name) = &r.preset else {
            out.push(r.clone());
            continue;
        };
        if *r
            != (RawHttpRule {
                preset: r.preset.clone(),
                ..RawHttpRule::default()
            })
        {
            return Err((
                i,
                format!("`preset: {name}` stands alone (write other rules as their own entries)"),
            ));
        }
        let p = expand(name).map_err(|e| (i, e))?;
        out.extend(p.http);
        for e in p.egress {
            if !egress.contains(&e) && !added.contains(&e) {
                added.push(e);
            }
        }
    }
    Ok((out, added))
}

/// The preset `name` (all of them: `None`) as YAML, the way it is expanded.
pub fn to_yaml(name: Option<&str>) -> Result<String, String> {
    let mut out = String::new();
    for n in NAMES.iter().filter(|n| name.is_none_or(|x| x == **n)) {
        let p = expand(n)?;
        let mut doc = serde_yaml::Mapping::new();
        doc.insert(
            "network".into(),
            serde_yaml::to_value(p).map_err(|e| e.to_string())?,
        );
        out.push_str(&format!("# `preset: {n}` in network.http stands for:\n"));
        out.push_str(&serde_yaml::to_string(&doc).map_err(|e| e.to_string())?);
    }
    match out.is_empty() {
        true => expand(name.unwrap_or("")).map(|_| out),
        false => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_compiles_into_ordinary_rules() {
        for n in NAMES {
            let p = expand(n).unwrap();
            assert!(!p.egress.is_empty() && !p.http.is_empty(), "{n}");
            for r in &p.http {
                r.compile().unwrap_or_else(|e| panic!("{n}: {e}"));
            }
            for e in &p.egress {
                crate::policy::entry::parse_entry(e).unwrap();
            }
        }
        assert!(expand("github-write").is_err());
        assert!(to_yaml(Some("pypi-install"))
            .unwrap()
            .contains("files.pythonhosted.org"));
        assert!(to_yaml(Some("nope")).is_err());
    }

    #[test]
    fn github_read_only_clones_but_never_pushes_or_writes() {
        let p = expand("github-read-only").unwrap();
        let rules: Vec<_> = p.http.iter().map(|r| r.compile().unwrap()).collect();
        let allowed = |host: &str, m: &str, path: &str, q: Option<&str>| {
            rules
                .iter()
                .filter(|r| r.host.matches(host))
                .any(|r| !matches!(r.admits(m, path, q), crate::policy::http_rules::Admits::No))
        };
        assert!(allowed(
            "github.com",
            "GET",
            "/o/r.git/info/refs",
            Some("service=git-upload-pack")
        ));
        assert!(allowed(
            "github.com",
            "POST",
            "/o/r.git/git-upload-pack",
            None
        ));
        assert!(!allowed(
            "github.com",
            "GET",
            "/o/r.git/info/refs",
            Some("service=git-receive-pack")
        ));
        assert!(!allowed(
            "github.com",
            "POST",
            "/o/r.git/git-receive-pack",
            None
        ));
        assert!(allowed("api.github.com", "GET", "/repos/o/r", None));
        assert!(!allowed("api.github.com", "POST", "/gists", None));
        assert!(!allowed("api.github.com", "POST", "/repos/o/r/forks", None));
        assert!(!allowed(
            "api.github.com",
            "PUT",
            "/repos/o/r/collaborators/x",
            None
        ));
        assert!(!allowed(
            "api.github.com",
            "PATCH",
            "/user/repository_invitations/1",
            None
        ));
        // GraphQL goes to its judge (queries only).
        assert!(allowed("api.github.com", "POST", "/graphql", None));
        assert!(!allowed("gist.github.com", "GET", "/", None));
    }
}
