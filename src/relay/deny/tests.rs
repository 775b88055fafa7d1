//! Unit tests of [`super`].

use super::*;

#[test]
fn reason_phrase_is_one_bounded_ascii_line() {
    let r = Wording {
        reason: Reason::NoRuleMatched,
        what: "CONNECT denied.example:443",
        sandbox: Some("agent1"),
        explanation: "not in network.egress of sandbox agent1 (policy.yaml)",
        retry_after: None,
        ask: AskUrl::Http,
    };
    assert_eq!(
            phrase(&r),
            "egress-proxy [no_rule_matched]: refused denied.example:443: not in network.egress of sandbox agent1 (policy.yaml) (ask: POST http://egress-proxy.local/v1/requests via HTTP_PROXY)"
        );
    let https = phrase(&Wording {
        ask: AskUrl::Https,
        ..r
    });
    assert!(
        https.ends_with("(ask: POST https://egress-proxy.local/v1/requests)"),
        "{https}"
    );
    let resp = response(&r);
    let p = resp.extensions().get::<hyper::ext::ReasonPhrase>().unwrap();
    assert_eq!(p.as_bytes(), phrase(&r).as_bytes());
    let long = "x\r\ny\u{e9}".repeat(200);
    let p = phrase(&Wording {
        explanation: &long,
        ..r
    });
    assert!(p.len() <= MAX_PHRASE, "{}", p.len());
    assert!(p.starts_with("egress-proxy [no_rule_matched]: "), "{p}");
    assert!(
        p.ends_with("v1/requests via HTTP_PROXY)"),
        "the ask survives the bound: {p}"
    );
    assert!(p.bytes().all(|b| (b' '..=b'~').contains(&b)), "{p}");
    assert!(hyper::ext::ReasonPhrase::try_from(p).is_ok());
}

#[test]
fn json_is_given_to_who_asks_for_it() {
    let accept = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        wants_json(&h)
    };
    assert!(accept("application/json"));
    assert!(accept("text/html, application/problem+json;q=0.9"));
    assert!(accept("Application/JSON; charset=utf-8"));
    assert!(!accept("application/json;q=0"));
    assert!(!accept("*/*"));
    assert!(!accept("text/plain"));
    assert!(!wants_json(&HeaderMap::new()));
    let target = Target::parse("denied.example:443", None).unwrap();
    let r = Wording {
        reason: Reason::DeniedByRule,
        what: "CONNECT denied.example:443",
        sandbox: Some("agent1"),
        explanation: "denied by rule `denied.example`",
        retry_after: None,
        ask: AskUrl::Http,
    };
    let s = Structured {
        target: Some(&target),
        rule: Some("denied.example"),
    };
    let (parts, body) = response_to(&r, Some(s)).into_parts();
    assert_eq!(parts.status, StatusCode::FORBIDDEN);
    assert_eq!(parts.headers[header::CONTENT_TYPE], "application/json");
    assert!(parts.headers.contains_key("proxy-status"));
    let bytes = futures_body(body);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["reason"], "denied_by_rule");
    assert_eq!(v["rule"], "denied.example");
    assert_eq!(
        (v["host"].as_str(), v["port"].as_u64()),
        (Some("denied.example"), Some(443))
    );
    assert_eq!(v["sandbox"], "agent1");
    assert!(v["hint"].as_str().unwrap().contains("network.deny"));
}

/// A whole body, collected.
fn futures_body(body: Body) -> Bytes {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(body.collect()).unwrap().to_bytes()
}

#[test]
fn headers_and_body() {
    let r = response(&Wording {
        reason: Reason::NoRuleMatched,
        what: "CONNECT evil.example:443",
        sandbox: Some("demo"),
        explanation: "not in network.egress of sandbox demo (config/proxy.yaml)",
        retry_after: None,
        ask: AskUrl::Http,
    });
    assert_eq!(r.status(), 403);
    assert_eq!(
            r.headers()["proxy-status"],
            "egress-proxy; error=http_request_denied; details=\"no_rule_matched: not in network.egress of sandbox demo (config/proxy.yaml)\"; request-access=\"http://egress-proxy.local/v1/requests\""
        );
    let r = response(&Wording {
        reason: Reason::AuthRequired,
        what: "CONNECT x:443",
        sandbox: None,
        explanation: "a \"quoted\"\u{7} thing",
        retry_after: None,
        ask: AskUrl::Http,
    });
    assert_eq!(r.status(), 407);
    assert_eq!(
        r.headers()["proxy-authenticate"],
        "Basic realm=\"egress-proxy\""
    );
    assert!(r.headers()["proxy-status"]
        .to_str()
        .unwrap()
        .contains("a \\\"quoted\\\"? thing"));
    let r = response(&Wording {
        reason: Reason::RateLimited,
        what: "x",
        sandbox: None,
        explanation: "",
        retry_after: Some(3),
        ask: AskUrl::Http,
    });
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "3");
    let raw = String::from_utf8(wire(&Wording {
        reason: Reason::ConnectionLimit,
        what: "a connection",
        sandbox: None,
        explanation: "egress-proxy is at its connection limit",
        retry_after: None,
        ask: AskUrl::Http,
    }))
    .unwrap();
    assert!(
            raw.starts_with("HTTP/1.1 429 egress-proxy [connection_limit]: refused a connection: egress-proxy is at its connection limit\r\n"),
            "{raw}"
        );
    assert!(raw.contains("retry-after: 1\r\n"), "{raw}");
    assert!(raw.contains("error=connection_limit_reached"), "{raw}");
    let (head, text) = raw.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains(&format!("content-length: {}", text.len())),
        "{raw}"
    );
}
