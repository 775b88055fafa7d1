//! The head phase of the request pipeline: what a request's method, target and headers make of
//! it under the `network.http` rules of its host, before any body is read. The same function
//! judges a forwarded plain-HTTP request and each request of a terminated tunnel.

use std::sync::Arc;

use http::{HeaderMap, Method, Uri};

use super::Refusal;
use crate::config::Binding;
use crate::policy::http_rules::{
    canonical_path_with, git_probe_ambiguous, git_request, method_refusal, override_refusal,
    Admits, GitService, HttpRule,
};
use crate::policy::process::Process;
use crate::policy::protocols::{form, lfs, Protocol};
use crate::policy::reason::Reason;

/// The `network.http` rules of one sandbox for one host, compiled once per binding.
#[derive(Debug, Clone, Default)]
pub struct HostRules {
    /// The rules of the host, in order.
    pub rules: Vec<HttpRule>,
    /// Every rule here matches any path (no glob, git or protocol): an encoded `/` cannot
    /// reach a path a rule would refuse (npm's `@scope%2fname`).
    pub any_path: bool,
    /// The header the proxy signs the sandbox's identity in, when `host` is an identity host:
    /// never the sandbox's own to send.
    pub identity_header: Option<http::HeaderName>,
    /// Rules of this host left out because their scope (`binaries:`, `execs:`) does not admit
    /// the connection's process: what a refusal says when no other rule is left.
    pub outside: Option<String>,
    /// The rules the sandbox's layers set for this host, by layer (root first): each layer's
    /// must allow the request before the sandbox's own are read.
    pub above: Vec<(Arc<str>, Vec<HttpRule>)>,
}

/// A request's head, as the pipeline reads it.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// Its URI.
    pub uri: &'a Uri,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// The request carries a body (or may: a length the framing does not give as zero).
    pub has_body: bool,
    /// It asks to switch to a WebSocket (`Upgrade: websocket`, or HTTP/2's extended
    /// CONNECT): only a `protocol: websocket` rule decides it, and such a rule decides
    /// nothing else.
    pub upgrade: bool,
    /// It is HTTP/2's extended CONNECT with `:protocol websocket` (RFC 8441).
    pub extended: bool,
}

impl<'a> Head<'a> {
    /// The head of `req`; a body is assumed unless the framing says it is empty.
    pub fn of<B: http_body::Body>(req: &'a http::Request<B>) -> Self {
        let b = req.body();
        Head {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            has_body: !(b.is_end_stream() || b.size_hint().exact() == Some(0)),
            upgrade: wants_websocket(req.headers()) || extended_websocket(req),
            extended: extended_websocket(req),
        }
    }
}

/// Whether `req` is HTTP/2's extended CONNECT for a WebSocket (RFC 8441).
pub fn extended_websocket<B>(req: &http::Request<B>) -> bool {
    req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// Whether `headers` ask to switch to a WebSocket: an `Upgrade` token `websocket`, any case.
pub fn wants_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
}

/// What the head phase made of a request.
#[derive(Debug)]
pub enum HeadVerdict {
    /// Refused.
    Refused(Refusal),
    /// Allowed; what it called (git's service), if anything.
    Allowed(Option<String>),
    /// Allowed if its body is one these protocols allow ([`super::body`]).
    Judge(Vec<Arc<Protocol>>),
    /// An upgrade to a WebSocket a `protocol: websocket` rule allows: its messages are judged
    /// by that rule (`crate::intercept::websocket`).
    Socket(Arc<Protocol>),
}

/// Methods that carry no body an origin is bound to read: a body on them is refused on a host
/// judged per request (a protocol rule would not see it; an origin that ignores it would
/// read it as the next request).
const BODILESS: [Method; 4] = [Method::GET, Method::HEAD, Method::DELETE, Method::OPTIONS];

/// The LLM provider whose `network.http` rule judges `host` for `binding`, when one does:
/// every refusal of a request to it is answered in that provider's error shape, on every path.
pub fn provider_of(
    binding: &Binding,
    host: &str,
) -> Option<crate::policy::protocols::inference::Provider> {
    binding.network.http.iter().find_map(|r| {
        match r.protocol.as_deref().filter(|_| r.host.matches(host)) {
            Some(crate::policy::protocols::Protocol::Inference(i)) => Some(i.provider),
            _ => None,
        }
    })
}

impl HostRules {
    /// The rules of `binding` for `host`, for a connection of `process`: a rule whose scope
    /// does not admit it is left out (an unknown process is admitted by no scope), and if
    /// that leaves none, every request is refused as `process_not_allowed`.
    pub fn of(binding: &Binding, host: &str, process: Option<&Process>) -> Self {
        let (rules, outside): (Vec<HttpRule>, Vec<HttpRule>) = binding
            .network
            .http
            .iter()
            .filter(|r| r.host.matches(host))
            .cloned()
            .partition(|r| r.scope.as_ref().is_none_or(|s| s.admits(process)));
        let outside = outside.first().and_then(|r| r.scope.as_ref()).map(|s| {
            let who = process.map_or("no process attributed".into(), |p| p.to_string());
            format!("the network.http rules for {host} are for {s}; this connection: {who}")
        });
        let above: Vec<(Arc<str>, Vec<HttpRule>)> = (binding.network.layers.iter())
            .filter_map(|l| {
                let mine: Vec<HttpRule> = (l.http.iter())
                    .filter(|r| r.host.matches(host))
                    .cloned()
                    .collect();
                (!mine.is_empty()).then(|| (l.id.clone(), mine))
            })
            .collect();
        let every = || rules.iter().chain(above.iter().flat_map(|(_, r)| r));
        let any_path = every().next().is_some()
            && every().all(|r| r.paths.is_empty() && r.git.is_empty() && r.protocol.is_none());
        let identity_header = binding
            .identity_token
            .as_ref()
            .filter(|t| t.bound_to(host))
            .map(|t| t.header.clone());
        HostRules {
            rules,
            any_path,
            identity_header,
            outside,
            above,
        }
    }

    /// Whether there is anything here to judge a request by.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
            && self.identity_header.is_none()
            && self.outside.is_none()
            && self.above.is_empty()
    }

    /// The head phase, in order: the method, override headers and parameters, the path's
    /// canonical form, a body where the method carries none, the proxy's identity header,
    /// then the rules.
    pub fn judge(&self, host: &str, head: Head<'_>) -> HeadVerdict {
        match self.refusal(head).or_else(|| self.layered(host, head)) {
            Some(r) => HeadVerdict::Refused(r),
            None => self.rules(host, head),
        }
    }

    /// Why a layer's rules refuse `head`, if one does: each layer with rules for the host
    /// must have one that allows the method and path (an upgrade's method is its GET).
    fn layered(&self, host: &str, head: Head<'_>) -> Option<Refusal> {
        let (path, query) = (head.uri.path(), head.uri.query());
        let method = match head.method.as_str() {
            "CONNECT" if head.extended => "GET",
            m => m,
        };
        let (id, _) = self.above.iter().find(|(_, rules)| {
            !rules
                .iter()
                .any(|r| matches!(r.admits(method, path, query), Admits::Yes))
        })?;
        let reason = match git_request(method, path, query) {
            Some(_) => Reason::GitNotAllowed,
            None => Reason::HttpNotAllowed,
        };
        Some(Refusal::new(
            reason,
            format!("no network.http rule of layer {id} allows {method} {path} on {host}"),
        ))
    }

    /// Why `head` is refused before the rules are read, if it is.
    fn refusal(&self, head: Head<'_>) -> Option<Refusal> {
        let method = head.method.as_str();
        let refuse = |why: String| Some(Refusal::new(Reason::HttpNotAllowed, why));
        // Extended CONNECT is the socket's method on HTTP/2 (its rule decides it).
        let every = self
            .rules
            .iter()
            .chain(self.above.iter().flat_map(|(_, r)| r));
        if let Some(why) = method_refusal(method, every).filter(|_| !head.extended) {
            return refuse(why);
        }
        if let Some(why) = override_refusal(head.headers, head.uri.query()) {
            return refuse(why);
        }
        if let Err(why) = canonical_path_with(head.uri.path(), self.any_path) {
            return refuse(format!(
                "{why}: refused on hosts judged per request (the origin could read it as another path)"
            ));
        }
        if head.has_body
            && BODILESS
                .iter()
                .any(|m| m.as_str().eq_ignore_ascii_case(method))
        {
            return refuse(format!(
                "a {method} request with a body is refused on hosts judged per request (no rule reads it, and an origin could read it as another request)"
            ));
        }
        if let Some(h) = self
            .identity_header
            .as_ref()
            .filter(|h| head.headers.contains_key(*h))
        {
            return Some(Refusal {
                reason: Reason::CredentialMisuse,
                detail: identity_header_sent(h),
                credential: None,
                shown: None,
            });
        }
        None
    }

    /// What the rules make of a request the checks before them passed. Where a rule reads a
    /// protocol on this request's path (or git's smart HTTP on its repository), only such
    /// rules decide: a plainer rule for the same host cannot skip the protocol's judgement.
    fn rules(&self, host: &str, head: Head<'_>) -> HeadVerdict {
        let (method, path, query) = (head.method.as_str(), head.uri.path(), head.uri.query());
        let git_call =
            || git_request(method, path, query).map(|(s, _)| format!("git {}", s.name()));
        if head.upgrade && (head.extended || method != "CONNECT") {
            return self.socket(host, method, path, query);
        }
        if self.rules.is_empty() {
            return match &self.outside {
                Some(why) => {
                    HeadVerdict::Refused(Refusal::new(Reason::ProcessNotAllowed, why.clone()))
                }
                None => HeadVerdict::Allowed(None),
            };
        }
        let plain = || self.rules.iter().filter(|r| !r.is_websocket());
        // Where a rule reads the request, only the rules that read it decide: the first is
        // found once, each after it is asked once, and none matches the path again.
        let first = plain().position(|r| r.reads(method, path, query));
        let mut judges = Vec::new();
        for (i, r) in plain().enumerate() {
            let admits = match first {
                None => r.admits(method, path, query),
                Some(f) if i < f => continue,
                Some(f) if i == f || r.reads(method, path, query) => {
                    r.admits_read(method, path, query)
                }
                Some(_) => continue,
            };
            match admits {
                Admits::Yes => {
                    return match self.form_to_read(head) {
                        Some(form) => HeadVerdict::Judge(vec![Arc::new(Protocol::plugin(form))]),
                        None => HeadVerdict::Allowed(git_call()),
                    }
                }
                Admits::Judge(proto) => judges.push(proto.clone()),
                Admits::No => {}
            }
        }
        if !judges.is_empty() {
            return HeadVerdict::Judge(judges);
        }
        let git = git_request(method, path, query).is_some()
            || git_probe_ambiguous(method, path, query)
            || lfs::batch_repository(method, path).is_some();
        if let Some((service, repo)) = git_request(method, path, query) {
            return HeadVerdict::Refused(Refusal::new(
                Reason::GitNotAllowed,
                self.git_refusal(service, host, repo),
            ));
        }
        let reason = match git {
            true => Reason::GitNotAllowed,
            false => Reason::HttpNotAllowed,
        };
        HeadVerdict::Refused(Refusal::new(
            reason,
            format!("no network.http rule allows {method} {path} on {host}"),
        ))
    }

    /// A POST sent as a form, on a host whose rules name methods: its body is read for a
    /// `_method` override before it is sent ([`crate::policy::protocols::form`]).
    fn form_to_read(&self, head: Head<'_>) -> Option<form::Form> {
        if !head.has_body
            || !head.method.as_str().eq_ignore_ascii_case("POST")
            || self.rules.iter().all(|r| r.methods.is_empty())
        {
            return None;
        }
        head.headers
            .get_all(http::header::CONTENT_TYPE)
            .iter()
            .find_map(|v| form::Form::of(v.to_str().unwrap_or("")))
    }

    /// An upgrade to a WebSocket: allowed by the first `protocol: websocket` rule on its path,
    /// refused without one (whatever other rules allow).
    fn socket(&self, host: &str, method: &str, path: &str, query: Option<&str>) -> HeadVerdict {
        // The upgrade is a GET on HTTP/1.1, an extended CONNECT on HTTP/2 (nothing else).
        let get = if method == "CONNECT" { "GET" } else { method };
        for r in self.rules.iter().filter(|r| r.is_websocket()) {
            if let Admits::Judge(p) = r.admits(get, path, query) {
                return HeadVerdict::Socket(p.clone());
            }
        }
        HeadVerdict::Refused(Refusal::new(
            Reason::WebSocketNotAllowed,
            format!(
                "no `protocol: websocket` rule allows a WebSocket on {method} {path} of {host}"
            ),
        ))
    }

    /// What a refused git call says: the operation, where, and what the rules allow (clients
    /// review F1: a refused push read as a refused `GET …/info/refs`, which the clone before it
    /// had just made).
    fn git_refusal(&self, service: GitService, host: &str, repo: &str) -> String {
        let mut allowed: Vec<&str> = self
            .rules
            .iter()
            .flat_map(|r| r.git.iter().map(|g| g.name()))
            .collect();
        allowed.sort_unstable();
        allowed.dedup();
        let rules = match allowed.is_empty() {
            true => "no network.http rule for this host allows git".to_string(),
            false => format!("the rules allow git: [{}]", allowed.join(", ")),
        };
        let repo = repo.trim_end_matches(".git");
        format!(
            "git {} is not allowed on {host}{repo} ({rules})",
            service.name()
        )
    }
}

/// The refusal of a request that carries the identity header itself (clients review F6: it
/// spoke of a placeholder the sandbox never had).
pub fn identity_header_sent(header: &http::HeaderName) -> String {
    format!(
        "{header} is set by the proxy (the sandbox's signed identity); a sandbox may not send it"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::protocols::graphql::GraphQlRule;

    fn rules(list: Vec<HttpRule>) -> HostRules {
        HostRules {
            any_path: false,
            rules: list,
            identity_header: None,
            outside: None,
            above: Vec::new(),
        }
    }

    fn judge(r: &HostRules, method: &str, target: &str, body: bool) -> HeadVerdict {
        let (m, u, h) = (
            Method::from_bytes(method.as_bytes()).unwrap(),
            target.parse::<Uri>().unwrap(),
            HeaderMap::new(),
        );
        r.judge(
            "h.test",
            Head {
                method: &m,
                uri: &u,
                headers: &h,
                has_body: body,
                upgrade: false,
                extended: false,
            },
        )
    }

    #[test]
    fn a_plain_rule_does_not_skip_a_graphql_rule_on_its_path() {
        let gql = GraphQlRule::new(&["query".into()], &[], &["viewer".into()], &[]).unwrap();
        let r = rules(vec![
            HttpRule::with_protocol(
                "h.test",
                &[],
                &["/graphql".into()],
                &[],
                Some(Protocol::GraphQl(gql)),
            )
            .unwrap(),
            HttpRule::new("h.test", &["GET".into()], &[]).unwrap(),
        ]);
        assert!(matches!(
            judge(&r, "GET", "/graphql?query=%7B%20secret%20%7D", false),
            HeadVerdict::Judge(_)
        ));
        assert!(matches!(
            judge(&r, "GET", "/other", false),
            HeadVerdict::Allowed(_)
        ));
    }

    #[test]
    fn bodies_on_bodiless_methods_and_dot_segments_are_refused() {
        let r = rules(vec![
            HttpRule::new("h.test", &[], &["/ok/**".into()]).unwrap()
        ]);
        for (m, t, body) in [
            ("GET", "/ok/a", true),
            ("DELETE", "/ok/a", true),
            ("GET", "/ok/../secret", false),
            ("GET", "/ok/%2e%2e/secret", false),
            ("GET", "/secret", false),
        ] {
            assert!(
                matches!(judge(&r, m, t, body), HeadVerdict::Refused(_)),
                "{m} {t}"
            );
        }
        assert!(matches!(
            judge(&r, "POST", "/ok/a", true),
            HeadVerdict::Allowed(_)
        ));
        assert!(matches!(
            judge(&r, "GET", "/ok/a", false),
            HeadVerdict::Allowed(_)
        ));
    }
}
