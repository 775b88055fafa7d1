//! Every default of `proxy.yaml` in one place, and the resolution of the sections that have
//! them (`defaults:`, `dns:`, limits; `listen:` is `config::listen`): raw serde values in,
//! checked typed values out, every problem recorded in the [`Sink`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::error::Sink;
use super::raw::{RawAdmission, RawDefaults, RawForwardKeepalive, RawLimits, RawRuntime};
use super::{Admission, Defaults, ForwardKeepalive, Limits, RuntimeLimits, Timeouts};
use crate::policy::ports::PortSet;

/// `listen.proxy`
pub const PROXY_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 3128);
/// `listen.admin`
pub const ADMIN_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);
/// `dns.timeout_ms`
pub const DNS_TIMEOUT_MS: u64 = 2_000;
/// `defaults.ports`: HTTPS only.
pub const PORTS: &[u16] = &[443];
/// `defaults.require_tls_ports`: tunnels to these ports must carry TLS.
pub const REQUIRE_TLS_PORTS: &[u16] = &[443];
/// `defaults.timeouts`
pub const CONNECT_MS: u64 = 10_000;
/// `timeouts.idle_ms` when not set.
pub const IDLE_MS: u64 = 300_000;
/// `timeouts.header_ms` when not set.
pub const HEADER_MS: u64 = 10_000;
/// `timeouts.shutdown_grace_ms` when not set.
pub const SHUTDOWN_GRACE_MS: u64 = 10_000;
/// `defaults.limits`
pub const LIMITS: Limits = Limits {
    max_connections: 512,
    connections_per_second: 100.0,
    burst: 200,
    bandwidth_up_bps: None,
    bandwidth_down_bps: None,
    dns_queries_per_second: 100.0,
    socket_buffer_bytes: Some(SOCKET_BUFFER_BYTES),
    bytes_per_day: None,
    requests_per_day: None,
    per_destination: Vec::new(),
    tokens_per_day: None,
    cost_per_day: None,
    per_process: None,
    prices: Vec::new(),
};
/// `defaults.limits.socket_buffer_bytes`: 256 KiB.
pub const SOCKET_BUFFER_BYTES: u32 = 256 * 1024;
/// `dns.max_answer_ttl_s`
pub const MAX_ANSWER_TTL_S: u32 = 60;
/// `dns.answer_grace_s`: clients (the JVM, Go, glibc with nscd) keep answers a little longer
/// than they were told.
pub const ANSWER_GRACE_S: u32 = 60;
/// `audit.path`: stdout.
pub const AUDIT_PATH: &str = "-";
/// Top-level `max_connections` (the global cap on identified connections).
pub const MAX_CONNECTIONS: u64 = 10_000;
/// `audit.queue_max`
pub const AUDIT_QUEUE_MAX: usize = 100_000;
/// `admission:`
pub const ADMISSION: Admission = Admission {
    unidentified_per_source: 256,
    unidentified_total: 10_000,
    accepts_per_second_per_source: 500.0,
    accept_burst_per_source: 1_000,
    first_byte: Duration::from_millis(3_000),
    auth_failures_per_second_per_source: 5.0,
    auth_failure_burst: 20,
    dns_queries_per_second_per_source: 10.0,
    dns_summary: Duration::from_secs(10),
    identified_share: 0.1,
    descriptor_reserve: 0.25,
};
/// `runtime:`
pub const RUNTIME: RuntimeLimits = RuntimeLimits {
    max_sandboxes: 100_000,
    max_binding_bytes: 64 * 1024,
    state_sync: Duration::ZERO,
    require_simulation: false,
};

/// `forward_keepalive:` — 4 s idle: shorter than the keep-alive timeouts of common origins
/// (Apache's is 5 s), so a kept connection is rarely one the origin is closing just then.
pub const FORWARD_KEEPALIVE: ForwardKeepalive = ForwardKeepalive {
    idle: Duration::from_secs(4),
    max_idle_per_origin: 64,
    max_idle: 1024,
};

pub(super) fn resolve_limits(raw: &RawLimits, base: Option<&Limits>) -> Limits {
    let d = base.cloned().unwrap_or(LIMITS);
    Limits {
        max_connections: raw.max_connections.unwrap_or(d.max_connections),
        connections_per_second: raw
            .connections_per_second
            .unwrap_or(d.connections_per_second),
        burst: raw.burst.unwrap_or(d.burst),
        bandwidth_up_bps: raw.bandwidth_up_bps.or(d.bandwidth_up_bps),
        bandwidth_down_bps: raw.bandwidth_down_bps.or(d.bandwidth_down_bps),
        dns_queries_per_second: raw
            .dns_queries_per_second
            .unwrap_or(d.dns_queries_per_second),
        socket_buffer_bytes: match raw.socket_buffer_bytes {
            // 0: the kernel's autotuning.
            Some(0) => None,
            Some(n) => Some(n),
            None => d.socket_buffer_bytes,
        },
        bytes_per_day: raw.bytes_per_day.or(d.bytes_per_day),
        requests_per_day: raw.requests_per_day.or(d.requests_per_day),
        per_destination: raw
            .per_destination
            .clone()
            .map(|v| {
                v.into_iter()
                    .map(|mut q| {
                        q.host = q.host.trim_end_matches('.').to_ascii_lowercase();
                        q
                    })
                    .collect()
            })
            .unwrap_or(d.per_destination),
        tokens_per_day: raw.tokens_per_day.or(d.tokens_per_day),
        cost_per_day: raw.cost_per_day.or(d.cost_per_day),
        per_process: raw.per_process.or(d.per_process),
        prices: d.prices,
    }
}

pub(super) fn check_limits(
    l: &Limits,
    sandbox: Option<&str>,
    field: &str,
    sink: &mut Sink<'_>,
    line: usize,
) {
    if l.max_connections == 0 {
        sink.push(
            sandbox,
            format!("{field}.max_connections"),
            "must be at least 1",
            Some("max_connections:"),
            line,
        );
    }
    if !(l.dns_queries_per_second.is_finite() && l.dns_queries_per_second > 0.0) {
        sink.push(
            sandbox,
            format!("{field}.dns_queries_per_second"),
            "must be a positive number",
            Some("dns_queries_per_second:"),
            line,
        );
    }
    if !(l.connections_per_second.is_finite() && l.connections_per_second > 0.0) {
        sink.push(
            sandbox,
            format!("{field}.connections_per_second"),
            "must be a positive number",
            Some("connections_per_second:"),
            line,
        );
    }
    if l.socket_buffer_bytes.is_some_and(|n| n < 4096) {
        sink.push(
            sandbox,
            format!("{field}.socket_buffer_bytes"),
            "must be at least 4096 (or 0 for the kernel's autotuning)",
            Some("socket_buffer_bytes:"),
            line,
        );
    }
    super::quotas::check_destination_quotas(l, sandbox, field, sink, line);
    if l.burst == 0 {
        sink.push(
            sandbox,
            format!("{field}.burst"),
            "must be at least 1",
            Some("burst:"),
            line,
        );
    }
    for (name, v) in [
        ("bandwidth_up_bps", l.bandwidth_up_bps),
        ("bandwidth_down_bps", l.bandwidth_down_bps),
        ("bytes_per_day", l.bytes_per_day),
        ("requests_per_day", l.requests_per_day),
        ("tokens_per_day", l.tokens_per_day),
    ] {
        if v == Some(0) {
            sink.push(
                sandbox,
                format!("{field}.{name}"),
                "must be positive (or null for unlimited)",
                Some(name),
                line,
            );
        }
    }
}

pub(super) fn resolve_defaults(raw: RawDefaults, sink: &mut Sink<'_>) -> Defaults {
    let ports = match PortSet::from_ports(&raw.ports) {
        Ok(p) if !raw.ports.is_empty() => p,
        Ok(_) => {
            sink.top(
                "defaults.ports",
                "must list at least one port",
                Some("ports:"),
            );
            PortSet::any()
        }
        Err(e) => {
            sink.top("defaults.ports", e.to_string(), Some("ports:"));
            PortSet::any()
        }
    };
    let mut limits = resolve_limits(&raw.limits, None);
    check_limits(&limits, None, "defaults.limits", sink, 1);
    if let Err((at, why)) = super::prices::check(&raw.prices) {
        sink.top(at, why, Some("prices:"));
    }
    limits.prices = raw.prices.clone();
    let t = &raw.timeouts;
    for (name, v) in [
        ("connect_ms", t.connect_ms),
        ("idle_ms", t.idle_ms),
        ("header_ms", t.header_ms),
    ] {
        if v == 0 {
            sink.top(
                format!("defaults.timeouts.{name}"),
                "must be positive",
                Some(name),
            );
        }
    }
    Defaults {
        ports,
        enforcement: raw.enforcement,
        prohibited_ranges: raw.prohibited_ranges.iter().map(IpNet::trunc).collect(),
        guard_allow_ranges: raw.guard_allow_ranges.iter().map(IpNet::trunc).collect(),
        limits,
        timeouts: Timeouts {
            connect: Duration::from_millis(t.connect_ms),
            idle: Duration::from_millis(t.idle_ms),
            header: Duration::from_millis(t.header_ms),
            shutdown_grace: Duration::from_millis(t.shutdown_grace_ms),
        },
        strict_sni_dst: raw.strict_sni_dst,
        require_tls_ports: tls_ports(
            &raw.require_tls_ports,
            "defaults.require_tls_ports",
            None,
            1,
            sink,
        ),
        refuse_ech: raw.refuse_ech,
        decider: None,
    }
}

/// A `require_tls_ports` list (`field`, of `sandbox` when a binding overrides it, near
/// `line`), sorted and deduplicated; 0 is an error.
pub(super) fn tls_ports(
    ports: &[u16],
    field: &str,
    sandbox: Option<&str>,
    line: usize,
    sink: &mut Sink<'_>,
) -> Arc<[u16]> {
    if ports.contains(&0) {
        sink.push(
            sandbox,
            field,
            "ports are 1 to 65535",
            Some("require_tls_ports"),
            line,
        );
    }
    let mut v: Vec<u16> = ports.iter().copied().filter(|p| *p != 0).collect();
    v.sort_unstable();
    v.dedup();
    v.into()
}

pub(super) fn resolve_admission(raw: RawAdmission, sink: &mut Sink<'_>) -> Admission {
    let d = ADMISSION;
    let a = Admission {
        unidentified_per_source: raw
            .unidentified_per_source
            .unwrap_or(d.unidentified_per_source),
        unidentified_total: raw.unidentified_total.unwrap_or(d.unidentified_total),
        accepts_per_second_per_source: raw
            .accepts_per_second_per_source
            .unwrap_or(d.accepts_per_second_per_source),
        accept_burst_per_source: raw
            .accept_burst_per_source
            .unwrap_or(d.accept_burst_per_source),
        first_byte: raw
            .first_byte_ms
            .map(Duration::from_millis)
            .unwrap_or(d.first_byte),
        auth_failures_per_second_per_source: raw
            .auth_failures_per_second_per_source
            .unwrap_or(d.auth_failures_per_second_per_source),
        auth_failure_burst: raw.auth_failure_burst.unwrap_or(d.auth_failure_burst),
        dns_queries_per_second_per_source: raw
            .dns_queries_per_second_per_source
            .unwrap_or(d.dns_queries_per_second_per_source),
        dns_summary: raw
            .dns_summary_s
            .map(Duration::from_secs)
            .unwrap_or(d.dns_summary),
        identified_share: raw.identified_share.unwrap_or(d.identified_share),
        descriptor_reserve: raw.descriptor_reserve.unwrap_or(d.descriptor_reserve),
    };
    check_admission(&a, sink);
    a
}

/// Each `admission` value within its range; every one out of it goes to `sink`.
fn check_admission(a: &Admission, sink: &mut Sink<'_>) {
    for (name, v) in [
        ("unidentified_per_source", a.unidentified_per_source),
        ("unidentified_total", a.unidentified_total),
        ("accept_burst_per_source", a.accept_burst_per_source),
        ("auth_failure_burst", a.auth_failure_burst),
    ] {
        if v == 0 || v > 10_000_000 {
            sink.top(
                format!("admission.{name}"),
                "must be from 1 to 10000000",
                Some(name),
            );
        }
    }
    for (name, v) in [
        (
            "accepts_per_second_per_source",
            a.accepts_per_second_per_source,
        ),
        (
            "auth_failures_per_second_per_source",
            a.auth_failures_per_second_per_source,
        ),
        (
            "dns_queries_per_second_per_source",
            a.dns_queries_per_second_per_source,
        ),
    ] {
        if !(v.is_finite() && v > 0.0) {
            sink.top(
                format!("admission.{name}"),
                "must be a positive number",
                Some(name),
            );
        }
    }
    if !(0.0..=0.9).contains(&a.descriptor_reserve) {
        sink.top(
            "admission.descriptor_reserve",
            "must be from 0 to 0.9",
            Some("descriptor_reserve"),
        );
    }
    if !(0.0..=0.9).contains(&a.identified_share) {
        sink.top(
            "admission.identified_share",
            "must be from 0 to 0.9",
            Some("identified_share"),
        );
    }
    if a.dns_summary.is_zero() {
        sink.top(
            "admission.dns_summary_s",
            "must be at least 1",
            Some("dns_summary_s"),
        );
    }
    if a.first_byte.is_zero() {
        sink.top(
            "admission.first_byte_ms",
            "must be positive",
            Some("first_byte_ms"),
        );
    }
}

pub(super) fn resolve_runtime(raw: RawRuntime, sink: &mut Sink<'_>) -> RuntimeLimits {
    let r = RuntimeLimits {
        max_sandboxes: raw.max_sandboxes.unwrap_or(RUNTIME.max_sandboxes),
        max_binding_bytes: raw.max_binding_bytes.unwrap_or(RUNTIME.max_binding_bytes),
        state_sync: raw
            .state_sync_ms
            .map(Duration::from_millis)
            .unwrap_or(RUNTIME.state_sync),
        require_simulation: raw.require_simulation.unwrap_or(false),
    };
    if r.state_sync > Duration::from_secs(10) {
        sink.top(
            "runtime.state_sync_ms",
            "must be from 0 (sync every write) to 10000",
            Some("state_sync_ms"),
        );
    }
    if r.max_binding_bytes == 0 || r.max_binding_bytes > 16 * 1024 * 1024 {
        sink.top(
            "runtime.max_binding_bytes",
            "must be from 1 to 16777216",
            Some("max_binding_bytes"),
        );
    }
    r
}

/// `forward_keepalive`, or `tls_intercept.upstream_keepalive` (`field`): the same shape.
pub(super) fn resolve_forward_keepalive(
    raw: RawForwardKeepalive,
    field: &str,
    sink: &mut Sink<'_>,
) -> ForwardKeepalive {
    let d = FORWARD_KEEPALIVE;
    let k = ForwardKeepalive {
        idle: raw.idle_ms.map(Duration::from_millis).unwrap_or(d.idle),
        max_idle_per_origin: raw.max_idle_per_origin.unwrap_or(d.max_idle_per_origin),
        max_idle: raw.max_idle.unwrap_or(d.max_idle),
    };
    if k.idle > Duration::from_secs(600) {
        sink.top(
            format!("{field}.idle_ms"),
            "must be from 0 (keep none) to 600000",
            Some("idle_ms"),
        );
    }
    if k.max_idle_per_origin > 1000 || k.max_idle > 100_000 {
        sink.top(
            field,
            "max_idle_per_origin must be at most 1000 and max_idle at most 100000",
            Some(field.rsplit('.').next().unwrap_or(field)),
        );
    }
    k
}
