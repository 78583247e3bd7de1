"""``GET /schema``: the API reference page, written here from the OpenAPI document, with no
script at all; ``GET /schema/openapi.json``: the document itself.

Why not Swagger UI: Litestar's Swagger plugin loads its script and style sheet from a CDN
(no integrity hash, no Content-Security-Policy), so the page was blank without internet
access and ran third-party code on the page where users paste their tokens. No copy of the
Swagger UI or ReDoc bundle ships with this package's dependencies, so the page is plain HTML
rendered on the server: the routes, their request bodies, answers and errors, and every
schema's fields. To send requests from a browser use ``/playground`` (same origin, its own
strict policy); any OpenAPI tool can read ``/schema/openapi.json``.

The page and the document carry :data:`HEADERS`: nothing may load from another origin, no
script may run (the one inline style sheet is allowed by its hash), no framing.
``KB_DOCS_PAGE=false`` removes the page (404) and keeps the document.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any

from litestar import Request, Router
from litestar.datastructures import ResponseHeader
from litestar.exceptions import NotFoundException
from litestar.openapi.plugins import JsonRenderPlugin, OpenAPIRenderPlugin

STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
         "code,pre{font:13px ui-monospace,monospace}pre{white-space:pre-wrap}h2{border-bottom:1px solid #ccc;margin-top:2.5rem}"
         "h3 code{background:#eef;padding:.1rem .4rem}table{border-collapse:collapse;margin:.5rem 0}"
         "td,th{border:1px solid #ddd;padding:.2rem .5rem;text-align:left;vertical-align:top}")
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[1] if isinstance(ref, str) else None


def _type_text(schema: dict[str, Any]) -> str:
    """A short type for a table cell: a link for a named schema, ``a | b`` for a union."""
    name = _ref_name(schema)
    if name:
        return f'<a href="#schema-{_e(name)}">{_e(name)}</a>'
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " | ".join(_type_text(s) for s in schema[key])
    kind = schema.get("type", "")
    if isinstance(kind, list):
        kind = " | ".join(map(str, kind))
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type_text(schema['items'])}"
    if "enum" in schema:
        return _e(kind) + " (" + ", ".join(f"<code>{_e(v)}</code>" for v in schema["enum"]) + ")"
    return _e(kind or "any")


def _content_schema(content: dict[str, Any] | None) -> dict[str, Any]:
    for media in (content or {}).values():
        return media.get("schema", {})
    return {}


def _content_type(content: dict[str, Any] | None) -> str:
    return _type_text(_content_schema(content)) if content else ""


def _fields_table(schema: dict[str, Any]) -> str:
    """An object schema's fields: name, type, required, description ("" for no fields)."""
    props = schema.get("properties", {})
    if not props:
        return ""
    required = set(schema.get("required", []))
    rows = ["<table><tr><th>field</th><th>type</th><th>required</th><th>meaning</th></tr>"]
    for field, sub in props.items():
        rows.append(f"<tr><td><code>{_e(field)}</code></td><td>{_type_text(sub)}</td>"
                    f"<td>{'yes' if field in required else ''}</td><td>{_e(sub.get('description', ''))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def render_reference(openapi: dict[str, Any], json_url: str) -> str:
    """The whole page, every value from the document escaped."""
    info = openapi.get("info", {})
    out = ["<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{_e(info.get('title', 'API'))} {_e(info.get('version', ''))}</title>",
           '<link rel="icon" href="data:,">', f"<style>{STYLE}</style></head><body>",
           f"<h1>{_e(info.get('title', 'API'))} <small>{_e(info.get('version', ''))}</small></h1>",
           f"<p>{_e(info.get('description', ''))}</p>",
           f'<p>The OpenAPI document: <a href="{_e(json_url)}">{_e(json_url)}</a>. '
           'To send requests from a browser: <a href="/playground">/playground</a>.</p>']
    schemes = openapi.get("components", {}).get("securitySchemes", {})
    if schemes:
        out.append("<h2>Authentication</h2><ul>")
        for name, scheme in schemes.items():
            out.append(f"<li><code>{_e(name)}</code>: {_e(scheme.get('type', ''))} {_e(scheme.get('scheme', ''))} "
                       f"({_e(scheme.get('bearerFormat', ''))}). {_e(scheme.get('description', ''))}</li>")
        out.append("</ul>")
    out.append("<h2>Routes</h2>")
    for path, item in openapi.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            out.append(f"<h3><code>{_e(method.upper())} {_e(path)}</code></h3>")
            if op.get("summary"):
                out.append(f"<p><b>{_e(op['summary'])}</b></p>")
            if op.get("description"):
                out.append(f"<pre>{_e(op['description'])}</pre>")
            if op.get("security"):
                out.append("<p>Needs: " + ", ".join(f"<code>{_e(k)}</code>" for s in op["security"] for k in s)
                           + "</p>")
            body = op.get("requestBody")
            if isinstance(body, dict):
                out.append(f"<p>Request body: {_content_type(body.get('content'))}</p>")
                out.append(_fields_table(_content_schema(body.get("content"))))  # an inline schema's fields
            out.append("<table><tr><th>status</th><th>meaning</th><th>body</th></tr>")
            for status, resp in op.get("responses", {}).items():
                out.append(f"<tr><td>{_e(status)}</td><td>{_e(resp.get('description', ''))}</td>"
                           f"<td>{_content_type(resp.get('content'))}</td></tr>")
            out.append("</table>")
    schemas = openapi.get("components", {}).get("schemas", {})
    if schemas:
        out.append("<h2>Schemas</h2>")
    for name, schema in schemas.items():
        out.append(f'<h3 id="schema-{_e(name)}"><code>{_e(name)}</code></h3>')
        if schema.get("description"):
            out.append(f"<p>{_e(schema['description'])}</p>")
        table = _fields_table(schema)
        if table:
            out.append(table)
        elif not _ref_name(schema):
            out.append(f"<p>{_type_text(schema)}</p>")
    out.append("</body></html>")
    return "\n".join(out)


class _Headers:
    """Puts :data:`HEADERS` on every answer of the OpenAPI router (the page, the document,
    its 404s): Litestar's render plugins return bytes only, and the router's response
    headers apply to all its routes."""

    def receive_router(self, router: Router) -> None:
        router.response_headers = (*(router.response_headers or ()),
                                   *(ResponseHeader(name=k, value=v) for k, v in HEADERS.items()))


class ReferencePagePlugin(_Headers, OpenAPIRenderPlugin):
    """``/schema``: :func:`render_reference` of the app's OpenAPI document."""

    def __init__(self) -> None:
        super().__init__(path="/")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        return render_reference(openapi_schema, self.get_openapi_json_route(request)).encode()


class NoPagePlugin(_Headers, OpenAPIRenderPlugin):
    """``/schema`` when ``KB_DOCS_PAGE`` is off: 404 (Litestar would otherwise answer the root
    path with its default plugin, here the JSON document)."""

    def __init__(self) -> None:
        super().__init__(path="/")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        raise NotFoundException()


def render_plugins(docs_page: bool) -> list[OpenAPIRenderPlugin]:
    """The OpenAPI router's plugins: the document at ``/openapi.json`` always, and the page
    (or its 404) at the root path."""
    return [ReferencePagePlugin() if docs_page else NoPagePlugin(), JsonRenderPlugin()]
