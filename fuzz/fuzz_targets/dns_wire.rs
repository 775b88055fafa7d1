#![no_main]
//! The DNS listener's two ways of reading a query and writing a refusal: wherever the wire
//! way (`dns::wire`) takes a query, its answer is byte for byte what hickory's decoder and
//! the listener's response builder give, and it reads the same question.
use egress_proxy::dns::wire::differs;
use hickory_proto::op::ResponseCode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the answer; the rest is the datagram.
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let code = [
        ResponseCode::NXDomain,
        ResponseCode::Refused,
        ResponseCode::NoError,
        ResponseCode::ServFail,
    ][usize::from(pick & 3)];
    let ede = (pick & 4 != 0).then_some((15, "egress-proxy [no_rule_matched]: refused"));
    if let Some(why) = differs(bytes, code, ede) {
        panic!("{why}");
    }
});
