//! The layers and simulation calls of the admin API (`docs/openapi.yaml`): `GET /v1/layers`,
//! `GET|PUT|DELETE /v1/layers/{id}`, `POST /v1/layers/{id}/simulate` and
//! `POST /v1/sandboxes/{id}/simulate` ([`super::simulate`]); and the query of a `PUT` —
//! `ttl_s=N` (registrations on etcd) and `require_simulation` (refuse a change that widens
//! reach, with the simulation that says so; `runtime.require_simulation` asks it of every
//! `PUT`). Changes go through etcd when it is configured.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::json;

use super::admin::{error, json_resp, read_body, Admin};
use super::error::{invalid, ControlError};
use super::etcd::TTL_RANGE;
use super::layers::parse_layer;
use super::ChangeError;
use crate::config::layers::RawLayer;
use crate::policy::cause::caused;

/// Which layers path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum At {
    /// `/v1/layers`.
    List,
    /// `/v1/layers/{id}`.
    One(String),
    /// `/v1/layers/{id}/simulate`.
    SimulateLayer(String),
    /// `/v1/sandboxes/{id}/simulate`.
    SimulateSandbox(String),
}

impl At {
    /// The layers path `path` names.
    pub fn of(path: &str) -> Option<At> {
        if path == "/v1/layers" {
            return Some(At::List);
        }
        let rest = path.strip_prefix("/v1/layers/")?;
        Some(match rest.split_once('/') {
            None => At::One(rest.to_string()),
            Some((id, "simulate")) => At::SimulateLayer(id.to_string()),
            Some(_) => return None,
        })
    }

    /// The methods it takes.
    pub fn allow(&self) -> &'static str {
        match self {
            At::List => "GET",
            At::One(_) => "GET, PUT, DELETE",
            At::SimulateLayer(_) | At::SimulateSandbox(_) => "POST",
        }
    }

    /// Whether it takes `m`.
    pub fn takes(&self, m: &Method) -> bool {
        self.allow().split(", ").any(|a| a == m.as_str())
    }

    /// Whether `m` needs the token: every change, and a simulation (it reads the trail).
    pub fn mutating(&self, m: &Method) -> bool {
        *m != Method::GET
    }
}

/// The query of a `PUT`: `ttl_s=N` and `require_simulation`, nothing else.
pub fn put_query(query: Option<&str>) -> Result<(Option<i64>, bool), ControlError> {
    let (mut ttl, mut require) = (None, false);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("ttl_s", v) => match v.parse::<i64>() {
                Ok(n) if TTL_RANGE.contains(&n) => ttl = Some(n),
                _ => {
                    return Err(invalid(format!(
                        "ttl_s must be a whole number of seconds from {} to {}",
                        TTL_RANGE.start(),
                        TTL_RANGE.end()
                    )))
                }
            },
            ("require_simulation", "" | "true" | "1") => require = true,
            _ => {
                let why = "unknown query parameter (PUT takes ttl_s and require_simulation)";
                return Err(invalid(why));
            }
        }
    }
    Ok((ttl, require))
}

/// What a `PUT` proposes.
pub enum Candidate {
    /// A registration's body for sandbox `id`.
    Sandbox(String, String),
    /// Layer `id`.
    Layer(String, Box<RawLayer>),
}

/// With `require_simulation` (asked, or `runtime.require_simulation`): the 409 that refuses
/// a change that widens reach, with the simulation; `None` when it may go ahead.
pub async fn refused_by_simulation(
    admin: &Admin,
    asked: bool,
    candidate: Candidate,
) -> Option<Response<Full<Bytes>>> {
    let required = asked || admin.control.config().runtime.require_simulation;
    if !required {
        return None;
    }
    let report = match simulate(admin, candidate).await {
        Ok(r) => r,
        Err(e) => return Some(change_error(e)),
    };
    if report["widens"] != true {
        return None;
    }
    let mut body = report;
    body["error"] = json!("the change widens reach (require_simulation): see simulation and diff");
    Some(json_resp(StatusCode::CONFLICT, body))
}

async fn simulate(admin: &Admin, candidate: Candidate) -> Result<serde_json::Value, ChangeError> {
    let control = admin.control.clone();
    tokio::task::spawn_blocking(move || match candidate {
        Candidate::Sandbox(id, body) => control.simulate_sandbox(&id, &body),
        Candidate::Layer(id, layer) => control.simulate_layer(&id, *layer),
    })
    .await
    .map_err(|e| ChangeError::Failed(caused("control task", e)))?
}

fn change_error(e: ChangeError) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, e.to_string())
}

/// Serve a layers path.
pub async fn route(admin: &Admin, at: At, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let query = req.uri().query().map(str::to_string);
    match (method, at) {
        (Method::GET, At::List) => json_resp(StatusCode::OK, admin.control.layers()),
        (Method::GET, At::One(id)) => match admin.control.layer(&id) {
            Some(v) => json_resp(StatusCode::OK, v),
            None => error(StatusCode::NOT_FOUND, format!("no layer `{id}`")),
        },
        (Method::POST, At::SimulateSandbox(id)) => match read_body(req, admin.max_body).await {
            Ok(body) => answer(simulate(admin, Candidate::Sandbox(id, body)).await),
            Err(r) => r,
        },
        (Method::POST, At::SimulateLayer(id)) => match read_body(req, admin.max_body).await {
            Ok(body) => match parse_layer(&id, &body) {
                Ok(l) => answer(simulate(admin, Candidate::Layer(id, Box::new(l))).await),
                Err(e) => change_error(e),
            },
            Err(r) => r,
        },
        (Method::PUT, At::One(id)) => {
            let require = match put_query(query.as_deref()) {
                Ok((None, r)) => r,
                Ok((Some(_), _)) => return error(StatusCode::BAD_REQUEST, "layers take no ttl_s"),
                Err(m) => return error(StatusCode::BAD_REQUEST, m.to_string()),
            };
            let layer = match read_body(req, admin.max_body)
                .await
                .map(|b| parse_layer(&id, &b))
            {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => return change_error(e),
                Err(r) => return r,
            };
            let candidate = Candidate::Layer(id.clone(), Box::new(layer.clone()));
            if let Some(refused) = refused_by_simulation(admin, require, candidate).await {
                return refused;
            }
            set(admin, id, Some(layer)).await
        }
        (Method::DELETE, At::One(id)) => set(admin, id, None).await,
        (_, at) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("use {}", at.allow()),
        ),
    }
}

fn answer(r: Result<serde_json::Value, ChangeError>) -> Response<Full<Bytes>> {
    match r {
        Ok(v) => json_resp(StatusCode::OK, v),
        Err(e) => change_error(e),
    }
}

/// Apply a layer's change (through etcd when configured).
async fn set(admin: &Admin, id: String, layer: Option<RawLayer>) -> Response<Full<Bytes>> {
    let deleting = layer.is_none();
    let result = match &admin.plane {
        Some(plane) => plane.set_layer(&id, layer).await,
        None => {
            let (control, lid) = (admin.control.clone(), id.clone());
            tokio::task::spawn_blocking(move || control.set_layer(&lid, layer))
                .await
                .unwrap_or_else(|e| Err(ChangeError::Failed(caused("control task", e))))
        }
    };
    let version = admin.shared.policy.load().version().to_string();
    match result {
        Ok(created) => {
            let status = match (created, deleting) {
                (true, _) => StatusCode::CREATED,
                _ => StatusCode::OK,
            };
            json_resp(
                status,
                json!({ "id": id, "created": created, "deleted": deleting, "policy_version": version }),
            )
        }
        Err(ChangeError::NotFound) => {
            error(StatusCode::NOT_FOUND, format!("no runtime layer `{id}`"))
        }
        Err(e) => change_error(e),
    }
}
