//! `GET /v1/sandboxes/{id}/flows` — a sandbox's flow labels (`network.flows`): which are
//! armed, by which request and when, and the waivers in force — and `POST …/flows/waive`,
//! a person's answer to a `flow_refused`: `{"label": "private", "once": true}` (one request
//! goes through), `{"label": …, "for_s": 600}` (the label is out of force for that long) or
//! `{"label": …, "reset": true}` (disarmed). Each waiver is kept before the answer and
//! recorded in the audit trail as an approval step naming who gave it.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use super::admin::{error, json_resp, read_body, Admin};
use crate::audit::record::{ApprovalFacts, Record};
use crate::audit::{AuditGuard, Mode};
use crate::pipeline::flow::WaiveError;
use crate::policy::flows::state::Waive;
use crate::policy::flows::Flows;
use crate::policy::sandbox_id::SandboxId;

/// A waiver as asked.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Asked {
    label: String,
    #[serde(default)]
    once: bool,
    #[serde(default)]
    for_s: Option<u64>,
    #[serde(default)]
    reset: bool,
    #[serde(default)]
    note: Option<String>,
}

/// The longest a waiver may last (a day: a longer one is a policy change).
const LONGEST: u64 = 86_400;

/// `GET …/flows` or `POST …/flows/waive` for sandbox `id`.
pub(super) async fn route(
    admin: &Admin,
    id: &str,
    waive: bool,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let set = admin.shared.policy.load();
    let found = SandboxId::new(id).ok().and_then(|s| {
        set.get(s.as_str())
            .map(|sb| (s, sb.binding.network.flows.clone()))
    });
    let Some((sandbox, rules)) = found else {
        return error(StatusCode::NOT_FOUND, format!("no sandbox `{id}`"));
    };
    if !waive {
        return show(admin, id, rules.as_deref());
    }
    let who = admin.who(&req);
    let body = match read_body(req, admin.max_body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let asked: Asked = match serde_json::from_str(&body) {
        Ok(a) => a,
        Err(e) => {
            let shape = r#"{"label": NAME, and one of "once": true | "for_s": SECONDS | "reset": true, "note"?}"#;
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {shape}: {e}"),
            );
        }
    };
    let (how, step) = match how(&asked) {
        Ok(h) => h,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    if rules.is_none_or(|f| f.label(&asked.label).is_none()) {
        let why = format!("sandbox {id} has no flow label `{}`", asked.label);
        return error(StatusCode::NOT_FOUND, why);
    }
    let given = (asked.label.as_str(), how, step);
    match give(admin, sandbox, &who, given, asked.note.clone()).await {
        Ok(labels) => json_resp(
            StatusCode::OK,
            json!({"sandbox": id, "armed": labels.armed, "waivers": labels.waivers}),
        ),
        Err(e @ WaiveError::NotArmed { .. }) => error(StatusCode::CONFLICT, e.to_string()),
        Err(WaiveError::Keep(io)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot keep the flow state: {io}"),
        ),
    }
}

/// Give a waiver (`label`, how, the record's step) of `sandbox`'s label as `who`, kept, and
/// record it in the audit trail as an approval step naming who gave it — for the admin API
/// and the console alike.
pub(super) async fn give(
    admin: &Admin,
    sandbox: SandboxId,
    who: &crate::approvals::Who,
    (label, how, step): (&str, Waive, &'static str),
    note: Option<String>,
) -> Result<crate::policy::flows::state::Labels, WaiveError> {
    let ledger = &admin.shared.settings.flows;
    let labels = ledger
        .waive(sandbox.as_str(), label, how, &who.approver())
        .await?;
    let client = who
        .client
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    let version = admin.shared.policy.load().version_arc();
    let mut rec = Record::new(0, client, Mode::Approval, version);
    rec.sandbox = Some(sandbox);
    rec.approval = Some(Box::new(ApprovalFacts {
        request: format!("flow:{label}").into(),
        step,
        by: who.by,
        credential: who.credential.clone(),
        grant: None,
        expires: None,
        text: note.map(Into::into),
        checks: Vec::new(),
    }));
    drop(AuditGuard::event(admin.shared.sink.clone(), rec));
    Ok(labels)
}

/// `GET …/flows`: the rules in words, the armed labels and the waivers.
fn show(admin: &Admin, id: &str, rules: Option<&Flows>) -> Response<Full<Bytes>> {
    let labels = admin.shared.settings.flows.labels(id).unwrap_or_default();
    let rules = rules.map(|f| {
        f.rules
            .iter()
            .map(|r| json!({"name": &*r.name, "says": f.explain(r)}))
            .collect::<Vec<_>>()
    });
    json_resp(
        StatusCode::OK,
        json!({"sandbox": id, "rules": rules, "armed": labels.armed, "waivers": labels.waivers}),
    )
}

/// The waiver asked for, and its record's step; `Err`: why the body is not one waiver.
fn how(asked: &Asked) -> Result<(Waive, &'static str), &'static str> {
    match (asked.once, asked.for_s, asked.reset) {
        (true, None, false) => Ok((Waive::Once, "flow_waived_once")),
        (false, Some(s), false) if (1..=LONGEST).contains(&s) => {
            let until = SystemTime::now() + Duration::from_secs(s);
            let secs = until
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            Ok((Waive::Until(secs), "flow_waived"))
        }
        (false, Some(_), false) => Err("for_s is 1 to 86400 seconds (a day)"),
        (false, None, true) => Ok((Waive::Reset, "flow_reset")),
        _ => Err("say one of once, for_s or reset"),
    }
}
