//! The serde shape of `proxy.yaml` (DESIGN §5), section by section. Unknown keys are rejected.
//! Each section is deserialised on its own so that one bad section does not hide the errors
//! of the others.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::defaults;
use crate::policy::Enforcement;

/// Top-level keys, for the unknown-key check.
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "listen",
    "layers",
    "admin_token_file",
    "admin",
    "dns",
    "defaults",
    "audit",
    "state_dir",
    "sandbox_dirs",
    "extra_providers",
    "max_connections",
    "admission",
    "runtime",
    "forward_keepalive",
    "upstream_proxy",
    "control_plane",
    "approvals",
    "tls_intercept",
    "decider",
    "otel",
    "sandboxes",
];

// Defaults come from [`super::defaults`]; serde needs them as functions.
fn d_proxy() -> Option<SocketAddr> {
    Some(defaults::PROXY_ADDR)
}
fn d_admin() -> Option<SocketAddr> {
    Some(defaults::ADMIN_ADDR)
}

/// `listen:` — a key left out takes the default; `null` disables the listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListen {
    #[serde(default = "d_proxy")]
    pub proxy: Option<SocketAddr>,
    #[serde(default)]
    pub transparent: Option<SocketAddr>,
    /// The transparent listener receives TPROXY'd connections (sets IP_TRANSPARENT).
    #[serde(default)]
    pub transparent_tproxy: bool,
    #[serde(default = "d_admin")]
    pub admin: Option<SocketAddr>,
    #[serde(default)]
    pub dns: Option<SocketAddr>,
    /// The SOCKS5 listener.
    #[serde(default)]
    pub socks5: Option<SocketAddr>,
    /// The HTTPS proxy listener.
    #[serde(default)]
    pub proxy_tls: Option<RawProxyTls>,
    /// TLS for the admin listener.
    #[serde(default)]
    pub admin_tls: Option<RawAdminTls>,
    #[serde(default)]
    pub default_sandbox: Option<String>,
    /// `listen.attribution`: name the process behind each connection from the kernel.
    #[serde(default)]
    pub attribution: Option<RawAttribution>,
    /// `listen.threads`: data-plane threads, each with its own runtime and sockets (0: the
    /// connections share the main runtime's workers).
    #[serde(default)]
    pub threads: usize,
}

/// `listen.attribution`: map each accepted connection to the process at its other end
/// (where the proxy shares a kernel with the sandboxes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAttribution {
    /// Look the process up (off by default).
    #[serde(default)]
    pub observe: bool,
    /// At most this many `/proc` lookups a second; past it a connection is marked unknown.
    #[serde(default = "d_lookups")]
    pub lookups_per_second: u32,
}

fn d_lookups() -> u32 {
    2000
}

/// `listen.admin_tls`: the admin listener over TLS; with `client_ca_file`, only clients with
/// a certificate signed by it get in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdminTls {
    pub cert_file: String,
    pub key_file: String,
    #[serde(default)]
    pub client_ca_file: Option<String>,
}

/// `listen.proxy_tls`: the explicit proxy over TLS, optionally with client certificates.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProxyTls {
    pub addr: SocketAddr,
    pub cert_file: String,
    pub key_file: String,
    #[serde(default)]
    pub client_ca_file: Option<String>,
    /// A URI SAN starting with this names the sandbox (the rest of it is the id).
    #[serde(default)]
    pub client_uri_prefix: Option<String>,
    /// The subject CN names the sandbox.
    #[serde(default)]
    pub client_cn: bool,
}

impl Default for RawListen {
    fn default() -> Self {
        RawListen {
            proxy: d_proxy(),
            transparent: None,
            transparent_tproxy: false,
            admin: d_admin(),
            dns: None,
            socks5: None,
            proxy_tls: None,
            admin_tls: None,
            default_sandbox: None,
            attribution: None,
            threads: 0,
        }
    }
}

fn d_dns_timeout() -> u64 {
    defaults::DNS_TIMEOUT_MS
}

/// `dns:`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDns {
    /// `ip` or `ip:port`; empty = the system's resolv.conf.
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    #[serde(default = "d_dns_timeout")]
    pub timeout_ms: u64,
    /// Zones whose names are resolved for address rules (default: resolv.conf's search).
    #[serde(default)]
    pub address_rule_zones: Option<Vec<String>>,
    /// Cap on the TTL of the DNS listener's answers.
    #[serde(default = "d_max_answer_ttl")]
    pub max_answer_ttl_s: u32,
    /// How long past its TTL an answer still names its addresses (transparent mode).
    #[serde(default = "d_answer_grace")]
    pub answer_grace_s: u32,
    /// Record types (names such as `TXT`, `MX`) passed through for allowed names.
    #[serde(default)]
    pub pass_types: Vec<String>,
    /// The address the DNS listener answers for `egress-proxy.local`.
    #[serde(default)]
    pub self_address: Option<IpAddr>,
}

fn d_max_answer_ttl() -> u32 {
    defaults::MAX_ANSWER_TTL_S
}

fn d_answer_grace() -> u32 {
    defaults::ANSWER_GRACE_S
}

impl Default for RawDns {
    fn default() -> Self {
        RawDns {
            servers: Vec::new(),
            hosts: BTreeMap::new(),
            timeout_ms: d_dns_timeout(),
            address_rule_zones: None,
            max_answer_ttl_s: d_max_answer_ttl(),
            answer_grace_s: d_answer_grace(),
            pass_types: Vec::new(),
            self_address: None,
        }
    }
}

/// Proxy-side limits of a sandbox (not AIP-36 `limits`). Every field optional so that a
/// binding can override just one; `defaults.limits` fills the rest.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// `max_connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// `connections_per_second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_second: Option<f64>,
    /// `burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// `bandwidth_up_bps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_up_bps: Option<u64>,
    /// `bandwidth_down_bps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_down_bps: Option<u64>,
    /// `dns_queries_per_second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_queries_per_second: Option<f64>,
    /// `socket_buffer_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_buffer_bytes: Option<u32>,
    /// `bytes_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_day: Option<u64>,
    /// `requests_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_day: Option<u64>,
    /// `per_destination`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_destination: Option<Vec<super::DestinationQuota>>,
    /// `tokens_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// `cost_per_day` (dollars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_day: Option<f64>,
    /// `per_process`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_process: Option<super::ProcessQuota>,
}

fn d_connect() -> u64 {
    defaults::CONNECT_MS
}
fn d_idle() -> u64 {
    defaults::IDLE_MS
}
fn d_header() -> u64 {
    defaults::HEADER_MS
}
fn d_grace() -> u64 {
    defaults::SHUTDOWN_GRACE_MS
}

/// `defaults.timeouts`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimeouts {
    #[serde(default = "d_connect")]
    pub connect_ms: u64,
    #[serde(default = "d_idle")]
    pub idle_ms: u64,
    #[serde(default = "d_header")]
    pub header_ms: u64,
    /// How long a graceful shutdown lets open tunnels finish.
    #[serde(default = "d_grace")]
    pub shutdown_grace_ms: u64,
}

impl Default for RawTimeouts {
    fn default() -> Self {
        RawTimeouts {
            connect_ms: d_connect(),
            idle_ms: d_idle(),
            header_ms: d_header(),
            shutdown_grace_ms: d_grace(),
        }
    }
}

fn d_ports() -> Vec<u16> {
    defaults::PORTS.to_vec()
}

/// `defaults:`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    #[serde(default = "d_ports")]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub enforcement: Enforcement,
    #[serde(default)]
    pub prohibited_ranges: Vec<IpNet>,
    #[serde(default)]
    pub guard_allow_ranges: Vec<IpNet>,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub timeouts: RawTimeouts,
    #[serde(default)]
    pub strict_sni_dst: bool,
    #[serde(default = "d_require_tls_ports")]
    pub require_tls_ports: Vec<u16>,
    #[serde(default)]
    pub refuse_ech: bool,
    #[serde(default)]
    pub prices: Vec<super::prices::Price>,
}

fn d_require_tls_ports() -> Vec<u16> {
    defaults::REQUIRE_TLS_PORTS.to_vec()
}

impl Default for RawDefaults {
    fn default() -> Self {
        RawDefaults {
            ports: d_ports(),
            enforcement: Enforcement::Enforce,
            prohibited_ranges: Vec::new(),
            guard_allow_ranges: Vec::new(),
            limits: RawLimits::default(),
            timeouts: RawTimeouts::default(),
            strict_sni_dst: false,
            require_tls_ports: d_require_tls_ports(),
            refuse_ech: false,
            prices: Vec::new(),
        }
    }
}

fn d_audit_path() -> String {
    defaults::AUDIT_PATH.into()
}

fn d_audit_queue() -> usize {
    defaults::AUDIT_QUEUE_MAX
}

/// `audit:`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    #[serde(default = "d_audit_path")]
    pub path: String,
    /// Records waiting for the writer beyond which new connections are refused (503).
    #[serde(default = "d_audit_queue")]
    pub queue_max: usize,
    /// `all` (default) or `denied`: which DNS listener queries are recorded.
    #[serde(default)]
    pub dns: super::AuditDns,
    /// Chain, checkpoints, rotation, fsync, format ([`super::audit`]).
    #[serde(flatten)]
    pub trail: super::audit::RawTrail,
}

impl Default for RawAudit {
    fn default() -> Self {
        RawAudit {
            path: d_audit_path(),
            queue_max: d_audit_queue(),
            dns: super::AuditDns::All,
            trail: Default::default(),
        }
    }
}

/// `admission:` — limits per client source address, before any sandbox is identified.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmission {
    pub unidentified_per_source: Option<u32>,
    pub unidentified_total: Option<u32>,
    pub accepts_per_second_per_source: Option<f64>,
    pub accept_burst_per_source: Option<u32>,
    pub first_byte_ms: Option<u64>,
    pub auth_failures_per_second_per_source: Option<f64>,
    pub auth_failure_burst: Option<u32>,
    pub dns_queries_per_second_per_source: Option<f64>,
    pub dns_summary_s: Option<u64>,
    pub identified_share: Option<f64>,
    pub descriptor_reserve: Option<f64>,
}

/// `forward_keepalive:` — idle upstream connections kept for forwarded plain HTTP.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForwardKeepalive {
    pub idle_ms: Option<u64>,
    pub max_idle_per_origin: Option<usize>,
    pub max_idle: Option<usize>,
}

/// `runtime:` — bounds on what the admin API may register.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRuntime {
    pub max_sandboxes: Option<usize>,
    pub max_binding_bytes: Option<usize>,
    pub state_sync_ms: Option<u64>,
    /// Refuse a `PUT` of a registration or layer that widens reach (`?require_simulation`).
    pub require_simulation: Option<bool>,
}

/// `auth:` of a binding: exactly one token form; never a plaintext token.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// `token_sha256`: the token's digest, written inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// `token_file`: a file holding the digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// `token_env`: an environment variable holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
}

/// One entry of `sandboxes:`; its `policy` is taken out and resolved separately.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBinding {
    pub id: String,
    /// The policy layer it is a member of ([`super::layers`]).
    #[serde(default)]
    pub layer: Option<String>,
    #[serde(default)]
    pub auth: Option<RawAuth>,
    #[serde(default)]
    pub sources: Vec<IpNet>,
    #[serde(default)]
    pub enforcement: Option<Enforcement>,
    #[serde(default)]
    pub limits: Option<RawLimits>,
    #[serde(default)]
    pub strict_sni_dst: Option<bool>,
    #[serde(default)]
    pub require_tls_ports: Option<Vec<u16>>,
    #[serde(default)]
    pub refuse_ech: Option<bool>,
    /// Secrets put on requests to the hosts they are bound to ([`super::credentials`]).
    #[serde(default)]
    pub credentials: Vec<super::credentials::RawCredential>,
    /// This sandbox's parent proxy, or `direct` ([`super::upstream`]).
    #[serde(default)]
    pub upstream_proxy: Option<super::upstream::RawSandboxParent>,
    /// This sandbox's decider (else the top-level one).
    #[serde(default)]
    pub decider: Option<super::decider::RawDecider>,
    /// Request-body scanning on terminated hosts.
    #[serde(default)]
    pub dlp: Option<super::decider::RawDlp>,
    /// A signed identity toward these hosts.
    #[serde(default)]
    pub identity_token: Option<super::identity_token::RawIdentityToken>,
}
