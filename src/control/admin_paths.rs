//! Which admin API path a request names (`docs/openapi.yaml`), the methods each takes and
//! which of them change something (those always need the token).

use http::Method;

use super::admin_layers::At;

/// The admin API's paths (`docs/openapi.yaml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Path {
    Healthz,
    Readyz,
    Metrics,
    Sandboxes,
    Sandbox(String),
    Keepalive(String),
    Placeholders(String),
    Check,
    Reload,
    Observe,
    /// `/v1/usage` ([`super::admin_usage`]).
    Usage,
    /// `/v1/requests[/{id}[/approve|/deny|/revoke]]` and `/v1/grants`
    /// ([`super::admin_requests`]).
    Requests(super::admin_requests::At),
    /// `/v1/layers…`, `/v1/sandboxes/{id}/simulate` ([`super::admin_layers`]).
    Layers(super::admin_layers::At),
    /// `/v1/sandboxes/{id}/flows` (`GET`) and `…/flows/waive` (`POST`)
    /// ([`super::admin_flows`]).
    Flows(String, bool),
}

impl Path {
    pub(super) fn of(path: &str) -> Option<Path> {
        Some(match path {
            "/healthz" => Path::Healthz,
            "/readyz" => Path::Readyz,
            "/metrics" => Path::Metrics,
            "/v1/sandboxes" => Path::Sandboxes,
            "/v1/check" => Path::Check,
            "/v1/reload" => Path::Reload,
            "/v1/observe" => Path::Observe,
            "/v1/usage" => Path::Usage,
            "/v1/grants" => Path::Requests(super::admin_requests::At::Grants),
            _ if path.starts_with("/v1/layers") => Path::Layers(At::of(path)?),
            _ if path.starts_with("/v1/requests") => {
                Path::Requests(super::admin_requests::At::of(path)?)
            }
            _ => {
                let rest = path.strip_prefix("/v1/sandboxes/")?;
                match rest.split_once('/') {
                    None => Path::Sandbox(rest.to_string()),
                    Some((id, "keepalive")) => Path::Keepalive(id.to_string()),
                    Some((id, "placeholders")) => Path::Placeholders(id.to_string()),
                    Some((id, "simulate")) => Path::Layers(At::SimulateSandbox(id.to_string())),
                    Some((id, "flows")) => Path::Flows(id.to_string(), false),
                    Some((id, "flows/waive")) => Path::Flows(id.to_string(), true),
                    Some(_) => return None,
                }
            }
        })
    }

    /// The methods the path takes (the `Allow` of a 405).
    pub(super) fn allow(&self) -> &'static str {
        match self {
            Path::Sandbox(_) => "GET, PUT, DELETE",
            Path::Keepalive(_) | Path::Check | Path::Reload => "POST",
            Path::Requests(at) => at.allow(),
            Path::Layers(at) => at.allow(),
            Path::Flows(_, true) => "POST",
            _ => "GET",
        }
    }

    /// Whether `method` on this path changes something (the token is then always needed).
    pub(super) fn mutating(&self, method: &Method) -> bool {
        match self {
            Path::Sandbox(_) => matches!(*method, Method::PUT | Method::DELETE),
            Path::Keepalive(_) | Path::Reload | Path::Requests(_) => *method == Method::POST,
            Path::Layers(at) => at.mutating(method),
            Path::Flows(_, waive) => *waive && *method == Method::POST,
            _ => false,
        }
    }
}
