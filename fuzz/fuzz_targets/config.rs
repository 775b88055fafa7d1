#![no_main]
//! The configuration loader: any text is a configuration or a list of errors, never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let base = std::path::Path::new("/nonexistent-fuzz-dir");
        let _ = egress_proxy::config::load_str(text, "fuzz.yaml", base, None);
    }
});
