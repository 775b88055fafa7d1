//! `control_plane:` — where registrations live when several replicas share them. Today one
//! backend: `etcd` ([`crate::control::etcd`]). Without the section registrations stay local to
//! the process (and its `state_dir`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::Sink;

/// The key prefix when none is given.
pub const DEFAULT_PREFIX: &str = "/egress-proxy/";
const DEFAULT_DIAL_TIMEOUT_MS: u64 = 2_000;
const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;

/// `control_plane:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawControlPlane {
    #[serde(default)]
    etcd: Option<RawEtcd>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    endpoints: Vec<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password_file: Option<String>,
    #[serde(default)]
    tls: Option<RawEtcdTls>,
    #[serde(default)]
    dial_timeout_ms: Option<u64>,
    #[serde(default)]
    request_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcdTls {
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
}

/// `control_plane.etcd`, validated; relative paths resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port` (a bare `host:port` gets the scheme that
    /// `tls` implies).
    pub endpoints: Vec<String>,
    /// Every key the proxy reads or writes starts with this (ends with `/`).
    pub prefix: String,
    /// The user to authenticate as, if any.
    pub username: Option<String>,
    /// Read when connecting, never kept in the configuration.
    pub password_file: Option<PathBuf>,
    /// TLS to etcd, if used.
    pub tls: Option<EtcdTls>,
    /// How long one connection attempt may take.
    pub dial_timeout: Duration,
    /// How long one call (a write, a list) may take before it counts as failed.
    pub request_timeout: Duration,
}

/// `control_plane.etcd.tls`: a CA to verify etcd with, and a client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signs etcd's certificate.
    pub ca_file: Option<PathBuf>,
    /// The client certificate, for mTLS.
    pub cert_file: Option<PathBuf>,
    /// Its key.
    pub key_file: Option<PathBuf>,
}

impl EtcdConfig {
    /// The key holding sandbox `id`.
    pub fn sandbox_key(&self, id: &str) -> String {
        format!("{}sandboxes/{id}", self.prefix)
    }

    /// The prefix of every sandbox key.
    pub fn sandboxes_prefix(&self) -> String {
        format!("{}sandboxes/", self.prefix)
    }
}

/// `control_plane.etcd.tls`: a CA is needed; a client certificate comes with its key.
fn check_tls(t: &EtcdTls, sink: &mut Sink<'_>) {
    if t.ca_file.is_none() {
        sink.top(
            "control_plane.etcd.tls.ca_file",
            "needs the CA that signs etcd's certificate",
            Some("tls:"),
        );
    }
    if t.cert_file.is_some() != t.key_file.is_some() {
        sink.top(
            "control_plane.etcd.tls",
            "`cert_file` and `key_file` go together (the client certificate and its key)",
            Some("tls:"),
        );
    }
}

/// Validate `control_plane:`; every problem goes to `sink`.
pub(super) fn resolve_control_plane(
    raw: RawControlPlane,
    rel: &dyn Fn(&str) -> PathBuf,
    sink: &mut Sink<'_>,
) -> Option<EtcdConfig> {
    let raw = raw.etcd?;
    let field = |f: &str| format!("control_plane.etcd.{f}");
    if raw.endpoints.is_empty() {
        sink.top(
            field("endpoints"),
            "needs at least one endpoint",
            Some("endpoints"),
        );
    }
    let tls = raw.tls.map(|t| EtcdTls {
        ca_file: t.ca_file.as_deref().map(rel),
        cert_file: t.cert_file.as_deref().map(rel),
        key_file: t.key_file.as_deref().map(rel),
    });
    if let Some(t) = &tls {
        check_tls(t, sink);
    }
    let endpoints = endpoints(&raw.endpoints, tls.is_some(), sink);
    let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_string());
    if prefix.is_empty() || !prefix.ends_with('/') {
        sink.top(
            field("prefix"),
            "must end with `/` (keys are {prefix}sandboxes/{id})",
            Some("prefix"),
        );
    }
    if raw.username.is_some() != raw.password_file.is_some() {
        sink.top(
            field("username"),
            "`username` and `password_file` go together",
            Some("username"),
        );
    }
    let ms = |v: Option<u64>, default: u64, name: &str, sink: &mut Sink<'_>| {
        let v = v.unwrap_or(default);
        if !(100..=60_000).contains(&v) {
            sink.top(field(name), "must be from 100 to 60000", Some(name));
        }
        Duration::from_millis(v)
    };
    let dial_timeout = ms(
        raw.dial_timeout_ms,
        DEFAULT_DIAL_TIMEOUT_MS,
        "dial_timeout_ms",
        sink,
    );
    let request_timeout = ms(
        raw.request_timeout_ms,
        DEFAULT_REQUEST_TIMEOUT_MS,
        "request_timeout_ms",
        sink,
    );
    Some(EtcdConfig {
        endpoints,
        prefix,
        username: raw.username,
        password_file: raw.password_file.as_deref().map(rel),
        tls,
        dial_timeout,
        request_timeout,
    })
}

/// `control_plane.etcd.endpoints` as URLs: `http://` or `https://` (a bare `host:port`
/// takes the scheme `tls` implies); every malformed one goes to `sink`.
fn endpoints(raw: &[String], tls: bool, sink: &mut Sink<'_>) -> Vec<String> {
    let field = |f: &str| format!("control_plane.etcd.{f}");
    let mut endpoints = Vec::new();
    for e in raw {
        let (scheme, rest) = match e.split_once("://") {
            Some((s, r)) => (Some(s), r),
            None => (None, e.as_str()),
        };
        let ok_scheme = match scheme {
            None => true,
            Some("http") => !tls,
            Some("https") => true,
            Some(_) => false,
        };
        if !ok_scheme {
            sink.top(
                field("endpoints"),
                format!(
                    "`{e}`: use http://host:port, or https://host:port with `tls` (a bare host:port takes the scheme `tls` implies)"
                ),
                Some(e),
            );
            continue;
        }
        if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
            sink.top(
                field("endpoints"),
                format!("`{e}`: expected host:port"),
                Some(e),
            );
            continue;
        }
        let scheme = scheme.unwrap_or(if tls { "https" } else { "http" });
        endpoints.push(format!("{scheme}://{rest}"));
    }
    endpoints
}

/// With etcd as the control plane, `state_dir` keeps no registrations: say so.
pub(super) fn unused_state_dir(etcd: bool, state_dir: bool) -> Option<String> {
    (etcd && state_dir).then(|| {
        "state_dir is not used for registrations when control_plane.etcd is set: etcd keeps them"
            .to_string()
    })
}

/// What a valid configuration is warned about: an unused `state_dir`, `on_error: allow`.
pub(super) fn notes<E, S>(
    etcd: &Option<E>,
    state_dir: &Option<S>,
    defaults: &super::Defaults,
) -> Vec<String> {
    let unused = unused_state_dir(etcd.is_some(), state_dir.is_some());
    let allow = super::decider::allow_warning(defaults.decider.as_deref());
    unused.into_iter().chain(allow).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::load_str;

    fn load(yaml: &str) -> Result<super::super::Config, String> {
        load_str(yaml, "t.yaml", Path::new("/cfg"), None).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = load("control_plane: { etcd: { endpoints: [\"10.0.0.1:2379\"], username: px, password_file: pw } }").unwrap();
        let e = c.etcd.unwrap();
        assert_eq!(e.endpoints, ["http://10.0.0.1:2379"]);
        assert_eq!(e.prefix, "/egress-proxy/");
        assert_eq!(e.sandbox_key("a1"), "/egress-proxy/sandboxes/a1");
        assert_eq!(e.password_file.unwrap(), Path::new("/cfg/pw"));
        assert!(load("{}").unwrap().etcd.is_none());
    }

    #[test]
    fn tls_makes_bare_endpoints_https_and_needs_a_ca() {
        let c =
            load("control_plane: { etcd: { endpoints: [\"e:2379\"], tls: { ca_file: ca.pem } } }")
                .unwrap();
        assert_eq!(c.etcd.unwrap().endpoints, ["https://e:2379"]);
        let err = load("control_plane: { etcd: { endpoints: [\"e:2379\"], tls: { cert_file: c.pem, key_file: k.pem } } }").unwrap_err();
        assert!(err.contains("tls.ca_file"), "{err}");
        let err = load(
            "control_plane: { etcd: { endpoints: [\"http://e:2379\"], tls: { ca_file: ca.pem } } }",
        )
        .unwrap_err();
        assert!(err.contains("https"), "{err}");
    }

    #[test]
    fn every_mistake_is_named() {
        for (yaml, needle) in [
            (
                "control_plane: { etcd: { endpoints: [] } }",
                "at least one endpoint",
            ),
            (
                "control_plane: { etcd: { endpoints: [\"e\"] } }",
                "host:port",
            ),
            (
                "control_plane: { etcd: { endpoints: [\"ftp://e:1\"] } }",
                "ftp://e:1",
            ),
            (
                "control_plane: { etcd: { endpoints: [\"e:1\"], prefix: /x } }",
                "end with `/`",
            ),
            (
                "control_plane: { etcd: { endpoints: [\"e:1\"], username: u } }",
                "go together",
            ),
            (
                "control_plane: { etcd: { endpoints: [\"e:1\"], dial_timeout_ms: 5 } }",
                "from 100",
            ),
            (
                "control_plane: { etcd: { endpoints: [\"e:1\"], typo: 1 } }",
                "typo",
            ),
            ("control_plane: { consul: {} }", "consul"),
        ] {
            let err = load(yaml).unwrap_err();
            assert!(err.contains(needle), "{yaml}: {err}");
        }
    }

    #[test]
    fn state_dir_with_etcd_is_a_warning() {
        let c = load("state_dir: st\ncontrol_plane: { etcd: { endpoints: [\"e:1\"] } }").unwrap();
        assert!(
            c.warnings.iter().any(|w| w.contains("state_dir")),
            "{:?}",
            c.warnings
        );
    }
}
