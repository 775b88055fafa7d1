#![no_main]
//! The WebSocket frame reader of the relay (`intercept::websocket::frames`), over any bytes a
//! sandbox could send after the upgrade, with a size cap from the first byte: never a panic;
//! every message it would forward fits the cap and a text message is UTF-8; every control
//! payload fits a control frame; a close carries an allowed code; and reading stops at the
//! first close or cut.
use egress_proxy::intercept::websocket::frames::{read_all, Event};
use fastwebsockets::OpCode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&c, rest)) = data.split_first() else {
        return;
    };
    let cap = 1 + usize::from(c) * 16;
    let (events, cut) = read_all(rest, cap);
    for (i, e) in events.iter().enumerate() {
        match e {
            Event::Message(op, d) => {
                assert!(d.len() <= cap, "a message over the cap");
                if *op == OpCode::Text {
                    assert!(std::str::from_utf8(d).is_ok(), "a text message not UTF-8");
                }
            }
            Event::Control(_, p) => assert!(p.len() <= 125, "a control payload over 125"),
            Event::Close(code, _) => {
                assert_eq!(i, events.len() - 1, "events after a close");
                assert!(cut.is_none());
                if let Some(code) = code {
                    assert!(matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999));
                }
            }
        }
    }
    if let Some((code, _)) = cut {
        assert!(matches!(code, 1002 | 1007 | 1008 | 1009), "cut with {code}");
    }
});
