//! egress-proxy: per-sandbox egress control for AI-agent sandboxes.
//!
//! # Layout: one folder per stage, each answering one question
//! A stage uses the stages below it in this list. The exceptions, listed in
//! `docs/architecture.md`: the audit guard and the egress stage hand each other their values
//! (`AuditGuard::decided(&Decided)`); egress's connections are relay's stream types; a
//! compiled [`policy::set`] sandbox keeps its `config::Binding`.
//! - `server` (`server.rs`, `server/`): how does the process start and stop? Binding
//!   (`bind`), the accept loops and the admission gate of every listener (`accept`), files
//!   and signals (`watch`), graceful shutdown.
//! - `listen/`: how does a connection arrive and say where it goes? Adapters over the one
//!   admission sequence ([`egress::admit`]): `explicit` (CONNECT and absolute-form HTTP, per
//!   request and per HTTP/2 stream), `explicit_tls` (the same over TLS), `tunnel` (a CONNECT
//!   once admitted), `transparent` (redirected TCP: `orig_dst`, one of the fenced `unsafe`
//!   modules, then the first bytes), `socks5` (a SOCKS5 CONNECT); and `relay_choice`, the one
//!   relay chooser.
//! - `dns/`: the filtering resolver (`listen.dns`: its own UDP loops with a repeat cache, TCP
//!   framed here); the answers it gave are remembered in `egress::answers`, where the
//!   sequence finds the name of a nameless transparent destination.
//! - [`control`]: how does policy change at runtime? The controller (registrations,
//!   `registry` — the one validator — `reload`, `state_store`), `admin` (health, metrics, the
//!   runtime API), `check` (`check` and `POST /v1/check`, through the data plane's own
//!   `egress::decide`), and `etcd/` (registrations shared by replicas).
//! - [`runtime`]: what every data-plane task reads — `Shared`, built by the server, and the
//!   narrower handles it lends (the sequence's `Cx`, a forwarded exchange's `Forwarding`).
//! - [`intercept`]: credential brokering, a relay that terminates TLS for bound hosts.
//! - [`pipeline`]: what is a request judged by? The one request pipeline's phases (head,
//!   body) and the one predicate of hosts judged per request, for forwarded plain HTTP and
//!   every request of a terminated tunnel alike.
//! - [`relay`]: how are bytes moved, and cut? `tunnel` / `splice` (shaped or zero-copy;
//!   `send_queue`, the other fenced `unsafe`, says what a reset discarded), `forward`
//!   (plain-HTTP exchange), `http_checked` (every request of a plain-HTTP stream checked),
//!   `liveness` (the one idle/stop tracker), `counted` (the one counting body), `watch` (each
//!   exchange re-checks its grant on every publication), `client_io`, and `deny` (the one
//!   refusal builder).
//! - [`audit`]: what is recorded and counted: `accept` (a connection's start), the guard that
//!   writes every `end` record, the writer, the chain and its verifier, OCSF, metrics,
//!   `suggest`.
//! - [`egress`]: who is it, may it, and to which address? `admit` (the one sequence) and
//!   `verdict` (the verdict point), `identity`, `admission` and `limits`, `decide` (policy on
//!   the name, resolve once with `resolve`, policy and guard on every address), `dial` (a
//!   checked address only) and the `grant` it makes.
//! - [`wire`]: what do the first bytes say? The ClientHello/SNI parser, peeking, first-bytes
//!   checks, HTTP/1 framing: parsers shared by listeners and relays.
//! - [`config`]: `proxy.yaml`, AIP-36 sandbox blocks and `*.SANDBOX.md` files → typed,
//!   validated bindings (the only module that knows YAML).
//! - [`policy`] (pure): entry grammar, compiled matchers and `decide` → a
//!   [`policy::Decision`] with one closed [`policy::reason::Reason`]; names, targets, the
//!   address guard, HTTP rules, and [`policy::set`]: every sandbox compiled, published to
//!   every live exchange by [`policy::live`].

#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::too_many_lines)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod approvals;
pub mod audit;
pub mod config;
pub mod control;
pub mod decider;
pub mod dns;
pub mod egress;
pub mod intercept;
mod listen;
pub mod otel;
pub mod pipeline;
pub mod policy;
pub mod relay;
pub mod runtime;
pub mod server;
pub mod wire;
