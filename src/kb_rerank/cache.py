"""The rerank cache (kb.kb_rerank_cache), append-only for the app role.

The app role has SELECT, INSERT and DELETE on the table, never UPDATE: an entry is
never changed in place. A write first deletes the key's *expired* row (if any) and then
inserts with ``on conflict (tenant_id, query_hash, source) do nothing``, so a live row
written by a concurrent request (another process) is kept, not overwritten.

Every function runs inside the caller's tenant transaction (``db.atenant_transaction``);
RLS limits it to that tenant, and each statement also names ``kb.current_tenant()`` so
the unique index serves the lookup.

``results_jsonb`` holds the response's ``results`` list only (never the query text).
A row whose ``results_jsonb`` does not have that shape (see :func:`valid_results`) is
treated as a miss and deleted, and the request then writes a fresh one.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

log = logging.getLogger("kb_rerank.cache")

RESULT_FIELDS = ("chunk_id", "doc_id", "doc_title", "snippet", "rerank_score", "source")

SELECT_LIVE = (
    "select cache_id, results_jsonb, model, trace_id, cached_at, expires_at"
    " from kb.kb_rerank_cache"
    " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s and expires_at > now()"
)
DELETE_ROW = "delete from kb.kb_rerank_cache where cache_id = %s"
DELETE_EXPIRED = (
    "delete from kb.kb_rerank_cache"
    " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s and expires_at <= now()"
)
INSERT = (
    "insert into kb.kb_rerank_cache"
    " (cache_id, tenant_id, query_hash, source, results_jsonb, cached_at, expires_at, trace_id, model)"
    " values (%s, kb.current_tenant(), %s, %s, %s, now(), now() + make_interval(secs => %s), %s, %s)"
    " on conflict (tenant_id, query_hash, source) do nothing"
)
DELETE_KEY = (
    "delete from kb.kb_rerank_cache"
    " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s"
)


@dataclass(frozen=True)
class CacheEntry:
    cache_id: uuid.UUID
    results: list[dict[str, Any]]
    model: str | None
    trace_id: str | None


def valid_results(value: Any, max_results: int) -> bool:
    """Whether a stored ``results_jsonb`` is a list (at most ``max_results``) of objects
    carrying exactly the response fields with the right types and a score in 0..1."""
    if not isinstance(value, list) or len(value) > max_results:
        return False
    seen: set[str] = set()
    for item in value:
        if not isinstance(item, dict) or set(item) != set(RESULT_FIELDS):
            return False
        for key in ("chunk_id", "doc_id"):
            try:
                uuid.UUID(str(item[key]))
            except (ValueError, TypeError):
                return False
        if not isinstance(item["doc_title"], str) or not isinstance(item["snippet"], str):
            return False
        if not isinstance(item["source"], str):
            return False
        score = item["rerank_score"]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            return False
        if not math.isfinite(score) or not 0.0 <= score <= 1.0:
            return False
        if item["chunk_id"] in seen:
            return False
        seen.add(item["chunk_id"])
    return True


async def get_live(conn, query_hash: str, source: str, *, max_results: int) -> CacheEntry | None:
    """The tenant's live entry for the key, or None. A malformed live row is deleted
    (and reported as a miss), so the caller's next write replaces it."""
    cur = await conn.execute(SELECT_LIVE, [query_hash, source])
    row = await cur.fetchone()
    if row is None:
        return None
    cache_id, results, model, trace_id = row[0], row[1], row[2], row[3]
    if not valid_results(results, max_results):
        log.warning("cache row %s for query_hash=%s source=%s is malformed: deleted, treated as a miss",
                    cache_id, query_hash, source)
        await conn.execute(DELETE_ROW, [cache_id])
        return None
    return CacheEntry(cache_id, results, model, trace_id)


async def put(conn, query_hash: str, source: str, results: list[dict[str, Any]], *, ttl_s: float,
              trace_id: str, model: str | None) -> bool:
    """Append the entry: delete the key's expired row, insert; a live row written
    meanwhile wins (``do nothing``). Returns whether this call inserted the row."""
    await conn.execute(DELETE_EXPIRED, [query_hash, source])
    cur = await conn.execute(
        INSERT, [uuid.uuid4(), query_hash, source, Jsonb(results), float(ttl_s), trace_id, model]
    )
    return cur.rowcount == 1


def invalidate(conn, query_hash: str, source: str) -> int:
    """Drop the key's entry (sync; used by ``kb-rerank curate`` after changing a list)."""
    return conn.execute(DELETE_KEY, [query_hash, source]).rowcount
