"""An MCP client for tests, the official MCP Python SDK's (PyPI `mcp`), through a proxy.

usage: mcp_client.py URL PROXY CA_FILE [MODE]   (PROXY `-`: none; MODE: auto | legacy)

Prints one JSON object: the tools, resources and prompts listed, what `search` returned, and what `delete_repo`,
reading `file:///secret/key` (also as `file:///docs/../secret/key` and its percent-encoded
form) and getting the `leak` prompt gave (a result, or the error's
message); with `ask_user` listed, what it gave and what the client was asked (elicited).
"""
import asyncio
import json
import ssl
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitResult

URL, PROXY, CA = sys.argv[1], sys.argv[2], sys.argv[3]
MODE = sys.argv[4] if len(sys.argv) > 4 else "auto"


def text(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def attempt(call):
    try:
        return {"ok": await call}
    except Exception as e:  # the SDK raises the JSON-RPC error it was answered with
        return {"error": str(e)}


ELICITED = []


async def on_elicit(context, params):
    ELICITED.append(params.message)
    return ElicitResult(action="accept", content={"answer": "the user's secret"})


async def main():
    ctx = ssl.create_default_context(cafile=CA)
    http = httpx2.AsyncClient(proxy=None if PROXY == "-" else PROXY, verify=ctx, timeout=20)
    out = {}
    transport = streamable_http_client(URL, http_client=http)
    async with Client(transport, elicitation_callback=on_elicit, mode=MODE) as client:
        listed = await client.list_tools()
        out["tools"] = sorted(t.name for t in listed.tools)
        out["resources"] = sorted(str(r.uri) for r in (await client.list_resources()).resources)
        out["prompts"] = sorted(p.name for p in (await client.list_prompts()).prompts)
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
        # Outside the allowed prefix by dot segments (review round B, B1): a server that
        # resolves the URI would read file:///secret/key.
        for k, uri in (("dotted", "file:///docs/../secret/key"),
                       ("encoded", "file:///docs/%2e%2e/secret/key")):
            r = await attempt(client.read_resource(uri))
            out[k] = "ok" if "ok" in r else r
        leak = await attempt(client.get_prompt("leak", {"text": "x"}))
        out["leak"] = "ok" if "ok" in leak else leak
        if "ask_user" in out["tools"] or PROXY == "-":
            asked = await attempt(client.call_tool("ask_user", {"q": "your password?"}))
            out["ask_user"] = {"ok": text(asked["ok"])} if "ok" in asked else asked
            out["elicited"] = ELICITED
    print(json.dumps(out), flush=True)


asyncio.run(main())
