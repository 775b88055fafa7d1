// egress-proxy console: the only script, served from /ui/assets/ (the page's
// Content-Security-Policy allows no other). Every page reads without it; with it, Live shows
// decisions as they are made, an opened refusal shows what `check` says of it, and Inbox and
// Grants follow answers made elsewhere. Text from records is set with textContent, never as
// HTML. Every URL is relative to the page's <base>, the session's place (/ui/s/{place}/).
"use strict";

// Text a sandbox wrote, as the server shows it (control::shown): each character that changes
// how text looks (bidirectional controls, zero-width, line separators, controls) as \u{xxxx}.
const DECEPTIVE = /[\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\u0000-\u001f\u007f-\u009f]/g;
function shown(text) {
  return String(text).replace(DECEPTIVE,
    (c) => "\\u{" + c.codePointAt(0).toString(16).padStart(4, "0") + "}");
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  td.textContent = shown(text);
  tr.appendChild(td);
  return td;
}

function destination(r) {
  if (r.target_host && r.target_port) return r.target_host + ":" + r.target_port;
  return r.target_host || r.original_dst || "-";
}

// A step of an access request: what happened and who took it, not a refusal.
function approvalRow(r, a) {
  const tr = document.createElement("tr");
  tr.className = "decision-approval";
  tr.dataset.sandbox = r.sandbox || "-";
  tr.dataset.reason = "approval";
  cell(tr, (r.ts || "").split("T")[1] || "");
  cell(tr, a.step || "-", "decision");
  cell(tr, r.sandbox || "-");
  cell(tr, "access request");
  const dest = cell(tr, "");
  const code = document.createElement("code");
  code.textContent = shown(destination(r));
  dest.appendChild(code);
  cell(tr, a.step === "requested" ? "asked: " + (a.text || "-") : "by " + (a.credential || a.by || "-"));
  cell(tr, a.request || "-");
  return tr;
}

// The same row the server renders for a record.
function row(r) {
  if (r.approval && typeof r.approval === "object") return approvalRow(r, r.approval);
  const tr = document.createElement("tr");
  const decision = r.decision || "-";
  tr.className = "decision-" + decision;
  tr.dataset.sandbox = r.sandbox || "-";
  tr.dataset.reason = r.reason || "-";
  const time = (r.ts || "").split("T")[1] || "";
  cell(tr, time);
  cell(tr, decision, "decision");
  cell(tr, r.sandbox || "-");
  cell(tr, (r.mode || "-") + (r.event === "open" ? " · open" : ""));
  const dest = cell(tr, "");
  const code = document.createElement("code");
  code.textContent = shown(destination(r));
  dest.appendChild(code);
  cell(tr, r.reason || "-");
  const last = cell(tr, decision === "allow" ? (r.rule || "-") : "");
  if (decision !== "allow") {
    const details = document.createElement("details");
    details.className = "why";
    const summary = document.createElement("summary");
    summary.textContent = "why";
    details.appendChild(summary);
    const dl = document.createElement("dl");
    for (const [k, v] of [["Rule", r.rule], ["Where", r.rule_source], ["Detail", r.detail]]) {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = shown(v || "-");
      dl.append(dt, dd);
    }
    details.appendChild(dl);
    const a = document.createElement("a");
    a.className = "explain";
    a.textContent = "What check says now";
    a.href = "explain?" + new URLSearchParams({ sandbox: r.sandbox || "", target: destination(r) });
    details.appendChild(a);
    last.appendChild(details);
  }
  return tr;
}

// An opened refusal fetches what `check` says and shows its explanation in place.
function explainOnOpen(root) {
  root.addEventListener("toggle", async (e) => {
    const d = e.target;
    if (!(d instanceof HTMLDetailsElement) || !d.open || d.dataset.explained) return;
    const a = d.querySelector("a.explain");
    if (!a) return;
    d.dataset.explained = "1";
    try {
      const page = await fetch(a.href, { credentials: "same-origin" }).then((r) => r.text());
      const doc = new DOMParser().parseFromString(page, "text/html");
      const text = doc.querySelector("#explained .explanation");
      const p = document.createElement("p");
      p.className = "explanation";
      p.textContent = text ? text.textContent : "no explanation";
      d.insertBefore(p, a);
    } catch (err) {
      delete d.dataset.explained;
    }
  }, true);
}

function live() {
  const table = document.getElementById("live");
  if (!table) return;
  explainOnOpen(table);
  const body = table.tBodies[0];
  const events = new EventSource(table.dataset.events);
  events.onmessage = (m) => {
    let r;
    try { r = JSON.parse(m.data); } catch (err) { return; }
    if (r.event === "observe_dropped") return;
    body.insertBefore(row(r), body.firstChild);
    while (body.rows.length > 500) body.deleteRow(body.rows.length - 1);
  };
}

// Inbox and Grants: when an approval step is recorded, take the page's new content, keeping
// a form someone is typing in.
function follow(page) {
  const events = new EventSource("live/events");
  let busy = false;
  events.onmessage = async (m) => {
    if (busy || !m.data.includes('"approval"')) return;
    busy = true;
    try {
      const text = await fetch(page, { credentials: "same-origin" }).then((r) => r.text());
      const fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main");
      const main = document.querySelector("main");
      const typing = document.activeElement && main.contains(document.activeElement)
        && document.activeElement.tagName !== "BUTTON";
      if (fresh && !typing) main.replaceWith(document.adoptNode(fresh));
    } finally {
      busy = false;
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "live") live();
  if (page === "inbox" || page === "grants") follow(page);
});
