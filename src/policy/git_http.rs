//! Git's smart HTTP as a server reads it: which service a request asks for (`git-upload-pack`
//! for fetch, `git-receive-pack` for push) and on which repository, with the probe's query
//! read as `git http-backend` reads it (parameter names percent-decoded). Pure; the
//! `network.http` rules' `git:` lists are matched against it ([`super::http_rules`]).

use super::http_rules::percent_decode;
use super::ParseError;

/// A git smart-HTTP service (`git: [fetch | push]` in a rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitService {
    /// `git-upload-pack`: clone and fetch.
    Fetch,
    /// `git-receive-pack`: push.
    Push,
}

impl GitService {
    /// The service a `service=` parameter or path names (`git-upload-pack`, `git-receive-pack`).
    pub fn parse(s: &str) -> Result<GitService, ParseError> {
        match s {
            "fetch" => Ok(GitService::Fetch),
            "push" => Ok(GitService::Push),
            _ => Err(ParseError(
                format!("git: `{s}` is not fetch or push").into(),
            )),
        }
    }

    /// As written in rules and records.
    pub fn name(self) -> &'static str {
        match self {
            GitService::Fetch => "fetch",
            GitService::Push => "push",
        }
    }

    fn pack(self) -> &'static str {
        match self {
            GitService::Fetch => "git-upload-pack",
            GitService::Push => "git-receive-pack",
        }
    }
}

/// What a request is in git's smart HTTP protocol: the service and the repository path, or
/// `None` when it is not a smart-HTTP request (the dumb protocol's plain GETs included).
pub fn git_request<'p>(
    method: &str,
    path: &'p str,
    query: Option<&str>,
) -> Option<(GitService, &'p str)> {
    let services = [GitService::Fetch, GitService::Push];
    if method.eq_ignore_ascii_case("GET") {
        let repo = path.strip_suffix("/info/refs")?;
        // Read as `git http-backend` reads it: names and values percent-decoded.
        let asked = git_services(query?);
        // One service, named exactly: two would leave the server to pick one.
        let [one] = &asked[..] else { return None };
        return services
            .into_iter()
            .find(|s| s.pack().as_bytes() == one.as_slice())
            .map(|s| (s, repo));
    }
    if method.eq_ignore_ascii_case("POST") {
        return services.into_iter().find_map(|s| {
            path.strip_suffix(s.pack())?
                .strip_suffix('/')
                .map(|r| (s, r))
        });
    }
    None
}

/// Every `service` parameter of a query, as servers read it: names and values
/// percent-decoded (`servic%65=` is `service=`), in order.
fn git_services(query: &str) -> Vec<Vec<u8>> {
    query
        .split(['&', ';'])
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k) == b"service").then(|| percent_decode(v))
        })
        .collect()
}

/// Whether a request is git's smart-HTTP probe (`GET …/info/refs`) whose service cannot be
/// read as exactly one: a `service` parameter named twice (however encoded), or a value that
/// is neither service. A server would pick one; the rules cannot judge which.
pub fn git_probe_ambiguous(method: &str, path: &str, query: Option<&str>) -> bool {
    if !method.eq_ignore_ascii_case("GET") || !path.ends_with("/info/refs") {
        return false;
    }
    let asked = git_services(query.unwrap_or(""));
    !asked.is_empty() && git_request(method, path, query).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_is_read_as_git_http_backend_reads_it() {
        let refs = "/org/a.git/info/refs";
        let q = |s: &'static str| Some(s);
        assert_eq!(
            git_request("GET", refs, q("service=git-upload-pack")).map(|(s, _)| s),
            Some(GitService::Fetch)
        );
        for two in [
            "service=git-upload-pack&servic%65=git-receive-pack",
            "service=git-upload-pack&%73ervice=git-receive-pack",
            "service=git-upload-pack;service=git-receive-pack",
            "service=git-upload-p%61ck&service=git-upload-pack",
        ] {
            assert_eq!(git_request("GET", refs, q(two)), None, "{two}");
            assert!(git_probe_ambiguous("GET", refs, q(two)), "{two}");
        }
        // One service, encoded: read as the server reads it.
        assert_eq!(
            git_request("GET", refs, q("servic%65=git-receive-pack")).map(|(s, _)| s),
            Some(GitService::Push)
        );
        assert!(!git_probe_ambiguous("GET", refs, q("x=1")));
    }
}
