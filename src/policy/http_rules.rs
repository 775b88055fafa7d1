//! What may a terminated request do? The names credentials and HTTP rules are bound to
//! ([`BoundHost`]: a name, `*.domain` or `**.domain`), the `network.http` rules
//! ([`HttpRule`]: methods and path globs on a host), and what a request must look like before
//! any rule is matched: a canonical path ([`canonical_path`]: nothing an upstream could read
//! as another path) and a method compared without regard to case ([`method_refusal`]). Pure:
//! compiled at load, matched per request by `intercept`.

use std::sync::Arc;

pub use super::git_http::{git_probe_ambiguous, git_request, GitService};
use super::protocols::{lfs, Protocol};
use super::ParseError;
use crate::policy::cause::{caused, of};

/// A host a credential (or an HTTP rule) is bound to: a name, `*.domain` or `**.domain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundHost {
    /// One name.
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
        let e = parse_entry(text).map_err(|e| ParseError(of(e)))?;
        if e.ports.is_some() {
            return Err(ParseError(
                format!("`{text}`: no port here (credentials follow the host on any allowed port)")
                    .into(),
            ));
        }
        match e.host {
            HostPattern::Exact(n) => Ok(BoundHost::Exact(n)),
            HostPattern::Subdomains(s) => Ok(BoundHost::Below(s)),
            HostPattern::ApexAndSubdomains(s) => Ok(BoundHost::ApexAndBelow(s)),
            _ => Err(ParseError(format!(
                "`{text}`: bind credentials to names (`api.example.com`, `*.example.com`, `**.example.com`), not globs or addresses"
            ).into())),
        }
    }

    /// As written in a config (`api.example.com`, `*.example.com`, `**.example.com`).
    pub fn text(&self) -> String {
        match self {
            BoundHost::Exact(n) => n.clone(),
            BoundHost::Below(d) => format!("*.{d}"),
            BoundHost::ApexAndBelow(d) => format!("**.{d}"),
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
    /// The rule as written (for records and explanations).
    pub text: String,
    /// The host it applies to.
    pub host: BoundHost,
    /// Upper-case; empty: any method.
    pub methods: Vec<String>,
    /// Path globs (`*` within a segment, `**` across); empty: any path. With `git`, they
    /// name repositories (the path before `/info/refs`, `/git-upload-pack`, …).
    pub paths: Vec<String>,
    /// `git: [fetch, push]`: the rule allows only git's smart HTTP for these services.
    pub git: Vec<GitService>,
    /// `protocol:` (or `lfs:`): the request body is judged by it ([`Protocol::judge`]).
    pub protocol: Option<Arc<Protocol>>,
    /// `binaries:` / `execs:`: the rule is for these processes only.
    pub scope: Option<crate::policy::process::Scope>,
    matcher: Option<globset::GlobSet>,
}

/// What a rule makes of a request's method, path and query.
#[derive(Debug, Clone, Copy)]
pub enum Admits<'r> {
    /// The rule does not allow the request.
    No,
    /// The rule allows the request.
    Yes,
    /// Yes if the body is one its protocol allows.
    Judge(&'r Arc<Protocol>),
}

impl PartialEq for HttpRule {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host
            && self.methods == other.methods
            && self.paths == other.paths
            && self.git == other.git
            && self.text == other.text
            && self.scope == other.scope
    }
}

impl HttpRule {
    /// A rule for `host` allowing `methods` on `paths` (globs); `Err` when one does not parse.
    pub fn new(host: &str, methods: &[String], paths: &[String]) -> Result<HttpRule, ParseError> {
        Self::with_git(host, methods, paths, &[])
    }

    /// A rule that may name git services (`git: [fetch | push]`): then it allows git's smart
    /// HTTP for those services on the repositories `paths` name, and nothing else.
    pub fn with_git(
        host: &str,
        methods: &[String],
        paths: &[String],
        git: &[String],
    ) -> Result<HttpRule, ParseError> {
        Self::with_protocol(host, methods, paths, git, None)
    }

    /// A rule that may also name a protocol ([`Protocol`]: `protocol: mcp | jsonrpc |
    /// graphql`, or `lfs:`): then it allows only that protocol's requests on its paths (for
    /// LFS: the batch calls of the repositories its paths name), judged by their bodies.
    pub fn with_protocol(
        host: &str,
        methods: &[String],
        paths: &[String],
        git: &[String],
        protocol: Option<Protocol>,
    ) -> Result<HttpRule, ParseError> {
        if protocol.is_some() && !methods.is_empty() {
            return Err(ParseError(
                "a rule with a protocol names no HTTP methods (the protocol's own are implied)"
                    .into(),
            ));
        }
        if matches!(protocol, Some(ref p) if !matches!(p, Protocol::Lfs(_))) && !git.is_empty() {
            return Err(ParseError(
                "a rule names git or a protocol, not both".into(),
            ));
        }
        let git = git
            .iter()
            .map(|g| GitService::parse(g))
            .collect::<Result<Vec<_>, _>>()?;
        if !git.is_empty() && !methods.is_empty() {
            return Err(ParseError(
                "a rule with `git` names no methods (git's own are implied); write another rule for the others".into(),
            ));
        }
        let host_pat = BoundHost::parse(host)?;
        let methods_up = upper_methods(methods)?;
        let matcher = path_matcher(paths)?;
        let git_text = match git.is_empty() {
            true => String::new(),
            false => {
                let names: Vec<&str> = git.iter().map(|g| g.name()).collect();
                format!(" git:{}", names.join(","))
            }
        };
        let protocol_text = protocol
            .as_ref()
            .map(|p| format!(" {}", p.describe()))
            .unwrap_or_default();
        Ok(HttpRule {
            text: format!(
                "{host} {} {}{git_text}{protocol_text}",
                methods_up.join(","),
                paths.join(",")
            ),
            host: host_pat,
            methods: methods_up,
            paths: paths.to_vec(),
            git,
            protocol: protocol.map(Arc::new),
            matcher,
            scope: None,
        })
    }

    /// Whether this rule allows `method` (any case) on `path` (canonical, without its
    /// query: see [`canonical_path`]).
    pub fn allows(&self, method: &str, path: &str) -> bool {
        self.allows_request(method, path, None)
    }

    /// [`HttpRule::allows`], with the request's query (git's smart HTTP names its service
    /// there). A rule with `git` allows only smart-HTTP requests for its services, on the
    /// repositories its paths name.
    pub fn allows_request(&self, method: &str, path: &str, query: Option<&str>) -> bool {
        matches!(self.admits(method, path, query), Admits::Yes)
    }

    /// What this rule makes of a request (see [`Admits`]). A rule with `git` allows only
    /// smart-HTTP requests for its services on the repositories its paths name (and, with
    /// `lfs`, judges those repositories' LFS batch calls); a rule with a protocol judges the
    /// requests that protocol carries on its paths.
    pub fn admits(&self, method: &str, path: &str, query: Option<&str>) -> Admits<'_> {
        let on = |p: &str| self.matcher.as_ref().is_none_or(|m| m.is_match(p));
        let yes = |b: bool| if b { Admits::Yes } else { Admits::No };
        if let Some(p) = self
            .protocol
            .as_ref()
            .filter(|p| matches!(***p, Protocol::Lfs(_)))
        {
            if let Some(repo) = lfs::batch_repository(method, path) {
                return match on(repo) {
                    true => Admits::Judge(p),
                    false => Admits::No,
                };
            }
        }
        if !self.git.is_empty() || matches!(self.protocol.as_deref(), Some(Protocol::Lfs(_))) {
            return yes(git_request(method, path, query)
                .is_some_and(|(service, repo)| self.git.contains(&service) && on(repo)));
        }
        match self.protocol.as_ref() {
            Some(p) if p.carries(method) && on(path) => Admits::Judge(p),
            Some(_) => Admits::No,
            None => yes(self.names_method(method) && on(path)),
        }
    }

    /// [`HttpRule::admits`] for a request this rule [`reads`](HttpRule::reads): a protocol
    /// rule's path is then known to match and is not matched again (a glob set's work, twice
    /// per judged call before).
    pub fn admits_read(&self, method: &str, path: &str, query: Option<&str>) -> Admits<'_> {
        match self.protocol.as_ref() {
            Some(p) if self.git.is_empty() && !matches!(**p, Protocol::Lfs(_)) => {
                match p.carries(method) {
                    true => Admits::Judge(p),
                    false => Admits::No,
                }
            }
            _ => self.admits(method, path, query),
        }
    }

    /// Whether this rule reads a protocol on this request, whatever its method: a rule naming
    /// a protocol on one of its paths, a `git` rule on a smart-HTTP request of one of its
    /// repositories, an LFS rule on a batch call of one of them. Where one does, a plainer
    /// rule for the same host does not decide the request ([`crate::pipeline::head`]).
    pub fn reads(&self, method: &str, path: &str, query: Option<&str>) -> bool {
        let on = |p: &str| self.matcher.as_ref().is_none_or(|m| m.is_match(p));
        let git = || {
            git_request(method, path, query).is_some_and(|(_, repo)| on(repo))
                || git_probe_ambiguous(method, path, query)
        };
        match self.protocol.as_deref() {
            Some(Protocol::Lfs(_)) => lfs::batch_repository(method, path).is_some_and(on) || git(),
            Some(_) => on(path),
            None => !self.git.is_empty() && git(),
        }
    }

    /// Whether this is a `protocol: websocket` rule (it decides upgrades only).
    pub fn is_websocket(&self) -> bool {
        matches!(self.protocol.as_deref(), Some(Protocol::WebSocket(_)))
    }

    /// Whether this rule names `method` (any case) explicitly.
    pub fn names_method(&self, method: &str) -> bool {
        self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    fn names_exactly(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }
}

/// The methods a terminated host serves without a rule naming them.
const ORDINARY_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"];

/// Why `method` is refused on a terminated host whose rules are `rules` (those bound to the
/// host), before any path is looked at: TRACE and TRACK echo the request (injected
/// credentials included), and methods other than the ordinary ones are refused unless a rule
/// names them. Compared without regard to case (`trace` is TRACE).
pub fn method_refusal<'r>(
    method: &str,
    mut rules: impl Iterator<Item = &'r HttpRule>,
) -> Option<String> {
    let ordinary = ORDINARY_METHODS
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method));
    if ordinary || rules.any(|r| r.names_exactly(method)) {
        return None;
    }
    let up = method.to_ascii_uppercase();
    Some(if up == "TRACE" || up == "TRACK" {
        format!("{up} is refused on terminated hosts (it would echo injected credentials)")
    } else {
        format!("{method} is refused on terminated hosts unless a network.http rule names it")
    })
}

/// Request headers that ask an upstream framework to treat the request as another method,
/// path or host than the one the rules judged (Rails, Laravel, Symfony, Express
/// `method-override`, IIS URL Rewrite, Spring's forwarded headers).
const OVERRIDE_HEADERS: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-original-uri",
    "x-rewrite-url",
    "x-override-url",
    "x-forwarded-host",
    "x-forwarded-prefix",
    "x-forwarded-path",
    "x-forwarded-uri",
];

/// Why a request on a terminated host asks to be read as another method, path or host than
/// the one its method and path rules judged: an override header ([`OVERRIDE_HEADERS`]), or a
/// `_method` query parameter (any case, percent-encoded or not). Such a request is refused:
/// the rules (and the credential injected with them) would apply to one request and the
/// upstream would act on another.
pub fn override_refusal(headers: &http::HeaderMap, query: Option<&str>) -> Option<String> {
    // One pass over the request's names (all lowercase), not a lookup per override name:
    // every one of them starts `x-`, which most request headers do not.
    let named = headers
        .keys()
        .map(http::HeaderName::as_str)
        .find(|n| n.starts_with("x-") && OVERRIDE_HEADERS.contains(n));
    if let Some(h) = named {
        return Some(format!(
            "the {h} header would make the upstream read another method, path or host than the rules judged; refused on terminated hosts"
        ));
    }
    let query = query?;
    for pair in query.split(['&', ';']) {
        let key = pair.split('=').next().unwrap_or("");
        let decoded = percent_decode(key);
        if decoded.eq_ignore_ascii_case(b"_method") {
            return Some(
                "the _method query parameter would make the upstream read another method than the rules judged; refused on terminated hosts"
                    .into(),
            );
        }
    }
    None
}

/// `%XX` decoded (`+` as a space); malformed escapes are kept as they are.
pub(crate) fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// Why a request path is not canonical: it could mean another path to the upstream than the
/// one rules are matched on. Refused: anything but an absolute path; `.` and `..` segments
/// (also as `..;params`); percent-encoded `.`, `/`, `\`, NUL or control bytes; malformed
/// percent-encoding; a raw `\` or control byte. Every other path is matched and forwarded
/// exactly as received.
pub fn canonical_path(path: &str) -> Result<(), &'static str> {
    canonical_path_with(path, false)
}

/// [`canonical_path`], with a percent-encoded `/` allowed when `encoded_slash` (the host's
/// rules match no path glob, so no reading of the path can reach one they would refuse: npm's
/// `@scope%2fname`).
pub fn canonical_path_with(path: &str, encoded_slash: bool) -> Result<(), &'static str> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Err("the path is not absolute");
    }
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => return Err("the path has a backslash"),
            c if c < 0x20 || c == 0x7f => return Err("the path has a control byte"),
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                let (Some(h), Some(l)) = (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err("the path has a malformed percent-encoding");
                };
                let c = (h * 16 + l) as u8;
                if c == b'/' && encoded_slash {
                    i += 3;
                    continue;
                }
                if matches!(c, b'.' | b'/' | b'\\') || c < 0x20 || c == 0x7f {
                    return Err("the path percent-encodes `.`, `/`, `\\` or a control byte");
                }
                i += 3;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    for segment in path.split('/') {
        let bare = segment.split(';').next().unwrap_or(segment);
        if bare == "." || bare == ".." {
            return Err("the path has a `.` or `..` segment");
        }
    }
    Ok(())
}

/// A rule's methods in upper case; an error names one that is not an HTTP method.
fn upper_methods(methods: &[String]) -> Result<Vec<String>, ParseError> {
    let mut up = Vec::with_capacity(methods.len());
    for m in methods {
        let u = m.to_ascii_uppercase();
        if u.is_empty() || !u.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(ParseError(
                format!("method `{m}` is not an HTTP method").into(),
            ));
        }
        up.push(u);
    }
    Ok(up)
}

/// A rule's path globs compiled (`*` within a segment, `**` across); `None`: every path.
fn path_matcher(paths: &[String]) -> Result<Option<globset::GlobSet>, ParseError> {
    if paths.is_empty() {
        return Ok(None);
    }
    let mut b = globset::GlobSetBuilder::new();
    for p in paths {
        if !p.starts_with('/') {
            return Err(ParseError(format!("path `{p}` must start with /").into()));
        }
        let g = globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|e| ParseError(caused(format!("path `{p}`"), e)))?;
        b.add(g);
    }
    Ok(Some(b.build().map_err(|e| ParseError(of(e)))?))
}

#[cfg(test)]
mod tests;
