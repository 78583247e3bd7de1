"""The flow behind ``POST /v1/kb/search/rerank`` (run by :class:`kb_rerank.endpoints.runner.Pipeline`).

Candidates: the source's search (:class:`~kb_rerank.retrieval.spec.RetrievalSpec`), or
the curated list (``manual_curation``: curated order, no model call, rank scores
``1 - i/(n+1)``). Every candidate goes to the cross-encoder; the top ``rerank_top_n`` by score
(then chunk id) are returned with the model's score in 0..1 rounded to 6 decimals. On a
fallback the candidates keep their first-stage order; a fallback is not cached.
The flow builds the :class:`~kb_rerank.endpoints.responses.RerankResponse`; the cache row holds
its ``results`` (msgspec's builtins of them, checked by :func:`kb_rerank.cache.store.valid_results`)
and the miss's ``candidate_count`` and ``reranked_count``, decoded back into the Struct.

Within the rerank budget (``KB_RERANK_BUDGET_MS``) the model may score only the first
candidates in fused order: those rank first by their scores, the rest follow in fused order
(a partial answer, not cached; each result says ``scored_by``: model | fused | curation).

Response fields: ``rerank_duration_ms`` is the time of this request's rerank step, the model
slot included (0 when the model was not called); ``candidate_count`` the candidates retrieved
by the miss that computed the answer (on a hit: the miss that filled the cache row);
``reranked_count`` those of them ranked by a model score (pair cache or model);
``partial_reason`` ``"budget"`` when the budget ended first; ``model`` the reranker that
scored at least one result (the cached row's on a hit, ``manual_curation`` for curated lists,
null on a fallback or an answer without results); ``ranked_by`` ``model`` | ``fused`` (a
fallback) | ``curation`` | ``none`` (no result). A result the model did not score (``scored_by: fused``: a fallback, or past the
budget) has ``rerank_score`` null and its first-stage ``fused_score``
(:mod:`kb_rerank.rerank.compose`, the rule of degraded answers).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from kb_rerank.core.candidate import Candidate
from kb_rerank.rerank import scoring
from kb_rerank.rerank.compose import (FUSED, answer_model, clamped, fallback_relevance, ranked_by,
                                        reported_score, rounded)
from kb_rerank.core.costs import Work
from kb_rerank.endpoints.runner import Lookup, Outcome, Selection, Served
from kb_rerank.core.query import normalize_query
from kb_rerank.endpoints.requests import RerankRequest
from kb_rerank.endpoints.responses import RerankResponse, RerankResult
from kb_rerank.retrieval.spec import CURATED, RetrievalSpec
from kb_rerank.core.settings import Settings
from kb_rerank.cache import store as result_cache

CURATION_MODEL = "manual_curation"


def _result(c: Candidate, score: float, source: str, scored_by: str) -> RerankResult:
    """A result; one the model did not score reports no ``rerank_score`` but its first-stage
    ``fused_score`` (:func:`~kb_rerank.rerank.compose.reported_score`: such results are
    never cached, so a cache row keeps the fields of a whole answer)."""
    return RerankResult(chunk_id=str(c.chunk_id), doc_id=str(c.doc_id), doc_title=c.doc_title, snippet=c.snippet,
                        rerank_score=reported_score(clamped(score), scored_by), source=source, scored_by=scored_by,
                        fused_score=rounded(c.score) if scored_by == FUSED else UNSET)


def _response(results: list[RerankResult], candidate_count: int, reranked_count: int) -> RerankResponse:
    """An answer as computed and cached: its results and the counts of the miss; the rest is
    the request's (:meth:`SearchFlow.answer`)."""
    return RerankResponse(results=results, from_cache=False, rerank_duration_ms=0, trace_id="", model=None,
                          fallback=False, fallback_reason=None, candidate_count=candidate_count,
                          reranked_count=reranked_count)


class SearchFlow:
    """``POST /v1/kb/search/rerank``."""

    tag = None
    fixed_generation = None
    keyed_on_policy = False
    admission = Work()

    def __init__(self, req: RerankRequest, settings: Settings, model: str, classifier: Any = None) -> None:
        self.req, self.settings, self.model = req, settings, model
        self.source = req.source
        self.normalized = normalize_query(req.query)
        self.top_n = int(req.top_n or settings.rerank_top_n)
        self.retrieval = RetrievalSpec.of(settings, req.source, filter=req.filter, language=req.language)
        curated = req.source == CURATED
        # the whole miss: its query embedding and every candidate's pair, at most
        self.miss = Work(embeddings=int(self.retrieval.needs_embedding), pairs=0 if curated else self.retrieval.limit)

    def params(self, policy: str | None) -> dict[str, Any]:
        # the query, the source and the configuration key the answer too; the filter is canonical
        # a named language keys it too (a detected one is the query's, already in the key)
        return {"endpoint": "search/v1", "top_n": self.top_n, "filter": self.req.filter,
                **({"language": self.req.language} if self.req.language else {})}

    def candidates(self) -> list[Candidate]:
        return []

    async def inspect(self, tools, cands: list[Candidate]) -> None:
        return None  # knowledge-base chunks were judged at ingestion; this endpoint applies no policy

    def select(self, cands: list[Candidate], policy: str) -> Selection:
        return Selection(cands, [] if self.source == CURATED else cands)

    def compose(self, look: Lookup, sel: Selection, scored: scoring.Scored) -> Outcome:
        cands, n, top_n = sel.candidates, len(sel.candidates), self.top_n
        if self.source == CURATED:
            ranks = fallback_relevance([None] * n)
            results = [_result(c, ranks[i], self.source, "curation") for i, c in enumerate(cands[:top_n])]
            return Outcome(_response(results, n, 0), n, len(results), answer_model(CURATION_MODEL, results))
        rel, by = scoring.relevance(scored, [c.score for c in cands])
        if scored.scores is None:
            order = list(range(min(n, top_n)))
        else:
            order = scoring.order([c.id for c in cands], rel)[:top_n]
        results = [_result(cands[i], rel[i], self.source, by[i]) for i in order]
        return Outcome(_response(results, n, scored.reranked), n, len(results), answer_model(self.model, results),
                       fallback_reason=scored.reason, rerank_ms=scored.ms, new_pairs=scored.new_pairs)

    def encode(self, body: RerankResponse) -> dict[str, Any]:
        return {"results": msgspec.to_builtins(body.results), "candidate_count": body.candidate_count,
                "reranked_count": body.reranked_count}

    def decode(self, payload: Any) -> RerankResponse | None:
        """A cache row: ``{"results", "candidate_count", "reranked_count"}`` (the miss's counts,
        which a hit reports), or the bare results list of a row cached before the counts were."""
        if isinstance(payload, list):
            payload = {"results": payload, "candidate_count": 0, "reranked_count": 0}
        if not isinstance(payload, dict) or set(payload) != {"results", "candidate_count", "reranked_count"}:
            return None
        counts = [payload["candidate_count"], payload["reranked_count"]]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in counts):
            return None
        if not result_cache.valid_results(payload["results"], self.settings.max_top_n):
            return None
        return _response(msgspec.convert(payload["results"], list[RerankResult]), *counts)

    def returned(self, body: RerankResponse) -> int:
        return len(body.results)

    def answer(self, served: Served, trace_id: str) -> RerankResponse:
        out, body = served.outcome, served.body
        results = body.results[: self.settings.max_top_n]
        reason = out.fallback_reason if out else None
        model = answer_model(served.model, results)
        # candidate_count and reranked_count stay the body's: a hit reports those of the miss that filled it
        return msgspec.structs.replace(
            body,
            results=results,
            from_cache=served.from_cache,
            rerank_duration_ms=max(0, int(out.rerank_ms)) if out else 0,
            trace_id=trace_id,
            model=model,
            ranked_by=ranked_by(model, reason, curated=served.model == CURATION_MODEL),
            fallback=bool(reason),
            fallback_reason=reason,
            partial_reason=out.partial if out else None,
        )
