#![no_main]
//! The ClientHello parser on arbitrary bytes: never panics, and a parsed hello stays parsed
//! when more bytes follow.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let egress_proxy::wire::sni::Hello::Parsed(h) = egress_proxy::wire::sni::parse(data) {
        let mut more = data.to_vec();
        more.extend_from_slice(&[0x17, 0x03, 0x03, 0x00, 0x00]);
        assert_eq!(egress_proxy::wire::sni::parse(&more), egress_proxy::wire::sni::Hello::Parsed(h));
    }
});
