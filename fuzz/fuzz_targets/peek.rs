#![no_main]
//! Transparent-mode classification (TLS / HTTP / other) on arbitrary first bytes.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = egress_proxy::wire::peek::classify(data);
});
