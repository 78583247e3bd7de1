"""The pair-score cache (kb.kb_rerank_pair_scores): cross-encoder scores kept per
``(tenant, model, query_hash, generation, chunk_id, content_hash)`` for ``cache_ttl_s``.

The result cache (:mod:`kb_rerank.cache.store`) is keyed by (query, source): the same query asked
with another source, or through ``/v1/kb/context``, misses it although most of its
candidates were already scored. This cache is keyed by the *pair* instead, so a pair is
scored by the model once per TTL whatever the route or source that retrieves it.

Key: the reranker's model name; ``query_hash`` = :func:`kb_rerank.core.query.query_hash` of the
normalised query (HMAC under the server's query-hash key; the text the model scores is never
stored); ``generation``: the tenant's knowledge-base generation read before the candidates
(:mod:`kb_rerank.cache.store`), so a change to the tenant's documents makes every pair score of a
chunk miss, or :data:`CALLER_DOCUMENTS_GENERATION` for ``/v2/rerank``'s caller documents,
whose scores do not depend on the knowledge base; ``chunk_id``; ``content_hash`` =
sha256 hex of the scored text (:func:`kb_rerank.core.candidate.sha256_hex`, equal to
``kb.chunks.content_hash``), so a chunk whose content changed misses and is scored again.
``/v2/rerank`` (caller documents, no chunk) uses :data:`NO_CHUNK` as the chunk id and the
sha256 of the (truncated) document text it scores.

Scores are stored as ``real``: every model score the pipeline uses goes through
:func:`as_real` first, so a score read back from the cache is bit-identical to the one the
model produced for the request that wrote it.

Append-only for the app, like the result cache: a write (kb.record_outcome, with the
answer's cache and audit rows: :mod:`kb_rerank.audit.record`) deletes the keys' *expired*
rows and those of older generations, then inserts with ``on conflict do nothing`` (a live
row written concurrently is kept).
Every function runs inside the caller's tenant transaction; RLS limits it to that tenant
and each statement also names ``kb.current_tenant()`` so the primary key serves it.
Expired rows of all tenants are evicted by ``kb.evict_expired_cache()``.
"""

from __future__ import annotations

import math
import struct
import uuid
from typing import Iterable

from kb_rerank.core.candidate import sha256_hex

NO_CHUNK = uuid.UUID(int=0)

PairKey = tuple[uuid.UUID, str]  # (chunk_id, content_hash)

# /v2/rerank scores caller-supplied texts, not knowledge-base chunks: their pair scores are
# keyed by this generation whatever the tenant's documents do.
CALLER_DOCUMENTS_GENERATION = 0

SELECT_LIVE = (
    "select p.chunk_id, p.content_hash, p.score"
    " from kb.kb_rerank_pair_scores p"
    " join unnest(%s::uuid[], %s::char(64)[]) as k(chunk_id, content_hash)"
    "   on p.chunk_id = k.chunk_id and p.content_hash = k.content_hash"
    " where p.tenant_id = kb.current_tenant() and p.model = %s and p.query_hash = %s and p.generation = %s"
    "   and p.expires_at > now()"
)


def as_real(x: float) -> float:
    """``x`` at PostgreSQL ``real`` (float32) precision, as the cache stores it."""
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def content_key(chunk_id: uuid.UUID | None, text: str) -> PairKey:
    return (chunk_id if chunk_id is not None else NO_CHUNK, sha256_hex(text))


def _unique(keys: Iterable[PairKey]) -> list[PairKey]:
    return list(dict.fromkeys(keys))


def live_scores(rows: Iterable[tuple[uuid.UUID | None, str, float | None]]) -> dict[PairKey, float]:
    """``{(chunk_id, content_hash): score}`` of the rows ``(chunk_id, scored text, score or
    None)`` read with their candidates (kb.retrieve_hybrid's pair_score), under the rule of
    :func:`get_live`: only finite scores in 0..1 count."""
    out: dict[PairKey, float] = {}
    for chunk_id, text, score in rows:
        if score is None:
            continue
        s = float(score)
        if math.isfinite(s) and 0.0 <= s <= 1.0:
            out[content_key(chunk_id, text)] = s
    return out


async def get_live(conn, model: str, query_hash: str, keys: Iterable[PairKey], *,
                   generation: int) -> dict[PairKey, float]:
    """The live scores among ``keys`` (one query, one generation), as
    ``{(chunk_id, content_hash): score}``."""
    keys = _unique(keys)
    if not keys:
        return {}
    cur = await conn.execute(SELECT_LIVE, [[k[0] for k in keys], [k[1] for k in keys], model, query_hash,
                                           generation])
    out: dict[PairKey, float] = {}
    for chunk_id, content_hash, score in await cur.fetchall():
        s = float(score)
        if math.isfinite(s) and 0.0 <= s <= 1.0:
            out[(chunk_id, str(content_hash))] = s
    return out
