"""A WebSocket origin for tests, built with the `websockets` library over TLS with the test
CA's certificate.

usage: ws_server.py CERT KEY LOG SECRET (none|deflate|force)   (prints the port, then serves until killed)

Every message it receives is appended to LOG (one JSON line: path, kind, text), then answered:
`secret?` with a text carrying SECRET, `binary?` with a binary message, `close?` by closing
with 4000, anything else with `got:` and the message. A normal close's reason (1000) received is
logged too (`kind: close`). It offers no extension, so a client
that asks for compression through a proxy that strips the offer still speaks to it; with
`deflate` it accepts permessage-deflate when offered. Each log line also carries the
handshake's `Sec-WebSocket-Extensions` (`extensions`).
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.server import serve

CERT, KEY, LOG, SECRET, COMPRESSION = sys.argv[1:6]


async def handler(ws):
    path = ws.request.path
    async for message in ws:
        kind = "binary" if isinstance(message, bytes) else "text"
        text = message.hex() if kind == "binary" else message
        with open(LOG, "a") as f:
            ext = ws.request.headers.get("Sec-WebSocket-Extensions", "")
            f.write(json.dumps({"path": path, "kind": kind, "text": text, "extensions": ext}) + "\n")
        if message == "secret?":
            await ws.send(f"the key is {SECRET}.")
        elif message == "binary?":
            await ws.send(b"\x00\x01binary")
        elif message == "close?":
            await ws.close(4000, "asked to")
        else:
            await ws.send(f"got:{text}")
    # A normal close's reason the origin received (none for a close without one; the proxy's
    # own closes, 1001 and 1008, are not logged).
    rcvd = ws.protocol.close_rcvd
    if rcvd is not None and rcvd.code == 1000 and rcvd.reason:
        with open(LOG, "a") as f:
            f.write(json.dumps({"path": path, "kind": "close", "text": rcvd.reason, "code": rcvd.code}) + "\n")


async def main():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT, KEY)
    def force(connection, request, response):
        # `force`: choose permessage-deflate whether or not it was offered.
        if COMPRESSION == "force" and response.status_code == 101:
            response.headers["Sec-WebSocket-Extensions"] = "permessage-deflate"
        return response

    async with serve(handler, "127.0.0.1", 0, ssl=ctx, compression="deflate" if COMPRESSION == "deflate" else None, process_response=force) as server:
        port = server.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


asyncio.run(main())
