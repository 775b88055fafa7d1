#![no_main]
//! The strict JSON reader the MCP, JSON-RPC, GraphQL, LFS and inference rules judge bodies with
//! (`policy::protocols::strict_json`), against `serde_json` over any bytes: never a panic; a
//! document it reads, `serde_json` reads as the same value; one it refuses that `serde_json`
//! reads is refused for a repeated key; and its borrowed tree, written back, is the same document.
use egress_proxy::policy::protocols::strict_json;
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
    if let Ok(tree) = strict_json::parse_borrowed(data) {
        let written: Value = serde_json::from_str(&tree.text()).expect("written back is JSON");
        assert_eq!(Some(&written), plain.as_ref().ok(), "written back differently");
    }
});
