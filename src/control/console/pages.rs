//! The console's frame and its approvers' pages, as server-rendered HTML (maud escapes every
//! value): the sign-in page, *Inbox* (pending access requests, the auto-approval checks, and
//! for an approver the forms that answer them) and *Grants* (standing grants, and for an
//! approver the form that revokes one). Text a sandbox wrote is shown through
//! [`crate::control::shown::for_person`]: bidirectional and invisible characters as escapes.
//! Every form that changes something carries the session's CSRF token.

use maud::{html, Markup, DOCTYPE};
use serde_json::Value;

use super::session::Principal;
use crate::config::console::Role;
use crate::control::shown::for_person;

/// Who is looking, and where: what every page's frame needs.
pub struct Frame<'a> {
    /// The signed-in person.
    pub who: &'a Principal,
    /// The session's CSRF token.
    pub csrf: &'a str,
    /// The session's place, `/ui/s/{place}/`: the page's `<base>`, so every link and form
    /// of the console is written relative to it.
    pub base: &'a str,
    /// The page's name (`inbox`, `grants`, `live`, `sandboxes`, `audit`).
    pub at: &'static str,
}

impl Frame<'_> {
    /// Whether the person may answer requests and revoke grants.
    pub fn approver(&self) -> bool {
        self.who.role == Role::Approver
    }

    /// The hidden CSRF field of a form.
    pub fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name="csrf" value=(self.csrf); }
    }
}

const PAGES: [(&str, &str); 5] = [
    ("inbox", "Inbox"),
    ("grants", "Grants"),
    ("live", "Live"),
    ("sandboxes", "Sandboxes"),
    ("audit", "Audit"),
];

fn head(title: &str, base: Option<&str>) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            @if let Some(b) = base { base href=(b); }
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { "egress-proxy · " (title) }
            link rel="stylesheet" href="/ui/assets/console.css";
            script src="/ui/assets/console.js" defer {}
        }
    }
}

/// A whole page: the navigation, who is signed in, the sign-out form, then `body`.
pub fn page(f: &Frame<'_>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, Some(f.base)))
            body data-page=(f.at) {
                header {
                    span.brand { "egress-proxy" }
                    nav {
                        @for (at, name) in PAGES {
                            a href=(at) class=[(at == f.at).then_some("here")] { (name) }
                        }
                    }
                    span.who #who data-role=(f.who.role.as_str()) {
                        (f.who.name) " · " (f.who.role.as_str())
                    }
                    form.inline method="post" action="logout" {
                        (f.csrf_field())
                        button type="submit" { "Sign out" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// The sign-in page; `certificate` is the verified client certificate's user, when one is.
pub fn sign_in(problem: Option<&str>, certificate: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("sign in", None))
            body data-page="login" {
                main.narrow {
                    h1 { "egress-proxy console" }
                    @if let Some(p) = problem { p.problem #problem { (p) } }
                    @if let Some(name) = certificate {
                        form method="post" action="/ui/login" {
                            input type="hidden" name="with" value="certificate";
                            button #cert-sign-in type="submit" { "Sign in as " (name) " (client certificate)" }
                        }
                        p { "or with a token:" }
                    }
                    form method="post" action="/ui/login" {
                        label for="token" { "Token" }
                        input #token type="password" name="token" autocomplete="off" required;
                        button #sign-in type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

/// A value of a request or grant as text (`-` when absent; a list joined by commas).
fn field(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => for_person(s).into_owned(),
        Value::Array(a) if a.is_empty() => "any".into(),
        Value::Array(a) => a.iter().map(field).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// *Inbox*: `requests` is `GET /v1/requests?state=pending`'s list; `answered` the latest others.
pub fn inbox(f: &Frame<'_>, pending: &[Value], answered: &[Value]) -> Markup {
    html! {
        p.count #pending-count data-count=(pending.len()) {
            (pending.len()) " pending " (if pending.len() == 1 { "request" } else { "requests" })
        }
        @if pending.is_empty() { p.empty { "Nothing waits for an answer." } }
        @for r in pending {
            @let id = r["id"].as_str().unwrap_or_default();
            section.request id=(format!("req-{id}")) data-id=(id) {
                h2 { (field(&r["sandbox"])) " asks for " code { (field(&r["host"])) ":" (field(&r["port"])) } }
                dl {
                    dt { "Reason" } dd.reason { (field(&r["reason"])) }
                    dt { "Methods" } dd { (field(&r["methods"])) }
                    dt { "Paths" } dd { (field(&r["paths"])) }
                    dt { "Asked" } dd { (field(&r["created"])) }
                    dt { "Pending until" } dd { (field(&r["expires"])) }
                    dt { "Auto-approval" } dd.checks {
                        @if r["checks"].as_array().is_none_or(|c| c.is_empty()) { "no checks ran" }
                        @for c in r["checks"].as_array().into_iter().flatten() { span.check { (field(c)) } }
                    }
                    dt { "Request" } dd { code { (id) } }
                }
                @if let Some(why) = r["console_why_not"].as_str().filter(|_| f.approver()) {
                    p.not-yours { (why) }
                }
                @if f.approver() && r["console_answerable"] != false {
                    form.answer method="post" action=(format!("requests/{id}/approve")) {
                        (f.csrf_field())
                        label { "Grant " select name="grant" {
                            option value="ttl" selected { "for a time" }
                            option value="once" { "once" }
                            option value="permanent" { "permanent" }
                        } }
                        label { "seconds " input type="number" name="ttl_s" value="3600" min="1"; }
                        label { "note " input type="text" name="note" maxlength="500"; }
                        button.approve type="submit" { "Approve" }
                    }
                    form.answer method="post" action=(format!("requests/{id}/deny")) {
                        (f.csrf_field())
                        label { "note " input type="text" name="note" maxlength="500"; }
                        button.deny type="submit" { "Deny" }
                    }
                }
            }
        }
        @if !answered.is_empty() {
            h2 { "Answered lately" }
            table.answered {
                thead { tr { th { "Request" } th { "Sandbox" } th { "Destination" } th { "State" } th { "By" } th { "Note" } } }
                tbody {
                    @for r in answered {
                        tr data-id=(field(&r["id"])) { td { code { (field(&r["id"])) } } td { (field(&r["sandbox"])) }
                             td { (field(&r["host"])) ":" (field(&r["port"])) } td { (field(&r["state"])) }
                             td.by { (field(if r["approver"].is_string() { &r["approver"] } else { &r["answered_by"] })) } td { (field(&r["note"])) } }
                    }
                }
            }
        }
    }
}

/// *Grants*: `GET /v1/grants`'s list.
pub fn grants(f: &Frame<'_>, grants: &[Value]) -> Markup {
    html! {
        p.count #grant-count data-count=(grants.len()) { (grants.len()) " standing" }
        table #grants {
            thead { tr { th { "Grant" } th { "Sandbox" } th { "Destination" } th { "Methods" } th { "Paths" }
                         th { "Kind" } th { "Ends" } th { "Approver" } th { "Spent" } @if f.approver() { th {} } } }
            tbody {
                @for g in grants {
                    @let id = g["id"].as_str().unwrap_or_default();
                    tr.grant data-id=(id) {
                        td { code { (id) } } td { (field(&g["sandbox"])) }
                        td { (field(&g["host"])) ":" (field(&g["port"])) }
                        td { (field(&g["methods"])) } td { (field(&g["paths"])) }
                        td { (field(&g["kind"])) } td { (field(&g["expires"])) }
                        td { (field(&g["approver"])) } td { (field(&g["used"])) }
                        @if f.approver() {
                            td { form.inline method="post" action=(format!("grants/{id}/revoke")) {
                                (f.csrf_field())
                                button.revoke type="submit" { "Revoke" }
                            } }
                        }
                    }
                }
            }
        }
    }
}

/// A page that says what went wrong (a refused answer, an unknown sandbox).
pub fn problem(f: &Frame<'_>, what: &str, back: &str) -> Markup {
    page(
        f,
        "Not done",
        html! { p.problem #problem { (for_person(what)) } p { a href=(back) { "Back" } } },
    )
}
