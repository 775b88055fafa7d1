//! egress-proxy: per-sandbox egress control for AI-agent sandboxes.
//!
//! # Layout: one folder per stage, each answering one question
//! A stage uses the stages below it in this list; CI holds it (`.ci/import-graph --check`
//! reads the order from `docs/architecture.md`, where the one exception left is listed: a
//! compiled [`sandboxes::set`] sandbox keeps its `config::Binding`).
//! - `server` (`server.rs`, `server/`): how does the process start and stop? Binding
//!   (`bind`), the accept loops and step 0 of every listener (`accept`: the audit trail can
//!   take a record, the per-source caps), files and signals (`signals`), what is kept across
//!   restarts (`usage`, the approvals desk), graceful shutdown.
//! - [`otel`]: OpenTelemetry export, an observer of the audit writer and the usage ledger
//!   (`health`: a failing export said in the proxy's log).
//! - `listen/`: how does a connection arrive and say where it goes? Adapters over the one
//!   admission sequence ([`egress::admit`]): `explicit` (CONNECT and absolute-form HTTP, per
//!   request and per HTTP/2 stream), `explicit_tls` (the same over TLS), `connect` (a CONNECT
//!   once admitted), `transparent` (redirected TCP: `orig_dst`, one of the fenced `unsafe`
//!   modules, then the first bytes), `socks5` (a SOCKS5 CONNECT), `ask` (the proxy's own
//!   `egress-proxy.local`), `refused_inside` (a refused CONNECT answered inside the tunnel,
//!   `tls_intercept.refusals_inside`); `running` (the one tail of every tunnel) and `relay_choice`, the
//!   one relay chooser.
//! - [`dns`]: the filtering resolver (`listen.dns`): an adapter over the sequence's query
//!   steps (`egress::admit::query_*`) that keeps the wire format; the answers it gave are
//!   remembered in `egress::answers`, where the sequence finds the name of a nameless
//!   transparent destination.
//! - [`control`]: how does policy change at runtime? The controller (registrations,
//!   `registry` — the one validator — `reload`, `state_store`), `admin` (health, metrics, the
//!   runtime API), `check` (`check` and `POST /v1/check`, through the data plane's own
//!   `egress::decide`), `observe`, and `etcd/` (registrations, grants and counts shared by
//!   replicas).
//! - [`runtime`]: what every data-plane task reads — `Shared`, built by the server, and the
//!   narrower handles it lends (the sequence's `Cx`, a forwarded exchange's `Forwarding`).
//! - [`approvals`]: the agent asks, a person (or a webhook, or auto-approval) answers; the
//!   grants that stand, kept in `state_dir` and shared through etcd.
//! - [`intercept`]: credential brokering — a relay that terminates TLS for bound hosts and
//!   serves every request of a host judged per request; credential kinds ([`intercept::credential::Kind`]),
//!   minting, sealing, identity tokens, scrubbing.
//! - [`decider`]: the operator's external decider, asked at the verdict point and per request.
//! - [`relay`]: how are bytes moved, and cut? `tunnel` / `splice` (shaped or zero-copy;
//!   `send_queue`, the other fenced `unsafe`, says what a reset discarded), `forward`
//!   (plain-HTTP exchange; `hop_by_hop`, what its head loses upstream), `http_checked` (every request of a plain-HTTP stream checked),
//!   `liveness` (the one idle/stop/quota tracker), `counted` (the one counting body), `watch`
//!   (each exchange re-checks its clearance on every publication), `client_io`, and `deny`
//!   (the one refusal builder).
//! - [`egress`]: who is it, may it, and to which address? `admit` (the one sequence, and its
//!   query steps for DNS) and `verdict` (the verdict point), `identity`, `source_caps` and
//!   `limits`, `decide` (policy on the name, resolve once with `resolve`, policy and guard on
//!   every address), `dial` (a checked address only: `server_io`, `abortable`,
//!   `upstream_pool`) and the `clearance` it makes.
//! - [`pipeline`]: what is a request judged by? The one request pipeline's phases (head,
//!   body, DLP) and the one predicate of hosts judged per request, for forwarded plain HTTP
//!   and every request of a terminated tunnel alike.
//! - [`audit`]: what is recorded and counted: `accept` (a connection's start), the guard that
//!   writes every `end` record, the writer, the chain and its verifier, OCSF, metrics, the
//!   usage ledger, `suggest`.
//! - [`wire`]: what do the bytes say? The ClientHello/SNI parser, peeking, first-bytes
//!   checks, HTTP/1 framing, SOCKS5, and the signature on what the proxy sends to operators'
//!   services: formats shared by listeners and relays.
//! - [`config`]: `proxy.yaml`, AIP-36 sandbox blocks and `*.SANDBOX.md` files → typed,
//!   validated bindings (the only module that knows YAML; the only one whose errors are
//!   collected messages).
//! - [`policy`] (pure): entry grammar, compiled matchers and `decide` → a
//!   [`policy::Decision`] with one closed [`policy::reason::Reason`]; names, targets, the
//!   address guard, HTTP rules, protocols, approved grants. It imports no configuration.
//! - [`sandboxes`]: which sandboxes are in force — [`sandboxes::set`], every sandbox's binding
//!   compiled into policy's matchers, published to every live exchange by [`sandboxes::live`].

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
pub mod sandboxes;
pub mod server;
pub mod wire;
