"""An HTTPS origin that checks the proxy's sandbox identity tokens for real: every request's
`X-Sandbox-Identity` is verified with PyJWT against the JWKS fetched from the proxy's admin
listener, with the audience its own host name. `/replay?aud=NAME` verifies the previous
request's token against another audience (a replay elsewhere); `/reflect` answers with the
request's token in a header (`X-Echo`) and in the body (an origin that echoes headers).

usage: identity_origin.py CERT KEY JWKS_URL   (prints the port)
"""
import http.server
import json
import ssl
import sys
from urllib.parse import parse_qs, urlsplit

import jwt

LAST = {"token": None}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def verify(self, token, aud):
        key = JWKS.get_signing_key_from_jwt(token)
        return jwt.decode(token, key.key, algorithms=["EdDSA"], audience=aud,
                          options={"require": ["exp", "iat", "sub", "aud", "iss", "jti"]})

    def do_GET(self):
        url = urlsplit(self.path)
        host = self.headers.get("Host", "").split(":")[0]
        if url.path == "/replay":
            aud = parse_qs(url.query)["aud"][0]
            try:
                self.verify(LAST["token"], aud)
                return self.send(200, {"replay": "accepted"})
            except Exception as e:  # noqa: BLE001 - the test reads why
                return self.send(401, {"replay": "rejected", "why": str(e)})
        token = self.headers.get("X-Sandbox-Identity")
        if url.path == "/reflect":
            body = json.dumps({"echo": token}).encode()
            self.send_response(200)
            self.send_header("X-Echo", token or "")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if not token:
            return self.send(401, {"error": "no token"})
        try:
            claims = self.verify(token, host)
        except Exception as e:  # noqa: BLE001
            return self.send(401, {"error": str(e)})
        LAST["token"] = token
        return self.send(200, claims)


CERT, KEY, JWKS_URL = sys.argv[1:4]
JWKS = jwt.PyJWKClient(JWKS_URL)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
print(server.server_address[1], flush=True)
server.serve_forever()
