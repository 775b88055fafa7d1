"""An MCP server for tests, built with the official MCP Python SDK (PyPI `mcp`): its own
streamable-HTTP app over HTTPS with the test CA's certificate.

usage: mcp_server.py CERT KEY (json|sse)   (prints the port, then serves until killed)

Tools: `search`, `delete_repo`, `create_issue`, `ask_user` (elicits an answer); a resource `file:///docs/readme` and one
`file:///secret/key`; prompts `summarize` and `leak`. `json` answers POSTs with JSON bodies,
`sse` with event streams.
"""
import asyncio
import socket
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel
from mcp.server.transport_security import TransportSecuritySettings

CERT, KEY, MODE = sys.argv[1], sys.argv[2], sys.argv[3]

server = MCPServer("test-origin")


@server.tool()
def search(q: str) -> str:
    """Search the docs."""
    return f"found:{q}"


@server.tool()
def delete_repo(name: str) -> str:
    """Delete a repository."""
    return f"deleted:{name}"


@server.tool()
def create_issue(repo: str, title: str) -> str:
    """Open an issue."""
    return f"issue:{repo}:{title}"


class Answer(BaseModel):
    answer: str


@server.tool()
async def ask_user(q: str, ctx: Context) -> str:
    """Ask the client's user (an elicitation: a request from the server to the client)."""
    result = await ctx.elicit(q, schema=Answer)
    return f"asked:{result.action}:{getattr(result.data, 'answer', '')}"


@server.resource("file:///docs/readme")
def readme() -> str:
    return "the readme"


@server.resource("file:///secret/key")
def secret() -> str:
    return "the secret"


@server.prompt()
def summarize(text: str) -> str:
    return f"Summarize: {text}"


@server.prompt()
def leak(text: str) -> str:
    return f"Leak: {text}"


async def main():
    app = server.streamable_http_app(
        json_response=(MODE == "json"),
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", ssl_certfile=CERT, ssl_keyfile=KEY)
    await uvicorn.Server(config).serve(sockets=[sock])


asyncio.run(main())
