"""An MCP client for tests, the official MCP Python SDK's (PyPI `mcp`), through a proxy.

usage: mcp_client.py URL PROXY CA_FILE   (PROXY `-`: none)

Prints one JSON object: the tools listed, what `search` returned, and what `delete_repo`,
reading `file:///secret/key` and getting the `leak` prompt gave (a result, or the error's
message).
"""
import asyncio
import json
import ssl
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL, PROXY, CA = sys.argv[1], sys.argv[2], sys.argv[3]


def text(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def attempt(call):
    try:
        return {"ok": await call}
    except Exception as e:  # the SDK raises the JSON-RPC error it was answered with
        return {"error": str(e)}


async def main():
    ctx = ssl.create_default_context(cafile=CA)
    http = httpx2.AsyncClient(proxy=None if PROXY == "-" else PROXY, verify=ctx, timeout=20)
    out = {}
    async with Client(streamable_http_client(URL, http_client=http)) as client:
        listed = await client.list_tools()
        out["tools"] = sorted(t.name for t in listed.tools)
        out["search"] = await attempt(client.call_tool("search", {"q": "rust"}))
        out["delete_repo"] = await attempt(client.call_tool("delete_repo", {"name": "prod"}))
        out["create_issue_other"] = await attempt(
            client.call_tool("create_issue", {"repo": "acme/secret", "title": "x"}))
        for k in ("search", "delete_repo", "create_issue_other"):
            r = out[k].get("ok")
            if r is not None:
                out[k] = {"ok": text(r), "is_error": bool(r.is_error)}
        readme = await attempt(client.read_resource("file:///docs/readme"))
        out["readme"] = "ok" if "ok" in readme else readme
        secret = await attempt(client.read_resource("file:///secret/key"))
        out["secret"] = "ok" if "ok" in secret else secret
        leak = await attempt(client.get_prompt("leak", {"text": "x"}))
        out["leak"] = "ok" if "ok" in leak else leak
    print(json.dumps(out), flush=True)


asyncio.run(main())
