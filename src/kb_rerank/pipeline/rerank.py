"""The flow behind ``POST /v1/kb/search/rerank`` (run by :class:`kb_rerank.pipeline.flow.Pipeline`,
which does the single flight, the cache read, the audit and the writes).

Key: ``(tenant, query_hash(normalised query), source)``, at the tenant's knowledge-base
generation; the cache row holds the ``results`` list.

Compute (a miss):
1. Candidates: the query is embedded on the embedder's executor (not for ``lexical_only``),
   then one tenant transaction runs kb.search_hybrid (up to 2 x ``candidates``),
   kb.search_lexical or kb.search_semantic (:mod:`.retrieval`), or reads the curated list
   (``manual_curation``: curated order, no model call, score ``1 - i/(n+1)`` for the i-th
   (from 0) of n curated chunks). With ``pair_cache`` on, the same transaction reads the
   live pair scores of the candidates.
2. Rerank outside any transaction (:func:`kb_rerank.pipeline.scoring.score`): the pairs the
   pair cache does not hold go to the model; top ``rerank_top_n`` by score desc then
   chunk_id; scores are the model's sigmoid in 0..1 rounded to 6 decimals. On a fallback
   (model not ready, error, timeout, invalid scores) the candidates keep their own (fused)
   order, score = candidate score / best clamped to 0..1 (rank based ``1 - i/(n+1)`` when
   the best is not positive); a fallback is not cached.

Costs: the whole miss (query embedding, at most ``max_pairs`` pairs) is reserved before any
work; the pairs not sent to the model are given back (:mod:`.limits`).

Response fields: ``rerank_duration_ms`` is the time of this request's model call (0 when the
model was not called); ``candidate_count`` the candidates retrieved by this request (0 on a
hit); ``model`` the reranker's name (the cached row's on a hit, ``manual_curation`` for
curated lists).
"""

from __future__ import annotations

import math
from typing import Any

from kb_rerank.candidate import Candidate
from kb_rerank.pipeline.flow import Lookup, Outcome, Pipeline, Served
from kb_rerank.pipeline.query import normalize_query
from kb_rerank.pipeline.requests import RerankRequest
from kb_rerank.pipeline.retrieval import pair_keys, retrieve
from kb_rerank.settings import Settings
from kb_rerank.store import result_cache, search
from kb_rerank.store.session import atenant_transaction

CURATION_MODEL = "manual_curation"


def _round(x: float) -> float:
    return min(1.0, max(0.0, round(float(x), 6)))


def _rank_score(i: int, n: int) -> float:
    return _round(1.0 - i / (n + 1))


def _result(c: Candidate, score: float, source: str) -> dict[str, Any]:
    return {"chunk_id": str(c.chunk_id), "doc_id": str(c.doc_id), "doc_title": c.doc_title, "snippet": c.snippet,
            "rerank_score": score, "source": source}


def fallback_results(candidates: list[Candidate], top_n: int, source: str) -> list[dict[str, Any]]:
    """Candidates in their own (fused) order; score / best score, clamped to 0..1."""
    top = candidates[:top_n]
    best = max((c.score for c in candidates if c.score is not None and math.isfinite(c.score)), default=0.0)
    out = []
    for i, c in enumerate(top):
        if best > 0 and c.score is not None and math.isfinite(c.score):
            s = _round(c.score / best)
        else:
            s = _rank_score(i, len(top))
        out.append(_result(c, s, source))
    return out


class SearchFlow:
    """``POST /v1/kb/search/rerank``."""

    tag = None
    fixed_generation = None
    keyed_on_policy = False

    def __init__(self, req: RerankRequest, settings: Settings) -> None:
        self.req = req
        self.settings = settings
        self.source = req.source
        self.normalized = normalize_query(req.query)

    def admit(self, pipe: Pipeline, tenant) -> None:
        pass  # a miss is reserved when it starts (compute): a hit costs only the guard's token

    def params(self, policy: str | None) -> None:
        return None  # the query and the source key the answer

    def encode(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return body["results"]

    def decode(self, payload: Any) -> dict[str, Any] | None:
        return {"results": payload} if result_cache.valid_results(payload, self.settings.rerank_top_n) else None

    def returned(self, body: dict[str, Any]) -> int:
        return len(body["results"])

    def answer(self, served: Served, trace_id: str) -> dict[str, Any]:
        out = served.outcome
        return {
            "results": served.body["results"][: self.settings.rerank_top_n],
            "from_cache": served.from_cache,
            "rerank_duration_ms": max(0, int(out.rerank_ms)) if out else 0,
            "trace_id": trace_id,
            "model": served.model,
            "fallback": bool(out and out.fallback_reason),
            "fallback_reason": out.fallback_reason if out else None,
            "candidate_count": out.candidate_count if out else 0,
        }

    async def compute(self, pipe: Pipeline, look: Lookup) -> Outcome:
        s, source, tenant = self.settings, self.source, look.tenant
        if source == "manual_curation":
            async def read(conn, _on_primary: bool):
                async with atenant_transaction(conn, tenant):
                    return await search.acurated(conn, look.query_hash, s.rerank_top_n)

            cands = await pipe.read(tenant, read)  # a standby's when read replicas are set
            results = [_result(c, _rank_score(i, len(cands)), source) for i, c in enumerate(cands)]
            return Outcome({"results": results}, len(cands), len(results), CURATION_MODEL)

        # the whole miss (query embedding, at most `max_pairs` pairs) is charged before any
        # work; the pairs not sent are given back by the scoring step
        max_pairs = 2 * s.candidates if source == "hybrid_lexical_semantic" else s.candidates
        reserved = pipe.limits.reserve_miss(tenant, embeddings=int(source != "lexical_only"), max_pairs=max_pairs)
        embedding = None
        if source != "lexical_only":
            # a refused embedder slot refuses the whole miss: its reservation goes back
            async with pipe.limits.embedding(tenant, charge=False, paid=pipe.limits.cost_per_embedding + reserved):
                embedding = await pipe.embed(pipe.embedder.embed_query, self.normalized)
        got = await retrieve(pipe, tenant, source, self.normalized, embedding, generation=look.generation)
        cands = got.candidates
        if not cands:
            pipe.limits.settle_pairs(tenant, reserved, 0)
            return Outcome({"results": []}, 0, 0, pipe.model_name)
        scored = await pipe.score(tenant, source, self.normalized, [c.content for c in cands], keys=pair_keys(cands),
                                  cached=got.cached_pairs, reserved=reserved)
        if scored.scores is None:
            results = fallback_results(cands, s.rerank_top_n, source)
            return Outcome({"results": results}, len(cands), len(results), pipe.model_name,
                           fallback_reason=scored.reason, rerank_ms=scored.ms)
        scores = scored.scores
        order = sorted(range(len(cands)), key=lambda i: (-scores[i], str(cands[i].chunk_id)))
        results = [_result(cands[i], _round(scores[i]), source) for i in order[: s.rerank_top_n]]
        return Outcome({"results": results}, len(cands), len(results), pipe.model_name, rerank_ms=scored.ms,
                       new_pairs=scored.new_pairs)
