"""Manual curation lists (kb.kb_rerank_curation): the writes and the listing of
``kb-rerank curate``. The request path's read of a list is :func:`.search.acurated`.

Every function runs inside the caller's tenant transaction (:func:`kb_rerank.core.session.atenant_transaction`):
the rows are the current tenant's (``kb.current_tenant()``), keyed by the query's hash.
"""

from __future__ import annotations

from uuid import UUID


async def exists(conn, query_hash: str) -> bool:
    """Whether ``query_hash`` has a curated list."""
    cur = await conn.execute("select exists (select from kb.kb_rerank_curation"
                             " where tenant_id = kb.current_tenant() and query_hash = %s)", [query_hash])
    return (await cur.fetchone())[0]


async def move(conn, old_hash: str, new_hash: str) -> int:
    """Move the list pinned under ``old_hash`` to ``new_hash`` (positions, notes and creation
    times kept; after a rotation of the query-hash key); returns the rows moved."""
    n = (await conn.execute(
        "insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id, note, created_at)"
        " select tenant_id, %s, position, chunk_id, note, created_at from kb.kb_rerank_curation"
        " where tenant_id = kb.current_tenant() and query_hash = %s", [new_hash, old_hash])).rowcount
    await conn.execute("delete from kb.kb_rerank_curation where tenant_id = kb.current_tenant()"
                 " and query_hash = %s", [old_hash])
    return n


async def append(conn, query_hash: str, chunk_ids: list[UUID], note: str | None) -> int:
    """Append ``chunk_ids``, in order, after the list's last position; returns the first
    position written."""
    cur = await conn.execute(
        "select coalesce(max(position) + 1, 0) from kb.kb_rerank_curation"
        " where tenant_id = kb.current_tenant() and query_hash = %s", [query_hash])
    start = (await cur.fetchone())[0]
    for i, chunk in enumerate(chunk_ids):
        await conn.execute(
            "insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id, note)"
            " values (kb.current_tenant(), %s, %s, %s, %s)",
            [query_hash, start + i, chunk, note],
        )
    return start


async def entries(conn, query_hash: str) -> list[tuple[int, UUID, str | None]]:
    """(position, chunk_id, note) of the list, in position order."""
    cur = await conn.execute(
        "select position, chunk_id, note from kb.kb_rerank_curation"
        " where tenant_id = kb.current_tenant() and query_hash = %s order by position", [query_hash])
    return await cur.fetchall()


async def clear(conn, query_hash: str) -> int:
    """Delete the list; returns the rows deleted."""
    cur = await conn.execute(
        "delete from kb.kb_rerank_curation where tenant_id = kb.current_tenant() and query_hash = %s",
        [query_hash])
    return cur.rowcount
