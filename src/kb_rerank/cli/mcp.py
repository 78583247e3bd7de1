"""`kb-rerank mcp`: the Model Context Protocol server (kb_rerank.integrations.mcp) for one
tenant's token. The ``mcp`` SDK is imported only when the command runs."""

from __future__ import annotations

import os
import sys

from kb_rerank.cli.common import command
from kb_rerank.core.settings import Settings

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PORT = 8765


def register(sub) -> None:
    text = ("a Model Context Protocol server (stdio or streamable HTTP) over the REST API, for one tenant's "
            "token (needs the mcp extra)")
    m = command(sub, "mcp", help=text)
    m.add_argument("--url", default=None,
                   help=f"base URL of the kb-rerank API (default KB_MCP_URL, else {DEFAULT_URL})")
    m.add_argument("--token", default=None,
                   help="the tenant's bearer token (default KB_MCP_TOKEN); the tenant is the token's")
    m.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (default) or http: streamable HTTP at http://HOST:PORT/mcp")
    m.add_argument("--host", default="127.0.0.1",
                   help="http: address to bind (default 127.0.0.1, loopback); clients send 'Authorization: Bearer"
                        " <key>' with the key KB_MCP_HTTP_KEY names (at least 24 characters), else a random one"
                        " printed on stderr at start")
    m.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"http: port (default {DEFAULT_PORT})")
    m.add_argument("--timeout", type=float, default=30.0, help="seconds per API call (default 30)")
    m.set_defaults(func=cmd_mcp)


def cmd_mcp(args, settings: Settings) -> int:
    token = args.token or os.environ.get("KB_MCP_TOKEN", "")
    if not token:
        print("kb-rerank: error: mcp needs the tenant's token: --token or KB_MCP_TOKEN", file=sys.stderr)
        return 2
    url = args.url or os.environ.get("KB_MCP_URL") or DEFAULT_URL
    from kb_rerank.integrations._client import KbRerankClient
    from kb_rerank.integrations.mcp import check_http_key, run

    key = os.environ.get("KB_MCP_HTTP_KEY") or None
    if args.transport == "http" and key is not None:
        try:
            check_http_key(key)
        except ValueError as exc:
            print(f"kb-rerank: error: {exc}", file=sys.stderr)
            return 2
    run(KbRerankClient(url, token, timeout=args.timeout), args.transport, host=args.host, port=args.port,
        http_key=key)
    return 0
