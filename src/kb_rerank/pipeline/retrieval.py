"""Candidates from the tenant's knowledge base, one tenant transaction (on a read replica when
configured: :mod:`kb_rerank.store.replicas`): the search the
source names (kb.search_hybrid fused from lists ``fusion_depth`` deep, the best
2 x ``candidates`` kept; kb.search_lexical with the BM25 parameters; kb.search_semantic),
deduplicated by chunk, optionally with each chunk's stored details, and the live pair
scores of the candidates (read in the same snapshot, keyed by the generation the request
read first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kb_rerank.candidate import Candidate
from kb_rerank.pipeline import timing
from kb_rerank.settings import Settings
from kb_rerank.store import pair_cache, replicas, search
from kb_rerank.store.session import atenant_transaction


@dataclass
class Retrieved:
    candidates: list[Candidate]
    cached_pairs: dict[pair_cache.PairKey, float] | None  # None with the pair cache off


def pair_keys(cands: list[Candidate]) -> list[pair_cache.PairKey]:
    return [pair_cache.content_key(c.chunk_id, c.content) for c in cands]


async def search_source(conn, source: str, normalized: str, embedding: Any, s: Settings) -> list[Candidate]:
    if source == "hybrid_lexical_semantic":
        # only the best 2 x candidates leave the database (the same rows as slicing here)
        rows = await search.ahybrid(conn, normalized, embedding, s.fusion_depth, **s.fusion, limit=2 * s.candidates)
    elif source == "lexical_only":
        rows = await search.alexical(conn, normalized, s.candidates, k1=s.bm25_k1, b=s.bm25_b)
    elif source == "semantic_only":
        rows = await search.asemantic(conn, embedding, s.candidates)
    else:
        raise ValueError(f"unknown source {source!r}")
    seen: set = set()
    unique = []
    for c in rows:
        if c.chunk_id not in seen:
            seen.add(c.chunk_id)
            unique.append(c)
    return unique


async def retrieve(pipe, tenant, source: str, normalized: str, embedding: Any, *, generation: int,
                   details: bool = False) -> Retrieved:
    with timing.stage("retrieve"):
        return await _retrieve(pipe, tenant, source, normalized, embedding, generation=generation, details=details)


async def _retrieve(pipe, tenant, source: str, normalized: str, embedding: Any, *, generation: int,
                    details: bool) -> Retrieved:
    s = pipe.settings
    want_pairs = s.pair_cache

    async def read(conn, on_primary: bool):
        async with atenant_transaction(conn, tenant):
            if not on_primary:
                # the answer is cached under the generation the primary gave the request: a
                # standby that has not replayed it yet would cache an older knowledge base
                cur = await conn.execute(replicas.GENERATION)
                if (await cur.fetchone())[0] < generation:
                    raise replicas.StandbyBehind
            cands = await search_source(conn, source, normalized, embedding, s)
            if details:
                await search.adetails(conn, cands)
            # on the primary, the pair scores come from the same snapshot
            cached = await read_pairs(conn, cands) if on_primary else None
        return cands, cached, on_primary

    async def read_pairs(conn, cands):
        if not (want_pairs and cands):
            return None
        return await pair_cache.get_live(conn, pipe.model_name, pipe.hash_query(normalized),
                                         pair_keys(cands), generation=generation)

    cands, cached, on_primary = await pipe.read(tenant, read)
    if not on_primary and want_pairs and cands:
        # the candidates came from a standby: pair scores are read on the primary
        async with pipe.connection(tenant) as conn:
            async with atenant_transaction(conn, tenant):
                cached = await read_pairs(conn, cands)
    return Retrieved(cands, cached)
