"""The tenant's injection policy applied to candidates, written once for every flow.

A candidate flagged for prompt injection (at ingestion for knowledge-base chunks, by the
detectors at request time for caller documents) carries strong or doubtful evidence
(:func:`kb_rerank.guard.verdict.strong_evidence`), and a knowledge-base chunk may carry a
person's review (``kb-rerank guard allow`` / ``block``: ``kb.chunks.injection_review``). What
happens to it (:func:`injection_decision`, also what ``kb-rerank guard list`` shows), per the
tenant's ``kb.tenant_policy``:

                     exclude (default)   demote     allow
  flagged, strong    excluded            demoted    allowed
  flagged, doubtful  demoted             demoted    allowed
  reviewed allow     allowed (its rank)  allowed    allowed
  reviewed block     excluded            demoted    allowed

A reviewed ``block`` counts as flagged with strong evidence, flagged or not; a reviewed
``allow`` keeps a flagged chunk at its rank whatever its evidence (reported with
``"review": "allowed"``; an unflagged one has nothing to report). Demoted: relevance x
``demote_factor``. A keyword-stuffed candidate is always demoted. A caller document the
detectors had no time to inspect (``inspected=False``: the budget is spent by load of the
moment, not by the request) is demoted, allowed under ``allow``, never excluded
(``not_inspected``); one the learned classifier could not reach (``classified=False``) is
reported ``not_classified`` and demoted the same way (once, also when its flag demotes it),
its flag entry kept beside it. Each decision is reported in ``filtered``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kb_rerank.core.candidate import Candidate
from kb_rerank.rerank.compose import rounded


@dataclass(frozen=True)
class Decision:
    """What the policy does with a flagged (or reviewed) candidate."""

    action: str  # excluded | demoted | allowed
    evidence: str  # strong | doubtful (a reviewed block: strong)
    review: str | None  # allowed | blocked | None (not reviewed)


def injection_decision(flagged: bool, strong: bool, review: str | None, policy: str) -> Decision | None:
    """The one decision for a candidate's injection verdict and review under ``policy``
    (None: nothing to decide: not flagged and no review)."""
    evidence = "strong" if strong else "doubtful"
    if review == "allow":
        return Decision("allowed", evidence, "allowed")
    if review == "block":
        flagged, evidence = True, "strong"
    if not flagged:
        return None
    if policy == "allow":
        action = "allowed"
    elif policy == "demote":
        action = "demoted"
    else:  # exclude, the default
        action = "excluded" if evidence == "strong" else "demoted"
    return Decision(action, evidence, "blocked" if review == "block" else None)


def apply(cands: list[Candidate], policy: str, demote_factor: float,
          where: Callable[[Candidate], dict[str, Any]]) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """(the candidates kept, with ``demote`` set; the ``filtered`` report). ``where`` names a
    candidate in the report (``{"chunk_id": ...}`` or ``{"index": ...}``)."""
    kept: list[Candidate] = []
    filtered: list[dict[str, Any]] = []
    for c in cands:
        if not c.inspected:
            allow = policy == "allow"
            if not allow:
                c.demote *= demote_factor
            filtered.append({**where(c), "reason": "not_inspected", "action": "allowed" if allow else "demoted"})
            kept.append(c)
            continue
        d = injection_decision(c.injection_flag, c.injection_strong, c.injection_review, policy)
        if d is not None and (c.injection_flag or d.review == "blocked"):
            entry = {**where(c), "reason": "prompt_injection", "score": rounded(c.injection_score, 4),
                     "signals": list(c.injection_reasons), "action": d.action, "evidence": d.evidence}
            if d.review is not None:
                entry["review"] = d.review
            filtered.append(entry)
            if d.action == "demoted":
                c.demote *= demote_factor
        else:
            d = None  # a reviewed allow of an unflagged chunk: nothing to report
        excluded = d is not None and d.action == "excluded"
        if not c.classified:
            # never passed as judged: the classifier's vote is missing (demoted once, not again
            # when its flag already demoted it)
            action = "excluded" if excluded else "allowed" if policy == "allow" else "demoted"
            if action == "demoted" and not (d is not None and d.action == "demoted"):
                c.demote *= demote_factor
            filtered.append({**where(c), "reason": "not_classified", "action": action})
        if excluded:
            continue
        if c.spam_flag:
            c.demote *= demote_factor
            filtered.append({**where(c), "reason": "keyword_stuffing", "action": "demoted"})
        kept.append(c)
    return kept, filtered
