"""The MCP HTTP transport's key middleware refuses a WebSocket upgrade itself, key or not: the
MCP app behind it never sees one; HTTP and lifespan pass as before."""

from __future__ import annotations

import asyncio

import pytest

from kb_rerank.integrations.mcp import _RequireKey

KEY = "k" * 32


def _call(scope: dict) -> tuple[list[dict], list[str]]:
    reached: list[str] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    asyncio.run(_RequireKey(app, KEY)(scope, receive, send))
    return sent, reached


@pytest.mark.parametrize("headers", [[], [(b"authorization", f"Bearer {KEY}".encode())]])
def test_a_websocket_upgrade_is_refused_before_the_app(headers):
    sent, reached = _call({"type": "websocket", "path": "/mcp", "headers": headers})
    assert sent == [{"type": "websocket.close", "code": 1008}] and reached == []


def test_http_with_the_key_and_lifespan_pass():
    sent, reached = _call({"type": "http", "path": "/mcp", "headers": [(b"authorization", f"Bearer {KEY}".encode())]})
    assert reached == ["http"] and sent == []
    sent, reached = _call({"type": "http", "path": "/mcp", "headers": []})
    assert reached == [] and sent[0]["status"] == 401
    assert _call({"type": "lifespan"})[1] == ["lifespan"]
