//! egress-proxy: per-sandbox egress control for AI-agent sandboxes.
//!
//! # Layout (pipeline order)
//! - [`config`]: `proxy.yaml`, AIP-36 sandbox blocks and `*.SANDBOX.md` files → typed,
//!   validated bindings (the only module that knows YAML).
//! - [`policy`]: entry grammar, compiled matchers and `decide` → a [`policy::Decision`].
//! - [`target`]: `host:port` targets as they arrive on the wire or the command line.
//! - [`guard`]: the address guard (special-purpose ranges, embedded IPv4, loop protection).
//! - [`policy_set`]: every sandbox compiled, plus the guard: what the data plane swaps in.
//! - [`server`]: runtime, listeners, accept loops, graceful shutdown.
//! - [`proxy`]: the explicit proxy (CONNECT and absolute-form HTTP), per request:
//!   [`identity`] → [`target`] → [`policy`] → [`resolve`] → [`guard`] → dial → [`tunnel`].
//! - [`transparent`]: the transparent listener, per connection: [`orig_dst`] (the only
//!   `unsafe`) → [`identity`] by source → [`peek`] ([`sni`] ClientHello parser, HTTP `Host`)
//!   → [`policy`] → [`resolve`] → [`guard`] → dial the resolved address → [`tunnel`].
//! - [`transparent`]: the transparent listener, per connection: [`orig_dst`] (the only
//!   `unsafe`) → [`identity`] by source → [`peek`] ([`sni`] ClientHello parser, HTTP `Host`)
//!   → [`policy`] → [`resolve`] → [`guard`] → dial the resolved address → [`tunnel`].
//! - [`deny`]: §6 deny responses; [`audit`]: one JSON line per connection;
//!   [`metrics`]: Prometheus; [`admin`]: health, readiness, metrics; [`shared`]: state
//!   every task sees.

pub mod admin;
pub mod audit;
pub mod config;
pub mod connect;
pub mod control;
pub mod deny;
pub mod guard;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod orig_dst;
pub mod peek;
pub mod policy;
pub mod policy_set;
pub mod proxy;
pub mod report;
pub mod resolve;
pub mod server;
pub mod shaped_body;
pub mod shared;
pub mod sni;
pub mod splice;
pub mod target;
pub mod transparent;
pub mod tunnel;
