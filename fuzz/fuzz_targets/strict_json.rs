#![no_main]
//! The strict JSON reader the MCP, JSON-RPC, GraphQL, LFS and inference rules judge bodies with
//! (`policy::protocols::strict_json`), against `serde_json` over any bytes: never a panic; a
//! document it reads, `serde_json` reads as the same value; one it refuses that `serde_json`
//! reads is refused for a repeated key; and its borrowed tree, written back, is the same document.
//! The MCP response filter's skim (`policy::protocols::json_skim`) refuses exactly what the
//! strict reader refuses, and what it keeps of a message is what the tree says.
use egress_proxy::policy::protocols::json_tree::Json;
use egress_proxy::policy::protocols::{json_skim, strict_json};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let strict = strict_json::parse(data);
    let plain = serde_json::from_slice::<Value>(data);
    match (&strict, &plain) {
        (Ok(s), Ok(p)) => assert_eq!(s, p, "read differently"),
        (Ok(_), Err(e)) => panic!("read what serde_json refuses: {e}"),
        (Err(e), Ok(_)) => assert!(
            e.to_string().contains("appears twice"),
            "refused a document serde_json reads, not for a repeated key: {e}"
        ),
        (Err(_), Err(_)) => {}
    }
    let tree = strict_json::parse_borrowed(data);
    if let Ok(tree) = &tree {
        let written: Value = serde_json::from_str(&tree.text()).expect("written back is JSON");
        assert_eq!(Some(&written), plain.as_ref().ok(), "written back differently");
    }
    match (json_skim::skim(data), &tree) {
        (Ok(Some(skim)), Ok(tree)) => {
            assert_eq!(skim.method, tree.get("method").is_some(), "skimmed `method` differently");
            assert_eq!(skim.id.as_ref(), tree.get("id"), "skimmed `id` differently");
            let asks = tree.get("result").and_then(|r| r.get("inputRequests"));
            assert_eq!(skim.input_requests, asks.is_some(), "skimmed `inputRequests` differently");
        }
        (Ok(None), Ok(tree)) => assert!(!matches!(tree, Json::Obj(_)), "skimmed an object as none"),
        (Ok(_), Err(e)) => panic!("skimmed what the strict reader refuses: {e}"),
        (Err(e), Ok(_)) => panic!("the skim refused what the strict reader reads: {e}"),
        (Err(_), Err(_)) => {}
    }
});
