#![no_main]
//! The response framer beside a checked relay (bytes an origin chose): any bytes, after any
//! mix of requests, fed in chunks of varying size, give an error or an answer — never a
//! panic — and a switch, once seen, stays.
use egress_proxy::wire::http_response::{Answer, ResponseStream};
use egress_proxy::wire::http_stream::RequestKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kinds, rest)) = data.split_first() else {
        return;
    };
    let mut stream = ResponseStream::new();
    for i in 0..4 {
        let bits = kinds >> (2 * i);
        stream.sent(RequestKind {
            head: bits & 1 == 1,
            connect: bits & 2 == 2 && i == 3,
            upgrade: bits & 2 == 2 && i != 3,
        });
    }
    let mut switched = false;
    for chunk in rest.chunks(1 + usize::from(kinds % 32)) {
        if stream.feed(chunk).is_err() {
            return;
        }
        if switched {
            assert_eq!(stream.answer(), Answer::Switched, "a switch was undone");
        }
        switched |= stream.answer() == Answer::Switched;
    }
});
