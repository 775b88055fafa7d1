"""Drive the console in headless Chromium (Debian's chromium and chromium-driver, Selenium
from PyPI), as tests/console.rs starts it: a proxy with the console on, an approver (alice)
and a viewer (vera) signing in with their own tokens, a sandbox `agent` that curl drives
through the proxy. Every check raises on failure; the last line printed is a JSON summary
for the Rust side. Screenshots of each page go to $CONSOLE_SCREENSHOTS.

Environment: ADMIN (http://127.0.0.1:PORT), ADMIN_TOKEN, ALICE_TOKEN, VERA_TOKEN, PROXY
(http://agent:tok-agent@127.0.0.1:PORT), ORIGIN_PORT, CACERT, CONSOLE_SCREENSHOTS."""

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

ADMIN = os.environ["ADMIN"]
PROXY = os.environ["PROXY"]
ORIGIN_PORT = os.environ["ORIGIN_PORT"]
CACERT = os.environ["CACERT"]
SHOTS = os.environ["CONSOLE_SCREENSHOTS"]
summary = {}
# The signed-in session's place (ADMIN/ui/s/{place}/): its pages are there, set at sign-in.
BASE = None


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                 "--disable-dev-shm-usage"):
        o.add_argument(flag)
    # The proxy under test is not the browser's proxy: the console is reached directly.
    o.add_argument("--no-proxy-server")
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def shot(d, name):
    os.makedirs(SHOTS, exist_ok=True)
    d.save_screenshot(os.path.join(SHOTS, name + ".png"))


def curl(*args):
    """curl through the proxy as the sandbox: (exit code, HTTP status — the origin's, or the
    proxy's answer to the CONNECT when it refused the tunnel)."""
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{http_connect}",
                          "--max-time", "10", "-x", PROXY, "--cacert", CACERT, *args],
                         capture_output=True, text=True)
    origin, connect = (out.stdout.split() + ["000", "000"])[:2]
    return out.returncode, origin if origin != "000" else connect


def fetch_origin(host):
    return curl(f"https://{host}:{ORIGIN_PORT}/hello")


def ask(host, reason):
    """The sandbox asks for access at http://egress-proxy.local/v1/requests: the request id."""
    body = json.dumps({"host": host, "port": int(ORIGIN_PORT), "reason": reason})
    out = subprocess.run(["curl", "-sS", "--max-time", "10", "-x", PROXY, "-H",
                          "Content-Type: application/json", "--data-binary", body,
                          "http://egress-proxy.local/v1/requests"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["id"]


def admin_api(path):
    req = urllib.request.Request(ADMIN + path,
                                 headers={"Authorization": "Bearer " + os.environ["ADMIN_TOKEN"]})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def within(d, seconds, what, f):
    """f() until it is truthy, at most `seconds`."""
    try:
        return WebDriverWait(d, seconds, poll_frequency=0.05).until(lambda _: f())
    except Exception as e:
        raise AssertionError(f"not within {seconds} s: {what}") from e


def sign_in(d, token):
    global BASE
    d.get(ADMIN + "/ui/login")
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.ID, "sign-in").click()
    within(d, 5, "signed in", lambda: d.current_url.endswith("/inbox"))
    BASE = d.current_url[: -len("inbox")]


def page(d, name):
    d.get(BASE + name)


def sign_out(d):
    d.find_element(By.CSS_SELECTOR, "form[action$='logout'] button").click()
    within(d, 5, "signed out", lambda: d.current_url.endswith("/ui/login"))


class Thief(http.server.BaseHTTPRequestHandler):
    """A server a sandbox runs on another port of the console's host. Whatever the approver's
    browser sends it, it replays to the console from its side, as the wave-5 attack did: read
    the inbox for a CSRF token, then approve the pending request."""
    seen = []      # (path, Cookie header) of each request the browser made here
    tried = []     # (what, status) of each replay
    read_inbox = False
    rid = None

    def log_message(self, *a):
        pass

    def replay(self, method, path, cookie, body=None):
        req = urllib.request.Request(ADMIN + path, data=body, method=method,
                                     headers={"Cookie": cookie} if cookie else {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, ""

    def do_GET(self):
        cookie = self.headers.get("Cookie", "")
        Thief.seen.append((self.path, cookie))
        # The console's paths this browser might have a cookie for, and this server's own.
        for path in ["/ui/inbox", self.path, self.path.rstrip("/") + "/inbox"]:
            status, text = self.replay("GET", path, cookie)
            Thief.tried.append(("GET " + path, status))
            if "req-" + Thief.rid in text:
                Thief.read_inbox = True
            m = re.search(r'name="csrf" value="([0-9a-f]+)"', text)
            csrf = m.group(1) if m else "none"
            body = f"csrf={csrf}&grant=permanent".encode()
            for target in [f"/ui/requests/{Thief.rid}/approve",
                           self.path.rstrip("/") + f"/requests/{Thief.rid}/approve"]:
                status, _ = self.replay("POST", target, cookie, body)
                Thief.tried.append(("POST " + target, status))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!doctype html><title>a sandbox's page</title><p>hello")


def another_port_cannot_act(d, rid):
    """A13: the approver opens pages a sandbox serves on another port of the console's host;
    nothing the browser sends them lets that server read the inbox or answer the request."""
    Thief.rid = rid
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Thief)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        for path in ["/ui/inbox", "/ui/s/", "/ui/", "/"]:
            d.get(f"http://127.0.0.1:{port}{path}")
            within(d, 5, "the sandbox's page", lambda: "hello" in d.page_source)
    finally:
        server.shutdown()
    assert len(Thief.seen) >= 4, Thief.seen
    state = admin_api(f"/v1/requests/{rid}")["state"]
    assert state == "pending", ("another port answered the request", state, Thief.tried)
    assert not Thief.read_inbox, ("another port read the inbox", Thief.tried)
    leaked = [c for _, c in Thief.seen if "egress_console" in c]
    assert not leaked, ("the session cookie reached another port", Thief.seen)
    summary["another_port"] = {"requests": len(Thief.seen), "replays": len(Thief.tried),
                               "cookies_seen": len(leaked)}


def sign_out_ends_the_live_stream(d):
    """A14: a Live stream open in one tab ends within a second of signing out in another."""
    page(d, "live")
    d.execute_script(
        "window.ended = null; const es = new EventSource('live/events');"
        "es.onerror = () => { if (window.ended === null) window.ended = Date.now(); };")
    within(d, 5, "the stream open", lambda: d.execute_script(
        "return document.querySelector('#live') !== null && window.ended === null"))
    time.sleep(0.3)  # the EventSource connects
    assert d.execute_script("return window.ended") is None, "the stream failed before sign-out"
    live_tab = d.current_window_handle
    d.switch_to.new_window("tab")
    page(d, "inbox")
    sign_out(d)
    signed_out = time.monotonic()
    other = d.current_window_handle
    d.switch_to.window(live_tab)
    within(d, 1.0, "the Live stream ended after sign-out",
           lambda: d.execute_script("return window.ended") is not None)
    summary["stream_ended_after_s"] = round(time.monotonic() - signed_out, 3)
    d.switch_to.window(other)
    d.close()
    d.switch_to.window(live_tab)


def post_in_page(d, path, fields):
    """A same-origin POST from the page itself (the session's cookie goes with it): status."""
    return d.execute_async_script(
        "const [path, fields, done] = arguments;"
        "fetch(path, {method: 'POST', body: new URLSearchParams(fields), redirect: 'manual'})"
        ".then(r => done(r.status)).catch(e => done(String(e)));", path, fields)


def main():
    d = browser()
    try:
        d.get(ADMIN + "/ui/inbox")
        within(d, 5, "sent to sign in", lambda: d.current_url.endswith("/ui/login"))
        shot(d, "sign-in")
        sign_in(d, os.environ["ALICE_TOKEN"])
        assert "alice" in d.find_element(By.ID, "who").text

        # Live: a refusal appears within a second, and opens to what check says.
        page(d, "live")
        time.sleep(0.3)  # the page's event stream connects
        code, status = fetch_origin("blocked.test")
        assert status == "403", (code, status)
        t0 = time.monotonic()
        row = within(d, 1.0, "the refusal in Live",
                     lambda: next((r for r in d.find_elements(By.CSS_SELECTOR, "#live tbody tr")
                                   if "blocked.test" in r.text), None))
        summary["live_seconds"] = round(time.monotonic() - t0, 3)
        assert "deny" in row.text and "no_rule_matched" in row.text, row.text
        row.find_element(By.CSS_SELECTOR, "details.why summary").click()
        explained = within(d, 5, "the explanation", lambda: row.find_elements(By.CSS_SELECTOR, "p.explanation"))
        summary["explanation"] = explained[0].text
        assert "not in network.egress of sandbox agent" in explained[0].text, explained[0].text
        shot(d, "live")

        # Inbox: the sandbox asks, with a hostile reason; it appears within a second, inert.
        page(d, "inbox")
        time.sleep(0.3)
        reason = "need docs <script>window.pwned=1</script> \u202egnp.exe\u202c"
        t0 = time.monotonic()
        rid = ask("granted.test", reason)
        section = within(d, 1.0, "the request in Inbox",
                         lambda: d.find_elements(By.ID, "req-" + rid))
        summary["inbox_seconds"] = round(time.monotonic() - t0, 3)
        shown = section[0].find_element(By.CSS_SELECTOR, "dd.reason").text
        assert "<script>window.pwned=1</script>" in shown, shown
        assert "\\u{202e}" in shown and "\u202e" not in shown, shown
        assert d.execute_script("return window.pwned === undefined"), "the reason ran as script"
        shot(d, "inbox")

        # No CSRF token: refused, even for an approver.
        status = post_in_page(d, f"requests/{rid}/approve", {"grant": "ttl", "ttl_s": "5"})
        assert status == 403, status
        assert admin_api(f"/v1/requests/{rid}")["state"] == "pending"

        # Approve for 5 s: the sandbox passes, the grant is listed, then it ends.
        code, status = fetch_origin("granted.test")
        assert status == "403", (code, status)
        Select(section[0].find_element(By.NAME, "grant")).select_by_value("ttl")
        ttl = section[0].find_element(By.NAME, "ttl_s")
        ttl.clear()
        ttl.send_keys("5")
        section[0].find_element(By.CSS_SELECTOR, "form.answer input[name=note]").send_keys("for the docs, 5 s")
        section[0].find_element(By.CSS_SELECTOR, "button.approve").click()
        within(d, 5, "the request answered", lambda: not d.find_elements(By.ID, "req-" + rid))
        approved_at = time.monotonic()
        code, status = fetch_origin("granted.test")
        assert status == "200", (code, status)
        page(d, "grants")
        grant = d.find_elements(By.CSS_SELECTOR, f"tr.grant[data-id='{rid}']")
        assert grant and "ttl" in grant[0].text, d.page_source[:2000]
        assert "console alice" in grant[0].text, grant[0].text
        shot(d, "grants")
        within(d, 15, "the grant expired and left Grants",
               lambda: (d.refresh() or True) and not d.find_elements(By.CSS_SELECTOR, f"tr.grant[data-id='{rid}']"))
        summary["grant_lasted_s"] = round(time.monotonic() - approved_at, 1)
        code, status = fetch_origin("granted.test")
        assert status == "403", ("after expiry", code, status)

        # Sandboxes: today's bars equal /v1/usage.
        page(d, "sandboxes/agent")
        bar = lambda chart: int(d.find_elements(By.CSS_SELECTOR, f"#chart-{chart} rect.bar")[-1].get_attribute("data-value"))
        answer = admin_api("/v1/usage?sandbox=agent")
        usage = answer["usage"]
        quota = next(q for q in answer["quotas"] if q["destination"] is None)
        line = lambda chart: int(d.find_element(By.CSS_SELECTOR, f"#chart-{chart} line.limit").get_attribute("data-value"))
        assert (line("requests"), line("bytes")) == (quota["requests_per_day"], quota["bytes_per_day"]), quota
        want = {"requests": sum(r["requests"] for r in usage),
                "bytes": sum(r["bytes_up"] + r["bytes_down"] for r in usage)}
        got = {"requests": bar("requests"), "bytes": bar("bytes")}
        assert got == want, (got, want)
        assert want["requests"] > 0 and want["bytes"] > 0, want
        summary["usage_today"] = got
        shot(d, "sandbox")

        # Audit: the trail verifies, chain and signatures.
        page(d, "audit")
        verified = d.find_element(By.ID, "verified")
        assert verified.get_attribute("data-verified") == "true", verified.text
        assert "signatures" in verified.text, verified.text
        shot(d, "audit")

        # Live shows an access request as a request, not a refusal, and names who answered:
        # the page as served, and a new one as the script adds it.
        page(d, "live")
        rows = d.find_elements(By.CSS_SELECTOR, "#live tbody tr.decision-approval")
        steps = {r.find_element(By.CSS_SELECTOR, "td.decision").text: r.text for r in rows}
        assert "approved" in steps and "console alice (approver, token)" in steps["approved"], steps
        assert "requested" in steps and "asked: need docs" in steps["requested"], steps
        denied = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#live tbody tr.decision-deny")
                  if "access request" in r.text]
        assert not denied, denied
        time.sleep(0.3)  # the page's event stream connects
        rid3 = ask("other.test", "a page on another port must not approve this \u202e")
        added = within(d, 1.0, "the new request in Live", lambda: next(
            (r for r in d.find_elements(By.CSS_SELECTOR, "#live tbody tr.decision-approval")
             if rid3 in r.text), None))
        assert "requested" in added.text and "\\u{202e}" in added.text, added.text
        page(d, "inbox")
        answered = d.find_element(By.CSS_SELECTOR, f"tr[data-id='{rid}'] td.by").text
        assert answered == "console alice", answered
        summary["answered_by"] = answered

        # Another port of the console's host cannot act as the approver; sign-out ends streams.
        another_port_cannot_act(d, rid3)
        page(d, "inbox")
        sign_out_ends_the_live_stream(d)

        # A viewer sees no approve button, and a forged POST from its session is refused.
        sign_in(d, os.environ["VERA_TOKEN"])
        rid2 = ask("other.test", "a viewer must not approve this")
        page(d, "inbox")
        within(d, 5, "the second request in Inbox", lambda: d.find_elements(By.ID, "req-" + rid2))
        assert not d.find_elements(By.CSS_SELECTOR, "button.approve, button.deny, form.answer")
        csrf = d.find_element(By.CSS_SELECTOR, "form[action$='logout'] input[name=csrf]").get_attribute("value")
        status = post_in_page(d, f"requests/{rid2}/approve", {"csrf": csrf, "grant": "permanent"})
        assert status == 403, status
        assert admin_api(f"/v1/requests/{rid2}")["state"] == "pending"
        shot(d, "inbox-viewer")
        summary["viewer_forged_post"] = status
        summary["ok"] = True
    finally:
        d.quit()
    print(json.dumps(summary))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        print(f"console drive failed: {e!r}", file=sys.stderr)
        raise
