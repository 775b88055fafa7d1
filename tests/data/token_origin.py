"""A token endpoint, an API and a GitHub-like host in one HTTPS origin, for tests of the
proxy's minted credentials. Everything it accepts, it verifies:

- POST /token (OAuth2; routed like Express: any case, trailing or doubled `/`): client_credentials with HTTP Basic client:secret (the proxy's
  client, or the sandbox's own `sandbox:sandbox-pass`); refresh_token with
  the current refresh token (rotated on every use); jwt_bearer with a JWT assertion whose
  RS256 signature PyJWT verifies with PUBKEY, iss = sub = the client id, aud = the token URL.
  Tokens live EXPIRES seconds. `/token?fail=1` style refusals: a wrong secret gets 401
  invalid_client.
- POST /app/installations/42/access_tokens (GitHub App): the app JWT (RS256, iss 7) verified
  with PUBKEY; answers an installation token and its expires_at.
- GET /api/...: needs `Authorization: Bearer` with a live token; answers what it saw, with the
  token echoed back (a reflected secret the proxy must scrub).
- git smart HTTP (/acme/docs.git/...): needs Basic auth with password a live installation
  token, then runs `git http-backend` over GITROOT.
- GET /_stats: counts by grant, and requests that arrived without a valid token.

usage: token_origin.py CERT KEY PUBKEY EXPIRES GITROOT   (prints the port)
"""
import base64
import datetime
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
import time
from urllib.parse import parse_qsl

import jwt

LOCK = threading.Lock()
STATS = {"client_credentials": 0, "refresh_token": 0, "jwt_bearer": 0, "github": 0,
         "api_ok": 0, "unauthorized": 0}
TOKENS = {}  # token -> expiry (monotonic)
STATE = {"refresh": "refresh-0", "n": 0}


def mint(prefix):
    with LOCK:
        STATE["n"] += 1
        token = "%s-%d-%s" % (prefix, STATE["n"], base64.b32encode(os.urandom(10)).decode())
        TOKENS[token] = time.monotonic() + EXPIRES
        return token


def live(token):
    with LOCK:
        return TOKENS.get(token, 0) > time.monotonic()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, obj=None, raw=None, ctype="application/json", extra=()):
        body = raw if raw is not None else json.dumps(obj or {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def count(self, key):
        with LOCK:
            STATS[key] += 1

    def token_endpoint(self, form):
        grant = form.get("grant_type")
        url = "https://%s/token" % self.headers["Host"]
        if grant == "client_credentials":
            auth = self.headers.get("Authorization", "")
            allowed = [b"agent:client-secret-1", b"sandbox:sandbox-pass"]
            if auth not in ["Basic " + base64.b64encode(c).decode() for c in allowed]:
                return self.send(401, {"error": "invalid_client"})
            self.count("client_credentials")
        elif grant == "refresh_token":
            with LOCK:
                ok = form.get("refresh_token") == STATE["refresh"]
                if ok:
                    n = int(STATE["refresh"].split("-")[1]) + 1
                    STATE["refresh"] = "refresh-%d" % n
            if not ok:
                return self.send(400, {"error": "invalid_grant"})
            self.count("refresh_token")
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            try:
                claims = jwt.decode(form.get("assertion", ""), PUBKEY, algorithms=["RS256"],
                                    audience=url, issuer="agent")
            except jwt.PyJWTError as e:
                return self.send(400, {"error": "invalid_grant", "why": str(e)})
            if claims.get("sub") != "agent":
                return self.send(400, {"error": "invalid_grant"})
            self.count("jwt_bearer")
        else:
            return self.send(400, {"error": "unsupported_grant_type"})
        answer = {"access_token": mint("at"), "token_type": "Bearer", "expires_in": EXPIRES}
        if grant == "refresh_token":
            answer["refresh_token"] = STATE["refresh"]
        return self.send(200, answer)

    def github_token(self):
        auth = self.headers.get("Authorization", "")
        try:
            claims = jwt.decode(auth.removeprefix("Bearer "), PUBKEY, algorithms=["RS256"],
                                issuer="7", options={"require": ["iat", "exp", "iss"]})
        except jwt.PyJWTError as e:
            return self.send(401, {"message": "bad app JWT: %s" % e})
        if claims["exp"] - claims["iat"] > 600:
            return self.send(401, {"message": "app JWT lives too long"})
        self.count("github")
        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=EXPIRES)
        return self.send(201, {"token": mint("ghs"),
                               "expires_at": at.strftime("%Y-%m-%dT%H:%M:%SZ")})

    def git(self, body):
        auth = self.headers.get("Authorization", "")
        password = ""
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        if not live(password):
            self.count("unauthorized")
            return self.send(401, raw=b"", extra=[("WWW-Authenticate", 'Basic realm="git"')])
        path, _, query = self.path.partition("?")
        env = dict(os.environ)
        env.update({"GIT_PROJECT_ROOT": GITROOT, "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1"})
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send(status, raw=rest, ctype=dict(headers).get("Content-Type", "text/plain"))

    def handle_any(self):
        body = self.body()
        path = self.path.partition("?")[0]
        if path == "/_stats":
            with LOCK:
                return self.send(200, STATS)
        # Routed as Express does by default: case-insensitive, a trailing or doubled `/`
        # ignored — `/token/`, `/TOKEN` and `//token` reach the token endpoint.
        route = "/" + "/".join(seg for seg in path.lower().split("/") if seg)
        if route == "/token" and self.command == "POST":
            return self.token_endpoint(dict(parse_qsl(body.decode())))
        if path == "/app/installations/42/access_tokens" and self.command == "POST":
            return self.github_token()
        if ".git/" in path:
            return self.git(body)
        auth = self.headers.get("Authorization", "")
        if not (auth.startswith("Bearer ") and live(auth[7:])):
            self.count("unauthorized")
            return self.send(401, {"error": "no valid token"})
        self.count("api_ok")
        return self.send(200, {"ok": True, "echo": auth})

    do_GET = do_POST = do_PUT = handle_any


CERT, KEY, PUBFILE, EXPIRES, GITROOT = sys.argv[1:6]
EXPIRES = int(EXPIRES)
PUBKEY = open(PUBFILE).read()
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
# The handshake runs in each connection's thread (on its first read), not in the accept loop:
# a client that connects and stays silent must not stall everyone else (as a real server).
server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
print(server.server_address[1], flush=True)
server.serve_forever()
