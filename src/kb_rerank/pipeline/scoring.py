"""The cross-encoder step, shared by every endpoint and by ``kb-rerank eval``.

:func:`score` sends the pairs the pair cache does not hold (each distinct key once) to
``reranker.ascore`` within ``timeout_s``, inside the slot its caller gives (the tenant's model
slot: :meth:`kb_rerank.pipeline.costs.Bill.model`). Any failure is a fallback *reason*
(``model_not_ready`` / ``model_timeout`` / ``model_error`` / ``invalid_scores``), never an
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
from kb_rerank.store import pair_cache

log = logging.getLogger(__name__)


@dataclass
class Scored:
    scores: list[float] | None  # one per text, None on fallback
    reason: str | None = None  # the fallback reason, None when served
    ms: int = 0  # time spent in the model call (0 when the model was not called)
    sent: int = 0  # pairs sent to the model
    cached: int = 0  # pair scores the pair cache gave
    # pair scores the model computed (for the pair cache; empty on fallback)
    new_pairs: dict[pair_cache.PairKey, float] = field(default_factory=dict)


def _no_slot(_pairs: int) -> AsyncContextManager[None]:
    return contextlib.nullcontext()


async def score(reranker: CrossEncoder | None, query: str, texts: Sequence[str], keys: Sequence[pair_cache.PairKey],
                cached: dict[pair_cache.PairKey, float] | None = None, *, timeout_s: float | None = None,
                slot: Callable[[int], AsyncContextManager[None]] = _no_slot) -> Scored:
    """Scores of ``texts`` (pair-cache key ``keys[i]`` each) for ``query``, or the fallback
    reason. ``slot(pairs)``: held around the model call (raising from it, a 429, propagates)."""
    known = cached or {}
    missing, seen = [], set()
    for i, k in enumerate(keys):
        if k not in known and k not in seen:
            seen.add(k)
            missing.append(i)
    if not missing:
        return Scored([known[k] for k in keys], cached=len(texts))
    if reranker is None or not reranker.ready:
        return Scored(None, "model_not_ready")
    reason: str | None = None
    raw: Any = None
    timeout = timeout_s if timeout_s and timeout_s > 0 else None
    async with slot(len(missing)):
        t = time.perf_counter()
        try:
            raw = await asyncio.wait_for(reranker.ascore(query, [texts[i] for i in missing]), timeout)
        except (TimeoutError, asyncio.TimeoutError, RerankerTimeout):
            reason = "model_timeout"
        except RerankerUnavailable:
            reason = "model_not_ready"
        except Exception as exc:  # noqa: BLE001 - any model failure means fallback
            reason = "model_error"
            log.warning("reranker failed (%s): %s", reason, type(exc).__name__)
        ms = int(round((time.perf_counter() - t) * 1000))
    fresh = _valid(raw, len(missing)) if reason is None else None
    if fresh is None:
        return Scored(None, reason or "invalid_scores", ms, sent=len(missing))
    new = {keys[i]: pair_cache.as_real(x) for i, x in zip(missing, fresh)}
    return Scored([known[k] if k in known else new[k] for k in keys], None, ms, sent=len(missing),
                  cached=len(texts) - len(missing), new_pairs=new)


def _valid(raw: Any, n: int) -> list[float] | None:
    """The model's answer as ``n`` finite scores in 0..1, or None."""
    try:
        fresh = [float(x) for x in raw]
    except (TypeError, ValueError):
        return None
    if len(fresh) != n or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in fresh):
        return None
    return fresh


def order(ids: Sequence[str], scores: Sequence[float]) -> list[int]:
    """Indices by score descending, ties broken by id (deterministic ranking)."""
    return sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
