"""Reads of the current tenant's documents and chunks (``kb-rerank eval``'s scratch tenants,
``GET /v1/kb/documents``, a filter's price), inside the caller's tenant transaction."""

from __future__ import annotations

from typing import Any

from kb_rerank.core.candidate import Candidate, from_row

COUNT = "select count(*) from kb.documents"
SOURCES = "select doc_id, source_uri from kb.documents"
CHUNKS_OF = (
    "select c.chunk_id, c.doc_id, d.title, left(c.content, 300), c.content"
    " from kb.chunks c join kb.documents d on d.doc_id = c.doc_id and d.tenant_id = c.tenant_id"
    " where c.doc_id = any(%s) order by c.doc_id, c.position"
)


async def count(conn) -> int:
    """The tenant's documents (also what a search filter can touch: its price, before it runs)."""
    return (await (await conn.execute(COUNT)).fetchone())[0]


async def sources(conn) -> list[tuple[Any, str]]:
    """(doc_id, source_uri) of every document."""
    return await (await conn.execute(SOURCES)).fetchall()


async def chunks_of(conn, doc_ids: list[Any]) -> list[Candidate]:
    """The chunks of these documents, in order, as candidates (no first-stage score)."""
    return [from_row(*r, 0.0) for r in await (await conn.execute(CHUNKS_OF, [doc_ids])).fetchall()]


# ``GET /v1/kb/documents``: the current tenant's documents (row-level security), keyset paged by
# source_uri (unique per tenant: the (tenant_id, source_uri) index answers the order and the seek)
_LIST = ("select doc_id, title, source_uri, language, updated_at, ingested_at from kb.documents{after}"
         " order by source_uri limit %s")
LIST_FIRST = _LIST.format(after="")
LIST_AFTER = _LIST.format(after=" where source_uri > %s")


async def alist_page(conn, limit: int, after: str | None = None) -> tuple[list[tuple], bool]:
    """Up to ``limit`` documents (doc_id, title, source_uri, language, updated_at, ingested_at) after the
    source path ``after`` (None: from the first), in source-path order, and whether more follow."""
    if after is None:
        cur = await conn.execute(LIST_FIRST, [limit + 1])
    else:
        cur = await conn.execute(LIST_AFTER, [after, limit + 1])
    rows = await cur.fetchall()
    return rows[:limit], len(rows) > limit
