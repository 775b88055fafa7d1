#![no_main]
//! The usage reader of LLM answers (`policy::protocols::inference_usage`) over any bytes an
//! origin could send, split at any point, for each provider and both framings: never a panic,
//! and the same usage whether the answer arrives whole or in two pieces (reading a copy of the
//! stream as it passes must not depend on where the chunks fall).
use egress_proxy::policy::protocols::inference::Provider;
use egress_proxy::policy::protocols::inference_usage::UsageReader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&c, rest)) = data.split_first() else {
        return;
    };
    let provider = [Provider::OpenAi, Provider::Anthropic, Provider::Gemini][usize::from(c % 3)];
    let events = c & 4 != 0;
    let at = if rest.is_empty() { 0 } else { usize::from(c) % (rest.len() + 1) };
    let mut whole = UsageReader::new(provider, events);
    whole.feed(rest);
    let mut split = UsageReader::new(provider, events);
    split.feed(&rest[..at]);
    split.feed(&rest[at..]);
    assert_eq!(whole.finish(), split.finish(), "the usage depends on the chunking");
});
