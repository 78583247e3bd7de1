"""The flow behind ``POST /v1/kb/context``: ranked, guarded context for a language model
(run by :class:`kb_rerank.endpoints.runner.Pipeline`). The flow builds the
:class:`~kb_rerank.endpoints.responses.ContextResponse`; the cache row holds
``{"kind": "kb_context_v3", "response": ...}`` encoded from it; the key adds the tenant's
injection policy.

1. Candidates: kb.search_hybrid with the chunks' stored guard flags, embeddings and document
   metadata (:class:`~kb_rerank.retrieval.spec.RetrievalSpec`, ``details``).
2. Gate ("nothing relevant"), separate from fusion: best semantic similarity below
   ``gate_min_similarity`` and no lexical hit -> ``answerable: false``, no results, the
   model is not called.
3. Guard policy (:mod:`.guard_policy`): flagged chunks excluded / demoted / allowed per the
   tenant's policy, keyword-stuffed ones demoted; reported in ``filtered``.
4. Cut-off: at most ``rerank_max_candidates`` by fused score (desc, chunk_id) go to the
   cross-encoder (a fallback ranks by :func:`~kb_rerank.rerank.compose.fallback_relevance`
   and is not cached).
5. MMR + composite (:mod:`.diversify`) over the reranked candidates, tiers from
   ``tier_high`` / ``tier_medium``, the top ``top_n`` assembled by :mod:`.prompt`. A result
   the model did not score (``scored_by: fused``) has ``rerank_score`` / ``scores.rerank`` /
   ``ranks.rerank``, ``final_score`` / ``scores.final`` and ``tier`` null (its place is its
   ``rank``); a fallback answer has ``model`` null and ``ranked_by: "fused"``, an answer
   without results (none found, the gate closed, nothing relevant) ``model`` null and
   ``ranked_by: "none"`` (:mod:`kb_rerank.rerank.compose`, the rule of degraded answers).
"""

from __future__ import annotations

from typing import Any, Mapping

import msgspec
import numpy as np
from msgspec import UNSET

from kb_rerank.core.candidate import Candidate
from kb_rerank.rerank import diversify
from kb_rerank.endpoints.context import prompt
from kb_rerank.rerank.compose import (NOTHING, answer_model, rank_map, ranked_by, reported_score, reported_tier,
                                        rounded)
from kb_rerank.core.costs import Work
from kb_rerank.endpoints.runner import Lookup, Outcome, Selection, Served, StoredResponse
from kb_rerank.guard.policy import apply as apply_policy
from kb_rerank.core.query import normalize_query
from kb_rerank.endpoints.requests import ContextRequest
from kb_rerank.endpoints.responses import (Boosts, ChunkFlags, ContextRanks, ContextResponse, ContextResult,
                                         ContextScores, ContextStage, FilteredChunk, Gate, Mmr, ScoreRank)
from kb_rerank.retrieval.spec import RetrievalSpec
from kb_rerank.rerank import scoring
from kb_rerank.rerank.scoring import Scored
from kb_rerank.core.settings import Settings

SOURCE = "hybrid_lexical_semantic"
CACHE_KIND = "kb_context_v3"  # a new kind whenever the stored answer changes shape: older rows miss


class ContextFlow(StoredResponse):
    """``POST /v1/kb/context``."""

    source = SOURCE
    cache_kind = CACHE_KIND
    response_type = ContextResponse
    tag = "context"
    fixed_generation = None
    keyed_on_policy = True
    admission = Work()

    def __init__(self, req: ContextRequest, settings: Settings, model: str, classifier: Any = None) -> None:
        self.req, self.settings, self.model = req, settings, model
        self.normalized = normalize_query(req.query)
        self.top_n = int(req.top_n or settings.context_top_n)
        self.lam = float(settings.mmr_lambda if req.lam is None else req.lam)
        self.retrieval = RetrievalSpec.of(settings, SOURCE, details=True, filter=req.filter, language=req.language)
        # the query embedding and the pairs of the cut-off, at most
        self.miss = Work(embeddings=1, pairs=min(self.retrieval.limit, max(1, settings.rerank_max_candidates)))

    def params(self, policy: str | None) -> Mapping[str, Any]:
        req = self.req
        return {
            "endpoint": "context/v1", "top_n": self.top_n, "lambda": self.lam,
            "recency_weight": req.recency_weight, "half_life_days": req.half_life_days,
            "authority_weight": req.authority_weight, "explain": req.explain, "injection_policy": policy,
            "filter": req.filter,  # canonical (kb_rerank.endpoints.parse)
            **({"language": req.language} if req.language else {}),  # named; a detected one is the query's
        }

    def answer(self, served: Served, trace_id: str) -> ContextResponse:
        if served.from_cache:
            # the miss's counts (candidate_count, reranked_count) as it reported them; the model
            # by the one rule also for a row cached before it named none for an empty answer
            body = served.body
            model = answer_model(body.model, body.results)
            return msgspec.structs.replace(body, model=model, ranked_by=ranked_by(model, body.fallback_reason),
                                           from_cache=True, trace_id=trace_id, rerank_duration_ms=0)
        return msgspec.structs.replace(served.body, from_cache=False, trace_id=trace_id)

    def candidates(self) -> list[Candidate]:
        return []

    async def inspect(self, tools, cands: list[Candidate]) -> None:
        return None  # the chunks' verdicts were stored at ingestion

    def select(self, cands: list[Candidate], policy: str) -> Selection:
        s = self.settings
        best_sim = max((c.semantic_score for c in cands if c.semantic_score is not None), default=None)
        lexical_hits = sum(1 for c in cands if c.lexical_rank is not None)
        closed = lexical_hits == 0 and (best_sim is None or best_sim < s.gate_min_similarity)
        gate = Gate(closed=closed, best_similarity=rounded(best_sim), lexical_hits=lexical_hits,
                    threshold=s.gate_min_similarity)
        if not cands or closed:
            return Selection(cands, [], note={"gate": gate})
        kept, filtered = apply_policy(cands, policy, s.demote_factor, lambda c: {"chunk_id": c.id})
        kept.sort(key=lambda c: (-(c.score if c.score is not None else 0.0), c.id))
        return Selection(cands, kept[: max(1, s.rerank_max_candidates)], kept, filtered, {"gate": gate})

    def compose(self, look: Lookup, sel: Selection, scored: Scored) -> Outcome:
        req, cands, cut, kept = self.req, sel.candidates, sel.chosen, sel.kept
        gate: Gate = sel.note["gate"]
        filtered = msgspec.convert(sel.filtered, list[FilteredChunk])
        if not cut:
            detail = "context;gate_closed" if gate.closed else ("context;unanswerable" if cands else "context")
            body = ContextResponse(
                answerable=False, results=[], filtered=filtered, gate=gate, context=prompt.build_context_block([]),
                system_prompt=prompt.system_prompt(0), model=None, ranked_by=NOTHING, fallback=False,
                fallback_reason=None, candidate_count=len(cands), reranked_count=0, partial_reason=None,
                rerank_duration_ms=0, lam=self.lam, injection_policy=look.policy,
                stages=[] if req.explain else UNSET, from_cache=False, trace_id="")
            return Outcome(body, len(cands), 0, None, detail=detail)
        rel, by = scoring.relevance(scored, [c.score for c in cut])
        for c, r, b in zip(cut, rel, by):
            c.relevance, c.scored_by = float(r), b
        ranked = diversify.composite(cut, _embeddings(cut), lam=self.lam, k=len(cut),
                                     recency_weight=req.recency_weight, half_life_days=req.half_life_days,
                                     authority_weight=req.authority_weight)
        fused_rank = {c.id: i + 1 for i, c in enumerate(kept)}
        rerank_rank = rank_map([c.id for c in cut], [reported_score(c.relevance, c.scored_by) for c in cut])
        results, passages = self._results(ranked, cut, fused_rank, rerank_rank, self.top_n)
        model = answer_model(self.model, results)
        body = ContextResponse(
            answerable=bool(results), results=results, filtered=filtered, gate=gate,
            context=prompt.build_context_block(passages), system_prompt=prompt.system_prompt(len(passages)),
            model=model, ranked_by=ranked_by(model, scored.reason),
            fallback=bool(scored.reason), fallback_reason=scored.reason or None, candidate_count=len(cands),
            reranked_count=scored.reranked, partial_reason=scored.partial, rerank_duration_ms=scored.ms,
            lam=self.lam, injection_policy=look.policy,
            stages=self._stages(ranked, cut, kept, cands, sel.filtered, fused_rank, rerank_rank, self.top_n)
            if req.explain else UNSET,
            from_cache=False, trace_id="")
        return Outcome(body, len(cands), len(results), model, fallback_reason=scored.reason,
                       rerank_ms=scored.ms, new_pairs=scored.new_pairs,
                       detail="context" if results else "context;unanswerable")

    def _results(self, ranked, cut: list[Candidate], fused_rank: dict[str, int], rerank_rank: dict[str, int],
                 top_n: int):
        results, passages = [], []
        for pos, r in enumerate(ranked[:top_n]):
            c = cut[r.index]
            passage = prompt.Passage(text=c.content, source=c.source_uri, title=c.doc_title)
            passages.append(passage)
            results.append(ContextResult(
                rank=pos + 1,
                chunk_id=c.id, doc_id=str(c.doc_id), doc_title=passage.fenced_title,
                source_path=c.source_uri, snippet=c.snippet, text=passage.fenced,
                final_score=reported_score(r.final_score, c.scored_by),
                tier=reported_tier(r.final_score, c.scored_by, self.settings),
                rerank_score=reported_score(c.relevance, c.scored_by),
                scores=ContextScores(lexical=rounded(c.lexical_score), semantic=rounded(c.semantic_score),
                                     fused=rounded(c.score), rerank=reported_score(c.relevance, c.scored_by),
                                     final=reported_score(r.final_score, c.scored_by)),
                ranks=ContextRanks(lexical=c.lexical_rank, semantic=c.semantic_rank, fused=fused_rank[c.id],
                                   rerank=rerank_rank.get(c.id), final=pos + 1),
                mmr=Mmr(penalty=r.mmr_penalty, max_sim=r.max_sim),
                boosts=Boosts(recency=rounded(r.recency_boost), authority=rounded(r.authority_boost)),
                flags=ChunkFlags(injection=c.injection_flag, spam=c.spam_flag, demoted=c.demote < 1.0),
                citation=pos + 1,
                scored_by=c.scored_by,
            ))
        return results, passages

    def _stages(self, ranked, cut, kept, cands, filtered, fused_rank: dict[str, int], rerank_rank: dict[str, int],
                top_n: int) -> list[ContextStage]:
        by_id = {cut[r.index].id: (pos + 1, r) for pos, r in enumerate(ranked)}
        in_cut = {c.id for c in cut}
        stages = []
        for c in kept:
            final_rank, r = by_id.get(c.id, (None, None))
            stages.append(ContextStage(
                chunk_id=c.id,
                lexical=ScoreRank(rounded(c.lexical_score), c.lexical_rank),
                semantic=ScoreRank(rounded(c.semantic_score), c.semantic_rank),
                fused=ScoreRank(rounded(c.score), fused_rank[c.id]),
                rerank=ScoreRank(reported_score(c.relevance, c.scored_by) if c.id in in_cut else None,
                                 rerank_rank.get(c.id)),
                mmr=Mmr(r.mmr_penalty if r else None, r.max_sim if r else None),
                final=ScoreRank(reported_score(r.final_score, c.scored_by) if r else None, final_rank),
                selected=(final_rank or top_n + 1) <= top_n,
                cut_off=c.id not in in_cut,
                demote=rounded(c.demote),
            ))
        excluded = {f["chunk_id"]: f["reason"] for f in filtered if f.get("action") == "excluded"}
        for c in cands:
            if c.id in excluded:
                stages.append(ContextStage(
                    chunk_id=c.id,
                    lexical=ScoreRank(rounded(c.lexical_score), c.lexical_rank),
                    semantic=ScoreRank(rounded(c.semantic_score), c.semantic_rank),
                    fused=ScoreRank(rounded(c.score), None),
                    rerank=ScoreRank(None, None), mmr=Mmr(None, None),
                    final=ScoreRank(None, None), selected=False, cut_off=False,
                    excluded=excluded[c.id],
                ))
        return stages


def _embeddings(cands: list[Candidate]) -> np.ndarray:
    """The candidates' stored embeddings as rows (a zero row where one is missing)."""
    dim = max((c.embedding.shape[0] for c in cands if c.embedding is not None), default=1)
    return np.stack([c.embedding if c.embedding is not None and c.embedding.shape[0] == dim
                     else np.zeros(dim, np.float32) for c in cands])
