//! What may a terminated request do? The names credentials and HTTP rules are bound to
//! ([`BoundHost`]: a name, `*.domain` or `**.domain`) and the `network.http` rules
//! ([`HttpRule`]: methods and path globs on a host). Pure: compiled at load, matched per
//! request by `intercept`.

use super::ParseError;

/// A host a credential (or an HTTP rule) is bound to: a name, `*.domain` or `**.domain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundHost {
    Exact(String),
    /// `*.d`: names below `d`.
    Below(String),
    /// `**.d`: `d` and names below it.
    ApexAndBelow(String),
}

impl BoundHost {
    /// Parse an entry; globs, addresses and ports are refused (bindings are by name).
    pub fn parse(text: &str) -> Result<BoundHost, ParseError> {
        use crate::policy::entry::{parse_entry, HostPattern};
        let e = parse_entry(text).map_err(|e| ParseError(e.to_string()))?;
        if e.ports.is_some() {
            return Err(ParseError(format!(
                "`{text}`: no port here (credentials follow the host on any allowed port)"
            )));
        }
        match e.host {
            HostPattern::Exact(n) => Ok(BoundHost::Exact(n)),
            HostPattern::Subdomains(s) => Ok(BoundHost::Below(s)),
            HostPattern::ApexAndSubdomains(s) => Ok(BoundHost::ApexAndBelow(s)),
            _ => Err(ParseError(format!(
                "`{text}`: bind credentials to names (`api.example.com`, `*.example.com`, `**.example.com`), not globs or addresses"
            ))),
        }
    }

    /// Whether `name` (normalised, lowercase) is this host.
    pub fn matches(&self, name: &str) -> bool {
        let below = |d: &str| {
            name.len() > d.len() + 1
                && name.ends_with(d)
                && name.as_bytes()[name.len() - d.len() - 1] == b'.'
        };
        match self {
            BoundHost::Exact(n) => name == n,
            BoundHost::Below(d) => below(d),
            BoundHost::ApexAndBelow(d) => name == d || below(d),
        }
    }
}

/// One `network.http` rule: on a terminated host, which methods and paths are allowed.
#[derive(Debug, Clone)]
pub struct HttpRule {
    pub text: String,
    pub host: BoundHost,
    /// Upper-case; empty: any method.
    pub methods: Vec<String>,
    /// Path globs (`*` within a segment, `**` across); empty: any path.
    pub paths: Vec<String>,
    matcher: Option<globset::GlobSet>,
}

impl PartialEq for HttpRule {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host && self.methods == other.methods && self.paths == other.paths
    }
}

impl HttpRule {
    pub fn new(host: &str, methods: &[String], paths: &[String]) -> Result<HttpRule, ParseError> {
        let host_pat = BoundHost::parse(host)?;
        let mut methods_up = Vec::new();
        for m in methods {
            let up = m.to_ascii_uppercase();
            if up.is_empty() || !up.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ParseError(format!("method `{m}` is not an HTTP method")));
            }
            methods_up.push(up);
        }
        let matcher = if paths.is_empty() {
            None
        } else {
            let mut b = globset::GlobSetBuilder::new();
            for p in paths {
                if !p.starts_with('/') {
                    return Err(ParseError(format!("path `{p}` must start with /")));
                }
                let g = globset::GlobBuilder::new(p)
                    .literal_separator(true)
                    .build()
                    .map_err(|e| ParseError(format!("path `{p}`: {e}")))?;
                b.add(g);
            }
            Some(b.build().map_err(|e| ParseError(e.to_string()))?)
        };
        Ok(HttpRule {
            text: format!("{host} {} {}", methods_up.join(","), paths.join(",")),
            host: host_pat,
            methods: methods_up,
            paths: paths.to_vec(),
            matcher,
        })
    }

    /// Whether this rule allows `method` on `path` (the path without its query).
    pub fn allows(&self, method: &str, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
            && self.matcher.as_ref().is_none_or(|m| m.is_match(path))
    }
}
