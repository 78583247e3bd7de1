"""The cross-encoder step, shared by every endpoint and by ``kb-rerank eval``.

:func:`score` sends the pairs the pair cache does not hold (each distinct key once) to the
model, inside the slot its caller gives (the tenant's model slot:
:meth:`kb_rerank.core.costs.Bill.model`): within the rerank budget (``KB_RERANK_BUDGET_MS``,
as many as fit, in fused order: a *partial* answer) where the model can stop at a deadline,
else all of them within ``timeout_s``. Any failure is a fallback *reason* (``model_not_ready``
/ ``model_failed`` / ``model_absent`` / ``model_timeout`` / ``model_error`` / ``invalid_scores`` / ``model_budget``), never an
exception. Model scores are taken at ``real`` precision (:func:`pair_cache.as_real`) so cached
and fresh scores are bit-identical. :func:`order` is the one ranking of scored candidates
(score descending, then id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncContextManager, Callable, Sequence

from kb_rerank.models import CrossEncoder
from kb_rerank.models.cross_encoder import RerankerTimeout, RerankerUnavailable
from kb_rerank.rerank.compose import fallback_relevance
from kb_rerank.rerank import pair_cache

log = logging.getLogger(__name__)


@dataclass
class Scored:
    scores: list[float] | None  # one per text, None on fallback
    reason: str | None = None  # the fallback reason, None when served
    ms: int = 0  # time of the rerank step: the model slot and the model call (0 when the model was not called)
    sent: int = 0  # pairs the model scored in this call
    cached: int = 0  # pair scores the pair cache gave
    # pair scores the model computed (for the pair cache; empty on fallback)
    new_pairs: dict[pair_cache.PairKey, float] = field(default_factory=dict)
    # which texts have a model score (None: all of them, or none on a fallback)
    by_model: list[bool] | None = None
    partial: str | None = None  # "budget" when the budget ended with texts unscored
    slot_pairs: int = 0  # the pairs the model slot was taken (and paid) for

    @property
    def reranked(self) -> int:
        """Texts ranked by a model score (the pair cache's or this call's)."""
        if self.scores is None:
            return 0
        return len(self.scores) if self.by_model is None else sum(self.by_model)

    def is_model(self, i: int) -> bool:
        return self.scores is not None and (self.by_model is None or self.by_model[i])


def budgeted(reranker: Any, budget_ms: float) -> bool:
    """Whether ``reranker`` scores within ``budget_ms``: a budget is set and the model can stop
    at a deadline (``ascore_until``: the in-process backends)."""
    return bool(budget_ms and budget_ms > 0) and reranker is not None and hasattr(reranker, "ascore_until")


def budget_pairs(reranker: Any, budget_ms: float) -> int | None:
    """How many pairs ``reranker`` can score within ``budget_ms`` by its measured cost, None when
    nothing bounds them (no budget, a remote model, or no measure yet)."""
    cost = getattr(reranker, "cost", None)
    if not budgeted(reranker, budget_ms) or cost is None or not getattr(cost, "calibrated", False):
        return None
    return cost.pairs_within(budget_ms)


def not_ready_reason(reranker: Any) -> str:
    """Why a model cannot score now: ``model_absent`` (none configured), ``model_failed`` (its
    load failed: no retry helps until an operator acts), else ``model_not_ready`` (loading)."""
    if reranker is None:
        return "model_absent"
    return "model_failed" if getattr(reranker, "state", None) == "failed" else "model_not_ready"


def _no_slot(_pairs: int) -> AsyncContextManager[None]:
    return contextlib.nullcontext()


def partial_relevance(values: Sequence[float | None]) -> list[float]:
    """A partial answer's scores: the model's where it scored, and below the lowest of those,
    for the ``u`` texts it did not reach (in the order given: the fused order), ``m * (u + 1 -
    j) / (u + 1)`` for the ``j``-th, ``m`` being the lowest model score. So every score stays
    in 0..1, every unscored text ranks below every scored one, and the unscored keep their
    fused order. Not a relevance, only their order: the answer reports no relevance for them
    (``scored_by: fused``, :func:`kb_rerank.rerank.compose.reported_score`)."""
    scored = [v for v in values if v is not None]
    floor = min(scored) if scored else 1.0
    u = sum(v is None for v in values)
    out, j = [], 0
    for v in values:
        if v is None:
            j += 1
            out.append(floor * (u + 1 - j) / (u + 1))
        else:
            out.append(float(v))
    return out


async def score(reranker: CrossEncoder | None, query: str, texts: Sequence[str], keys: Sequence[pair_cache.PairKey],
                cached: dict[pair_cache.PairKey, float] | None = None, *, timeout_s: float | None = None,
                budget_ms: float = 0, slot: Callable[[int], AsyncContextManager[None]] = _no_slot) -> Scored:
    """Scores of ``texts`` (pair-cache key ``keys[i]`` each, in the order the model should
    take them: the fused order) for ``query``, or the fallback reason.

    ``budget_ms > 0`` with a model that can stop at a deadline (``ascore_until``: the in-process
    backends): the step (slot wait included) ends by ``budget_ms``; the pairs the pair cache
    holds come free, the model scores the others in order while time is left, and the texts
    it did not reach get :func:`partial_relevance` (``partial="budget"``). When no text at all
    got a model score, that is the fallback ``model_budget``. Otherwise (remote servers, test
    doubles, eval) the model scores every pair within ``timeout_s``.
    ``slot(pairs)``: held around the model call (raising from it, a 429, propagates)."""
    t = time.perf_counter()
    known = cached or {}
    missing, seen = [], set()
    for i, k in enumerate(keys):
        if k not in known and k not in seen:
            seen.add(k)
            missing.append(i)
    if not missing:
        return Scored([known[k] for k in keys], cached=len(texts))
    if reranker is None or not reranker.ready:
        return Scored(None, not_ready_reason(reranker))
    until = reranker.ascore_until if budgeted(reranker, budget_ms) else None
    reason: str | None = None
    raw: Any = None
    timeout = timeout_s if timeout_s and timeout_s > 0 else None
    cap = budget_pairs(reranker, budget_ms)
    expect = len(missing) if cap is None else min(len(missing), cap)
    deadline = time.monotonic() + budget_ms / 1000.0
    async with slot(expect):
        sent = [texts[i] for i in missing]
        try:
            if until is not None:
                raw = await until(query, sent, deadline, timeout_s=timeout)
            else:
                raw = await asyncio.wait_for(reranker.ascore(query, sent), timeout)
        except (TimeoutError, asyncio.TimeoutError, RerankerTimeout):
            reason = "model_timeout"
        except RerankerUnavailable:
            reason = not_ready_reason(reranker)
        except Exception as exc:  # noqa: BLE001 - any model failure means fallback
            reason = "model_error"
            log.warning("reranker failed (%s): %s", reason, type(exc).__name__)
    ms = int(round((time.perf_counter() - t) * 1000))
    fresh = _valid(raw, len(missing), prefix=until is not None) if reason is None else None
    if fresh is None:
        return Scored(None, reason or "invalid_scores", ms, sent=0, slot_pairs=expect)
    new = {keys[i]: pair_cache.as_real(x) for i, x in zip(missing, fresh)}
    values = [known[k] if k in known else new.get(k) for k in keys]
    n_cached = sum(k in known for k in keys)
    if all(v is None for v in values):
        return Scored(None, "model_budget", ms, sent=0, slot_pairs=expect)
    if any(v is None for v in values):
        return Scored(partial_relevance(values), None, ms, sent=len(fresh), cached=n_cached, new_pairs=new,
                      by_model=[v is not None for v in values], partial="budget", slot_pairs=expect)
    return Scored([float(v) for v in values], None, ms, sent=len(fresh), cached=n_cached, new_pairs=new,
                  slot_pairs=expect)


def relevance(scored: Scored, first_stage: Sequence[float | None]) -> tuple[list[float], list[str]]:
    """Each text's ranking value and what it is (``"model"`` | ``"fused"``): the scores, or on a
    fallback :func:`~kb_rerank.rerank.compose.fallback_relevance` of ``first_stage`` (an
    order, never reported as a relevance: :func:`~kb_rerank.rerank.compose.reported_score`)."""
    if scored.scores is None:
        return fallback_relevance(list(first_stage)), ["fused"] * len(first_stage)
    return list(scored.scores), ["model" if scored.is_model(i) else "fused" for i in range(len(scored.scores))]


def _valid(raw: Any, n: int, *, prefix: bool = False) -> list[float] | None:
    """The model's answer as ``n`` finite scores in 0..1 (``prefix``: at most ``n``), or None."""
    try:
        fresh = [float(x) for x in raw]
    except (TypeError, ValueError):
        return None
    if (len(fresh) > n if prefix else len(fresh) != n) or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in fresh):
        return None
    return fresh


def order(ids: Sequence[str], scores: Sequence[float]) -> list[int]:
    """Indices by score descending, ties broken by id (deterministic ranking)."""
    return sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
