#![no_main]
//! The SOCKS5 listener's messages (greeting, RFC 1929 login, request) on any bytes: no panic,
//! and a message read whole never claims more bytes than it was given.
use egress_proxy::wire::socks5::{greeting, login, request, Step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Step::Done(_, n)) = greeting(data) {
        assert!(n <= data.len());
    }
    if let Ok(Step::Done(_, n)) = login(data) {
        assert!(n <= data.len());
    }
    if let Ok(Step::Done(r, n)) = request(data) {
        assert!(n <= data.len());
        let _ = egress_proxy::policy::target::Target::parse(&r.destination.authority(), None);
    }
});
