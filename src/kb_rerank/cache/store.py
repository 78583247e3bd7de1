"""The rerank cache (kb.kb_rerank_cache), append-only for the app role.

The app role has SELECT, INSERT and DELETE on the table, never UPDATE: an entry is
never changed in place. A write (kb.record_outcome, with the answer's pair scores and audit
row: :mod:`kb_rerank.audit.record`) first deletes the key's *expired* rows and those of older
generations, then inserts with ``on conflict (tenant_id, query_hash, source, generation) do
nothing``, so a live row written by a concurrent request (another process) is kept, not
overwritten.

Every function here runs inside the caller's tenant transaction (:func:`kb_rerank.core.session.atenant_transaction`);
RLS limits it to that tenant, and each statement also names ``kb.current_tenant()`` so
the unique index serves the lookup.

Generation: every row carries the tenant's knowledge-base generation
(``kb.kb_generation``, bumped in the same transaction by every statement that changes the
tenant's documents or chunks) and is found only at that generation. :func:`get_live` /
:func:`lookup` read the generation and the row in ONE statement (one snapshot), before the
request reads any candidate; the answer is then written under that generation. So an
answer computed from data read before a delete or re-ingest committed is stored under the
old generation and no reader at the new one ever sees it; the data an answer was computed
from is never older than the generation it is stored under. A write also drops the key's
rows of older generations (dead: generations only grow).

``results_jsonb`` holds the answer (never the query text): the search endpoint's ``results``
list (:func:`valid_results` checks its shape), or ``{"kind", "response"}`` for the context and
caller-documents endpoints. Each flow decodes its rows; a row it cannot decode is treated as a
miss and deleted, and the request then writes a fresh one.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

# the fields of a cached search result (a row without ``scored_by``, written before it existed,
# misses once and is written again)
RESULT_FIELDS = ("chunk_id", "doc_id", "doc_title", "snippet", "rerank_score", "source", "scored_by")
SCORED_BY = ("model", "fused", "curation")

# The tenant's generation (0 without a row), or the one the caller fixes (``%s`` not null),
# and the live row of the key at that generation, in one statement.
LOOKUP = (
    "select g.generation, c.cache_id, c.results_jsonb, c.model, c.trace_id"
    " from (select coalesce(%s::bigint,"
    "        (select generation from kb.kb_generation where tenant_id = kb.current_tenant()), 0) as generation) g"
    " left join kb.kb_rerank_cache c"
    "   on c.tenant_id = kb.current_tenant() and c.query_hash = %s and c.source = %s"
    "  and c.generation = g.generation and c.expires_at > now()"
)
DELETE_ROW = "delete from kb.kb_rerank_cache where cache_id = %s"
DELETE_SOURCE = "delete from kb.kb_rerank_cache where tenant_id = kb.current_tenant() and source = %s"


# What a row's results_jsonb holds: the search endpoint's results list, or an object
# {"kind", "response"} (the context and caller-documents endpoints), decoded by each flow.
Json = list[Any] | dict[str, Any]


@dataclass(frozen=True)
class CacheEntry:
    cache_id: uuid.UUID
    body: Any  # the flow's decoded answer
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
        if item["scored_by"] not in SCORED_BY:
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


async def lookup(conn, query_hash: str, source: str, *, generation: int | None = None) -> tuple[int, tuple | None]:
    """``(generation, row)``: the tenant's current generation (or ``generation`` when the
    caller fixes it: answers that do not depend on the knowledge base) and the key's live row
    at it, ``(cache_id, results_jsonb, model, trace_id)``, or None."""
    cur = await conn.execute(LOOKUP, [generation, query_hash, source])
    row = await cur.fetchone()
    gen = int(row[0])
    return gen, (None if row[1] is None else tuple(row[1:]))


async def get_live(conn, query_hash: str, source: str, *, decode: Callable[[Any], Any | None],
                   generation: int | None = None) -> tuple[int, CacheEntry | None]:
    """``(generation, entry)``: the tenant's generation (or ``generation``) and its live entry
    for the key at that generation, or None. ``decode`` turns the row's JSON into the answer
    (None when malformed: the row is deleted and reported as a miss, so the caller's next
    write replaces it)."""
    gen, row = await lookup(conn, query_hash, source, generation=generation)
    if row is None:
        return gen, None
    cache_id, payload, model, trace_id = row
    body = decode(payload)
    if body is None:
        log.warning("cache row %s for query_hash=%s source=%s is malformed: deleted, treated as a miss",
                    cache_id, query_hash, source)
        await conn.execute(DELETE_ROW, [cache_id])
        return gen, None
    return gen, CacheEntry(cache_id, body, model, trace_id)


async def invalidate(conn, source: str) -> int:
    """Drop the tenant's cached answers of ``source``, every key and generation (used by
    ``kb-rerank curate`` after changing a list: a key hashes the app's configuration with the
    query, which the CLI does not know, and curated answers cost no model call to rebuild)."""
    return (await conn.execute(DELETE_SOURCE, [source])).rowcount
