#![no_main]
//! CONNECT / Host / SNI target parsing.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = egress_proxy::policy::target::Target::parse(text, None);
        let _ = egress_proxy::policy::target::Target::parse(text, Some(443));
    }
});
