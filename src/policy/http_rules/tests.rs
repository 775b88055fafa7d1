//! Unit tests of [`super`].

use super::*;

#[test]
fn an_encoded_slash_passes_only_where_no_path_glob_is_matched() {
    assert!(canonical_path("/@types%2fnode").is_err());
    assert!(canonical_path_with("/@types%2fnode", true).is_ok());
    assert!(canonical_path_with("/@types%2Fnode", true).is_ok());
    for still_bad in ["/a/%2e%2e/b", "/a/..", "/a%5cb", "/a%00"] {
        assert!(canonical_path_with(still_bad, true).is_err(), "{still_bad}");
    }
}

#[test]
fn paths_that_could_mean_another_path_are_not_canonical() {
    for bad in [
        "/repos/../admin",
        "/repos/./x",
        "/repos/%2e%2e/admin",
        "/repos/%2E%2E/admin",
        "/repos/..%2fadmin",
        "/repos/..%2Fadmin",
        "/repos/.%2e/admin",
        "/repos/%2e/admin",
        "/repos/..;x/admin",
        "/repos/..",
        "/repos\\..\\admin",
        "/repos/%5c..%5cadmin",
        "/repos/a%00b",
        "/repos/a%0ab",
        "/repos/%zz",
        "/repos/%2",
        "*",
        "repos",
    ] {
        assert!(canonical_path(bad).is_err(), "{bad} passed");
    }
    for good in [
        "/",
        "/repos/a/b",
        "/repos/a%20b",
        "/a.b/c..d/.e",
        "/x;y=1",
        "/%41",
    ] {
        assert_eq!(canonical_path(good), Ok(()), "{good}");
    }
}

#[test]
fn methods_are_compared_without_case() {
    let get = HttpRule::new("api.test", &["GET".into()], &["/v1/**".into()]).unwrap();
    assert!(get.allows("get", "/v1/x"));
    assert!(!get.allows("delete", "/v1/x"));
    let none: [&HttpRule; 0] = [];
    for m in ["TRACE", "trace", "Track", "PROPFIND", "CONNECT"] {
        assert!(method_refusal(m, none.iter().copied()).is_some(), "{m}");
    }
    for m in ["GET", "get", "Patch", "OPTIONS"] {
        assert!(method_refusal(m, none.iter().copied()).is_none(), "{m}");
    }
    let propfind = HttpRule::new("dav.test", &["PROPFIND".into()], &[]).unwrap();
    assert!(method_refusal("propfind", [&propfind].into_iter()).is_none());
    // A rule with no methods allows the ordinary ones, never TRACE.
    let any = HttpRule::new("api.test", &[], &[]).unwrap();
    assert!(method_refusal("TRACE", [&any].into_iter()).is_some());
}

#[test]
fn override_headers_and_method_parameters_are_found() {
    let mut h = http::HeaderMap::new();
    assert_eq!(override_refusal(&h, Some("a=1&b=2")), None);
    for q in [
        "_method=DELETE",
        "a=1&_METHOD=put",
        "%5Fmethod=x",
        "x=1;%5fMethod=y",
    ] {
        assert!(override_refusal(&h, Some(q)).is_some(), "{q}");
    }
    assert_eq!(override_refusal(&h, Some("my_method=1&method=2")), None);
    for name in [
        "X-HTTP-Method-Override",
        "x-original-url",
        "X-Rewrite-URL",
        "X-Forwarded-Host",
    ] {
        h.clear();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_static("DELETE"),
        );
        assert!(override_refusal(&h, None)
            .unwrap()
            .contains(&name.to_ascii_lowercase()));
    }
}

#[test]
fn git_rules_tell_fetch_from_push_and_allow_nothing_else() {
    let fetch =
        HttpRule::with_git("git.test", &[], &["/org/*.git".into()], &["fetch".into()]).unwrap();
    let q = |s: &'static str| Some(s);
    assert!(fetch.allows_request("GET", "/org/a.git/info/refs", q("service=git-upload-pack")));
    assert!(fetch.allows_request("POST", "/org/a.git/git-upload-pack", None));
    // Push, in both of its forms; the dumb protocol; two services at once; other repos.
    assert!(!fetch.allows_request("GET", "/org/a.git/info/refs", q("service=git-receive-pack")));
    assert!(!fetch.allows_request("POST", "/org/a.git/git-receive-pack", None));
    assert!(!fetch.allows_request("GET", "/org/a.git/info/refs", None));
    assert!(!fetch.allows_request("GET", "/org/a.git/objects/info/packs", None));
    assert!(!fetch.allows_request(
        "GET",
        "/org/a.git/info/refs",
        q("service=git-upload-pack&service=git-receive-pack")
    ));
    assert!(!fetch.allows_request("POST", "/other/a.git/git-upload-pack", None));
    assert!(!fetch.allows_request("PUT", "/org/a.git/git-upload-pack", None));
    assert!(!fetch.allows_request("GET", "/org/a.git", None));
    let push = HttpRule::with_git("git.test", &[], &[], &["fetch".into(), "push".into()]).unwrap();
    assert!(push.allows_request("POST", "/any/r/git-receive-pack", None));
    assert!(HttpRule::with_git("git.test", &["GET".into()], &[], &["fetch".into()]).is_err());
    assert!(HttpRule::with_git("git.test", &[], &[], &["clone".into()]).is_err());
    assert_ne!(
        fetch,
        HttpRule::with_git("git.test", &[], &["/org/*.git".into()], &["push".into()]).unwrap()
    );
}

#[test]
fn every_override_header_is_found_among_ordinary_ones() {
    // The search looks only at names starting `x-`: every listed name must, or it is missed.
    let ordinary = [
        "host",
        "accept",
        "content-type",
        "x-request-id",
        "user-agent",
    ];
    for name in OVERRIDE_HEADERS {
        let mut h = http::HeaderMap::new();
        for o in ordinary {
            h.insert(o, http::HeaderValue::from_static("v"));
        }
        h.insert(*name, http::HeaderValue::from_static("DELETE"));
        let why = override_refusal(&h, None).unwrap_or_default();
        assert!(why.contains(name), "{name}: {why:?}");
    }
    let mut h = http::HeaderMap::new();
    for o in ordinary {
        h.insert(o, http::HeaderValue::from_static("v"));
    }
    assert_eq!(override_refusal(&h, None), None);
}

#[test]
fn a_rule_known_to_read_a_request_admits_it_as_when_its_path_is_matched_again() {
    use crate::policy::protocols::graphql::GraphQlRule;
    use crate::policy::protocols::lfs::LfsOp;
    use crate::policy::protocols::mcp::{McpRule, ToolRule};
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mcp = || {
        let tools = vec![ToolRule::new("search", vec![]).unwrap()];
        Some(Protocol::Mcp(
            McpRule::new(tools, &[], &[], &[]).unwrap().into(),
        ))
    };
    let gql = GraphQlRule::new(&["query".into()], &[], &["viewer".into()], &[]).unwrap();
    let lfs = Some(Protocol::Lfs(vec![LfsOp::Download]));
    let rules = [
        HttpRule::with_protocol("h.test", &[], &s(&["/mcp"]), &[], mcp()).unwrap(),
        HttpRule::with_protocol("h.test", &[], &[], &[], mcp()).unwrap(),
        HttpRule::with_protocol(
            "h.test",
            &[],
            &s(&["/gql/**"]),
            &[],
            Some(Protocol::GraphQl(gql)),
        )
        .unwrap(),
        HttpRule::with_protocol(
            "h.test",
            &[],
            &s(&["/org/*.git"]),
            &s(&["fetch"]),
            lfs.clone(),
        )
        .unwrap(),
        HttpRule::with_protocol("h.test", &[], &s(&["/org/*.git"]), &[], lfs).unwrap(),
        HttpRule::with_git("h.test", &[], &s(&["/org/*.git"]), &s(&["fetch"])).unwrap(),
        HttpRule::new("h.test", &s(&["GET"]), &s(&["/mcp"])).unwrap(),
    ];
    let paths = [
        "/mcp",
        "/mcp/x",
        "/gql/a",
        "/gql",
        "/org/a.git/info/lfs/objects/batch",
        "/org/a.git/info/refs",
        "/org/a.git/git-upload-pack",
        "/other",
    ];
    let kind = |a: Admits<'_>| match a {
        Admits::No => (0, std::ptr::null()),
        Admits::Yes => (1, std::ptr::null()),
        Admits::Judge(p) => (2, Arc::as_ptr(p)),
    };
    let mut read = 0;
    for r in &rules {
        for m in ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"] {
            for p in paths {
                for q in [None, Some("service=git-upload-pack")] {
                    if !r.reads(m, p, q) {
                        continue;
                    }
                    read += 1;
                    let (again, known) = (r.admits(m, p, q), r.admits_read(m, p, q));
                    assert_eq!(kind(again), kind(known), "{} {m} {p} {q:?}", r.text);
                }
            }
        }
    }
    assert!(read > 40, "the rules read {read} of the requests");
}
