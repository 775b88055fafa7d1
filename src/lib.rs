//! egress-proxy: per-sandbox egress control for AI-agent sandboxes.
//!
//! # Layout: one folder per stage, each answering one question
//! Every arrow runs down this list: a stage uses the ones below it, never one above.
//! - `server` (`server.rs`, `server/`): how does the process start and stop? Runtime,
//!   listeners, accept loops, graceful shutdown; `server::shared` is what every connection
//!   handler reads.
//! - `listen/`: how does a connection arrive and say where it goes? `explicit` (CONNECT and
//!   absolute-form HTTP, per request), `explicit_tls` (the same over TLS), `transparent`
//!   (redirected TCP: `orig_dst`, one of two fenced `unsafe` modules, then the first bytes),
//!   `client_io`, `accept`, and `deny`, the refusal builder.
//! - `dns/`: the filtering resolver (`listen.dns`) and the memory of its answers, where
//!   `transparent` finds the name of a nameless connection's destination.
//! - [`control`]: how does policy change at runtime? The controller (reloads, registrations,
//!   `state_dir` via `state_store`), `admin` (health, metrics, the runtime API), `check`
//!   (`check` and `POST /v1/check`, through the data plane's own `egress::decide`), and
//!   `etcd/` (registrations shared by replicas: list, watch, writes, leases, apply).
//! - [`relay`]: how are bytes moved, and cut? `tunnel` / `splice` (shaped or zero-copy;
//!   `send_queue`, the other fenced `unsafe`, says what a reset discarded), `forward`
//!   (plain-HTTP exchange), `http_checked` (every request of a plain-HTTP stream checked),
//!   the bodies, and `watch`: each exchange watches its grant and is cut when the policy no
//!   longer allows it or at shutdown.
//! - [`intercept`]: credential brokering, a relay that terminates TLS for bound hosts.
//! - [`audit`]: what is recorded and counted: the guard that writes the one `end` record,
//!   the writer, the chain and its verifier, OCSF, metrics, `suggest`.
//! - [`egress`]: who is it, may it, and to which address? `identity` (which sandbox),
//!   `admission` and `limits` (admitted under its limits), `decide` (policy on the name,
//!   resolve once with `resolve`, policy and guard on every address) and `dial` (a checked
//!   address only).
//! - [`wire`]: what do the first bytes say? The ClientHello/SNI parser, peeking, first-bytes
//!   checks, HTTP/1 framing: parsers shared by listeners and relays.
//! - [`config`]: `proxy.yaml`, AIP-36 sandbox blocks and `*.SANDBOX.md` files → typed,
//!   validated bindings (the only module that knows YAML).
//! - [`policy`] (pure, no I/O): entry grammar, compiled matchers and `decide` → a
//!   [`policy::Decision`] with one closed [`policy::reason::Reason`]; names, targets, the
//!   address guard, and [`policy::set`]: every sandbox compiled, published to every live
//!   exchange.

#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod audit;
pub mod config;
pub mod control;
mod dns;
pub mod egress;
pub mod intercept;
mod listen;
pub mod policy;
pub mod relay;
pub mod server;
pub mod wire;
