#![no_main]
//! The request framer that checks every request of a plain-HTTP stream: any bytes, fed in
//! chunks of varying size, give an error or steps that never claim more than they were given.
use egress_proxy::wire::http_stream::{RequestStream, Step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut stream = RequestStream::new();
    let mut rest = data;
    for _ in 0..100_000 {
        if rest.is_empty() {
            return;
        }
        let chunk = &rest[..rest.len().min(1 + usize::from(rest[0] % 64))];
        let used = match stream.step(chunk) {
            Err(_) => return,
            Ok(Step::Pass(n)) => n,
            Ok(Step::Buffered) => chunk.len(),
            Ok(Step::Line { consumed }) | Ok(Step::Head { consumed, .. }) => {
                let _ = stream.take_held();
                consumed
            }
            // The origin's answer to an upgrade decides; the fuzzer's first byte picks it.
            Ok(Step::AwaitSwitch) => {
                stream.switched(rest[0] & 1 == 1);
                continue;
            }
        };
        assert!(used <= chunk.len(), "a step claimed more bytes than it was given");
        if used == 0 {
            return;
        }
        rest = &rest[used..];
    }
});
