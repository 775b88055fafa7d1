#!/usr/bin/env python3
"""An example decider for egress-proxy (protocol version 1, docs/decider.md).

It serves HTTP/1.1 on 127.0.0.1 (a free port, printed on the first line) or on a Unix
socket (`--unix PATH`), and answers each ask:

- a tunnel or connection (`protocol: connect`) to a host under `blocked.test`: deny;
- a request whose path starts with /admin: deny, status 403;
- a POST, PUT or PATCH without its body: need_body; with it, deny when the body mentions
  "PROJECT-X", else allow;
- any other request (`protocol: http` — forwarded, or plain HTTP read in a tunnel — or
  `https`, terminated): allow, adding the header `x-decided-by: example-decider` and
  removing `x-debug` (the proxy makes header changes on every request it reads);
- anything else: allow.

`--secret-file FILE` answers only asks signed with the key in FILE (the proxy's
`decider.secret_file`): `X-Egress-Proxy-Signature: sha256=HEX`, the HMAC-SHA256 of
`TIMESTAMP.BODY` with `X-Egress-Proxy-Timestamp: TIMESTAMP` within 300 s of now; any other
POST gets 401, so a question forged by a sandbox that reaches the decider is not answered.

`GET /` answers `{"asked": N}`: how many asks it has been sent (counted before any sleep), so a
test can wait until the proxy's asks are under way.

`--sleep S` answers every ask S seconds late (to see the proxy's timeout); `--load-sleep S`
answers S seconds late for each ask in flight, this one included (a decider that slows under
load). `--schema FILE`
checks every ask, and every answer it gives, against docs/decider.schema.json (Python's
`jsonschema`): an ask that does not match is denied with the reason `schema: …`.

usage: decider.py [--unix PATH] [--sleep S] [--load-sleep S] [--schema FILE] [--secret-file FILE]
"""
import base64
import hashlib
import hmac
import http.server
import json
import os
import socket
import socketserver
import sys
import threading
import time

SLEEP = 0.0
LOAD_SLEEP = 0.0
IN_FLIGHT = [0]
IN_FLIGHT_LOCK = threading.Lock()
ASKED = [0]
SCHEMA = None
SECRET = None


def checked(ask):
    """`decide`, with the ask and the answer checked against the schema when one is given."""
    if SCHEMA is not None:
        import jsonschema
        defs = SCHEMA["$defs"]
        try:
            jsonschema.validate(ask, {**defs["Ask"], "$defs": defs})
        except jsonschema.ValidationError as e:
            return {"verdict": "deny", "reason": "schema: %s" % e.message[:150]}
        answer = decide(ask)
        jsonschema.validate(answer, {**defs["Answer"], "$defs": defs})
        return answer
    return decide(ask)


def decide(ask):
    """The verdict for one ask (a dict as the proxy sent it)."""
    if ask.get("version") != 1:
        return {"verdict": "deny", "reason": "unknown protocol version"}
    target = ask["target"]["host"]
    if target == "blocked.test" or target.endswith(".blocked.test"):
        return {"verdict": "deny", "status": 403, "reason": "this host is blocked by the decider"}
    if ask["protocol"] == "connect":
        return {"verdict": "allow"}
    path = ask.get("path") or "/"
    if path.startswith("/admin"):
        return {"verdict": "deny", "status": 403, "reason": "admin paths are off limits"}
    if ask.get("method") in ("POST", "PUT", "PATCH"):
        body = ask.get("body")
        if body is None:
            return {"verdict": "need_body"}
        if b"PROJECT-X" in base64.b64decode(body["base64"]):
            return {"verdict": "deny", "status": 403, "reason": "the body mentions PROJECT-X"}
    if ask["protocol"] in ("http", "https"):
        return {"verdict": "allow", "set_headers": {"x-decided-by": "example-decider"},
                "remove_headers": ["x-debug"]}
    return {"verdict": "allow"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def address_string(self):
        return "decider-client"

    def signed(self, raw):
        """Whether the ask carries the proxy's signature (always, without --secret-file)."""
        if SECRET is None:
            return True
        ts = self.headers.get("X-Egress-Proxy-Timestamp", "")
        sig = self.headers.get("X-Egress-Proxy-Signature", "")
        if not ts.isdigit() or abs(int(ts) - time.time()) > 300:
            return False
        want = hmac.new(SECRET, ts.encode() + b"." + raw, hashlib.sha256).hexdigest()
        return hmac.compare_digest(sig, "sha256=" + want)

    def do_GET(self):
        with IN_FLIGHT_LOCK:
            body = json.dumps({"asked": ASKED[0]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.signed(raw):
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        ask = json.loads(raw)
        with IN_FLIGHT_LOCK:
            ASKED[0] += 1
        if SLEEP:
            time.sleep(SLEEP)
        if LOAD_SLEEP:
            with IN_FLIGHT_LOCK:
                IN_FLIGHT[0] += 1
                n = IN_FLIGHT[0]
            time.sleep(LOAD_SLEEP * n)
            with IN_FLIGHT_LOCK:
                IN_FLIGHT[0] -= 1
        body = json.dumps(checked(ask)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main():
    global SLEEP, LOAD_SLEEP, SCHEMA, SECRET
    args = sys.argv[1:]
    unix = None
    while args:
        a = args.pop(0)
        if a == "--unix":
            unix = args.pop(0)
        elif a == "--sleep":
            SLEEP = float(args.pop(0))
        elif a == "--load-sleep":
            LOAD_SLEEP = float(args.pop(0))
        elif a == "--schema":
            SCHEMA = json.load(open(args.pop(0)))
        elif a == "--secret-file":
            SECRET = open(args.pop(0), "rb").read().strip()
    if unix:
        if os.path.exists(unix):
            os.unlink(unix)
        server = UnixServer(unix, Handler)
        print(unix, flush=True)
    else:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
