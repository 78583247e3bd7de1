"""``GET /v1/kb/documents``: the tenant's documents (id, title, source path, language, updated
at), keyset paged by source path (``limit`` 1..200, default 50; ``cursor`` from the previous
page's ``next_cursor``). One tenant transaction on one of the tenant's pool connections (row-level
security: another tenant's rows are never read); the MCP server's ``kb://documents`` resource
reads it (:mod:`kb_rerank.integrations.mcp`)."""

from __future__ import annotations

import base64
import binascii
import uuid

from litestar import Request, Response, get
from litestar.datastructures import State

from kb_rerank.http.body import invalid
from kb_rerank.endpoints.schemas import ERROR_RESPONSES, DocumentItem, DocumentsResponse, query_operation
from kb_rerank.endpoints.documents import store as documents
from kb_rerank.core.session import atenant_transaction

PATH = "/v1/kb/documents"
DEFAULT_LIMIT, MAX_LIMIT = 50, 200
_MAX_CURSOR = 4096

_OPERATION = query_operation([
    {"name": "limit", "description": f"documents per page, 1..{MAX_LIMIT} (default {DEFAULT_LIMIT})",
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}},
    {"name": "cursor", "description": "the previous page's next_cursor (absent: the first page)",
     "schema": {"type": "string"}},
])


def encode_cursor(source_path: str) -> str:
    return base64.urlsafe_b64encode(source_path.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(value: str) -> str:
    if not value or len(value) > _MAX_CURSOR:
        raise invalid("cursor", "not a cursor this route gave")
    try:
        after = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise invalid("cursor", "not a cursor this route gave") from None
    if not after or "\x00" in after:  # PostgreSQL text holds no NUL
        raise invalid("cursor", "not a cursor this route gave")
    return after


def parse_limit(values: list[str]) -> int:
    if not values:
        return DEFAULT_LIMIT
    if len(values) > 1:
        raise invalid("limit", "give limit once")
    text = values[0].strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise invalid("limit", f"an integer from 1 to {MAX_LIMIT}")
    return int(text)


@get(PATH, operation_class=_OPERATION, responses={k: v for k, v in ERROR_RESPONSES.items() if k in (401, 422, 429, 503)},
     summary="The tenant's documents", description="Id, title, source path, language, own date and ingestion time of the "
     "tenant's documents, a page at a time in source-path order.")
async def documents_handler(request: Request, state: State) -> Response[DocumentsResponse]:
    scope_state = request.scope["state"]
    trace_id: str = scope_state["trace_id"]
    tenant: uuid.UUID = scope_state["tenant"]
    limit = parse_limit(request.query_params.getall("limit", []))
    cursors = request.query_params.getall("cursor", [])
    if len(cursors) > 1:
        raise invalid("cursor", "give cursor once")
    after = decode_cursor(cursors[0]) if cursors else None
    pipeline = state.pipeline
    async with pipeline.connection(tenant) as conn, atenant_transaction(conn, tenant):
        rows, more = await documents.alist_page(conn, limit, after)
    items = [DocumentItem(doc_id=str(doc_id), title=title, source_path=source, language=language,
                          updated_at=updated.isoformat(), ingested_at=ingested.isoformat())
             for doc_id, title, source, language, updated, ingested in rows]
    next_cursor = encode_cursor(rows[-1][2]) if more and rows else None
    return Response(DocumentsResponse(documents=items, next_cursor=next_cursor, trace_id=trace_id),
                    headers={"X-Trace-Id": trace_id})
