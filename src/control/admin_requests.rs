//! The approvers' side of access requests on the admin API (`docs/openapi.yaml`):
//! `GET /v1/requests[?state=]`, `GET /v1/requests/{id}`, `POST /v1/requests/{id}/approve`
//! `{"grant": "once" | "ttl" | "permanent", "ttl_s"?, "note"?}` and
//! `POST /v1/requests/{id}/deny` `{"note"?}`; and the standing grants, `GET /v1/grants[?sandbox=]`
//! (revoked by id at `POST /v1/requests/{id}/revoke`). Answering needs the admin token, like every
//! call that changes something; the answer is applied by the approvals desk
//! ([`crate::approvals`]), on a blocking thread (it publishes through the controller's lock).

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use super::admin::{error, json_resp, read_body};
use crate::approvals::{request, Answer, Desk, DeskError, Request as Asked, State, Who};
use crate::policy::granted::GrantKind;
use crate::runtime::Shared;

/// Which requests path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum At {
    List,
    One(String),
    Approve(String),
    Deny(String),
    Revoke(String),
    /// `/v1/grants`.
    Grants,
}

impl At {
    pub fn of(path: &str) -> Option<At> {
        if path == "/v1/requests" {
            return Some(At::List);
        }
        let rest = path.strip_prefix("/v1/requests/")?;
        Some(match rest.split_once('/') {
            None => At::One(rest.to_string()),
            Some((id, "approve")) => At::Approve(id.to_string()),
            Some((id, "deny")) => At::Deny(id.to_string()),
            Some((id, "revoke")) => At::Revoke(id.to_string()),
            Some(_) => return None,
        })
    }

    pub fn allow(&self) -> &'static str {
        match self {
            At::List | At::One(_) | At::Grants => "GET",
            At::Approve(_) | At::Deny(_) | At::Revoke(_) => "POST",
        }
    }

    pub fn takes(&self, m: &Method) -> bool {
        m.as_str() == self.allow()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(default)]
    grant: Option<GrantKind>,
    #[serde(default)]
    ttl_s: Option<u64>,
    #[serde(default)]
    note: Option<String>,
}

pub async fn route(
    shared: &Arc<Shared>,
    at: At,
    req: Request<Incoming>,
    (max_body, who): (usize, Who),
) -> Response<Full<Bytes>> {
    let Some(desk) = shared.desk.get().cloned() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the proxy is starting");
    };
    match at {
        At::List => {
            let state = req
                .uri()
                .query()
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|kv| kv.strip_prefix("state="));
            let state = match state.map(|s| (s, State::parse(s))) {
                None => None,
                Some((_, Some(s))) => Some(s),
                Some((s, None)) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("state must be pending, approved, denied or expired, not `{s}`"),
                    )
                }
            };
            json_resp(StatusCode::OK, desk.list(state))
        }
        At::One(id) => match desk.find(&id).filter(|_| request::valid_id(&id)) {
            Some(r) => json_resp(StatusCode::OK, r.view()),
            None => error(StatusCode::NOT_FOUND, format!("no request `{id}`")),
        },
        At::Approve(id) | At::Deny(id) | At::Revoke(id) if !request::valid_id(&id) => {
            error(StatusCode::NOT_FOUND, format!("no request `{id}`"))
        }
        At::Approve(id) => {
            let body = match parse(req, max_body).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let kind = body.grant.unwrap_or(GrantKind::Ttl);
            let answer = match Answer::approve(kind, body.ttl_s, body.note) {
                Ok(a) => a,
                Err(e) => return refused(e),
            };
            apply(desk, id, answer, who).await
        }
        At::Deny(id) => {
            let body = match parse(req, max_body).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            if body.grant.is_some() || body.ttl_s.is_some() {
                return error(StatusCode::BAD_REQUEST, "a denial takes only a note");
            }
            match Answer::deny(body.note) {
                Ok(a) => apply(desk, id, a, who).await,
                Err(e) => refused(e),
            }
        }
        At::Revoke(id) => done_json(on_desk(desk, move |d| d.revoke(&id, who)).await),
        At::Grants => grants(&desk, req.uri().query()),
    }
}

/// `GET /v1/grants[?sandbox=ID]`: the standing grants ([`Desk::grant_list`]).
fn grants(desk: &Desk, query: Option<&str>) -> Response<Full<Bytes>> {
    let mut sandbox = None;
    for kv in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|kv| !kv.is_empty())
    {
        match kv.split_once('=') {
            Some(("sandbox", id)) => sandbox = Some(id),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter `{kv}`: /v1/grants takes sandbox=ID"),
                )
            }
        }
    }
    json_resp(StatusCode::OK, desk.grant_list(sandbox))
}

/// The answer's body (empty: `{}`).
async fn parse(req: Request<Incoming>, max: usize) -> Result<Body, Response<Full<Bytes>>> {
    let text = read_body(req, max).await?;
    if text.trim().is_empty() {
        return Ok(Body::default());
    }
    let body: Body = serde_json::from_str(&text).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body must be {{\"grant\": \"once\"|\"ttl\"|\"permanent\", \"ttl_s\"?, \"note\"?}}: {e}"),
        )
    })?;
    Ok(body)
}

/// Apply an answer, once for the fleet ([`crate::approvals::shared::answer`]).
async fn apply(desk: Arc<Desk>, id: String, answer: Answer, who: Who) -> Response<Full<Bytes>> {
    done_json(crate::approvals::shared::answer(desk, id, answer, who, Vec::new()).await)
}

/// A step on the desk (an answer, a revocation) on a blocking thread: it publishes through
/// the controller's lock. The admin API and the console take every step through here.
pub(super) async fn on_desk(
    desk: Arc<Desk>,
    step: impl FnOnce(&Desk) -> Result<Asked, DeskError> + Send + 'static,
) -> Result<Asked, DeskError> {
    match tokio::task::spawn_blocking(move || step(&desk)).await {
        Ok(done) => done,
        Err(_) => Err(DeskError {
            status: 500,
            message: "the answer could not be applied".into(),
        }),
    }
}

/// The request as it now stands, or the refusal.
fn done_json(done: Result<Asked, DeskError>) -> Response<Full<Bytes>> {
    match done {
        Ok(r) => json_resp(StatusCode::OK, r.view()),
        Err(e) => refused(e),
    }
}

/// An answer the desk refused, as the admin API says it.
fn refused(e: DeskError) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    json_resp(status, json!({ "error": e.message }))
}
