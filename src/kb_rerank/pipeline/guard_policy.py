"""The tenant's injection policy applied to candidates, written once for every flow.

A candidate flagged for prompt injection (at ingestion for knowledge-base chunks, by the
detectors at request time for caller documents) is excluded, demoted (relevance x
``demote_factor``) or allowed, per the tenant's ``kb.tenant_policy`` (default ``exclude``);
a keyword-stuffed one is always demoted. A caller document the detectors had no time to
inspect (``inspected=False``: the budget is spent by load of the moment, not by the
request) is demoted like a flagged one, allowed under ``allow``, never excluded. Each
decision is reported in ``filtered``.
"""

from __future__ import annotations

from typing import Any, Callable

from kb_rerank.candidate import Candidate
from kb_rerank.pipeline.compose import rounded


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
        if c.injection_flag:
            entry = {**where(c), "reason": "prompt_injection", "score": rounded(c.injection_score, 4),
                     "signals": list(c.injection_reasons)}
            if policy == "exclude":
                filtered.append({**entry, "action": "excluded"})
                continue
            if policy == "demote":
                c.demote *= demote_factor
            filtered.append({**entry, "action": "demoted" if policy == "demote" else "allowed"})
        if c.spam_flag:
            c.demote *= demote_factor
            filtered.append({**where(c), "reason": "keyword_stuffing", "action": "demoted"})
        kept.append(c)
    return kept, filtered
