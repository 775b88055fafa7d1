#![no_main]
//! The policy entry grammar, and compiling whatever it accepts.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(entry) = egress_proxy::policy::entry::parse_entry(text) {
            let spec = egress_proxy::policy::NetworkSpec {
                mode: egress_proxy::policy::Mode::Restricted,
                egress: vec![(text.to_string(), entry)],
                deny: vec![],
                resolve_for_address_rules: false,
                http: Default::default(),
                scoped: Vec::new(),
                layers: Default::default(),
                flows: None,
            };
            let ports = egress_proxy::policy::ports::PortSet::any();
            let _ = egress_proxy::policy::CompiledPolicy::compile("f", "f", &spec, egress_proxy::policy::Enforcement::Enforce, &ports);
        }
    }
});
