"""An S3-like origin for tests that checks every request's AWS Signature Version 4 with the
*real* keys, using botocore's own signer for the canonical request (header and presigned
signatures) and the streaming rules of the S3 documentation for `aws-chunked` bodies.

A request whose signature, payload hash or any chunk signature does not verify gets S3's
403 SignatureDoesNotMatch. Objects live in memory: PUT stores the decoded body, GET returns
it. A form POST (`Action=GetCallerIdentity`, as STS's) answers the caller's key id.

usage: aws_origin.py CERT KEY ACCESS_KEY_ID SECRET_ACCESS_KEY
(prints the port, then serves until killed)
"""
import hashlib
import hmac
import http.server
import ssl
import sys
from urllib.parse import parse_qsl, urlencode, urlsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

OBJECTS = {}
QUERY_AUTH = {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
              "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token"}


def scope_parts(credential):
    key_id, date, region, service, _ = credential.split("/")
    return key_id, date, region, service


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def fail(self, why):
        body = ("<Error><Code>SignatureDoesNotMatch</Code><Message>%s</Message></Error>"
                % why).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, status, body=b"", ctype="application/xml"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def verify(self, body):
        """The error, or None when the request is signed with the real keys."""
        host = self.headers.get("Host")
        url = "https://%s%s" % (host, self.path)
        split = urlsplit(url)
        query = parse_qsl(split.query, keep_blank_values=True)
        names = {k for k, _ in query}
        creds = Credentials(KEY_ID, SECRET, TOKEN)
        if "X-Amz-Signature" in names:
            q = dict(query)
            key_id, _, region, service = scope_parts(q["X-Amz-Credential"])
            given = q["X-Amz-Signature"]
            signed = q["X-Amz-SignedHeaders"].split(";")
            kept = [(k, v) for k, v in query if k != "X-Amz-Signature"]
            url = "https://%s%s?%s" % (host, split.path, urlencode(kept))
            timestamp = q["X-Amz-Date"]
            auth = S3SigV4QueryAuth(creds, service, region, int(q["X-Amz-Expires"]))
        else:
            header = self.headers.get("Authorization", "")
            if not header.startswith("AWS4-HMAC-SHA256 "):
                return "not signed with SigV4"
            fields = dict(p.strip().split("=", 1) for p in header[17:].split(","))
            key_id, _, region, service = scope_parts(fields["Credential"])
            given = fields["Signature"]
            signed = fields["SignedHeaders"].split(";")
            timestamp = self.headers.get("X-Amz-Date")
            auth = (S3SigV4Auth if service == "s3" else SigV4Auth)(creds, service, region)
        if key_id != KEY_ID:
            return "signed with another access key id"
        headers = {k: v for k, v in self.headers.items() if k.lower() in signed}
        req = AWSRequest(method=self.command, url=url, headers=headers, data=body)
        req.context["timestamp"] = timestamp
        canonical = auth.canonical_request(req)
        expected = auth.signature(auth.string_to_sign(req, canonical), req)
        if not hmac.compare_digest(expected, given):
            return "the signature does not verify with the real secret key"
        if TOKEN is not None and self.headers.get("X-Amz-Security-Token") != TOKEN and \
                dict(query).get("X-Amz-Security-Token") != TOKEN:
            return "no session token"
        declared = self.headers.get("X-Amz-Content-SHA256")
        if declared and len(declared) == 64 and hashlib.sha256(body).hexdigest() != declared:
            return "the body does not match x-amz-content-sha256"
        self.signing = (timestamp, region, service, given)
        return None

    def decode_chunks(self, body, signed):
        """The data of an aws-chunked body; with `signed`, every chunk signature checked."""
        timestamp, region, service, previous = self.signing
        date = timestamp[:8]
        key = ("AWS4" + SECRET).encode()
        for part in (date, region, service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        scope = "%s/%s/%s/aws4_request" % (date, region, service)
        empty = hashlib.sha256(b"").hexdigest()
        out, rest = b"", body
        while True:
            line, rest = rest.split(b"\r\n", 1)
            size_text, _, ext = line.decode().partition(";")
            size = int(size_text, 16)
            data, rest = rest[:size], rest[size:]
            if signed:
                sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", timestamp, scope, previous, empty,
                                 hashlib.sha256(data).hexdigest()])
                sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
                if ext != "chunk-signature=" + sig:
                    return None
                previous = sig
            out += data
            if size == 0:
                return out
            rest = rest[2:]

    def handle_any(self):
        body = self.read_body()
        if self.path == "/_modes":
            return self.answer(200, ",".join(MODES).encode(), "text/plain")
        why = self.verify(body)
        if why:
            return self.fail(why)
        mode = self.headers.get("X-Amz-Content-SHA256", "")
        if mode.startswith("STREAMING-"):
            data = self.decode_chunks(body, signed=mode == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
            if data is None:
                return self.fail("a chunk signature does not verify")
            body = data
        path = urlsplit(self.path).path
        if self.command == "PUT":
            OBJECTS[path] = body
            MODES.append(mode or "none")
            return self.answer(200)
        if self.command == "GET":
            if path not in OBJECTS:
                return self.answer(404, b"<Error><Code>NoSuchKey</Code></Error>")
            return self.answer(200, OBJECTS[path], "application/octet-stream")
        if self.command == "POST" and b"Action=GetCallerIdentity" in body:
            xml = ("<GetCallerIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                   "<GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/test</Arn>"
                   "<UserId>%s</UserId><Account>123456789012</Account></GetCallerIdentityResult>"
                   "<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>"
                   "</GetCallerIdentityResponse>") % KEY_ID
            return self.answer(200, xml.encode(), "text/xml")
        return self.answer(400)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any


MODES = []
CERT, KEY, KEY_ID, SECRET = sys.argv[1:5]
TOKEN = sys.argv[5] if len(sys.argv) > 5 else None
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
print(server.server_address[1], flush=True)
server.serve_forever()
