"""Small rules the flows share when they compose an answer: rounding for the wire, the
fallback relevance (the order without the model), rank maps, the tier thresholds, and what a
degraded answer reports (the one rule, below: no relevance and no tier for a result the model
did not score, no model for an answer it did not rank, a header on each)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from kb_rerank.rerank.diversify import tier
from kb_rerank.core.settings import Settings


def rounded(x: float | None, nd: int = 6) -> float | None:
    """``x`` rounded to ``nd`` decimals for the wire; None for None and non-finite values."""
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def clamped(x: float) -> float:
    """A relevance for the wire: rounded to 6 decimals, within 0..1."""
    return min(1.0, max(0.0, round(float(x), 6)))


def fallback_relevance(first_stage: list[float | None]) -> list[float]:
    """Relevance without the model: first-stage score / best, clamped 0..1; rank based
    (``1 - i/(n+1)``) when the best is not positive."""
    n = len(first_stage)
    finite = [x if x is not None and math.isfinite(x) else None for x in first_stage]
    best = max((x for x in finite if x is not None), default=0.0)
    if best > 0:
        return [min(1.0, max(0.0, x / best)) if x is not None else 0.0 for x in finite]
    return [1.0 - i / (n + 1) for i in range(n)]


def rank_map(keys: list[Any], values: list[float | None]) -> dict[Any, int]:
    """1-based ranks of ``keys`` by ``values`` (desc, then key); None values are unranked."""
    order = sorted([i for i, v in enumerate(values) if v is not None], key=lambda i: (-values[i], str(keys[i])))
    return {keys[i]: r + 1 for r, i in enumerate(order)}


def tiers(settings: Settings) -> tuple[float, float]:
    return (float(settings.tier_high), float(settings.tier_medium))


# --------------------------------------------------------------------------- degraded answers
# The one rule for an answer the cross-encoder did not (wholly) rank, used by the three flows
# (kb_rerank.endpoints.search.flow, .context, .caller_documents) and the HTTP layer:
#
# * a result the model did not score (``scored_by`` "fused") reports no relevance
#   (``rerank_score`` / ``relevance_score`` null), no score made of one (``final_score`` null:
#   its position is its rank) and no tier; what ranked it is said by
#   ``scored_by`` (and, on the search endpoint, its first-stage ``fused_score`` as it is). The
#   value the flows rank such a result by (:func:`fallback_relevance`,
#   :func:`kb_rerank.rerank.scoring.partial_relevance`) is an ordering device, never sent as
#   a relevance: a client thresholding on it would take a fused order for a model's verdict;
# * an answer names the model that scored at least one of its results, else none (``model``
#   null): a fallback says ``ranked_by: "fused"``, an answer with no result ``ranked_by:
#   "none"``; the cache row and the audit row name the same model as the answer;
# * every degraded answer carries a header for clients that read only results
#   (:func:`degraded_headers`): ``X-KB-Fallback: <reason>`` on a fallback, ``X-KB-Partial:
#   budget`` on a partial answer.

MODEL, FUSED, CURATION, NOTHING = "model", "fused", "curation", "none"
FALLBACK_HEADER, PARTIAL_HEADER = "X-KB-Fallback", "X-KB-Partial"
# how long a caller should wait before asking again, by fallback reason (Retry-After of the
# 503 a flow answers instead of a fallback): a model still loading takes seconds; a model
# whose load failed, or none configured, gets no Retry-After (no retry can help)
RETRY_AFTER_S: dict[str, int | None] = {"model_not_ready": 10, "model_failed": None, "model_absent": None}
RETRY_AFTER_DEFAULT_S = 2


def reported_score(score: float | None, scored_by: str) -> float | None:
    """A relevance a result reports, or a score made of it (the composite ``final_score``):
    rounded when the model (or a curated list) ranked the result, None when the first stage
    did (``scored_by`` "fused": the value would be a fused order dressed as a relevance)."""
    return None if scored_by == FUSED else rounded(score)


def reported_tier(final_score: float, scored_by: str, settings: Settings) -> str | None:
    """``high`` / ``medium`` / ``low`` from ``final_score`` for a result the model scored; None
    for one it did not (a tier of a fused score would claim a relevance nobody measured)."""
    return tier(final_score, tiers(settings)) if scored_by == MODEL else None


def answer_model(model: str | None, results: Sequence[Any]) -> str | None:
    """The ``model`` an answer names: ``model`` when it scored at least one of the answer's
    ``results`` (response Structs, whose ``scored_by`` reads ``model`` in a row cached before
    the field existed: a whole answer, the model's), else None: an empty answer, a "nothing
    relevant" answer and a fallback name no model, whatever state the model is in."""
    return model if any(r.scored_by != FUSED for r in results) else None


def ranked_by(model: str | None, fallback_reason: str | None, *, curated: bool = False) -> str:
    """What ranked an answer, agreeing with ``model`` (:func:`answer_model`) and ``fallback``:
    ``fused`` (a fallback: the first stage), ``none`` (no result: nothing was ranked, ``model``
    null, not a fallback), ``curation`` (a curated list), else ``model`` (a partial answer too:
    its first results are the model's, each result's ``scored_by`` says which)."""
    if fallback_reason:
        return FUSED
    if model is None:
        return NOTHING
    return CURATION if curated else MODEL


def degraded_headers(fallback_reason: str | None, partial: str | None) -> dict[str, str]:
    """The response headers of a degraded answer (none for a whole model answer)."""
    out = {}
    if fallback_reason:
        out[FALLBACK_HEADER] = fallback_reason
    if partial:
        out[PARTIAL_HEADER] = partial
    return out


def degraded_warning(fallback_reason: str | None, partial: str | None) -> str | None:
    """One sentence for a client that shows warnings (``meta.warnings`` of /v2/rerank)."""
    if fallback_reason:
        return (f"no cross-encoder scored this answer ({fallback_reason}): results are in first-stage order,"
                " relevance_score is null")
    if partial:
        return (f"the rerank budget ended first ({partial}): results with relevance_score null were not scored"
                " by the model and follow the scored ones in first-stage order")
    return None


class ModelUnavailable(Exception):
    """No model could score an answer whose caller asked for a reranker (``/v2/rerank`` with
    ``KB_V2_FALLBACK=error``): answered 503 with ``reason`` by the HTTP layer, instead of a
    fallback, and ``Retry-After`` when a retry can help (``retry_after_s`` not None)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = RETRY_AFTER_S.get(reason, RETRY_AFTER_DEFAULT_S)
