"""The scoring step every endpoint shares: pair cache, cross-encoder call, fallback reason.

``score`` sends the pairs the pair cache does not hold to ``reranker.ascore`` (each distinct
key once), bounded by ``rerank_timeout_s`` and inside one of the tenant's model slots
(:mod:`kb_rerank.limits`). Any failure is a fallback *reason* (``model_not_ready`` /
``model_timeout`` / ``model_error`` / ``invalid_scores``), counted in the metrics under the
caller's ``source`` and followed by a background reload (``reload_later``); what a fallback
answer looks like stays with each endpoint. Model scores are taken at ``real`` precision
(``pair_cache.as_real``) so cached and fresh scores are bit-identical.

No Litestar import: the callers pass what they hold (service or app state).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kb_rerank.store import pair_cache
from kb_rerank.models.cross_encoder import RerankerTimeout, RerankerUnavailable

log = logging.getLogger(__name__)


@dataclass
class Scored:
    scores: list[float] | None  # one per text, None on fallback
    reason: str | None  # the fallback reason, None when served
    ms: int  # time spent in the model call (0 when the model was not called)
    # pair scores the model computed (to write into the pair cache; empty on fallback or with
    # the pair cache off)
    new_pairs: dict[pair_cache.PairKey, float] = field(default_factory=dict)


async def score(*, reranker: Any, settings: Any, metrics: Any, limits: Any, reload_later: Callable[[], None],
                query: str, texts: list[str], source: str,
                keys: list[pair_cache.PairKey] | None = None,
                cached: dict[pair_cache.PairKey, float] | None = None,
                tenant: Any = None, prepaid: bool = False, reserved: float | None = None) -> Scored:
    """Scores of ``texts`` for ``query``, or the fallback reason.

    ``keys``: the pair-cache key of each text; texts whose key is in ``cached`` are not sent
    (without keys every text is). The pairs sent are charged to ``tenant`` when the model
    slot is taken, unless the request paid for them already: ``prepaid`` (charged up front),
    or ``reserved`` (the pairs' share of ``limits.reserve_miss``, settled here to the pairs
    actually sent, before the slot is taken)."""
    known = cached or {}
    if keys is None:
        missing = list(range(len(texts)))
    else:
        missing, seen = [], set()
        for i, k in enumerate(keys):
            if k not in known and k not in seen:
                seen.add(k)
                missing.append(i)
    ready = bool(missing) and reranker is not None and getattr(reranker, "ready", True)
    if reserved is not None:
        limits.settle_pairs(tenant, reserved, len(missing) if ready else 0)
    if not texts:
        return Scored([], None, 0)
    if not missing:
        metrics.pair_scores(len(texts), 0)
        return Scored([known[k] for k in keys or ()], None, 0)
    reason: str | None = None
    ms = 0
    if not ready:
        reason = "model_not_ready"
    else:
        # one of the tenant's model slots taken before the work (429 if not)
        # (settled reserved pairs go back if the slot is refused)
        release = await limits.enter_model(tenant, len(missing), charge=not prepaid and reserved is None,
                                           paid=limits.cost_per_pair * len(missing) if reserved is not None else 0.0)
        t = time.perf_counter()
        timeout = settings.rerank_timeout_s if settings.rerank_timeout_s and settings.rerank_timeout_s > 0 else None
        try:
            raw = await asyncio.wait_for(reranker.ascore(query, [texts[i] for i in missing]), timeout)
        except (TimeoutError, asyncio.TimeoutError, RerankerTimeout):
            reason = "model_timeout"
        except RerankerUnavailable:
            reason = "model_not_ready"
        except Exception as exc:  # noqa: BLE001 - any model failure means fallback
            reason = "model_error"
            log.warning("reranker failed (%s): %s", reason, type(exc).__name__)
        finally:
            release()
            elapsed = time.perf_counter() - t
            ms = int(round(elapsed * 1000))
            metrics.model_call(elapsed, len(missing))
        if reason is None:
            try:
                fresh = [float(x) for x in raw]
            except (TypeError, ValueError):
                fresh = None
            if fresh is None or len(fresh) != len(missing) or not all(math.isfinite(x) and 0.0 <= x <= 1.0
                                                                     for x in fresh):
                reason = "invalid_scores"
    if reason is not None:
        metrics.fallback(source, reason)
        reload_later()
        return Scored(None, reason, ms)
    real = [pair_cache.as_real(x) for x in fresh]  # type: ignore[union-attr]
    new: dict[pair_cache.PairKey, float] = {}
    if keys is not None:
        new = {keys[i]: x for i, x in zip(missing, real)}
        real = [known[k] if k in known else new[k] for k in keys]
    metrics.pair_scores(len(texts) - len(missing), len(missing))
    return Scored(real, None, ms, new_pairs=new if settings.pair_cache else {})
