"""Python side of the search functions: one call each to kb.search_lexical,
kb.search_semantic and kb.search_hybrid (or kb.retrieve_hybrid, the hybrid read with its pair
scores), inside the caller's tenant transaction.

Every search takes ``filter``: a search filter (kb_rerank.filters.grammar, docs/filters.md),
passed as jsonb to the functions' ``filter`` parameter (None: no filter), which apply it inside
each candidate list. The lexical and hybrid searches take ``language``: the query's language
(named or detected: kb_rerank.retrieval.spec), None when unknown."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from psycopg.types.json import Jsonb

from kb_rerank.core.candidate import Candidate, from_row
from kb_rerank.core.settings import default
from kb_rerank.rerank import pair_cache

# The searches' defaults: the settings' declared defaults, as the SQL functions' own (rendered
# from the same declarations by kb_rerank.db.layer).
K, FUSION_DEPTH = default("candidates"), default("fusion_depth")
RRF_K, FUSION = default("rrf_k"), default("fusion_method")
LEXICAL_WEIGHT, SEMANTIC_WEIGHT = default("lexical_weight"), default("semantic_weight")
K1, B = default("bm25_k1"), default("bm25_b")

LEXICAL_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, score, rank"
    " from kb.search_lexical(%s, %s, %s, %s, %s, %s)"
)
SEMANTIC_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, score, rank"
    " from kb.search_semantic(%s::vector, %s, %s)"
)
HYBRID_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, lexical_rank, semantic_rank,"
    " lexical_score, semantic_score, score"
    " from kb.search_hybrid(%s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# The best ``limit`` rows of kb.search_hybrid, in its own order (score desc, chunk_id): the
# service keeps only 2 x ``candidates`` of the 2 x ``fusion_depth`` rows, so the rest (each
# with its chunk's content) need not cross the wire nor become Candidates.
HYBRID_TOP_SQL = HYBRID_SQL + " order by score desc, chunk_id limit %s"
# A weak guess of a query's language (%s) when the tenant's own choice for the query
# (kb.query_languages(query, tenant), under its RLS) does not hold it, else NULL
# (kb_rerank.retrieval.spec.RetrievalSpec.query_language).
WEAK_GUESS_SQL = (
    "select case when %s::text = any(kb.query_languages(%s, kb.current_tenant())) then null else %s::text end"
)
# The same rows as HYBRID_TOP_SQL, each with its live pair score (NULL: none kept, or no pair
# key given), in one statement (kb.retrieve_hybrid, retrieval/sql/retrieve_hybrid.sql): the
# service's read of a miss, instead of HYBRID_TOP_SQL and then pair_cache.SELECT_LIVE.
RETRIEVE_HYBRID_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, lexical_rank, semantic_rank,"
    " lexical_score, semantic_score, score, pair_score"
    " from kb.retrieve_hybrid(%s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
    " %s::uuid[], %s::uuid[], %s::float8[])"
)
# The hybrid read's lexical list alone (kb.search_lexical_ids), as three arrays in its rank
# order (its rank is the position): what kb.retrieve_hybrid takes instead of reading it
# (:func:`alexical_list`). Never NULL: no rows is three empty arrays.
LEXICAL_LIST_SQL = (
    "select coalesce(array_agg(chunk_id order by rank), '{}') as chunk_ids,"
    " coalesce(array_agg(doc_id order by rank), '{}') as doc_ids, coalesce(array_agg(score order by rank), '{}') as scores"
    " from kb.search_lexical_ids(%s, %s, %s, %s, %s, %s)"
)


def _lexical_rows(rows) -> list[Candidate]:
    return [from_row(*r[:6], lexical_rank=r[6], lexical_score=r[5]) for r in rows]


def _semantic_rows(rows) -> list[Candidate]:
    return [from_row(*r[:6], semantic_rank=r[6], semantic_score=r[5]) for r in rows]


def _hybrid_rows(rows) -> list[Candidate]:
    return [from_row(*r[:5], r[9], lexical_rank=r[5], semantic_rank=r[6], lexical_score=r[7], semantic_score=r[8])
            for r in rows]


def _vec(embedding: Any) -> np.ndarray:
    return np.asarray(embedding, dtype=np.float32).reshape(-1)


def _filter(filter: Mapping[str, Any] | None) -> Jsonb | None:
    return None if filter is None else Jsonb(dict(filter))


async def alexical(conn, query: str, k: int = K, *, k1: float = K1, b: float = B,
                   filter: Mapping[str, Any] | None = None, language: str | None = None) -> list[Candidate]:
    cur = await conn.execute(LEXICAL_SQL, [query, k, k1, b, _filter(filter), language])
    return _lexical_rows(await cur.fetchall())


async def alexical_list(conn, query: str, k: int, *, k1: float, b: float,
                        filter: Mapping[str, Any] | None = None,
                        language: str | None = None) -> tuple[list, list, list]:
    """kb.search_lexical_ids' rows as (chunk ids, document ids, scores), in rank order: the
    lexical list :func:`aretrieve_hybrid` takes as ``lexical`` (LEXICAL_LIST_SQL)."""
    cur = await conn.execute(LEXICAL_LIST_SQL, [query, k, k1, b, _filter(filter), language])
    chunks, docs, scores = await cur.fetchone()
    return list(chunks), list(docs), list(scores)


async def aweak_guess(conn, query: str, guess: str) -> str | None:
    """``guess`` when the tenant's own languages for ``query`` leave it out, else None
    (WEAK_GUESS_SQL)."""
    cur = await conn.execute(WEAK_GUESS_SQL, [guess, query, guess])
    return (await cur.fetchone())[0]


async def asemantic(conn, embedding, k: int = K, *, filter: Mapping[str, Any] | None = None) -> list[Candidate]:
    cur = await conn.execute(SEMANTIC_SQL, [_vec(embedding), k, _filter(filter)])
    return _semantic_rows(await cur.fetchall())


async def ahybrid(conn, query: str, embedding, k: int = FUSION_DEPTH, *, rrf_k: int = RRF_K, fusion: str = FUSION,
                  lexical_weight: float = LEXICAL_WEIGHT, semantic_weight: float = SEMANTIC_WEIGHT, k1: float = K1,
                  b: float = B, limit: int | None = None,
                  filter: Mapping[str, Any] | None = None, language: str | None = None) -> list[Candidate]:
    """kb.search_hybrid's rows; with ``limit``, only its first ``limit`` (the same rows as
    slicing the full answer)."""
    args = [query, _vec(embedding), k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b, _filter(filter),
            language]
    if limit is None:
        cur = await conn.execute(HYBRID_SQL, args)
    else:
        cur = await conn.execute(HYBRID_TOP_SQL, [*args, int(limit)])
    return _hybrid_rows(await cur.fetchall())


async def aretrieve_hybrid(conn, query: str, embedding, k: int, *, rrf_k: int, fusion: str,
                           lexical_weight: float, semantic_weight: float, k1: float, b: float, limit: int,
                           pairs: tuple[str, str] | None = None, generation: int | None = None,
                           filter: Mapping[str, Any] | None = None,
                           language: str | None = None,
                           lexical: tuple[list, list, list] | None = None) -> tuple[list[Candidate], dict | None]:
    """The first ``limit`` rows of kb.search_hybrid (the rows of :func:`ahybrid` with
    ``limit``) and, when ``pairs`` (the model and the query's pair hash) is given, their live
    pair scores under ``generation`` as :func:`kb_rerank.rerank.pair_cache.get_live` returns
    them (``{(chunk_id, content_hash): score}``); None when ``pairs`` is None. One statement.
    ``lexical``: the lexical list already read (:func:`alexical_list` with the same query, k,
    k1, b, filter and language): the statement fuses it instead of reading it, the same rows."""
    model, pair_hash = pairs if pairs is not None else (None, None)
    chunks, docs, scores = lexical if lexical is not None else (None, None, None)
    cur = await conn.execute(RETRIEVE_HYBRID_SQL, [
        query, _vec(embedding), k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b, int(limit),
        model, pair_hash, None if pairs is None else int(generation),  # type: ignore[arg-type]
        _filter(filter), language, chunks, docs, scores])
    rows = await cur.fetchall()
    cands = _hybrid_rows(rows)
    if pairs is None:
        return cands, None
    return cands, pair_cache.live_scores((c.chunk_id, c.content, r[10]) for c, r in zip(cands, rows))


# The chunk's stored guard verdict (its evidence and a person's review, materialised on the
# chunk row: no join on the query path), embedding and document metadata (the context flow).
DETAILS_SQL = (
    "select c.chunk_id, c.embedding, c.injection_flag, c.injection_score, c.injection_reasons, c.spam_flag,"
    " d.source_uri, d.authority, d.updated_at, c.injection_strong, c.injection_review"
    " from kb.chunks c join kb.documents d on d.doc_id = c.doc_id and d.tenant_id = c.tenant_id"
    " where c.chunk_id = any(%s)"
)

CURATION_SQL = (
    "select c.chunk_id, c.doc_id, d.title, left(c.content, 300), c.content"
    " from kb.kb_rerank_curation cu"
    " join kb.chunks c on c.chunk_id = cu.chunk_id and c.tenant_id = cu.tenant_id"
    " join kb.documents d on d.doc_id = c.doc_id and d.tenant_id = c.tenant_id"
    " where cu.tenant_id = kb.current_tenant() and cu.query_hash = %s"
    # a filter keeps the curated chunks of its documents only, as it does in the searches
    " and (%s::jsonb is null or c.doc_id = any (kb.search_filter_docs(%s::jsonb)))"
    " order by cu.position"
    " limit %s"
)


async def adetails(conn, cands: list[Candidate]) -> None:
    """Fill each candidate's stored guard verdict, embedding and document metadata."""
    if not cands:
        return
    cur = await conn.execute(DETAILS_SQL, [[c.chunk_id for c in cands]])
    rows = {r[0]: r for r in await cur.fetchall()}
    for c in cands:
        r = rows.get(c.chunk_id)
        if r is None:
            continue
        emb = r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1]
        c.embedding = None if emb is None else np.asarray(emb, dtype=np.float32)
        c.injection_flag, c.injection_score = bool(r[2]), float(r[3] or 0.0)
        c.injection_reasons, c.spam_flag = list(r[4] or []), bool(r[5])
        c.source_uri, c.authority, c.updated_at = r[6], float(r[7]), r[8]
        c.injection_strong, c.injection_review = bool(r[9]), r[10]


async def acurated(conn, query_hash: str, limit: int, *,
                   filter: Mapping[str, Any] | None = None) -> list[Candidate]:
    """The tenant's curated list for ``query_hash``, in curated order (within ``filter``)."""
    cur = await conn.execute(CURATION_SQL, [query_hash, _filter(filter), _filter(filter), limit])
    return [from_row(*r, 0.0) for r in await cur.fetchall()]
