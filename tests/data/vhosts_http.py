"""An origin with name-based virtual hosts, as Python's http.server reads requests: any method
(the request line split on any white space) is answered `vhost=NAME` from its Host header.
Prints its port on the first line."""

import http.server
import sys


class Vhosts(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.answer
        raise AttributeError(name)

    def answer(self):
        name = (self.headers.get("Host") or "").split(":")[0]
        body = f"vhost={name} method={self.command}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Vhosts)
print(server.server_address[1], flush=True)
sys.stdout.close()
server.serve_forever()
