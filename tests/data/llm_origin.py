"""An LLM provider origin for tests: speaks the documented wire formats of OpenAI (Chat
Completions and Responses, JSON and server-sent events), Anthropic Messages (JSON and events)
and Gemini (generateContent, streamGenerateContent with alt=sse) over TLS with the test CA's
certificate, with fixed usage numbers the tests check:

  OpenAI chat:      prompt_tokens 12 (2 cached), completion_tokens 5 (1 reasoning)
  OpenAI responses: input_tokens 9, output_tokens 3
  Anthropic:        input_tokens 25, output_tokens 15, cache reads 4, cache writes 6
  Gemini:           promptTokenCount 8 (1 cached), candidatesTokenCount 3, thoughts 2

usage: llm_origin.py CERT KEY LOG SECRET   (prints the port, then serves until killed)

Each request is appended to LOG (path, model, whether the brokered SECRET came in the
provider's key header, stream), so a refused call is seen never to have arrived. A request
header `x-test-delay-ms` holds the answer; `x-test-use-all` makes an OpenAI answer use its whole
output bound; `x-test-chunks` and `x-test-chunk-ms` shape a
stream (the benchmark's). A call without the key is answered 401 in the provider's shape.
"""
import json
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CERT, KEY, LOG, SECRET = sys.argv[1:5]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def provider(self):
        if self.path.startswith("/v1/messages"):
            return "anthropic"
        if "/models/" in self.path:
            return "gemini"
        return "openai"

    def keyed(self, provider):
        h = self.headers
        if provider == "openai":
            return h.get("Authorization") == f"Bearer {SECRET}"
        if provider == "anthropic":
            return h.get("x-api-key") == SECRET
        return h.get("x-goog-api-key") == SECRET

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "gpt-4o-mini"}]}).encode()
        self.send(200, "application/json", body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(n) or b"{}")
        provider = self.provider()
        path = self.path.split("?")[0]
        model = req.get("model") or path.split("/models/")[-1].split(":")[0]
        stream = bool(req.get("stream")) or ":streamGenerateContent" in path
        ok = self.keyed(provider)
        with open(LOG, "a") as f:
            bound = next((req[k] for k in ("max_output_tokens", "max_completion_tokens", "max_tokens") if k in req), None)
            f.write(json.dumps({"path": path, "model": model, "keyed": ok, "stream": stream,
                                "max_output": bound}) + "\n")
        delay = int(self.headers.get("x-test-delay-ms") or 0)
        if delay:
            time.sleep(delay / 1000)
        if not ok:
            err = {"error": {"message": "bad key", "type": "invalid_request_error", "code": "invalid_api_key"}}
            if provider == "anthropic":
                err = {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
            return self.send(401, "application/json", json.dumps(err).encode())
        chunks = int(self.headers.get("x-test-chunks") or 3)
        pause = int(self.headers.get("x-test-chunk-ms") or 0) / 1000
        events = getattr(self, f"{provider}_{'responses' if path.endswith('/responses') else 'answer'}")(model, stream, req, chunks)
        if not stream:
            return self.send(200, "application/json", json.dumps(events).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for name, data in events:
            text = (f"event: {name}\n" if name else "") + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
            raw = text.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()
            if pause:
                time.sleep(pause)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def send(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def openai_answer(self, model, stream, req, chunks):
        # `x-test-use-all`: the answer uses its whole output bound (the worst case a budget
        # must hold against).
        out = 5
        if self.headers.get("x-test-use-all"):
            out = req.get("max_completion_tokens") or req.get("max_tokens") or 100000
        usage = {"prompt_tokens": 12, "completion_tokens": out, "total_tokens": 12 + out,
                 "prompt_tokens_details": {"cached_tokens": 2},
                 "completion_tokens_details": {"reasoning_tokens": 1}}
        if not stream:
            return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": usage}
        out = []
        for i in range(chunks):
            out.append((None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
                               "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}))
        if (req.get("stream_options") or {}).get("include_usage"):
            out.append((None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
                               "choices": [], "usage": usage}))
        out.append((None, "[DONE]"))
        return out

    def openai_responses(self, model, stream, req, chunks):
        resp = {"id": "resp_1", "object": "response", "created_at": 1, "model": model, "status": "completed",
                "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": "hi", "annotations": []}]}],
                "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}
        if not stream:
            return resp
        return [("response.completed", {"type": "response.completed", "sequence_number": 1, "response": resp})]

    def anthropic_answer(self, model, stream, req, chunks):
        usage = {"input_tokens": 25, "output_tokens": 15, "cache_read_input_tokens": 4,
                 "cache_creation_input_tokens": 6}
        msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
               "stop_sequence": None, "usage": usage}
        if not stream:
            return msg
        start = dict(msg, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
        out = [("message_start", {"type": "message_start", "message": start}),
               ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]
        for i in range(chunks):
            out.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"t{i} "}}))
        out += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 15}}),
                ("message_stop", {"type": "message_stop"})]
        return out

    def gemini_answer(self, model, stream, req, chunks):
        def chunk(text, final):
            c = {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}],
                 "modelVersion": model}
            c["usageMetadata"] = {"promptTokenCount": 8, "candidatesTokenCount": 3 if final else 1,
                                  "cachedContentTokenCount": 1, "thoughtsTokenCount": 2, "totalTokenCount": 13}
            if final:
                c["candidates"][0]["finishReason"] = "STOP"
            return c
        if not stream:
            return chunk("hi", True)
        return [(None, chunk(f"t{i} ", i == chunks - 1)) for i in range(chunks)]


def main():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT, KEY)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    print(server.server_address[1], flush=True)
    server.serve_forever()


main()
