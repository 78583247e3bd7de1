"""Context ranking after the cross-encoder: MMR diversity, the composite final score,
deterministic tie-breaking and confidence tiers. Pure functions, no database.

MMR (Carbonell & Goldstein 1998)
    Greedy: at each step pick the remaining candidate maximising
    ``lam * relevance[i] - (1 - lam) * max_{j selected} max(0, cos(e_i, e_j))``.
    ``lam = 1`` is the relevance order, ``lam = 0`` diversity only (the first pick is
    still the most relevant). Exact ties go to the lower input index, so callers sort
    the input by their tie-break key first (:func:`tie_key`). Negative similarity is
    clipped to 0 (dissimilar does not earn a bonus).

Composite score (:func:`composite`)
    ``boosted_i = relevance_i * demote_i + recency_weight * 0.5 ** (age_days_i / half_life_days)
    + authority_weight * authority_i / (1 + authority_i)``

    MMR runs on ``boosted``; the *MMR penalty* of a pick is
    ``(1 - lam) / lam * max_sim`` (its similarity to the already selected ones), so that
    ``final = boosted - penalty = mmr_objective / lam``: the final score is the MMR
    objective on the relevance scale, it equals the relevance at ``lam = 1`` and with
    no boosts, and it never increases along the MMR order (the objective of each
    remaining candidate can only fall as the selected set grows). At ``lam = 0`` the
    penalty is ``max_sim`` (the order is diversity alone and ``final`` is reported,
    not used to order). ``final`` is clamped at 0 and rounded to 6 decimals.
    Boost weights are 0 by default: then ``final`` depends on relevance and MMR only.
    Similarities: cosine clipped at 0 (textbook MMR). ``sim_floor`` (off by default)
    rescales them above a floor (:func:`similarity_matrix`); measured on Cranfield it
    costs far more nDCG@10 than plain cosine (docs/context-ranking.md), so the endpoints
    use plain cosine.

Ties (equal relevance / MMR objective)
    authority desc, then updated_at desc (more recent first), then information density
    desc, then id asc: :func:`tie_key`.

Information density (:func:`information_density`)
    Distinct word tokens / word tokens, times ``min(1, tokens / 20)`` so a very short
    chunk is not "dense" by having few words. 0 for a text with no word. In 0..1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Sequence

import numpy as np

from kb_rerank.core.candidate import Candidate

__all__ = [
    "Ranked",
    "composite",
    "demoted_relevance",
    "information_density",
    "mmr",
    "mmr_select",
    "recency_factor",
    "tie_key",
    "tier",
]

_WORD = re.compile(r"\w+", re.UNICODE)



LAMBDA_DIVERSITY_ONLY = 1e-6  # see composite()

def information_density(text: str) -> float:
    toks = [t.casefold() for t in _WORD.findall(text or "")]
    if not toks:
        return 0.0
    return (len(set(toks)) / len(toks)) * min(1.0, len(toks) / 20.0)


def _unit_rows(embeddings: np.ndarray) -> np.ndarray:
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError("embeddings must be a 2-d array (one row per candidate)")
    norms = np.linalg.norm(e, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return e / norms


def similarity_matrix(embeddings: np.ndarray, sim_floor: float | str | None = None) -> np.ndarray:
    """Cosine similarities clipped at 0; with ``sim_floor`` rescaled as
    ``max(0, (sim - floor) / (1 - floor))``. ``sim_floor="auto"``: the floor is the median
    off-diagonal similarity of the candidate set (clipped to 0..0.99), which removes the
    constant offset of anisotropic embedders (e5-style models put unrelated passages at
    cosine 0.7-0.85, so without it the penalty is nearly the same for every candidate)."""
    u = _unit_rows(embeddings)
    sim = np.clip(u @ u.T, 0.0, None)
    n = sim.shape[0]
    if sim_floor is None or n < 2:
        return sim
    if sim_floor == "auto":
        floor = float(np.median(sim[~np.eye(n, dtype=bool)]))
    else:
        floor = float(sim_floor)
    floor = min(0.99, max(0.0, floor))
    if floor <= 0.0:
        return sim
    return np.clip((sim - floor) / (1.0 - floor), 0.0, None)


def mmr_select(relevance: Sequence[float], embeddings: np.ndarray, lam: float, k: int,
               sim_floor: float | str | None = None) -> tuple[list[int], list[float]]:
    """MMR order of the first ``k`` candidates and each pick's max similarity to the
    candidates picked before it (0 for the first); ``sim_floor``: see
    :func:`similarity_matrix` (None: plain cosine, the textbook MMR)."""
    if not 0.0 <= lam <= 1.0 or math.isnan(lam):
        raise ValueError(f"lambda must be in 0..1, got {lam!r}")
    rel = np.asarray(list(relevance), dtype=np.float64)
    n = len(rel)
    if n == 0 or k <= 0:
        return [], []
    if len(embeddings) != n:
        raise ValueError(f"{len(embeddings)} embeddings for {n} candidates")
    k = min(k, n)
    sim = similarity_matrix(embeddings, sim_floor)
    if lam >= 1.0:
        order = sorted(range(n), key=lambda i: (-rel[i], i))[:k]
        sims_out = [0.0] + [float(np.max(sim[order[:t], order[t]])) for t in range(1, k)]
        return order, sims_out
    max_sim = np.zeros(n)
    remaining = np.ones(n, dtype=bool)
    order: list[int] = []
    sims: list[float] = []
    for _ in range(k):
        obj = lam * rel - (1.0 - lam) * max_sim
        obj = np.where(remaining, obj, -np.inf)
        best = float(np.max(obj))
        # lowest index among exact maxima (np.argmax returns the first)
        i = int(np.argmax(obj >= best - 1e-12))
        order.append(i)
        sims.append(float(max_sim[i]))
        remaining[i] = False
        max_sim = np.maximum(max_sim, sim[i])
    return order, sims


def mmr(relevance: list[float], embeddings: np.ndarray, lam: float, k: int) -> list[int]:
    """Indices of the ``k`` candidates in MMR order (see the module docstring)."""
    return mmr_select(relevance, embeddings, lam, k)[0]


def recency_factor(updated_at: datetime | None, now: datetime, half_life_days: float) -> float:
    """``0.5 ** (age_days / half_life_days)`` in 0..1 (1 for a future / missing-age-free
    date); 0 when ``updated_at`` is unknown or the half-life is not positive."""
    if updated_at is None or half_life_days is None or half_life_days <= 0:
        return 0.0
    if updated_at.tzinfo is None:
        updated_at = updated_at.replace(tzinfo=timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    age_days = max(0.0, (now - updated_at).total_seconds() / 86400.0)
    return 0.5 ** (age_days / half_life_days)


@dataclass(frozen=True)
class Ranked:
    index: int  # into the input list
    final_score: float
    relevance: float
    boosted: float
    mmr_penalty: float
    max_sim: float
    recency_boost: float
    authority_boost: float
    density: float


def _ts(d: datetime | None) -> float:
    if d is None:
        return float("-inf")
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()


def demoted_relevance(c: Candidate) -> float:
    """The relevance the final order uses: the candidate's relevance times its guard-policy
    ``demote`` (1 unless the policy demoted it)."""
    return float(c.relevance) * float(c.demote)


def tie_key(c: Candidate) -> tuple:
    """Sort key (ascending) for equal scores: authority desc, updated_at desc,
    information density desc, id asc."""
    return (-float(c.authority), -_ts(c.updated_at), -information_density(c.content), str(c.id))


def composite(
    cands: Sequence[Candidate],
    embeddings: np.ndarray,
    *,
    lam: float = 0.6,
    k: int = 10,
    recency_weight: float = 0.0,
    half_life_days: float = 30.0,
    authority_weight: float = 0.0,
    now: datetime | None = None,
    sim_floor: float | str | None = None,
) -> list[Ranked]:
    """The first ``k`` candidates in final order with their scores (module docstring)."""
    if recency_weight < 0 or authority_weight < 0:
        raise ValueError("boost weights must be >= 0")
    n = len(cands)
    if n == 0 or k <= 0:
        return []
    now = now or datetime.now(timezone.utc)
    # Input order = the deterministic tie order, so MMR's "lowest index wins" applies it.
    pre = sorted(range(n), key=lambda i: tie_key(cands[i]))
    rec = [recency_weight * recency_factor(cands[i].updated_at, now, half_life_days) if recency_weight else 0.0
           for i in pre]
    auth = [authority_weight * (max(0.0, cands[i].authority) / (1.0 + max(0.0, cands[i].authority)))
            if authority_weight else 0.0 for i in pre]
    rel = [demoted_relevance(cands[i]) for i in pre]
    boosted = [r + a + b for r, a, b in zip(rel, rec, auth)]
    emb = np.asarray(embeddings)[pre] if n else np.zeros((0, 1))
    order, sims = mmr_select(boosted, emb, lam, k, sim_floor)
    # below LAMBDA_DIVERSITY_ONLY the order is diversity alone, as at 0, and so is the report:
    # (1 - lam) / lam overflows for a subnormal lam and inf x 0 similarity is NaN (a 500
    # found by the schema fuzzer with lambda 2.2e-309)
    coef = (1.0 - lam) / lam if lam >= LAMBDA_DIVERSITY_ONLY else 1.0
    out = []
    for j, s in zip(order, sims):
        i = pre[j]
        penalty = coef * s
        out.append(Ranked(
            index=i,
            final_score=round(max(0.0, boosted[j] - penalty), 6),
            relevance=float(cands[i].relevance),
            boosted=boosted[j],
            mmr_penalty=round(penalty, 6),
            max_sim=round(s, 6),
            recency_boost=rec[j],
            authority_boost=auth[j],
            density=information_density(cands[i].content),
        ))
    return out


def tier(score: float, thresholds: tuple[float, float]) -> str:
    """``high`` when ``score >= thresholds[0]``, ``medium`` when ``>= thresholds[1]``, else ``low``."""
    high, medium = thresholds
    if high < medium:
        raise ValueError("tier thresholds must be (high, medium) with high >= medium")
    if score >= high:
        return "high"
    if score >= medium:
        return "medium"
    return "low"
