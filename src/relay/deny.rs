//! Deny responses on the explicit proxy (DESIGN §6): status, `Proxy-Status` (RFC 9209) with
//! the error type and `details`, and a short text body that tells an agent what was refused,
//! for which sandbox, why, which file/rule to change — and that going around the proxy will
//! not work. One builder serves every refusal, 429s included; [`wire`] renders the same
//! response as raw HTTP/1.1 for the accept loop, which refuses before hyper is involved.
//!
//! Most CONNECT clients drop a refusal's headers and body and print only its status line, so
//! the **reason phrase** says it too: `HTTP/1.1 403 egress-proxy: refused denied.example:443:
//! not in network.egress of sandbox agent1 (policy.yaml) [no_rule_matched]` reaches the
//! errors of wget, urllib, requests, pip, httpx, aiohttp, npm, Go and Java. One line of
//! printable ASCII, at most [`MAX_PHRASE`] bytes, built from the same sanitised text as the
//! body (no credentials: targets never carry userinfo).
//!
//! A client that asks for JSON (`Accept: application/json`, as an agent's tool would) gets the
//! same refusal as a JSON object it can act on ([`response_to`]): `reason`, `rule`, `host`,
//! `port`, `sandbox`, `explanation`, `hint`, `retry_after`.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::policy::protocols::inference::Provider;
use crate::policy::reason::Reason;
use crate::policy::target::Target;
use crate::relay::body::{self, Body};

/// What an HTTP refusal says: the wording every answer shape here is built from.
pub struct Wording<'a> {
    pub reason: Reason,
    /// `CONNECT host:port` or `GET http://…` (already sanitised, no credentials).
    pub what: &'a str,
    /// The sandbox, when identified.
    pub sandbox: Option<&'a str>,
    /// The explanation (`Decision::explain`).
    pub explanation: &'a str,
    /// Seconds for `Retry-After` on 429s (1 when not given).
    pub retry_after: Option<u64>,
    /// Where this sandbox can ask for access (shown when a grant could answer the refusal).
    pub ask: AskUrl,
}

/// Where a sandbox asks for access, in the form this proxy can serve it (F3 of the client
/// review): a sandbox set up with `HTTPS_PROXY` alone sends `http://` URLs direct, so the
/// advertised URL is `https://` whenever the proxy can terminate `egress-proxy.local` (it has
/// the interception CA the sandbox trusts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskUrl {
    /// `https://egress-proxy.local/v1/requests`: reached through `HTTPS_PROXY` alone.
    Https,
    /// `http://egress-proxy.local/v1/requests`: no interception CA, so the request must be sent
    /// through the proxy as plain HTTP (`HTTP_PROXY`, or `curl -x`).
    Http,
}

impl AskUrl {
    /// The form a proxy with (`true`) or without an interception CA serves.
    pub fn with_tls(tls: bool) -> AskUrl {
        if tls {
            AskUrl::Https
        } else {
            AskUrl::Http
        }
    }

    /// The URL to `POST` an access request to.
    pub fn url(self) -> &'static str {
        match self {
            AskUrl::Https => REQUEST_ACCESS_HTTPS,
            AskUrl::Http => REQUEST_ACCESS,
        }
    }

    /// The end of a reason phrase: how to ask, in a form every client prints.
    fn phrase_tail(self) -> &'static str {
        match self {
            AskUrl::Https => " (ask: POST https://egress-proxy.local/v1/requests)",
            AskUrl::Http => " (ask: POST http://egress-proxy.local/v1/requests via HTTP_PROXY)",
        }
    }
}

/// Longest reason phrase sent.
pub const MAX_PHRASE: usize = 240;

/// The reason phrase of a refusal: printable ASCII, one line, bounded — with the
/// `[reason]` code first, so that however it is cut (here, or by a client that shows only
/// the start of a line) the code survives; a refusal a grant could answer ends with where to
/// ask, which the bound never cuts (the explanation is shortened instead).
pub fn phrase(r: &Wording<'_>) -> String {
    let subject = r.what.strip_prefix("CONNECT ").unwrap_or(r.what);
    let text = format!(
        "egress-proxy [{}]: refused {subject}: {}",
        r.reason.code(),
        r.explanation
    );
    let tail = if grantable(r.reason) {
        r.ask.phrase_tail()
    } else {
        ""
    };
    let mut out: String = text
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect();
    let room = MAX_PHRASE - tail.len();
    if out.len() > room {
        out.truncate(room - 3);
        out.push_str("...");
    }
    out.push_str(tail);
    out
}

/// Keep printable ASCII only, and escape what an sf-string cannot hold.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

/// Build the HTTP response for a refusal.
pub fn response(r: &Wording<'_>) -> Response<Body> {
    let (parts, text) = build(r).into_parts();
    Response::from_parts(parts, body::full(text))
}

/// What a refusal in JSON says besides the text's: the refused target and the rule.
#[derive(Clone, Copy, Default)]
pub struct Structured<'a> {
    pub target: Option<&'a Target>,
    pub rule: Option<&'a str>,
}

/// Whether a request's `Accept` asks for JSON (`application/json` or `+json`, not refused with
/// `q=0`).
pub fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let json = media == "application/json" || media.ends_with("+json");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            json && !refused
        })
}

/// [`response`], with the body as JSON when `json` is given (the client asked for it).
pub fn response_to(r: &Wording<'_>, json: Option<Structured<'_>>) -> Response<Body> {
    let Some(s) = json else {
        return response(r);
    };
    let (mut parts, _) = build(r).into_parts();
    let body = serde_json::json!({
        "error": "refused by egress-proxy",
        "reason": r.reason.code(),
        "rule": s.rule,
        "host": s.target.map(|t| t.host.to_string()),
        "port": s.target.map(|t| t.port),
        "sandbox": r.sandbox,
        "refused": r.what,
        "explanation": r.explanation,
        "hint": hint(r.reason, r.ask).trim_end(),
        "retry_after": r.retry_after,
        "request_access": grantable(r.reason).then(|| serde_json::json!({
            "method": "POST",
            "url": r.ask.url(),
            "body": {
                "host": s.target.map(|t| crate::policy::granted::host_text(&t.host).trim_matches(['[', ']']).to_string()),
                "port": s.target.map(|t| t.port),
                "reason": "why this sandbox needs it",
            },
        })),
    });
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, body::full(Bytes::from(body.to_string())))
}

/// A refusal on a host an LLM provider's rule judges, in that provider's error shape (its SDK
/// raises an error that carries the message): `reason`'s status, the explanation as the
/// error's message, `Retry-After` and `x-should-retry: false` on a budget (the official SDKs
/// would otherwise retry a 429), `Proxy-Status` as in every refusal.
pub fn provider_shaped(
    provider: Provider,
    reason: Reason,
    explanation: &str,
    sandbox: Option<&str>,
) -> Response<Body> {
    let message = format!(
        "{} (egress-proxy): {explanation}{}",
        reason.code(),
        sandbox
            .map(|i| format!(" [sandbox {i}]"))
            .unwrap_or_default()
    );
    let code = reason.code();
    let doc = match provider {
        Provider::OpenAi => serde_json::json!({
            "error": { "message": message, "type": code, "param": null, "code": code }
        }),
        Provider::Anthropic => serde_json::json!({
            "type": "error", "error": { "type": code, "message": message }
        }),
        Provider::Gemini => serde_json::json!({
            "error": {
                "code": reason.status(),
                "message": message,
                "status": match reason {
                    Reason::BudgetExceeded => "RESOURCE_EXHAUSTED",
                    _ => "PERMISSION_DENIED",
                }
            }
        }),
    };
    let mut resp = Response::new(body::full(Bytes::from(doc.to_string())));
    *resp.status_mut() = StatusCode::from_u16(reason.status()).unwrap_or(StatusCode::FORBIDDEN);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert("x-should-retry", HeaderValue::from_static("false"));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "egress-proxy; error=http_request_denied; details=\"{code}\""
    )) {
        h.insert("proxy-status", v);
    }
    if reason == Reason::BudgetExceeded {
        let secs = crate::egress::quota::until_tomorrow().as_secs();
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// The same refusal inside a tunnel the proxy terminated (credential brokering): the
/// connection stays open for the client's next request, so no `Connection: close`.
pub fn in_tunnel(r: &Wording<'_>) -> Response<Body> {
    let mut resp = response(r);
    resp.headers_mut().remove(header::CONNECTION);
    resp
}

/// The refusal of JSON-RPC calls (MCP, `protocol: jsonrpc`), answered the way their client
/// reads answers: status 200, `application/json`, one error per request id (an array for a
/// batch), code -32001, the house text as the message and the reason in `data`; the
/// `Proxy-Status` header as in every other refusal.
pub fn jsonrpc(r: &Wording<'_>, ids: &[serde_json::Value], batch: bool) -> Response<Body> {
    let (mut parts, text) = build(r).into_parts();
    let message = String::from_utf8_lossy(&text)
        .lines()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let error = |id: &serde_json::Value| {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": -32001,
                "message": message,
                "data": {"reason": r.reason.code(), "sandbox": r.sandbox, "detail": r.explanation},
            }
        })
    };
    let doc = match (batch, ids) {
        (false, [one]) => error(one),
        _ => serde_json::Value::Array(ids.iter().map(error).collect()),
    };
    parts.status = StatusCode::OK;
    parts.headers.remove(header::CONNECTION);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    Response::from_parts(parts, body::full(doc.to_string()))
}

/// The same response as HTTP/1.1 bytes (status line, headers, body).
pub fn wire(r: &Wording<'_>) -> Vec<u8> {
    render(build(r), &phrase(r))
}

/// A response as HTTP/1.1 bytes with reason phrase `phrase`.
fn render(resp: Response<Bytes>, phrase: &str) -> Vec<u8> {
    let status = resp.status();
    let mut out = format!("HTTP/1.1 {} {phrase}\r\n", status.as_u16()).into_bytes();
    for (name, value) in resp.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let text = resp.into_body();
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", text.len()).as_bytes());
    out.extend_from_slice(&text);
    out
}

fn build(r: &Wording<'_>) -> Response<Bytes> {
    let status = StatusCode::from_u16(r.reason.status()).unwrap_or(StatusCode::FORBIDDEN);
    let who = r
        .sandbox
        .map(|s| format!(" for sandbox {s}"))
        .unwrap_or_default();
    let body = format!(
        "egress-proxy refused {what}{who}.\nreason: {code}: {why}\n{hint}Retrying without the proxy will not work: this sandbox's network only leads through it.\n",
        what = r.what,
        code = r.reason.code(),
        why = r.explanation,
        hint = hint(r.reason, r.ask),
    );
    let mut proxy_status = format!(
        "egress-proxy; error={}; details=\"{}: {}\"",
        r.reason.proxy_status_error(),
        r.reason.code(),
        sf_string(r.explanation)
    );
    if grantable(r.reason) {
        proxy_status.push_str(&format!("; request-access=\"{}\"", r.ask.url()));
    }
    let mut resp = Response::new(Bytes::from(body));
    *resp.status_mut() = status;
    if let Ok(p) = hyper::ext::ReasonPhrase::try_from(phrase(r)) {
        resp.extensions_mut().insert(p);
    }
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    if let Ok(v) = HeaderValue::from_str(&proxy_status) {
        h.insert("proxy-status", v);
    }
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        h.insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"egress-proxy\""),
        );
    }
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        let secs = r.retry_after.unwrap_or(1).max(1);
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Where a sandbox asks for access over plain HTTP through the proxy (`crate::listen::ask`).
pub const REQUEST_ACCESS: &str = "http://egress-proxy.local/v1/requests";
/// The same endpoint over `CONNECT egress-proxy.local:443` (needs the interception CA).
pub const REQUEST_ACCESS_HTTPS: &str = "https://egress-proxy.local/v1/requests";

/// Whether a grant could answer a refusal for `reason` (the policy lacked a rule).
pub fn grantable(reason: Reason) -> bool {
    matches!(reason, Reason::NoRuleMatched | Reason::PortNotAllowed)
}

fn hint(reason: Reason, ask: AskUrl) -> &'static str {
    match (reason, ask) {
        (Reason::NoRuleMatched | Reason::PortNotAllowed, AskUrl::Https) => {
            "To ask for it, POST {\"host\", \"port\", \"reason\"} to https://egress-proxy.local/v1/requests through this proxy (HTTPS_PROXY is enough) and wait for a person to approve (GET /v1/requests/ID?wait=30); or an operator adds it to network.egress of this sandbox's policy.\n"
        }
        (Reason::NoRuleMatched | Reason::PortNotAllowed, AskUrl::Http) => {
            "To ask for it, POST {\"host\", \"port\", \"reason\"} to http://egress-proxy.local/v1/requests through this proxy (set HTTP_PROXY too, or curl -x \"$HTTPS_PROXY\": an http:// URL is not sent through HTTPS_PROXY) and wait for a person to approve (GET /v1/requests/ID?wait=30); or an operator adds it to network.egress of this sandbox's policy.\n"
        }
        (Reason::DenyAllMode, _) => {
            "To allow it, add the host (and port) to network.egress of this sandbox's policy; an operator must change it, not the agent.\n"
        }
        (Reason::DeniedByRule, _) => "The destination is explicitly denied by network.deny.\n",
        (Reason::AuthRequired | Reason::AuthFailed | Reason::UnknownSandbox, _) => {
            "Use HTTPS_PROXY=http://SANDBOX_ID:TOKEN@proxy:port with this sandbox's credentials.\n"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests;
