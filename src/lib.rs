//! egress-proxy: per-sandbox egress control for AI-agent sandboxes.
//!
//! # Layout (pipeline order)
//! - [`config`]: `proxy.yaml`, AIP-36 sandbox blocks and `*.SANDBOX.md` files → typed,
//!   validated bindings (the only module that knows YAML).
//! - [`policy`]: entry grammar, compiled matchers and `decide` → a [`policy::Decision`].
//! - [`target`]: `host:port` targets as they arrive on the wire or the command line.
//! - [`guard`]: the address guard (special-purpose ranges, embedded IPv4, loop protection).
//! - [`policy_set`]: every sandbox compiled, plus the guard: what the data plane swaps in.

pub mod config;
pub mod guard;
pub mod policy;
pub mod policy_set;
pub mod resolve;
pub mod server;
pub mod target;
