//! Unit tests of [`super`].

use super::super::jsonrpc::parse;
use super::super::strict_json::parse_borrowed;
use super::*;
use serde_json::json;

fn rule() -> McpRule {
    let tools = vec![
        ToolRule::new("search*", vec![]).unwrap(),
        ToolRule::new(
            "create_issue",
            vec![("repo".into(), ArgMatch::OneOf(vec![json!("acme/docs")]))],
        )
        .unwrap(),
    ];
    McpRule::new(
        tools,
        &["file:///docs/**".into()],
        &["summarize".into()],
        &[],
    )
    .unwrap()
}

fn judge(body: &str) -> Result<Vec<String>, String> {
    rule()
        .judge(&parse(body.as_bytes()).unwrap())
        .map(|(c, _)| c.split(',').map(String::from).collect())
        .map_err(|(why, _)| why)
}

#[test]
fn resource_uris_that_could_name_another_resource_are_refused() {
    let read = |uri: &str| {
        json!({"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":uri}}).to_string()
    };
    for bad in [
        "file:///docs/../secret/key",
        "file:///docs/%2e%2e/secret/key",
        "file:///docs/%2E%2E/secret/key",
        "file:///docs/..%2fsecret",
        "file:///docs/./../secret",
        "file:///docs/..\\secret",
        "file:///docs/a%00b",
    ] {
        let why = judge(&read(bad)).unwrap_err();
        assert!(why.contains("not canonical"), "{bad}: {why}");
    }
    assert!(judge(&read("file:///docs/readme")).is_ok());
    assert!(judge(&read("file:///docs/a%20b")).is_ok());
    assert!(judge(&read("file:///secret/key")).is_err());
    for good in ["urn:x:y", "note://host/a/b?x=1", "file:///", "mem:"] {
        assert_eq!(canonical_uri(good), Ok(()), "{good}");
    }
}

#[test]
fn calls_are_judged_by_tool_arguments_resource_and_prompt() {
    let call = |name: &str, args: Value| {
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":args}}).to_string()
    };
    assert_eq!(
        judge(&call("search_code", json!({"q":"x"}))).unwrap(),
        ["tools/call search_code"]
    );
    assert!(judge(&call("delete_repo", json!({})))
        .unwrap_err()
        .contains("delete_repo"));
    assert!(judge(&call("create_issue", json!({"repo":"acme/docs"}))).is_ok());
    assert!(judge(&call("create_issue", json!({"repo":"acme/secret"}))).is_err());
    assert!(judge(&call("create_issue", json!({}))).is_err());
    let read = |uri: &str| {
        json!({"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":uri}}).to_string()
    };
    assert!(judge(&read("file:///docs/a/b.md")).is_ok());
    assert!(judge(&read("file:///etc/passwd")).is_err());
    assert!(judge(
        r#"{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"summarize"}}"#
    )
    .is_ok());
    assert!(
        judge(r#"{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"other"}}"#)
            .is_err()
    );
    assert!(judge(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_ok());
    assert!(judge(r#"{"jsonrpc":"2.0","id":4,"method":"tasks/run"}"#).is_err());
    // An answer to a server request is refused unless the rule allows some.
    assert!(judge(r#"{"jsonrpc":"2.0","id":9,"result":{}}"#).is_err());
    // A batch with one refused call is refused whole.
    let batch = format!(
        "[{},{}]",
        call("search", json!({})),
        call("delete_repo", json!({}))
    );
    assert!(judge(&batch).is_err());
}

#[test]
fn lists_are_filtered_and_server_requests_dropped() {
    let r = rule();
    let (_, lists) = r
        .judge(&parse(br#"{"jsonrpc":"2.0","id":"t","method":"tools/list"}"#).unwrap())
        .unwrap();
    let text = |v: Value| v.to_string();
    let resp = text(
        json!({"jsonrpc":"2.0","id":"t","result":{"tools":[{"name":"search"},{"name":"delete_repo"},{"name":"create_issue"}]}}),
    );
    let mut resp = parse_borrowed(resp.as_bytes()).unwrap();
    assert_eq!(r.filter(&mut resp, &lists), Filtered::Hid(1));
    assert!(
        matches!(resp.get("result").and_then(|r| r.get("tools")), Some(Json::Arr(t)) if t.len() == 2)
    );
    // Another id's result is not a list the client asked for here.
    let other = text(json!({"jsonrpc":"2.0","id":"u","result":{"tools":[{"name":"delete_repo"}]}}));
    let mut other = parse_borrowed(other.as_bytes()).unwrap();
    assert_eq!(r.filter(&mut other, &lists), Filtered::Kept);
    let sampling =
        text(json!({"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}));
    let mut sampling = parse_borrowed(sampling.as_bytes()).unwrap();
    assert_eq!(
        r.filter(&mut sampling, &lists),
        Filtered::Dropped("sampling/createMessage".into())
    );
    let note = text(json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}));
    let mut note = parse_borrowed(note.as_bytes()).unwrap();
    assert_eq!(r.filter(&mut note, &lists), Filtered::Kept);
    let input = text(
        json!({"jsonrpc":"2.0","id":3,"result":{"resultType":"input_required","inputRequests":{"a":{"method":"sampling/createMessage","params":{}}}}}),
    );
    let mut input = parse_borrowed(input.as_bytes()).unwrap();
    assert_eq!(
        r.filter(&mut input, &lists),
        Filtered::Answered("sampling/createMessage".into())
    );
    let input = input.to_value();
    assert!(input.get("result").is_none() && input["error"]["code"] == -32001);
}

#[test]
fn routing_headers_must_say_what_the_body_says() {
    let b = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"}}"#)
        .unwrap();
    assert!(McpRule::headers_agree(&b, Some("tools/call"), Some("search")).is_ok());
    assert!(McpRule::headers_agree(&b, None, None).is_ok());
    assert!(McpRule::headers_agree(&b, Some("tools/list"), None).is_err());
    assert!(McpRule::headers_agree(&b, Some("tools/call"), Some("delete_repo")).is_err());
    // Answers to a server's input requests are refused unless the rule allows some.
    let retry = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","inputResponses":{"a":{}}}}"#;
    assert!(rule().judge(&parse(retry).unwrap()).is_err());
}

proptest::proptest! {
    /// A tool name without glob syntax, compared as a string, answers as its glob would.
    #[test]
    fn a_literal_tool_name_answers_as_its_glob(
        pattern in "[a-zA-Z0-9_./ -]{0,12}",
        other in "[a-zA-Z0-9_./ -]{0,12}",
    ) {
        let t = ToolRule::new(&pattern, vec![]).unwrap();
        proptest::prop_assert!(t.literal);
        let glob = globset::Glob::new(&pattern).unwrap().compile_matcher();
        for name in [pattern.as_str(), other.as_str(), &pattern.to_uppercase(), &format!("{pattern}x")] {
            proptest::prop_assert_eq!(t.names(name), glob.is_match(name), "{:?} {:?}", pattern, name);
        }
    }
}

#[test]
fn a_tool_glob_with_syntax_is_still_a_glob() {
    for (pattern, name) in [
        ("search*", "search_web"),
        ("a?c", "abc"),
        ("[ab]x", "bx"),
        ("{p,q}", "q"),
    ] {
        let t = ToolRule::new(pattern, vec![]).unwrap();
        assert!(!t.literal && t.names(name), "{pattern} {name}");
    }
}
