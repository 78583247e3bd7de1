"""The one candidate type: a passage on its way through a request, from retrieval (or the
caller's documents) through the guard policy and the cross-encoder to the final order.

Retrieval fills the identity and first-stage fields (:mod:`kb_rerank.retrieval.store`), the
knowledge-base flows add the chunk's stored guard flags and document metadata, the caller
documents flow its own detector verdicts and metadata; the pipeline then sets ``demote``
(guard policy) and ``relevance`` (cross-encoder or fallback) and
:func:`kb_rerank.rerank.diversify.composite` orders them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import numpy as np


@dataclass
class Candidate:
    id: str  # the chunk id as text, or the caller document's index zero-padded (a stable tie-break)
    content: str  # what the cross-encoder reads
    score: float | None = None  # first-stage score: fused (hybrid), the list's own, or the caller's RRF
    chunk_id: UUID | None = None
    doc_id: UUID | None = None
    doc_title: str = ""
    snippet: str = ""
    lexical_rank: int | None = None
    semantic_rank: int | None = None
    lexical_score: float | None = None
    semantic_score: float | None = None
    # guard verdict: stored at ingestion (knowledge base) or computed now (caller documents);
    # inspected=False when the detectors ran out of budget
    injection_flag: bool = False
    injection_score: float = 0.0
    injection_reasons: list[str] = field(default_factory=list)
    injection_strong: bool = False  # strong evidence (verdict.strong_evidence); a flag without it is doubtful
    # a person's review of the chunk's text (kb.chunks.injection_review): 'allow', 'block' or None
    injection_review: str | None = None
    spam_flag: bool = False
    inspected: bool = True
    classified: bool = True  # False: a caller document the learned classifier could not reach
    # document metadata (composite score) and the chunk's embedding (MMR)
    source_uri: str = ""
    authority: float = 1.0
    updated_at: datetime | None = None
    embedding: np.ndarray | None = None
    # set by the pipeline
    demote: float = 1.0  # multiplier on relevance from the guard policy; 1 = none
    relevance: float = 0.0  # cross-encoder score (or fallback relevance), 0..1
    # what ``relevance`` is: "model" (the cross-encoder's) | "fused" (the first stage's order:
    # a fallback, or a candidate the rerank budget did not reach)
    scored_by: str = "model"


def from_row(chunk_id: UUID, doc_id: UUID, doc_title: str, snippet: str, content: str, score: float | None,
             **ranks: int | float | None) -> Candidate:
    """A retrieved chunk (the columns every kb.search_* function returns)."""
    return Candidate(id=str(chunk_id), content=content, score=score, chunk_id=chunk_id, doc_id=doc_id,
                     doc_title=doc_title, snippet=snippet, **ranks)  # type: ignore[arg-type]


def sha256_hex(text: str) -> str:
    """The content hash a chunk's text is known by (kb.chunks.content_hash, the pair cache's key)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
