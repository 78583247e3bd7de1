"""The guard policy (kb_rerank.guard.policy.apply) for every tenant policy and every
kind of verdict: strong and doubtful evidence, a person's allow / block review, a caller
document the classifier could not reach (not_classified), and the cases kept as they were
(not_inspected, keyword_stuffing). The expected outcomes are written out here, one table, so
that a change of the rule shows as a diff of this table."""

from __future__ import annotations

import pytest

from kb_rerank.core.candidate import Candidate
from kb_rerank.guard.detectors import InjectionVerdict, SpamVerdict
from kb_rerank.guard.verdict import decide, strong_evidence
from kb_rerank.guard.policy import apply, injection_decision

F = 0.5  # the demote factor

# case -> candidate fields
CASES = {
    "strong": dict(injection_flag=True, injection_strong=True),
    "doubtful": dict(injection_flag=True),
    "allowed_strong": dict(injection_flag=True, injection_strong=True, injection_review="allow"),
    "allowed_doubtful": dict(injection_flag=True, injection_review="allow"),
    "allowed_unflagged": dict(injection_review="allow"),
    "blocked_unflagged": dict(injection_review="block"),
    "blocked_doubtful": dict(injection_flag=True, injection_review="block"),
    "not_classified": dict(classified=False),
    "not_classified_doubtful": dict(classified=False, injection_flag=True),
    "not_classified_strong": dict(classified=False, injection_flag=True, injection_strong=True),
    "not_inspected": dict(inspected=False),
    "stuffed": dict(spam_flag=True),
    "plain": dict(),
}

# (policy, case) -> (kept, demote, [(reason, action, evidence, review)]); None where a key is absent
X, D, A = "excluded", "demoted", "allowed"
PI, NC = "prompt_injection", "not_classified"
EXPECTED = {
    ("exclude", "strong"): (False, 1.0, [(PI, X, "strong", None)]),
    ("exclude", "doubtful"): (True, F, [(PI, D, "doubtful", None)]),
    ("exclude", "allowed_strong"): (True, 1.0, [(PI, A, "strong", "allowed")]),
    ("exclude", "allowed_doubtful"): (True, 1.0, [(PI, A, "doubtful", "allowed")]),
    ("exclude", "allowed_unflagged"): (True, 1.0, []),
    ("exclude", "blocked_unflagged"): (False, 1.0, [(PI, X, "strong", "blocked")]),
    ("exclude", "blocked_doubtful"): (False, 1.0, [(PI, X, "strong", "blocked")]),
    ("exclude", "not_classified"): (True, F, [(NC, D, None, None)]),
    ("exclude", "not_classified_doubtful"): (True, F, [(PI, D, "doubtful", None), (NC, D, None, None)]),
    ("exclude", "not_classified_strong"): (False, 1.0, [(PI, X, "strong", None), (NC, X, None, None)]),
    ("exclude", "not_inspected"): (True, F, [("not_inspected", D, None, None)]),
    ("exclude", "stuffed"): (True, F, [("keyword_stuffing", D, None, None)]),
    ("exclude", "plain"): (True, 1.0, []),

    ("demote", "strong"): (True, F, [(PI, D, "strong", None)]),
    ("demote", "doubtful"): (True, F, [(PI, D, "doubtful", None)]),
    ("demote", "allowed_strong"): (True, 1.0, [(PI, A, "strong", "allowed")]),
    ("demote", "allowed_doubtful"): (True, 1.0, [(PI, A, "doubtful", "allowed")]),
    ("demote", "allowed_unflagged"): (True, 1.0, []),
    ("demote", "blocked_unflagged"): (True, F, [(PI, D, "strong", "blocked")]),
    ("demote", "blocked_doubtful"): (True, F, [(PI, D, "strong", "blocked")]),
    ("demote", "not_classified"): (True, F, [(NC, D, None, None)]),
    ("demote", "not_classified_doubtful"): (True, F, [(PI, D, "doubtful", None), (NC, D, None, None)]),
    ("demote", "not_classified_strong"): (True, F, [(PI, D, "strong", None), (NC, D, None, None)]),
    ("demote", "not_inspected"): (True, F, [("not_inspected", D, None, None)]),
    ("demote", "stuffed"): (True, F, [("keyword_stuffing", D, None, None)]),
    ("demote", "plain"): (True, 1.0, []),

    ("allow", "strong"): (True, 1.0, [(PI, A, "strong", None)]),
    ("allow", "doubtful"): (True, 1.0, [(PI, A, "doubtful", None)]),
    ("allow", "allowed_strong"): (True, 1.0, [(PI, A, "strong", "allowed")]),
    ("allow", "allowed_doubtful"): (True, 1.0, [(PI, A, "doubtful", "allowed")]),
    ("allow", "allowed_unflagged"): (True, 1.0, []),
    ("allow", "blocked_unflagged"): (True, 1.0, [(PI, A, "strong", "blocked")]),
    ("allow", "blocked_doubtful"): (True, 1.0, [(PI, A, "strong", "blocked")]),
    ("allow", "not_classified"): (True, 1.0, [(NC, A, None, None)]),
    ("allow", "not_classified_doubtful"): (True, 1.0, [(PI, A, "doubtful", None), (NC, A, None, None)]),
    ("allow", "not_classified_strong"): (True, 1.0, [(PI, A, "strong", None), (NC, A, None, None)]),
    ("allow", "not_inspected"): (True, 1.0, [("not_inspected", A, None, None)]),
    ("allow", "stuffed"): (True, F, [("keyword_stuffing", D, None, None)]),
    ("allow", "plain"): (True, 1.0, []),
}


def test_the_table_covers_every_policy_and_case():
    assert set(EXPECTED) == {(p, c) for p in ("exclude", "demote", "allow") for c in CASES}


@pytest.mark.parametrize("policy,case", sorted(EXPECTED))
def test_apply(policy, case):
    c = Candidate(id="7", content="text", injection_score=0.91234, injection_reasons=["sig"], **CASES[case])
    other = Candidate(id="8", content="plain")
    kept, filtered = apply([c, other], policy, F, lambda x: {"index": int(x.id)})
    want_kept, want_demote, want_entries = EXPECTED[(policy, case)]
    assert (c in kept) is want_kept and other in kept and other.demote == 1.0
    assert c.demote == pytest.approx(want_demote)
    assert all(f["index"] == 7 for f in filtered)
    got = [(f["reason"], f["action"], f.get("evidence"), f.get("review")) for f in filtered]
    assert got == want_entries
    for f in filtered:
        if f["reason"] == "prompt_injection":
            assert f["score"] == 0.9123 and f["signals"] == ["sig"]
        else:
            assert set(f) == {"index", "reason", "action"}


def test_decision_of_an_unflagged_unreviewed_chunk_is_none():
    for policy in ("exclude", "demote", "allow"):
        assert injection_decision(False, False, None, policy) is None
        assert injection_decision(False, True, None, policy) is None  # strong without a flag: nothing


# --------------------------------------------------------------------------- the evidence rule


class _Clf:
    """The classifier interface decide() uses, with a fixed probability."""

    floor, span_threshold = 0.0, None

    def __init__(self, p, strong_threshold=0.9):
        self.p = p
        self.strong_threshold = strong_threshold

    def probability(self, embedding, inj):
        return self.p


HIT = InjectionVerdict(True, 0.8, ("ignore_previous",))
MISS = InjectionVerdict(False, 0.0, ())
NO_SPAM = SpamVerdict(False, 0.0, ())


def test_strong_only_when_the_patterns_fire_and_the_classifier_agrees_at_the_weights_strong_threshold():
    vec = [0.0]
    # no classifier voting (none, another embedder, threshold 1): the patterns alone are doubtful
    # (0.3 % of ordinary passages held out: configuration files' XML comments)
    assert not strong_evidence(HIT, None, None, None, 0.9)
    assert not strong_evidence(HIT, 0.99, None, _Clf(0.99), 1.0)
    assert not strong_evidence(MISS, None, None, None, 0.9)
    # both layers: strong at p >= the weights' strong_threshold only
    assert strong_evidence(HIT, 0.9, None, _Clf(0.9), 0.95)
    assert not strong_evidence(HIT, 0.89, None, _Clf(0.89), 0.95)
    assert strong_evidence(HIT, 0.99, None, _Clf(0.99, strong_threshold=0.99), 0.95)
    assert not strong_evidence(HIT, 0.98, None, _Clf(0.98, strong_threshold=0.99), 0.95)
    # weights without a strong threshold: nothing is strong
    assert not strong_evidence(HIT, 0.999, None, _Clf(0.999, strong_threshold=None), 0.95)
    # the classifier alone, or its spans, are doubtful however sure
    assert not strong_evidence(MISS, 0.999, None, _Clf(0.999), 0.9)
    assert not strong_evidence(MISS, 0.5, 0.999, _Clf(0.5), 0.9)
    # decide() sets it on the flags and says it in the reasons, for flagged texts only
    f = decide(HIT, NO_SPAM, vec, _Clf(0.995), 0.99)
    assert f.injection_flag and f.strong and f.injection_reasons[-1] == "evidence:strong"
    f = decide(MISS, NO_SPAM, vec, _Clf(0.995), 0.99)
    assert f.injection_flag and not f.strong and f.injection_reasons[-1] == "evidence:doubtful"
    f = decide(HIT, NO_SPAM, vec, _Clf(0.85), 0.8)
    assert f.injection_flag and not f.strong and f.injection_reasons[-1] == "evidence:doubtful"
    # the shipped weights' veto floor 1.0 keeps the patterns from voting alone; their own verdict still counts
    sure = _Clf(0.995)
    sure.floor = 1.0
    f = decide(HIT, NO_SPAM, vec, sure, 0.99)
    assert {"vetoed:patterns", "fired:classifier", "evidence:strong"} <= set(f.injection_reasons) and f.strong
    # the patterns without a classifier flag, doubtfully
    f = decide(HIT, NO_SPAM)
    assert f.injection_flag and not f.strong and f.injection_reasons == ["ignore_previous", "evidence:doubtful"]
    f = decide(MISS, NO_SPAM, vec, _Clf(0.5), 0.9)
    assert not f.injection_flag and not f.strong and not any(r.startswith("evidence:") for r in f.injection_reasons)
