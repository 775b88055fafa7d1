"""A plain or TLS origin on Python's own http.server that reads requests the way common servers
do, for the request-pipeline tests: every request it gets is appended to a log file as one JSON
line (method, raw path, the path normalised as a server that resolves dot segments would, the
headers the tests look for, and the body's length), and answered 200 with that line.

`/graphql` reads a POST as graphene-django's `GraphQLView.parse_body` does: a form body
(`application/x-www-form-urlencoded`) by its `query` field, JSON otherwise, `?query=` on a GET —
and answers which operation it would have executed (`mutation` or `query`), so a test sees
what the origin would have run.

usage: judged_origin.py LOG [CERT KEY]   (prints the port)
"""
import http.server
import json
import posixpath
import ssl
import sys
from urllib.parse import parse_qs, unquote, urlsplit

LOG = sys.argv[1]


def operation(doc):
    doc = (doc or "").strip()
    return "mutation" if doc.startswith("mutation") else "query"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        url = urlsplit(self.path)
        seen = {
            "method": self.command,
            "path": self.path,
            "normalised": posixpath.normpath(unquote(url.path)),
            "host": self.headers.get("Host"),
            "identity": self.headers.get("X-Sandbox-Identity"),
            "body": len(body),
        }
        if url.path == "/graphql":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if self.command == "GET":
                doc = parse_qs(url.query).get("query", [""])[-1]
            elif ctype == "application/x-www-form-urlencoded":
                doc = parse_qs(body.decode("utf-8", "replace")).get("query", [""])[-1]
            else:
                try:
                    doc = json.loads(body or b"{}").get("query", "")
                except ValueError:
                    doc = ""
            seen["executed"] = operation(doc)
        line = json.dumps(seen)
        with open(LOG, "a") as f:
            f.write(line + "\n")
        out = line.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = handle_any


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if len(sys.argv) > 3:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])
    server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
print(server.server_address[1], flush=True)
server.serve_forever()
