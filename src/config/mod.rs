//! Configuration: `proxy.yaml` (DESIGN §5), sandbox bindings, AIP-36 blocks inline or by
//! `ref` (a file path or an `@owner/slug` found in `sandbox_dirs`), turned into typed,
//! validated values. The only module that knows YAML. Loading reads the named files and
//! nothing else (no DNS, no network), collects every problem, and fails once with all of them.

//!
//! Layout: this file (the typed configuration and `load`), [`defaults`] (every default and
//! the sections that have them), `binding` (sandbox bindings, tokens, policy resolution,
//! runtime registrations), [`block`] (the AIP-36 block) and `conformance` (its checks),
//! `refs` (`*.SANDBOX.md` files and `sandbox_dirs`), `raw` (the serde shape), [`error`].

pub mod approvals;
pub mod audit;
mod binding;
mod binding_secrets;
pub mod block;
mod conformance;
pub mod console;
pub mod control_plane;
pub mod credential_kinds;
pub mod credentials;
pub mod decider;
pub mod defaults;
mod dns;
pub mod error;
pub mod files;
pub mod flows;
pub mod http_rules;
pub mod identity_token;
pub mod intercept;
pub mod layers;
mod listen;
mod load;
pub mod otel;
pub mod presets;
pub mod prices;
mod quotas;
mod raw;
mod refs;
mod runtime_body;
mod sandboxes;
pub mod scoped;
mod tls_files;
pub mod upstream;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;

use binding::{build_binding, id_lines, BindingCtx};
pub use block::SandboxBlock;
use control_plane::{resolve_control_plane, RawControlPlane};
pub use control_plane::{EtcdConfig, EtcdTls};
use defaults::{resolve_admission, resolve_defaults, resolve_forward_keepalive, resolve_runtime};
use dns::resolve_dns;
use error::{redact, unknown_field, Sink};
pub use error::{ConfigError, ConfigErrors};
use listen::resolve_listen;
pub use load::load_str;
use load::load_with;
use raw::{
    RawAdmission, RawAudit, RawDefaults, RawDns, RawForwardKeepalive, RawListen, RawRuntime,
    TOP_LEVEL_KEYS,
};
pub use raw::{RawAuth, RawLimits};
use refs::PolicyIndex;

use crate::policy::ports::PortSet;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::{Enforcement, NetworkSpec};

/// The embedded default configuration (`config/proxy.yaml`), used when `--config` is absent.
pub const EMBEDDED_CONFIG: &str = include_str!("../../config/proxy.yaml");
/// How the embedded configuration is named in messages.
pub const EMBEDDED_NAME: &str = "<embedded config/proxy.yaml>";

/// Listener addresses; `None` means disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The explicit proxy listener.
    pub proxy: Option<SocketAddr>,
    /// The transparent listener.
    pub transparent: Option<SocketAddr>,
    /// The transparent listener is a TPROXY target (IP_TRANSPARENT), not a REDIRECT one.
    pub transparent_tproxy: bool,
    /// The admin listener.
    pub admin: Option<SocketAddr>,
    /// The DNS listener (UDP and TCP on the same address); off by default.
    pub dns: Option<SocketAddr>,
    /// The SOCKS5 listener (CONNECT, username/password or by source); off by default.
    pub socks5: Option<SocketAddr>,
    /// The HTTPS proxy listener; off by default.
    pub proxy_tls: Option<ProxyTls>,
    /// TLS for the admin listener (its `addr` is `admin`'s).
    pub admin_tls: Option<ProxyTls>,
    /// Sidecar mode: the sandbox of connections no other method identifies.
    pub default_sandbox: Option<String>,
    /// `listen.attribution.observe`: the `/proc` lookups allowed a second when on.
    pub observe_processes: Option<u32>,
    /// `listen.threads`: data-plane threads, each accepting on a socket of its own for every
    /// TCP data-plane listener and keeping its connections (0: the main runtime's workers).
    pub threads: usize,
}

/// `listen.proxy_tls`, paths resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyTls {
    /// The TLS proxy listener's address.
    pub addr: SocketAddr,
    /// Its certificate chain.
    pub cert_file: PathBuf,
    /// Its key.
    pub key_file: PathBuf,
    /// Client certificates signed by this CA identify sandboxes (optional for clients).
    pub client_ca_file: Option<PathBuf>,
    /// How a client certificate names its sandbox.
    pub client_names: ClientNames,
    /// Clients must present a certificate signed by `client_ca_file` (the admin listener).
    pub require_client_cert: bool,
}

/// How a verified client certificate names its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientNames {
    /// No client certificates are asked for.
    None,
    /// A URI SAN `<prefix><sandbox id>` (e.g. `spiffe://cluster.local/sandbox/agent1`).
    UriPrefix(String),
    /// The subject common name is the sandbox id.
    CommonName,
}

/// `audit.dns`: which DNS listener queries are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditDns {
    /// Every query (the default).
    #[default]
    All,
    /// Refused (and reported) queries only; answered ones are still counted in metrics.
    Denied,
}

/// Resolver settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// Empty: the system's resolv.conf.
    pub servers: Vec<SocketAddr>,
    /// Static answers consulted before DNS (normalised names).
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// How long a lookup may take.
    pub timeout: Duration,
    /// Names under these zones (normalised, no dots at the ends) are resolved when only
    /// address rules could allow them; other names no name rule allows are refused without
    /// a DNS query.
    pub address_rule_zones: Vec<String>,
    /// The DNS listener's answers live at most this long (`dns.max_answer_ttl_s`).
    pub max_answer_ttl: Duration,
    /// How long past its TTL a DNS listener answer still names its addresses for
    /// transparent connections (`dns.answer_grace_s`).
    pub answer_grace: Duration,
    /// Record types the DNS listener passes through for names a name rule could allow
    /// (`dns.pass_types`), besides A and AAAA.
    pub pass_types: Vec<u16>,
    /// What the DNS listener answers for `egress-proxy.local` (`dns.self_address`); `None`:
    /// the DNS listener's own address, else the proxy listener's, when bound to one.
    pub self_address: Option<IpAddr>,
}

/// Proxy-side limits of one sandbox, every field resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    /// Concurrent connections at most.
    pub max_connections: u32,
    /// New connections per second (token bucket rate).
    pub connections_per_second: f64,
    /// The bucket's burst.
    pub burst: u32,
    /// Upload bandwidth, bytes per second.
    pub bandwidth_up_bps: Option<u64>,
    /// Download bandwidth, bytes per second.
    pub bandwidth_down_bps: Option<u64>,
    /// Queries per second the DNS listener answers for the sandbox (one second's worth may
    /// come at once).
    pub dns_queries_per_second: f64,
    /// The kernel buffer a relayed tunnel's client socket may queue to send (`SO_SNDBUF`) and
    /// its destination socket may hold received (`SO_RCVBUF`): what a client that stops
    /// reading can pin in kernel memory, per tunnel. `None`: the kernel's autotuning (MiBs).
    pub socket_buffer_bytes: Option<u32>,
    /// Bytes (both directions) the sandbox may move in a UTC day (`quota_exceeded` past it).
    pub bytes_per_day: Option<u64>,
    /// Requests (tunnels not seen into, forwarded and terminated requests) in a UTC day.
    pub requests_per_day: Option<u64>,
    /// Daily quotas on destinations (`per_destination`): each counts the exchanges with the
    /// hosts its pattern matches, on top of the sandbox's own.
    pub per_destination: Vec<DestinationQuota>,
    /// LLM tokens (input, cached, output) the sandbox's inference calls may use in a UTC day
    /// (`budget_exceeded` past it).
    pub tokens_per_day: Option<u64>,
    /// Dollars the sandbox's inference calls may cost in a UTC day, priced by
    /// `defaults.prices`.
    pub cost_per_day: Option<f64>,
    /// Daily quotas of each process of the sandbox (`per_process`): its vouched exec, else
    /// its observed executable, counted on top of the sandbox's own.
    pub per_process: Option<ProcessQuota>,
    /// `defaults.prices` (set-wide: a sandbox's own limits cannot change them; not shown
    /// with each sandbox's limits).
    #[serde(skip)]
    pub prices: Vec<crate::config::prices::Price>,
}

/// `limits.per_process`: the daily quotas of each process (a vouched exec, else an observed
/// executable) of a sandbox, so one runaway tool is cut without cutting the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessQuota {
    /// Bytes a day, both directions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_day: Option<u64>,
    /// Requests a day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_day: Option<u64>,
    /// How many processes' quotas the sandbox's processes may spend together in a day
    /// (default [`ProcessQuota::PROCESSES_DEFAULT`]): every count of every process also
    /// counts into one sandbox-wide total of this many times each quota, so a sandbox that
    /// invents exec names cannot multiply its quota (security review A09).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
}

impl ProcessQuota {
    /// Processes' worth of quota a sandbox spends in all when `processes` is not written.
    pub const PROCESSES_DEFAULT: u32 = 16;

    /// The sandbox-wide total: each quota times `processes` (saturating).
    pub fn total(&self) -> (Option<u64>, Option<u64>) {
        let n = u64::from(self.processes.unwrap_or(Self::PROCESSES_DEFAULT));
        (
            self.bytes_per_day.map(|b| b.saturating_mul(n)),
            self.requests_per_day.map(|r| r.saturating_mul(n)),
        )
    }
}

/// One `limits.per_destination` entry: a host (`api.example.com`) or every name under a
/// domain (`*.example.com`), and its daily quotas.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationQuota {
    /// The destination host (a name or pattern).
    pub host: String,
    /// Bytes a day to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_day: Option<u64>,
    /// Requests a day to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_day: Option<u64>,
    /// LLM tokens a day to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// Dollars of inference a day to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_day: Option<f64>,
}

impl DestinationQuota {
    /// Whether `host` (lower case) is one this entry counts.
    pub fn matches(&self, host: &str) -> bool {
        match self.host.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1),
            None => self.host == host,
        }
    }
}

/// Timeouts of the data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to a destination.
    pub connect: Duration,
    /// Nothing moving on an exchange.
    pub idle: Duration,
    /// A request head, or a tunnel's first bytes, arriving.
    pub header: Duration,
    /// Draining on shutdown.
    pub shutdown_grace: Duration,
}

/// `defaults:`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// The ports an entry without a port allows.
    pub ports: PortSet,
    /// Enforce or report, unless a sandbox says.
    pub enforcement: Enforcement,
    /// The address ranges the guard refuses.
    pub prohibited_ranges: Vec<IpNet>,
    /// Ranges the guard lets through all the same.
    pub guard_allow_ranges: Vec<IpNet>,
    /// Limits, unless a sandbox says.
    pub limits: Limits,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Refuse a tunnel whose SNI resolves elsewhere than its destination.
    pub strict_sni_dst: bool,
    /// Ports whose tunnels must carry TLS (a ClientHello first).
    pub require_tls_ports: Arc<[u16]>,
    /// Refuse ClientHellos that offer ECH (the SNI would not be the real one).
    pub refuse_ech: bool,
    /// The top-level `decider:` (a sandbox's own takes precedence).
    pub decider: Option<Arc<decider::DeciderConfig>>,
}

/// One sandbox binding: identity, proxy-side settings and its AIP-36 block.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// The sandbox's id.
    pub id: SandboxId,
    /// SHA-256 of the sandbox's proxy token, when it authenticates with one.
    pub token_sha256: Option<[u8; 32]>,
    /// The source addresses that identify it.
    pub sources: Vec<IpNet>,
    /// Enforce or report.
    pub enforcement: Enforcement,
    /// Its limits.
    pub limits: Limits,
    /// Refuse a tunnel whose SNI resolves elsewhere than its destination.
    pub strict_sni_dst: bool,
    /// Ports whose tunnels must carry TLS (shared with `defaults` unless overridden).
    pub require_tls_ports: Arc<[u16]>,
    /// Refuse ClientHellos that carry Encrypted Client Hello.
    pub refuse_ech: bool,
    /// The AIP-36 block as written, as JSON (shown by the admin API; everything in it but the
    /// network part is the runtime's). Text, not the parsed block: one small allocation per
    /// sandbox instead of a kilobyte of mostly empty fields.
    pub block_json: Arc<str>,
    /// Its network policy (mode, egress, deny).
    pub network: NetworkSpec,
    /// The file the policy block lives in (the config file, or the referenced SANDBOX.md).
    pub policy_file: Arc<str>,
    /// The `ref` used, if any.
    pub policy_ref: Option<String>,
    /// Secrets put on requests to the hosts they are bound to (terminated by the proxy).
    pub credentials: Arc<[credentials::Credential]>,
    /// `upstream_proxy` of this sandbox: inherit the top-level parent, `direct`, or its own.
    pub upstream_proxy: upstream::ParentChoice,
    /// The decider asked after the policy allowed ([`crate::decider`]).
    pub decider: Option<Arc<decider::DeciderConfig>>,
    /// The scanner of request bodies to terminated hosts.
    pub dlp: Option<Arc<decider::DlpConfig>>,
    /// The hosts whose terminated requests carry the sandbox's identity token.
    pub identity_token: Option<Arc<identity_token::IdentityToken>>,
}

/// `max_connections`: a number of connections the process can actually hold — at least 1, at
/// most [`MaxConnections::LIMIT`] (a tokio semaphore cannot hold more than `usize::MAX >> 3`
/// permits, and the shutdown wait counts them in a `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxConnections(u32);

impl MaxConnections {
    /// The largest value taken.
    pub const LIMIT: u32 = 10_000_000;

    /// `n`, if it is 1 to [`MaxConnections::LIMIT`].
    pub fn new(n: u64) -> Option<Self> {
        (1..=u64::from(Self::LIMIT))
            .contains(&n)
            .then_some(MaxConnections(n as u32))
    }

    /// The value.
    pub fn get(self) -> usize {
        self.0 as usize
    }

    /// The value, as `u32`.
    pub fn get_u32(self) -> u32 {
        self.0
    }
}

impl Default for MaxConnections {
    fn default() -> Self {
        MaxConnections(defaults::MAX_CONNECTIONS as u32)
    }
}

/// `admission:` — what one client address may do before a sandbox is identified, so that a
/// client that connects and says nothing (or guesses tokens) cannot take slots from others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    /// Connections from one address not yet identified, at once.
    pub unidentified_per_source: u32,
    /// Connections not yet identified, at once, from everywhere.
    pub unidentified_total: u32,
    /// New connections per second from one address (token bucket) …
    pub accepts_per_second_per_source: f64,
    /// … and its burst.
    pub accept_burst_per_source: u32,
    /// How long a new connection may stay silent before its first byte.
    pub first_byte: Duration,
    /// Failed authentications per second from one address (token bucket) …
    pub auth_failures_per_second_per_source: f64,
    /// … and its burst.
    pub auth_failure_burst: u32,
    /// DNS queries per second one unidentified address gets answered (`REFUSED`); beyond it
    /// they are dropped unanswered. Burst: twice the rate.
    pub dns_queries_per_second_per_source: f64,
    /// How often an unidentified address's refused DNS queries are summed into one record.
    pub dns_summary: Duration,
    /// The share of `unidentified_total` only addresses that identified a sandbox in the
    /// last ten minutes may use.
    pub identified_share: f64,
    /// The share of the descriptor limit kept for the data plane: the admin listener and DNS
    /// over TCP are refused when open descriptors reach the rest.
    pub descriptor_reserve: f64,
}

/// `forward_keepalive:` — upstream connections of forwarded plain HTTP kept idle for the
/// next request of the same sandbox to the same origin ([`crate::egress::upstream_pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardKeepalive {
    /// How long an idle connection is kept (zero: none is kept).
    pub idle: Duration,
    /// Idle connections per sandbox, origin and address, at most.
    pub max_idle_per_origin: usize,
    /// Idle connections in all, at most.
    pub max_idle: usize,
}

/// `runtime:` — bounds on what the admin API may register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeLimits {
    /// Sandboxes registered through the API, at most.
    pub max_sandboxes: usize,
    /// Largest `PUT /v1/sandboxes/{id}` body.
    pub max_binding_bytes: usize,
    /// `state_sync_ms`: zero syncs every `state_dir` write before answering; otherwise writes
    /// are flushed together at most this often ([`crate::control::state_store`]).
    pub state_sync: Duration,
    /// `require_simulation`: every `PUT` of a registration or layer is simulated first and
    /// refused when it widens reach (as with `?require_simulation`).
    pub require_simulation: bool,
}

/// A fully loaded configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The main file's name as shown in messages.
    pub origin: Arc<str>,
    /// Directory relative paths resolve against.
    pub base_dir: PathBuf,
    /// The listeners.
    pub listen: Listen,
    /// The file holding the admin token's digest.
    pub admin_token_file: Option<PathBuf>,
    /// `admin:`: the console and who may sign in to it.
    pub console: console::ConsoleConfig,
    /// The filtering resolver.
    pub dns: DnsConfig,
    /// Defaults every sandbox inherits.
    pub defaults: Defaults,
    /// `None`: audit to stdout.
    pub audit_path: Option<PathBuf>,
    /// Where registrations, grants and counts are kept.
    pub state_dir: Option<PathBuf>,
    /// Sandbox providers accepted besides the known ones.
    pub extra_providers: Vec<String>,
    /// Records waiting for the audit writer beyond which new connections are refused.
    pub audit_queue_max: usize,
    /// Which DNS queries get a record (`audit.dns`).
    pub audit_dns: AuditDns,
    /// Chain, checkpoints, rotation, fsync and format of the audit trail.
    pub audit_trail: audit::AuditTrail,
    /// Global cap on concurrent identified client connections.
    pub max_connections: MaxConnections,
    /// Limits per client address before identification.
    pub admission: Admission,
    /// Bounds on runtime registrations.
    pub runtime: RuntimeLimits,
    /// Keeping upstream connections of forwarded requests.
    pub forward_keepalive: ForwardKeepalive,
    /// `upstream_proxy`: the parent every allowed connection goes through.
    pub upstream_proxy: Option<upstream::UpstreamProxy>,
    /// `control_plane.etcd`: registrations shared by every replica through etcd.
    pub etcd: Option<EtcdConfig>,
    /// `approvals`: bounds on access requests, the webhook, auto-approval.
    pub approvals: approvals::ApprovalsConfig,
    /// `otel`: OpenTelemetry export of records and counters ([`crate::otel`]).
    pub otel: Option<otel::OtelConfig>,
    /// `tls_intercept`: the CA for terminating hosts that credentials or HTTP rules bind.
    pub intercept: Option<credentials::InterceptConfig>,
    /// `layers:`: every policy layer, as written and as the chain a member is bounded by.
    pub layers: layers::LayerSet,
    /// Every sandbox defined in files.
    pub bindings: Vec<Binding>,
    /// What loading warned about.
    pub warnings: Vec<String>,
    /// Members' entries beyond a ceiling of their layers, each as the sentence `run` refuses
    /// it with: listed only by [`load_for_simulation`] (otherwise they are errors).
    pub beyond_ceiling: Vec<String>,
    /// Every file read (config, referenced and indexed SANDBOX.md files): what to watch.
    pub files: Vec<PathBuf>,
    /// Policies found in `sandbox_dirs`, for `@owner/slug` refs made later (admin PUT).
    index: Arc<PolicyIndex>,
    /// What placeholders derive from (a digest of the interception CA's key).
    placeholder_key: Option<[u8; 32]>,
    /// Whether secrets had to be readable when this was loaded (registrations parse alike).
    secrets: Secrets,
}

/// How a review tool's warning about a secret it could not read ends (`check` and `suggest`
/// print these; `validate` prints every warning).
pub const ABSENT_SECRET_NOTE: &str =
    "not needed to review the policy, but `run` refuses to start without it";

/// Whether the secrets a configuration names (credentials' `source`, the interception CA's
/// key) must be readable. `run` needs them; the review tools (`check`, `validate`,
/// `suggest --config`) run where policies are reviewed, which rarely holds the secrets: there
/// a missing secret is a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Secrets {
    /// A missing secret is an error.
    #[default]
    Required,
    /// A missing secret is a warning (`validate` on another machine).
    MayBeAbsent,
}

/// Load a configuration file, or the embedded default when `path` is `None`.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigErrors> {
    load_with(path, Secrets::Required, false)
}

/// [`load`] for the review tools: secrets that cannot be read are warnings.
pub fn load_for_review(path: Option<&Path>) -> Result<Config, ConfigErrors> {
    load_with(path, Secrets::MayBeAbsent, false)
}

/// [`load_for_review`] for `simulate`: a member whose entries reach beyond a ceiling of its
/// layers does not refuse the file (as it does for `run`); each such entry is listed in
/// [`Config::beyond_ceiling`], and the decisions refuse it `outside_ceiling` — what a
/// narrower ceiling would break is what the team asks.
pub fn load_for_simulation(path: Option<&Path>) -> Result<Config, ConfigErrors> {
    load_with(path, Secrets::MayBeAbsent, true)
}

#[cfg(test)]
mod tests;

impl Config {
    /// The addresses of the deciders and the approvals webhook this configuration (and the
    /// runtime `extra` bindings) ask: protected like the proxy's own listeners
    /// ([`crate::policy::guard`]) — no rule, grant or approval lets a sandbox reach them.
    pub fn protected_endpoints(&self, extra: &[Arc<Binding>]) -> Vec<std::net::SocketAddr> {
        let deciders = self
            .bindings
            .iter()
            .chain(extra.iter().map(|b| &**b))
            .filter_map(|b| b.decider.as_ref())
            .chain(self.defaults.decider.as_ref());
        let mut out: Vec<std::net::SocketAddr> = deciders.flat_map(|d| d.url.addresses()).collect();
        if let Some(hook) = &self.approvals.webhook {
            if let Some(a) = hook.url.authority() {
                let port = a.port_u16().unwrap_or(match hook.url.scheme_str() {
                    Some("https") => 443,
                    _ => 80,
                });
                out.extend(decider::authority_addresses(&format!(
                    "{}:{port}",
                    a.host()
                )));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}
