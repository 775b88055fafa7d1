//! egress-proxy: per-sandbox egress control for AI-agent sandboxes.
//!
//! # Layout (pipeline order)
//! Configuration and policy, compiled before any connection:
//! - [`config`]: `proxy.yaml`, AIP-36 sandbox blocks and `*.SANDBOX.md` files → typed,
//!   validated bindings (the only module that knows YAML). [`sandbox_id`]: the checked id.
//! - [`policy`]: entry grammar, compiled matchers and `decide` → a [`policy::Decision`] with
//!   one closed [`reason::Reason`]; [`hostname`] normalises names, [`target`] parses
//!   `host:port`, `addr_table` is the longest-prefix table, [`guard`] the address guard.
//! - [`policy_set`]: every sandbox compiled, plus the guard: what the data plane reads, and
//!   `LivePolicy`, which publishes each new set to every live exchange.
//!
//! One connection, in the order it meets the modules:
//! - `server`: runtime, listeners, accept loops (global cap), graceful shutdown; each accepted
//!   connection becomes an `accept::Accepted` with its own `audit::AuditGuard`.
//! - `proxy` (explicit: CONNECT and absolute-form HTTP, per request) or `transparent`
//!   (redirected TCP: `orig_dst`, one of two fenced `unsafe` modules, then `peek` with the `sni` parser):
//!   → `identity` (which sandbox) → `limits` (admitted under its limits)
//!   → `egress::decide` (policy on the name, resolve once with `resolve`, policy and guard on
//!   every address) → `egress::dial` (a checked address only)
//!   → `tunnel` / `splice` (relay, shaped or zero-copy) or `forward` (plain-HTTP exchange),
//!   each watching `revocation::Watch`: cut when the policy no longer allows it or at shutdown
//!   (reset; `send_queue`, the other fenced `unsafe`, says what the reset discarded).
//! - Refusals: `deny` builds the §6 response; the `audit` guard writes the one `end` record
//!   when the connection (or request) ends, and `metrics` counts it.
//!
//! DNS: `dns_listener` (`listen.dns`, a filtering resolver per sandbox on hickory-server)
//! answers only what the policy could use and remembers each answer in `dns_memory`, where
//! `transparent` finds the name of a nameless connection's destination.
//!
//! Control plane: `control` (reloads, runtime registrations, `state_dir`), `control_plane`
//! (registrations shared by replicas through etcd: list, watch, writes, leases), `admin`
//! (health, metrics, the runtime API), [`report`] (`check` and `POST /v1/check`, through the data
//! plane's own `egress::decide`).

#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod abortable;
mod accept;
mod addr_table;
mod admin;
mod admission;
mod allowed;
pub mod audit;
mod body;
mod client_io;
pub mod config;
mod control;
mod control_plane;
mod deny;
mod dns_listener;
mod dns_memory;
mod egress;
mod forward;
pub mod guard;
mod hostname;
pub mod http_relay;
pub mod http_stream;
mod identity;
pub mod inspect;
pub mod intercept;
pub mod limits;
mod metrics;
#[allow(unsafe_code)]
mod orig_dst;
mod outcome;
pub mod peek;
pub mod policy;
pub mod policy_set;
mod proxy;
mod proxy_tls;
pub mod reason;
pub mod report;
pub mod resolve;
mod revocation;
pub mod sandbox_id;
#[allow(unsafe_code)]
mod send_queue;
pub mod server;
mod shaped_body;
mod shared;
pub mod sni;
mod splice;
mod state_store;
pub mod suggest;
pub mod target;
mod transparent;
mod tunnel;
