//! What the console's pages read and what its forms do: sign-in and sign-out, answering an
//! access request and revoking a grant (an approver's, with the session's CSRF token, through
//! the admin API's own desk steps), the live event stream, and the data each page shows.

use std::time::{Duration, UNIX_EPOCH};

use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use maud::Markup;

use super::allowed;
use super::pages::{self, Frame};
use super::session::{self, Principal, Session};
use super::views::{self, Usage};
use super::{html, plain, see_other, tls, Console};
use crate::approvals::{request, Answer, Desk, State, Who};
use crate::config::console::Role;
use crate::control::admin::{read_body, Admin, AdminBody, Caller};
use crate::control::admin_requests::on_desk;
use crate::control::error::{invalid, ControlError};
use crate::control::observe::Filter;
use crate::policy::cause::of;
use crate::policy::flows::state::Waive;
use crate::policy::granted::GrantKind;
use crate::runtime::Shared;

/// Days the usage charts show.
const DAYS: u32 = 7;

/// The verified client certificate's subject, when the listener has one.
fn certificate(req: &Request<Incoming>) -> Option<&str> {
    req.extensions().get::<Caller>()?.certificate.as_deref()
}

/// `GET /ui/login`.
pub fn login_page(console: &Console, req: &Request<Incoming>) -> Response<AdminBody> {
    let by_cert = session::sign_in(&console.cfg, None, None, certificate(req));
    html(
        StatusCode::OK,
        pages::sign_in(None, by_cert.as_ref().map(|p| p.name.as_str())),
    )
}

/// A form body's fields.
async fn form(
    admin: &Admin,
    req: Request<Incoming>,
) -> Result<Vec<(String, String)>, Response<AdminBody>> {
    let body = read_body(req, admin.max_body)
        .await
        .map_err(|r| r.map(BodyExt::boxed))?;
    Ok(form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect())
}

fn get<'a>(fields: &'a [(String, String)], k: &str) -> Option<&'a str> {
    fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str())
}

/// Whether a state-changing request comes from a page of this console: a browser names the
/// page's origin in `Origin` (or says `Sec-Fetch-Site: same-origin`); one that names another
/// is refused. (The CSRF token is the check; this refuses a cross-site sign-in too.)
fn same_origin(req: &Request<Incoming>) -> bool {
    let h = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = h("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return false;
        }
    }
    match (h("origin"), h("host")) {
        (Some("null"), _) => false,
        (Some(o), Some(host)) => o.split_once("://").is_some_and(|(_, rest)| rest == host),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// `POST /ui/login`: a token or the client certificate; then a session and its cookie.
pub async fn login(
    admin: &Admin,
    console: &Console,
    req: Request<Incoming>,
) -> Response<AdminBody> {
    if !same_origin(&req) {
        return plain(StatusCode::FORBIDDEN, "cross-site sign-in refused\n");
    }
    let tls = tls(&req);
    let from = req.extensions().get::<Caller>().map(|c| c.addr.ip());
    if let Some(wait) = from.and_then(|ip| console.limits.may_try(ip).err()) {
        tracing::warn!(client = ?from, "console sign-in refused: too many wrong tokens");
        return too_many(wait, "too many wrong tokens from this address");
    }
    let cert = certificate(&req).map(str::to_string);
    let fields = match form(admin, req).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let cert = cert.filter(|_| get(&fields, "with") == Some("certificate"));
    let token = get(&fields, "token");
    let who = session::sign_in(
        &console.cfg,
        admin.token_sha256.as_ref(),
        token,
        cert.as_deref(),
    );
    let Some(principal) = who else {
        if let Some(ip) = from {
            console.limits.failed(ip);
        }
        tracing::info!("console sign-in refused");
        let page = pages::sign_in(
            Some("Sign-in refused: that token or certificate is not a console user's."),
            None,
        );
        return html(StatusCode::UNAUTHORIZED, page);
    };
    if let Err(wait) = console.limits.sign_in(&principal.name) {
        tracing::warn!(user = %principal.name, "console sign-in refused: signing in too often");
        return too_many(wait, "this user signs in too often");
    }
    tracing::info!(user = %principal.name, role = principal.role.as_str(), "console sign-in");
    let (id, opened) = match console.sessions.open(principal) {
        Ok(o) => o,
        Err(why) => {
            let text = match why {
                session::NotOpened::NoRandom => "no random bytes for a session\n",
                session::NotOpened::Full => "too many sessions are open: try again later\n",
            };
            return plain(StatusCode::SERVICE_UNAVAILABLE, text);
        }
    };
    let mut r = see_other(&format!("{}inbox", opened.base()));
    if let Ok(v) = HeaderValue::from_str(&console.sessions.set_cookie(&id, &opened, tls)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `429 Too Many Requests` with `Retry-After`.
fn too_many(wait: Duration, why: &str) -> Response<AdminBody> {
    let secs = super::throttle::retry_after(wait);
    let mut r = plain(
        StatusCode::TOO_MANY_REQUESTS,
        format!("sign-in refused: {why}; try again in {secs} s\n"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// A state-changing form of a signed-in session: the CSRF token first, then the role.
pub async fn post(
    admin: &Admin,
    console: &Console,
    req: Request<Incoming>,
    path: &str,
    (sid, session): (String, Session),
) -> Response<AdminBody> {
    let tls = tls(&req);
    let client = req.extensions().get::<Caller>().map(|c| c.addr);
    let refuse = |why: &str| plain(StatusCode::FORBIDDEN, format!("{why}\n"));
    if !same_origin(&req) {
        return refuse("cross-site form refused");
    }
    let fields = match form(admin, req).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if !session.csrf_ok(get(&fields, "csrf")) {
        return refuse("the form's CSRF token is missing or wrong: reload the page");
    }
    if path == "/ui/logout" {
        console.sessions.close(&sid);
        let mut r = see_other("/ui/login");
        if let Ok(v) = HeaderValue::from_str(&session::clear_cookie(&session, tls)) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    if session.principal.role != Role::Approver {
        tracing::warn!(user = %session.principal.name, path = %path, "console: a viewer's change refused");
        return refuse("a viewer cannot answer requests or revoke grants");
    }
    if let Some(rest) = path.strip_prefix("/ui/sandboxes/") {
        return flow_step(admin, &session, rest, &fields, client).await;
    }
    desk_step(admin, &session, path, &fields, client).await
}

/// Who answers through the console: the signed-in person, named on grants and records.
fn console_who(session: &Session, client: Option<std::net::SocketAddr>) -> Who {
    Who {
        by: "console",
        client,
        credential: Some(session.principal.credential().into()),
        identity: None,
        principal: Some(session.principal.name.as_str().into()),
    }
}

/// An approver's waiver of a sandbox's flow label (`{id}/flows/waive`, `how`: `once` or
/// `reset`), through the admin API's own step (kept, recorded with who); then back to the
/// sandbox's page, or a page that says why it was refused.
async fn flow_step(
    admin: &Admin,
    session: &Session,
    rest: &str,
    fields: &[(String, String)],
    client: Option<std::net::SocketAddr>,
) -> Response<AdminBody> {
    let Some(id) = rest.strip_suffix("/flows/waive") else {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    };
    let set = admin.shared.policy.load();
    let Some((sandbox, sb)) = crate::policy::sandbox_id::SandboxId::new(id)
        .ok()
        .and_then(|s| set.get(s.as_str()).cloned().map(|sb| (s, sb)))
    else {
        return plain(StatusCode::NOT_FOUND, "no such sandbox\n");
    };
    let base = session.base();
    let frame = Frame {
        who: &session.principal,
        csrf: &session.csrf,
        base: &base,
        at: "sandboxes",
    };
    let problem =
        |status: StatusCode, why: &str| html(status, pages::problem(&frame, why, "sandboxes"));
    if let Err(why) = allowed::may_answer(&session.principal, &sb.binding.network.layers) {
        return problem(StatusCode::FORBIDDEN, &why.to_string());
    }
    let (how, step) = match get(fields, "how") {
        Some("once") => (Waive::Once, "flow_waived_once"),
        Some("reset") => (Waive::Reset, "flow_reset"),
        _ => return problem(StatusCode::BAD_REQUEST, "say once or reset"),
    };
    let label = get(fields, "label").unwrap_or_default();
    let who = console_who(session, client);
    let given = (label, how, step);
    match crate::control::admin_flows::give(admin, sandbox, &who, given, note(fields)).await {
        Ok(_) => see_other(&format!("{base}sandboxes/{id}")),
        Err(e) => problem(StatusCode::CONFLICT, &e.to_string()),
    }
}

/// An approver's answer or revocation, through the admin API's desk steps; then back to the
/// page, or a page that says why it was refused.
async fn desk_step(
    admin: &Admin,
    session: &Session,
    path: &str,
    fields: &[(String, String)],
    client: Option<std::net::SocketAddr>,
) -> Response<AdminBody> {
    let Some(desk) = admin.shared.desk.get().cloned() else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "the proxy is starting\n");
    };
    let who = console_who(session, client);
    let rest = path.strip_prefix("/ui/").unwrap_or_default();
    let parts: Vec<&str> = rest.split('/').collect();
    if let Some(id) = parts.get(1) {
        if let Err(why) = layers_allow(admin, &desk, &session.principal, id) {
            tracing::warn!(user = %session.principal.name, path = %path, "console: not this approver's to answer");
            return plain(StatusCode::FORBIDDEN, format!("{why}\n"));
        }
    }
    let (back, done) = match parts.as_slice() {
        ["requests", id, step @ ("approve" | "deny")] if request::valid_id(id) => {
            let answer = match *step {
                "approve" => approval(fields),
                _ => Answer::deny(note(fields)),
            };
            let id = id.to_string();
            let done = match answer {
                Ok(a) => crate::approvals::shared::answer(desk, id, a, who, Vec::new()).await,
                Err(e) => Err(e),
            };
            ("inbox", done)
        }
        ["grants", id, "revoke"] if request::valid_id(id) => {
            let id = id.to_string();
            ("grants", on_desk(desk, move |d| d.revoke(&id, who)).await)
        }
        _ => return plain(StatusCode::NOT_FOUND, "not found\n"),
    };
    let base = session.base();
    match done {
        Ok(_) => see_other(&format!("{base}{back}")),
        Err(e) => {
            let frame = Frame {
                who: &session.principal,
                csrf: &session.csrf,
                base: &base,
                at: back,
            };
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            html(status, pages::problem(&frame, &e.message, back))
        }
    }
}

/// Whether `who` may take a step on request `id` (its sandbox's layers may name their
/// approvers): a request the desk does not know is the desk's to refuse.
fn layers_allow(admin: &Admin, desk: &Desk, who: &Principal, id: &str) -> Result<(), ControlError> {
    let Some(r) = desk.find(id) else {
        return Ok(());
    };
    let set = admin.shared.policy.load();
    match set.get(r.sandbox.as_str()) {
        Some(sb) => allowed::may_answer(who, &sb.binding.network.layers),
        None => allowed::may_answer(who, &[]),
    }
}

fn note(fields: &[(String, String)]) -> Option<String> {
    get(fields, "note")
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
}

/// An approval from the form: `grant` (`ttl`, `once`, `permanent`), `ttl_s` for a TTL.
fn approval(fields: &[(String, String)]) -> Result<Answer, crate::approvals::DeskError> {
    let bad = |m: String| crate::approvals::DeskError {
        status: 400,
        message: m,
    };
    let kind = match get(fields, "grant").unwrap_or("ttl") {
        "ttl" => GrantKind::Ttl,
        "once" => GrantKind::Once,
        "permanent" => GrantKind::Permanent,
        other => return Err(bad(format!("grant `{other}`: once, ttl or permanent"))),
    };
    let ttl_s = match (
        kind,
        get(fields, "ttl_s")
            .map(str::trim)
            .filter(|t| !t.is_empty()),
    ) {
        (GrantKind::Ttl, Some(t)) => Some(
            t.parse()
                .map_err(|_| bad(format!("seconds `{t}`: a whole number")))?,
        ),
        _ => None,
    };
    Answer::approve(kind, ttl_s, note(fields))
}

/// *Inbox*'s data: the pending requests, and the last 20 answered.
pub fn inbox(admin: &Admin, frame: &Frame<'_>) -> Markup {
    let Some(desk) = admin.shared.desk.get() else {
        return pages::inbox(frame, &[], &[]);
    };
    let list = |s: Option<State>| {
        desk.list(s)["requests"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let mut pending = list(Some(State::Pending));
    for r in &mut pending {
        let id = r["id"].as_str().unwrap_or_default();
        let answerable = layers_allow(admin, desk, frame.who, id);
        r["console_answerable"] = serde_json::json!(answerable.is_ok());
        r["console_why_not"] = serde_json::json!(answerable.err().map(|e| e.to_string()));
    }
    let mut answered = list(None);
    answered.retain(|r| r["state"] != "pending");
    answered.truncate(20);
    pages::inbox(frame, &pending, &answered)
}

/// *Grants*' data.
pub fn grants(shared: &Shared, frame: &Frame<'_>) -> Markup {
    let all = shared
        .desk
        .get()
        .map(|d| d.grant_list(None))
        .unwrap_or_default();
    pages::grants(frame, all["grants"].as_array().map_or(&[][..], |v| v))
}

/// The *Live* filters of a query: the non-empty ones, checked as `/v1/observe` checks them.
fn filters(query: Option<&str>) -> (views::Filters, Result<Filter, ControlError>) {
    let kept: views::Filters = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let q: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(kept.iter())
        .finish();
    let f = Filter::parse(Some(&q)).map_err(|e| invalid(of(e)));
    (kept, f)
}

/// *Live*.
pub fn live(console: &Console, query: Option<&str>) -> Markup {
    let (kept, filter) = filters(query);
    match filter {
        Ok(f) => views::live(&kept, &console.live.recent(&f), None),
        Err(why) => views::live(&kept, &[], Some(&why.to_string())),
    }
}

/// `GET /ui/live/events`: Server-Sent Events of the records that pass the filters, until the
/// session ends.
pub fn events(admin: &Admin, query: Option<&str>, session: &Session) -> Response<AdminBody> {
    let filter = match filters(query).1 {
        Ok(f) => f,
        Err(why) => return plain(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    let lines = crate::control::observe::stream(admin.shared.sink.log.observe(), filter);
    let events = lines.map_frame(|f| f.map_data(|line| super::live::event(&line)));
    let until = super::live::Until::new(events, session.expires, session.ended());
    super::secured(StatusCode::OK, "text/event-stream", until.boxed())
}

/// `GET /ui/explain?sandbox=&target=`: what `check` says now, resolving as the proxy would.
pub async fn explain(shared: &Shared, query: Option<&str>) -> Result<Markup, ControlError> {
    let q: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let (Some(sandbox), Some(target)) = (get(&q, "sandbox"), get(&q, "target")) else {
        return Err(invalid("explain takes sandbox and target"));
    };
    let set = shared.policy.load();
    let sb = set
        .get(sandbox)
        .ok_or_else(|| invalid(format!("no sandbox `{sandbox}`")))?;
    let checked =
        crate::control::check::check(&set, sb, target, Some(&shared.resolver()), None).await;
    Ok(views::explain(sandbox, target, &checked))
}

/// One sandbox's page (with the approver's waiver forms when `frame` is an approver's),
/// `None` when there is no such sandbox.
pub fn sandbox(admin: &Admin, id: &str, frame: &Frame<'_>) -> Option<Markup> {
    let view = admin.control.get(id)?;
    let set = admin.shared.policy.load();
    let layers = set.get(id).map_or_else(Vec::new, |sb| {
        sb.binding
            .network
            .layers
            .iter()
            .map(|l| {
                let texts =
                    |v: &[(String, _)]| v.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
                super::views::LayerView {
                    id: l.id.to_string(),
                    ceiling: l.ceiling.as_deref().map(texts),
                    deny: texts(&l.deny),
                    http: l.http.iter().map(|r| r.text.clone()).collect(),
                    limits: serde_json::to_value(&l.limits).unwrap_or_default(),
                }
            })
            .collect()
    });
    let quota = crate::control::admin_usage::quotas(&admin.shared, Some(id))
        .into_iter()
        .find(|q| q["destination"].is_null());
    let labels = admin.shared.settings.flows.labels(id).unwrap_or_default();
    let flows = serde_json::json!({ "armed": labels.armed, "waivers": labels.waivers });
    let grants = admin
        .shared
        .desk
        .get()
        .map(|d| d.grant_list(Some(id)))
        .unwrap_or_default();
    Some(views::sandbox(
        &view,
        &layers,
        grants["grants"].as_array().map_or(&[][..], |v| v),
        &days(&admin.shared, id),
        (quota.as_ref(), &flows),
        frame.approver().then_some((id, frame)),
    ))
}

/// The last [`DAYS`] UTC days of `id`'s usage, oldest first; each day is the ledger's sums
/// from its first hour less those from the next day's (today: exactly `GET /v1/usage`'s).
fn days(shared: &Shared, id: &str) -> Vec<(String, Usage)> {
    let ledger = &shared.sink.usage;
    let today = crate::egress::quota::today();
    let from = |day: u32| -> Usage {
        let mut u = Usage::default();
        for c in ledger.sums(Some(id), day * 24) {
            u.requests = u.requests.saturating_add(c.tally.requests);
            u.bytes = (u.bytes.saturating_add(c.tally.bytes_up)).saturating_add(c.tally.bytes_down);
            u.tokens = u.tokens.saturating_add(c.tally.tokens.total());
        }
        u
    };
    let mut after = Usage::default();
    let mut out = Vec::new();
    for day in (today.saturating_sub(DAYS - 1)..=today).rev() {
        let since = from(day);
        let u = Usage {
            requests: since.requests.saturating_sub(after.requests),
            bytes: since.bytes.saturating_sub(after.bytes),
            tokens: since.tokens.saturating_sub(after.tokens),
        };
        after = since;
        let t = UNIX_EPOCH + Duration::from_secs(u64::from(day) * 86_400);
        let date = crate::audit::record::rfc3339(t);
        out.push((date.get(5..10).unwrap_or(&date).to_string(), u));
    }
    out.reverse();
    out
}

/// *Audit*: the trail verified on a blocking thread (it reads every file), or the last
/// verification when it is recent.
pub async fn audit(admin: &Admin, console: &Console) -> Markup {
    let recent = |c: &Console| {
        let v = c.verified.lock().unwrap_or_else(|e| e.into_inner());
        v.as_ref()
            .filter(|(at, _)| at.elapsed() < super::VERIFIED_FOR)
            .map(|(_, t)| t.clone())
    };
    let trail = match recent(console) {
        Some(t) => t,
        None => {
            let config = admin.control.config();
            let t = tokio::task::spawn_blocking(move || super::trail::verify_trail(&config))
                .await
                .unwrap_or_else(
                    |_| serde_json::json!({ "verified": false, "error": "the check failed" }),
                );
            let mut v = console.verified.lock().unwrap_or_else(|e| e.into_inner());
            *v = Some((std::time::Instant::now(), t.clone()));
            t
        }
    };
    let health = admin.shared.sink.log.health().status();
    let sink = match health.failing_for {
        Some(d) => format!("failing for {:.0} s: {}", d.as_secs_f64(), health.error),
        None => "writing".into(),
    };
    views::audit(
        &trail,
        &console.live.per_minute(super::live::now_minute()),
        &sink,
    )
}
