//! The console (`docs/console.md`): web pages for the people who approve and audit, served
//! by the admin listener under `/ui/` when `admin.console: true` — same listener, TLS and
//! client certificates, admission caps and body limit as the admin API. Server-rendered HTML
//! (maud); one small script and one style sheet compiled into the binary, served from
//! `/ui/assets/`; every page reads without JavaScript. Sign-in opens a session
//! ([`session`]); roles `viewer` and `approver`; a CSRF token on every form that changes
//! something; a strict Content-Security-Policy (no inline script or style), `X-Frame-Options:
//! DENY`, `no-store`. Answers and revocations take the admin API's own steps
//! ([`super::admin_requests`]) and record the signed-in principal, never a token.

mod actions;
mod allowed;
pub mod chart;
pub mod live;
mod pages;
pub mod session;
mod throttle;
mod trail;
mod views;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use maud::Markup;

use super::admin::{Admin, AdminBody, Caller};
use crate::config::console::ConsoleConfig;
use session::{Session, Sessions};

/// The console's state: its settings, the sessions, what it keeps of the decision stream.
pub struct Console {
    cfg: ConsoleConfig,
    sessions: Sessions,
    limits: throttle::SignInLimits,
    live: Arc<live::Live>,
    /// The last verification of the trail and when it ran: the *Audit* page reads the whole
    /// trail, so at most once per [`VERIFIED_FOR`] however often it is loaded.
    verified: std::sync::Mutex<Option<(std::time::Instant, serde_json::Value)>>,
}

/// How long a verification of the trail is shown before the next page load runs another.
const VERIFIED_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl Console {
    /// The console of `cfg`, following the audit stream of `shared`; `None` when it is off.
    pub fn start(cfg: &ConsoleConfig, shared: &crate::runtime::Shared) -> Option<Arc<Console>> {
        if !cfg.enabled {
            return None;
        }
        let live = Arc::new(live::Live::default());
        live.follow(shared.sink.log.observe());
        Some(Arc::new(Console {
            cfg: cfg.clone(),
            sessions: Sessions::new(cfg.session_ttl),
            limits: Default::default(),
            live,
            verified: Default::default(),
        }))
    }
}

/// Content-Security-Policy of every console response: only the console's own script, style
/// and connections; no frames, no inline code, forms post only here.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'self'";

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// A console response with the security headers every one carries.
fn secured(status: StatusCode, content_type: &'static str, body: AdminBody) -> Response<AdminBody> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn whole(status: StatusCode, content_type: &'static str, body: String) -> Response<AdminBody> {
    secured(status, content_type, Full::new(Bytes::from(body)).boxed())
}

/// A short text answer.
fn plain(status: StatusCode, text: impl Into<String>) -> Response<AdminBody> {
    whole(status, "text/plain; charset=utf-8", text.into())
}

/// An HTML page.
fn html(status: StatusCode, page: Markup) -> Response<AdminBody> {
    whole(status, "text/html; charset=utf-8", page.into_string())
}

/// `303 See Other` to `to` (after a form: the browser then GETs the page).
fn see_other(to: &str) -> Response<AdminBody> {
    let mut r = plain(StatusCode::SEE_OTHER, String::new());
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Whether the admin listener this request came through is TLS (then cookies are `Secure`).
fn tls(req: &Request<Incoming>) -> bool {
    req.extensions().get::<Caller>().is_some_and(|c| c.tls)
}

/// Whether `path` is the console's (`/ui`, `/ui/…`).
pub fn owns(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// Serve `/ui…` (the caller checked [`owns`]): 404 when the console is off.
pub async fn respond(admin: &Admin, req: Request<Incoming>) -> Response<AdminBody> {
    let Some(console) = &admin.console else {
        let off = "not found (the console is off: admin.console)\n";
        return plain(StatusCode::NOT_FOUND, off);
    };
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/ui" | "/ui/") => return see_other("/ui/login"),
        (&Method::GET, "/ui/assets/console.css") => {
            return whole(StatusCode::OK, "text/css; charset=utf-8", CSS.into())
        }
        (&Method::GET, "/ui/assets/console.js") => {
            return whole(StatusCode::OK, "text/javascript; charset=utf-8", JS.into())
        }
        (&Method::GET, "/ui/login") => return actions::login_page(console, &req),
        (&Method::POST, "/ui/login") => return actions::login(admin, console, req).await,
        _ => {}
    }
    // A session's pages are under its place: `/ui/s/{place}/{page}`. Anything else (a page
    // of an older session, a guess) goes to sign-in.
    let placed = path
        .strip_prefix("/ui/s/")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(place, _)| session::valid_place(place));
    let cookie = req
        .headers()
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok());
    let found = placed.and_then(|(place, page)| {
        let (sid, s) = console.sessions.find(cookie, place)?;
        Some((sid, s, format!("/ui/{page}")))
    });
    let Some((sid, session, page)) = found else {
        return match method {
            Method::GET => see_other("/ui/login"),
            _ => plain(StatusCode::UNAUTHORIZED, "sign in first\n"),
        };
    };
    if method == Method::POST {
        return actions::post(admin, console, req, &page, (sid, session)).await;
    }
    if method != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET or POST\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
        return r;
    }
    read(admin, console, &req, &page, &session).await
}

/// The pages that only read.
async fn read(
    admin: &Admin,
    console: &Console,
    req: &Request<Incoming>,
    path: &str,
    session: &Session,
) -> Response<AdminBody> {
    let query = req.uri().query();
    let at = match path {
        "/ui/inbox" => "inbox",
        "/ui/grants" => "grants",
        "/ui/live" | "/ui/explain" => "live",
        "/ui/audit" => "audit",
        "/ui/live/events" => return actions::events(admin, query, session),
        p if p == "/ui/sandboxes" || p.starts_with("/ui/sandboxes/") => "sandboxes",
        _ => return plain(StatusCode::NOT_FOUND, "not found\n"),
    };
    let base = session.base();
    let frame = pages::Frame {
        who: &session.principal,
        csrf: &session.csrf,
        base: &base,
        at,
    };
    let shared = &admin.shared;
    let (title, body) = match path {
        "/ui/inbox" => ("Inbox".to_string(), actions::inbox(admin, &frame)),
        "/ui/grants" => ("Grants".to_string(), actions::grants(shared, &frame)),
        "/ui/live" => ("Live".to_string(), actions::live(console, query)),
        "/ui/explain" => match actions::explain(shared, query).await {
            Ok(body) => ("Explanation".to_string(), body),
            Err(why) => {
                return html(
                    StatusCode::BAD_REQUEST,
                    pages::problem(&frame, &why.to_string(), "live"),
                )
            }
        },
        "/ui/audit" => ("Audit".to_string(), actions::audit(admin, console).await),
        "/ui/sandboxes" => (
            "Sandboxes".to_string(),
            views::sandboxes(&admin.control.list()),
        ),
        p => {
            let id = percent(p.trim_start_matches("/ui/sandboxes/"));
            match actions::sandbox(admin, &id, &frame) {
                Some(body) => (format!("Sandbox {id}"), body),
                None => {
                    let why = format!("no sandbox `{id}`");
                    return html(
                        StatusCode::NOT_FOUND,
                        pages::problem(&frame, &why, "sandboxes"),
                    );
                }
            }
        }
    };
    html(StatusCode::OK, pages::page(&frame, &title, body))
}

/// A path segment `%`-decoded.
fn percent(s: &str) -> String {
    String::from_utf8_lossy(&crate::policy::http_rules::percent_decode(s)).into_owned()
}
