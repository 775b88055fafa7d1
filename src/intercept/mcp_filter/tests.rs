//! The MCP response filter against bodies as servers send them: lists, server requests, cut
//! streams, report mode, whole JSON answers.

use super::*;
use crate::intercept::scrub::tests::Chunks;
use crate::policy::protocols::jsonrpc;
use crate::policy::protocols::mcp::ToolRule;
use http_body_util::BodyExt;

/// A rule allowing the tool `search`, and the lists of a `tools/list` request with id 1.
fn search_only() -> (McpRule, Lists) {
    search_only_asked(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
}

/// A rule allowing the tool `search`, and the lists of the client's body `asked`.
fn search_only_asked(asked: &[u8]) -> (McpRule, Lists) {
    let rule = McpRule::new(
        vec![ToolRule::new("search", vec![]).unwrap()],
        &[],
        &[],
        &[],
    )
    .unwrap();
    let asked = jsonrpc::parse(asked).unwrap();
    let (_, lists) = rule.judge(&asked).unwrap();
    (rule, lists)
}

fn filtered(framing: Framing, chunks: Vec<&'static [u8]>) -> Result<String, String> {
    filtered_after(search_only(), framing, chunks)
}

fn filtered_after(
    (rule, lists): (McpRule, Lists),
    framing: Framing,
    chunks: Vec<&'static [u8]>,
) -> Result<String, String> {
    let chunks = Chunks(chunks.into_iter().map(Bytes::from_static).collect());
    let rule = Arc::new(rule);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let out = match framing {
        Framing::EventStream => {
            let body = McpFiltered::new(chunks, rule, lists, 1 << 16, Default::default());
            rt.block_on(body.collect())
                .map(|c| c.to_bytes())
                .map_err(|e| e.to_string())
        }
        Framing::Json => {
            let filter = McpFiltered::new((), rule, lists, 1 << 16, Default::default());
            rt.block_on(filter.read_whole(chunks))
                .map_err(|e| e.to_string())
        }
    };
    out.map(|b| String::from_utf8_lossy(&b).to_string())
}

#[test]
fn event_streams_are_filtered_event_by_event_across_chunks() {
    let out = filtered(
        Framing::EventStream,
        vec![
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n: keepalive\n\n",
            b"id: 1\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"search\"},",
            b"{\"name\":\"delete_repo\"}]}}\r\n\r",
            b"\n",
        ],
    )
    .unwrap();
    assert!(
        out.contains("search") && !out.contains("delete_repo"),
        "{out}"
    );
    assert!(out.contains("id: 1\nevent: message\ndata: "), "{out}");
    assert!(
        out.contains("notifications/progress") && out.contains(": keepalive"),
        "{out}"
    );
    assert!(filtered(Framing::EventStream, vec![b"data: {not json}\n\n"]).is_err());
}

#[test]
fn a_dropped_server_request_ends_the_stream_with_errors_for_what_is_unanswered() {
    let out = filtered(
        Framing::EventStream,
        vec![
            b"data: {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"elicitation/create\",\"params\":{}}\n\n",
            b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[]}}\n\n",
        ],
    )
    .unwrap();
    assert!(!out.contains("elicitation/create\","), "{out}");
    assert!(
        out.contains("\"id\":1") && out.contains("-32001") && out.contains("elicitation/create"),
        "{out}"
    );
    assert!(
        !out.contains("\"result\""),
        "the stream ended before the server's answer: {out}"
    );
}

/// A request answered before the cut gets no error: neither an answer that passes
/// skimmed (id 2, a call) nor one filtered whole (id 1, a list) is counted twice.
#[test]
fn what_was_answered_before_the_cut_gets_no_error() {
    let asked = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},
        {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search"}},
        {"jsonrpc":"2.0","id":3,"method":"ping"}]"#;
    let out = filtered_after(
        search_only_asked(asked),
        Framing::EventStream,
        vec![
            b"data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[]}}\n\n",
            b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[]}}\n\n",
            b"data: {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"elicitation/create\"}\n\n",
        ],
    )
    .unwrap();
    let errors: Vec<&str> = out.lines().filter(|l| l.contains("-32001")).collect();
    assert_eq!(errors.len(), 1, "{out}");
    assert!(errors[0].contains("\"id\":3"), "{out}");
}

#[test]
fn a_json_answer_read_whole_is_passed_without_a_copy_or_refused_past_the_limit() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let read = |sent: Vec<&'static [u8]>, limit, dry| {
        let (rule, lists) = search_only();
        let notes: Arc<Mutex<Notes>> = Default::default();
        let f = McpFiltered::new((), Arc::new(rule), lists, limit, notes.clone()).dry(dry);
        let chunks = Chunks(sent.into_iter().map(Bytes::from_static).collect());
        let out = rt.block_on(f.read_whole(chunks)).map_err(|e| e.to_string());
        let hidden = notes.lock().unwrap().hidden;
        (out, hidden)
    };
    let call: &'static [u8] = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}";
    let (out, _) = read(vec![call], 1 << 16, false);
    let out = out.unwrap();
    assert_eq!(
        (&out[..], out.as_ptr()),
        (call, call.as_ptr()),
        "the same bytes"
    );
    let list: &'static [u8] =
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"x\"}]}}";
    let (out, hidden) = read(vec![&list[..20], &list[20..]], 1 << 16, false);
    assert_eq!(
        (out.unwrap(), hidden),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#.into(),
            1
        )
    );
    let (out, hidden) = read(vec![list], 1 << 16, true);
    assert_eq!((&out.unwrap()[..], hidden), (list, 1), "report mode");
    let (out, _) = read(vec![&list[..20], &list[20..]], list.len() - 1, false);
    assert!(out.unwrap_err().contains("larger than"), "past the limit");
}

#[test]
fn report_mode_passes_everything_and_notes_what_it_would_filter() {
    let (rule, lists) = search_only();
    let sent: &'static [u8] = b"data: {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"elicitation/create\"}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"search\"},{\"name\":\"x\"}]}}\n\n";
    let notes: Arc<Mutex<Notes>> = Default::default();
    let body = McpFiltered::new(
        Chunks([Bytes::from_static(sent)].into()),
        Arc::new(rule),
        lists,
        1 << 16,
        notes.clone(),
    )
    .dry(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let out = rt.block_on(body.collect()).unwrap().to_bytes();
    assert_eq!(&out[..], sent, "nothing changed in report mode");
    let n = notes.lock().unwrap();
    assert!(
        n.report && n.hidden == 1 && n.dropped == ["elicitation/create"],
        "{n:?}"
    );
}

#[test]
fn json_bodies_are_filtered_whole() {
    let out = filtered(
        Framing::Json,
        vec![b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"search\"},{\"name\":\"x\"}]}}"],
    )
    .unwrap();
    assert!(out.contains("search") && !out.contains("\"x\""), "{out}");
    assert!(filtered(Framing::Json, vec![b"{\"a\":1,\"a\":2}"]).is_err());
    assert_eq!(filtered(Framing::Json, vec![]).unwrap(), "");
}
