#![no_main]
//! A query as the DNS listener reads it: any bytes give a question or a refusal, never a
//! panic; an accepted name is normalised (lower case, no trailing dot).
use egress_proxy::dns::question::read;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(q) = read(data, &[16, 33]) {
        assert!(!q.name.ends_with('.'));
        assert_eq!(&*q.name, q.name.to_ascii_lowercase());
    }
});
