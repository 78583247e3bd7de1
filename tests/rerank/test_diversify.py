"""kb_rerank.rerank.diversify: MMR, composite score, ties, tiers, density -- hand-computed values."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import math

import numpy as np
import pytest

from kb_rerank.rerank import diversify as ranking
from kb_rerank.core.candidate import Candidate
from kb_rerank.rerank.diversify import composite, information_density, mmr, mmr_select, recency_factor, tier

NOW = datetime(2026, 1, 31, tzinfo=timezone.utc)

# a, a' near-duplicates (cos 0.8), b orthogonal to both
E = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 0.0, 1.0]])


def C(id: str, relevance: float, text: str = "", **kw) -> Candidate:
    """A reranked candidate as the composite sees it."""
    return Candidate(id=id, content=text, relevance=relevance, **kw)


def test_mmr_lambda_one_is_relevance_order():
    assert mmr([0.2, 0.9, 0.5], E, 1.0, 3) == [1, 2, 0]
    assert mmr([0.5, 0.5, 0.5], E, 1.0, 3) == [0, 1, 2]  # ties: lower index


def test_mmr_hand_computed():
    # lam=0.5: step 1 picks 0 (0.5*0.9); step 2: cand1 = .5*.85 - .5*.8 = 0.025,
    # cand2 = .5*.3 - 0 = 0.15 -> 2; step 3 -> 1 with max_sim 0.8
    order, sims = mmr_select([0.9, 0.85, 0.3], E, 0.5, 3)
    assert order == [0, 2, 1]
    assert sims == pytest.approx([0.0, 0.0, 0.8])
    # lam=0.9: cand1 = .9*.85 - .1*.8 = 0.685 > cand2 = 0.27 -> relevance wins
    assert mmr([0.9, 0.85, 0.3], E, 0.9, 3) == [0, 1, 2]


def test_mmr_lambda_zero_diversity_only_and_k():
    assert mmr([0.9, 0.85, 0.3], E, 0.0, 2) == [0, 2]
    assert mmr([0.9, 0.85, 0.3], E, 0.6, 1) == [0]
    assert mmr([], np.zeros((0, 3)), 0.6, 5) == []
    with pytest.raises(ValueError):
        mmr([0.1], np.ones((1, 3)), 1.5, 1)


def test_single_candidate_kept():
    assert mmr([0.7], np.array([[1.0, 0, 0]]), 0.6, 10) == [0]
    r = composite([C("a", 0.7)], np.array([[1.0, 0, 0]]), lam=0.6, k=10, now=NOW)
    assert [x.index for x in r] == [0] and r[0].final_score == pytest.approx(0.7)


def test_composite_final_is_mmr_objective_over_lambda():
    cands = [C("a", 0.9), C("b", 0.85), C("c", 0.3)]
    r = composite(cands, E, lam=0.5, k=3, now=NOW)
    assert [x.index for x in r] == [0, 2, 1]
    # final = boosted - (1-lam)/lam * max_sim: 0.9, 0.3, 0.85 - 1*0.8 = 0.05
    assert [x.final_score for x in r] == pytest.approx([0.9, 0.3, 0.05])
    assert [x.mmr_penalty for x in r] == pytest.approx([0.0, 0.0, 0.8])
    scores = [x.final_score for x in r]
    assert scores == sorted(scores, reverse=True)


def test_composite_boosts_zero_by_default_leave_relevance_order():
    cands = [C("a", 0.4, authority=5.0, updated_at=NOW),
             C("b", 0.8, authority=0.0, updated_at=NOW - timedelta(days=900))]
    r = composite(cands, np.eye(2), lam=1.0, k=2, now=NOW)
    assert [x.index for x in r] == [1, 0]
    assert [x.final_score for x in r] == pytest.approx([0.8, 0.4])


def test_composite_recency_and_authority_boosts_hand_computed():
    cands = [C("old", 0.5, authority=1.0, updated_at=NOW - timedelta(days=30)),
             C("new", 0.5, authority=3.0, updated_at=NOW)]
    r = composite(cands, np.eye(2), lam=1.0, k=2, recency_weight=0.2, half_life_days=30, authority_weight=0.1,
                  now=NOW)
    by = {cands[x.index].id: x for x in r}
    # old: 0.5 + 0.2*0.5 + 0.1*(1/2) = 0.65 ; new: 0.5 + 0.2*1 + 0.1*(3/4) = 0.775
    assert by["old"].final_score == pytest.approx(0.65)
    assert by["new"].final_score == pytest.approx(0.775)
    assert [cands[x.index].id for x in r] == ["new", "old"]


def test_demote_multiplies_relevance():
    cands = [C("stuffed", 0.9, demote=0.5), C("genuine", 0.6)]
    r = composite(cands, np.eye(2), lam=0.6, k=2, now=NOW)
    assert [cands[x.index].id for x in r] == ["genuine", "stuffed"]
    assert r[1].final_score == pytest.approx(0.45)


def test_ties_break_by_authority_recency_density_id():
    t = NOW
    dense = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau"
    sparse = "alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha"
    cands = [
        C("z", 0.5, text=dense, authority=1.0, updated_at=t),
        C("y", 0.5, text=dense, authority=2.0, updated_at=t - timedelta(days=1)),  # authority first
        C("x", 0.5, text=dense, authority=1.0, updated_at=t - timedelta(days=3)),  # older
        C("w", 0.5, text=sparse, authority=1.0, updated_at=t),  # less dense
        C("v", 0.5, text=dense, authority=1.0, updated_at=t),  # same as z: id decides
    ]
    for lam in (1.0, 0.6):
        r = composite(cands, np.eye(5), lam=lam, k=5, now=NOW)
        assert [cands[x.index].id for x in r] == ["y", "v", "z", "w", "x"]
    # deterministic whatever the input order
    rev = list(reversed(cands))
    r2 = composite(rev, np.eye(5), lam=0.6, k=5, now=NOW)
    assert [rev[x.index].id for x in r2] == ["y", "v", "z", "w", "x"]


def test_tier_thresholds():
    assert tier(0.7, (0.7, 0.3)) == "high"
    assert tier(0.69, (0.7, 0.3)) == "medium"
    assert tier(0.3, (0.7, 0.3)) == "medium"
    assert tier(0.29, (0.7, 0.3)) == "low"
    with pytest.raises(ValueError):
        tier(0.5, (0.2, 0.3))


def test_information_density_hand_computed():
    assert information_density("") == 0.0
    # 4 tokens, 2 distinct: 0.5 * 4/20 = 0.1
    assert information_density("a b a b") == pytest.approx(0.1)
    # 20 distinct tokens: 1.0
    assert information_density(" ".join(f"w{i}" for i in range(20))) == pytest.approx(1.0)
    # 40 tokens, 20 distinct: 0.5
    assert information_density(" ".join(f"w{i % 20}" for i in range(40))) == pytest.approx(0.5)


def test_recency_factor_half_life():
    assert recency_factor(NOW - timedelta(days=10), NOW, 10) == pytest.approx(0.5)
    assert recency_factor(NOW - timedelta(days=20), NOW, 10) == pytest.approx(0.25)
    assert recency_factor(NOW + timedelta(days=5), NOW, 10) == pytest.approx(1.0)
    assert recency_factor(None, NOW, 10) == 0.0
    assert recency_factor(NOW.replace(tzinfo=None), NOW, 10) == pytest.approx(1.0)


def test_negative_boosts_rejected():
    with pytest.raises(ValueError):
        ranking.composite([C("a", 0.5)], np.eye(1), recency_weight=-1)


def test_similarity_floor_removes_anisotropic_offset():
    # e5-like: everything at cosine >= 0.8; a and a' near-duplicates (0.98)
    E2 = np.array([[1.0, 0.0, 0.0], [0.98, 0.199, 0.0], [0.8, 0.0, 0.6], [0.8, -0.36, 0.48]])
    plain = ranking.similarity_matrix(E2)
    auto = ranking.similarity_matrix(E2, "auto")
    off = plain[~np.eye(4, dtype=bool)]
    floor = float(np.median(off))
    assert auto[0, 1] == pytest.approx((plain[0, 1] - floor) / (1 - floor))
    assert auto[0, 2] == pytest.approx(max(0.0, (plain[0, 2] - floor) / (1 - floor)))
    assert ranking.similarity_matrix(E2, 0.5)[0, 2] == pytest.approx((0.8 - 0.5) / 0.5)
    # relevance 0.95 / 0.94 / 0.7 / 0.1: plain MMR keeps the duplicate second, the floor lets the
    # other intent through
    rel = [0.95, 0.94, 0.7, 0.1]
    assert mmr_select(rel, E2, 0.6, 2)[0] == [0, 1]
    assert mmr_select(rel, E2, 0.6, 2, "auto")[0] == [0, 2]
    # basis vectors: median 0, nothing changes
    assert np.allclose(ranking.similarity_matrix(np.eye(3), "auto"), np.eye(3))


@pytest.mark.parametrize("lam", [0.0, 2.225073858507203e-309, 5e-324, 1e-7])
def test_composite_reports_finite_numbers_for_any_lambda(lam):
    """A subnormal lambda made (1 - lam) / lam overflow and inf x 0 similarity gave a NaN
    penalty, which the cache (jsonb) refused: a 500 found by the schema fuzzer."""
    cands = [C("a", 0.9), C("b", 0.8), C("c", 0.1)]
    E = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]])
    r = composite(cands, E, lam=lam, k=3, now=NOW, recency_weight=1.0, half_life_days=9.1e-294)
    values = [v for x in r for v in (x.final_score, x.mmr_penalty, x.boosted, x.max_sim)]
    assert all(math.isfinite(v) for v in values), values
    assert r[0].mmr_penalty == 0.0 and r[1].mmr_penalty == pytest.approx(r[1].max_sim)
