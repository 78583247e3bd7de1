"""Small rules the flows share when they compose an answer: rounding for the wire, the
fallback relevance (the one rule for a score without the model), rank maps and the tier
thresholds."""

from __future__ import annotations

import math
from typing import Any

from kb_rerank.settings import Settings


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
