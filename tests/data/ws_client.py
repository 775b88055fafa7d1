"""A WebSocket client for tests, the `websockets` library through an HTTP proxy (CONNECT).

usage: ws_client.py URL PROXY CAFILE MESSAGES_JSON

Opens URL through PROXY (trusting CAFILE), sends each message of MESSAGES_JSON in turn (a
string is sent as text, {"binary": HEX} as binary, {"close": REASON} closes with 1000 and
that reason, `sleep:N` sends nothing and waits N s) and waits up to 3 s for one answer to
each; prints one JSON object: `answers` (text, or {"binary": HEX}), and `close` (code and
reason) when the connection was closed, or `error` when it could not be opened.
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

URL, PROXY, CAFILE, MESSAGES = sys.argv[1:5]


async def main():
    ctx = ssl.create_default_context(cafile=CAFILE)
    out = {"answers": []}
    try:
        async with connect(URL, proxy=PROXY, ssl=ctx, open_timeout=10) as ws:
            try:
                for m in json.loads(MESSAGES):
                    if isinstance(m, dict) and "close" in m:
                        await ws.close(1000, m["close"])
                        break
                    if isinstance(m, str) and m.startswith("sleep:"):
                        try:
                            await asyncio.wait_for(ws.recv(), float(m[6:]))
                        except asyncio.TimeoutError:
                            pass
                        continue
                    await ws.send(bytes.fromhex(m["binary"]) if isinstance(m, dict) else m)
                    try:
                        a = await asyncio.wait_for(ws.recv(), 3)
                    except asyncio.TimeoutError:
                        out["answers"].append(None)
                        continue
                    out["answers"].append({"binary": a.hex()} if isinstance(a, bytes) else a)
                await ws.close()
            except ConnectionClosed:
                pass
            if ws.close_code is not None:
                out["close"] = {"code": ws.close_code, "reason": ws.close_reason}
    except InvalidStatus as e:
        out["error"] = f"status {e.response.status_code}: {e.response.body.decode(errors='replace')}"
    except Exception as e:  # noqa: BLE001 - the test reads what failed
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


asyncio.run(main())
