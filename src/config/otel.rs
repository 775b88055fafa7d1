//! `otel:` — OpenTelemetry export of the audit records (as OTel logs) and the usage counters
//! (as OTel metrics) to an OTLP collector ([`crate::otel`] does it; here it is validated).
//!
//! ```yaml
//! otel:
//!   endpoint: http://collector:4317   # gRPC; http://collector:4318 for protocol: http
//!   protocol: grpc                    # or http (OTLP/HTTP with protobuf bodies)
//!   headers_file: otel.headers        # optional: `Name: value` lines (a token), a secret
//!   interval_ms: 10000                # how often the counters are exported
//!   timeout_ms: 5000                  # one export, at most
//!   service_name: egress-proxy
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::Sink;

/// The wire protocol to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OtelProtocol {
    /// OTLP over gRPC.
    Grpc,
    /// OTLP over HTTP (protobuf).
    Http,
}

/// `otel:`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// `http://` or `https://` with a host (and for `http`, no path: the signal paths are
    /// appended, `/v1/logs` and `/v1/metrics`).
    pub endpoint: String,
    /// gRPC or HTTP.
    pub protocol: OtelProtocol,
    /// `Name: value` lines sent with every export (read at start; never logged).
    pub headers_file: Option<PathBuf>,
    /// How often metrics are exported.
    pub interval: Duration,
    /// How long an export may take.
    pub timeout: Duration,
    /// `service.name`.
    pub service_name: String,
}

/// `otel:` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtel {
    /// `endpoint`.
    pub endpoint: String,
    /// `protocol`.
    #[serde(default)]
    pub protocol: Option<OtelProtocol>,
    /// `headers_file`: headers sent with each export (a token).
    #[serde(default)]
    pub headers_file: Option<String>,
    /// `interval_ms`.
    #[serde(default)]
    pub interval_ms: Option<u64>,
    /// `timeout_ms`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `service_name`.
    #[serde(default)]
    pub service_name: Option<String>,
}

/// Validate `otel:`; errors name the key.
pub(super) fn resolve_otel(
    raw: Option<RawOtel>,
    rel: &dyn Fn(&str) -> PathBuf,
    sink: &mut Sink<'_>,
) -> Option<OtelConfig> {
    let raw = raw?;
    let protocol = raw.protocol.unwrap_or(OtelProtocol::Grpc);
    match raw.endpoint.parse::<http::Uri>() {
        Ok(u)
            if matches!(u.scheme_str(), Some("http" | "https"))
                && u.host().is_some_and(|h| !h.is_empty()) =>
        {
            if protocol == OtelProtocol::Http && !matches!(u.path(), "" | "/") {
                sink.top(
                    "otel.endpoint",
                    "for protocol http give the collector's base URL (the proxy adds /v1/logs and /v1/metrics)",
                    Some("endpoint"),
                );
            }
        }
        _ => sink.top(
            "otel.endpoint",
            format!(
                "`{}` is not an http:// or https:// URL with a host",
                raw.endpoint
            ),
            Some("endpoint"),
        ),
    }
    let ms = |v: Option<u64>, d: u64, key: &str, sink: &mut Sink<'_>| {
        let v = v.unwrap_or(d);
        if v == 0 {
            sink.top(format!("otel.{key}"), "must be positive", Some(key));
        }
        Duration::from_millis(v.max(1))
    };
    let interval = ms(raw.interval_ms, 10_000, "interval_ms", sink);
    let timeout = ms(raw.timeout_ms, 5_000, "timeout_ms", sink);
    let service_name = raw.service_name.unwrap_or_else(|| "egress-proxy".into());
    if service_name.trim().is_empty() {
        sink.top(
            "otel.service_name",
            "must not be empty",
            Some("service_name"),
        );
    }
    Some(OtelConfig {
        endpoint: raw.endpoint.trim_end_matches('/').to_string(),
        protocol,
        headers_file: raw.headers_file.as_deref().map(rel),
        interval,
        timeout,
        service_name,
    })
}

/// The headers in `text`: `Name: value` lines; blank lines and `#` comments are skipped.
/// An error names the line, never its value.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("line {}: expected `Name: value`", i + 1));
        };
        let (name, value) = (name.trim(), value.trim());
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
        {
            return Err(format!("line {}: not a valid header", i + 1));
        }
        out.push((name.to_ascii_lowercase(), value.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::load_str;
    use std::path::Path;

    fn load(otel: &str) -> Result<crate::config::Config, String> {
        load_str(&format!("otel: {otel}\n"), "t", Path::new("/etc"), None)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn otel_is_validated_with_clear_errors() {
        let c = load("{ endpoint: \"http://c:4318\", protocol: http, headers_file: h }").unwrap();
        let o = c.otel.unwrap();
        assert_eq!(o.protocol, super::OtelProtocol::Http);
        assert_eq!(o.headers_file.unwrap(), Path::new("/etc/h"));
        assert_eq!(o.service_name, "egress-proxy");
        let e = load("{ endpoint: \"c:4317\" }").unwrap_err();
        assert!(e.contains("otel.endpoint"), "{e}");
        let e = load("{ endpoint: \"http://c:4318/v1/logs\", protocol: http }").unwrap_err();
        assert!(e.contains("base URL"), "{e}");
        let e = load("{ endpoint: \"http://c:4317\", protocol: udp }").unwrap_err();
        assert!(e.contains("otel"), "{e}");
        let e = load("{ endpoint: \"http://c:4317\", interval_ms: 0 }").unwrap_err();
        assert!(e.contains("otel.interval_ms"), "{e}");
        let e = load("{ endpoint: \"http://c:4317\", color: red }").unwrap_err();
        assert!(e.contains("color"), "{e}");
    }

    #[test]
    fn header_lines_parse_and_errors_never_show_the_value() {
        let h =
            super::parse_headers("# token\nAuthorization: Bearer s3cret\n\nX-Tenant: a\n").unwrap();
        assert_eq!(h[0], ("authorization".into(), "Bearer s3cret".into()));
        assert_eq!(h.len(), 2);
        let e = super::parse_headers("Authorization Bearer s3cret").unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
    }
}
