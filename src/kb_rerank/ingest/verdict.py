"""The one injection / stuffing decision, shared by every path that judges a text (issue 19).

* ingestion and ``kb-rerank guard scan`` (:mod:`kb_rerank.ingest.loader`): :func:`chunk_flags`
  over a chunk and its stored embedding; the result is stored per chunk, and
  ``/v1/kb/context`` reads that stored verdict (the tenant's policy applied to it);
* caller-supplied documents (``/v2/rerank``): :func:`inspect_documents`, the same rule over
  each document and its embedding, within the request's guard budget.

The rule (:func:`decide`): flagged when the learned detector's probability
(:mod:`kb_rerank.ingest.guard_classifier`) reaches the threshold, or when the patterns
(:mod:`kb_rerank.ingest.detectors`) flag the text and that probability is not below the
weights' veto floor; a threshold of 1.0 turns the classifier off, vote and veto (the
patterns decide alone; the probability is still reported). A flagged text's evidence is
strong or doubtful (:func:`strong_evidence`): the default policy excludes the first and
demotes the second (:mod:`kb_rerank.pipeline.guard_policy`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import numpy as np

from kb_rerank.ingest import detectors
from kb_rerank.ingest.detectors import InjectionVerdict, SpamVerdict
from kb_rerank.ingest.guard_classifier import GuardClassifier, classifier_for, spans

log = logging.getLogger(__name__)

EMBED_BATCH = 8  # documents per embedder call in inspect_documents: the deadline is checked between calls


@dataclass(frozen=True)
class ChunkFlags:
    """Guard verdicts of one text (stored with a chunk: kb.chunks injection_* and spam_flag)."""

    injection_flag: bool
    injection_score: float
    injection_reasons: list[str]
    spam_flag: bool
    # strong evidence of injection (kb.chunks.injection_strong; :func:`strong_evidence`): what
    # the default policy ``exclude`` excludes; a flag without it is doubtful and only demoted
    strong: bool = False


def strong_evidence(inj: InjectionVerdict, p: float | None, span_p: float | None,
                    classifier: GuardClassifier | None, threshold: float) -> bool:
    """Whether a flagged text's evidence of injection is strong enough to exclude it under the
    default policy (otherwise it is doubtful: demoted and reported, kept). Called by
    :func:`decide` for flagged texts only.

    Strong when two layers agree: the patterns flag the text (``inj.flagged``, their own
    verdict, also where the weights' veto floor keeps them from voting alone) AND the
    classifier voted (``threshold`` < 1) with a probability of at least the weights'
    ``strong_threshold``. Measured held out on the ordinary corpus (bench/guard_ordinary.py,
    bench/results/guard-ordinary.md): no ordinary passage of 3,700 in 14 languages reaches it,
    against 0.3 % for the patterns alone (XML comments of configuration files) and 0.1-2 % for
    the classifier alone at any threshold that keeps useful recall. So a flag by the classifier
    or the spans alone, or by the patterns without the classifier (another embedder, a
    threshold of 1, a caller document it could not reach), is doubtful."""
    if not inj.flagged or classifier is None or p is None or threshold >= 1.0:
        return False
    return classifier.strong_threshold is not None and p >= classifier.strong_threshold


def decide(inj: InjectionVerdict, spam: SpamVerdict, embedding: np.ndarray | None = None,
           classifier: GuardClassifier | None = None, threshold: float = 1.0,
           span_p: float | None = None, p: float | None = None) -> ChunkFlags:
    """Flagged when the classifier's probability reaches ``threshold`` (it votes and vetoes
    only when ``threshold`` < 1), or when the patterns flag the text and the probability is not below
    the classifier's ``floor`` (its veto of pattern hits it finds clearly benign, trained
    with the weights); without a classifier or an embedding, the patterns alone. The
    reasons are the pattern signals, then ``classifier_p=<p>`` (always, when it ran), then
    ``fired:patterns`` / ``fired:classifier`` for the layers that flagged the text, or
    ``vetoed:patterns`` when the floor overruled a pattern hit, and last, for a flagged text,
    ``evidence:strong`` or ``evidence:doubtful`` (:func:`strong_evidence`, also returned as
    ``strong``); the score is the pattern
    score, or the probability when the classifier fired and it is higher. ``span_p``: the
    highest probability over the text's spans (:meth:`GuardClassifier.span_probability`),
    when they were scored: reported as ``span_p=<p>``, and the text is flagged
    (``fired:spans``) when it reaches the classifier's ``span_threshold`` (while the
    classifier votes, ``threshold`` < 1). ``p``: the classifier's probability for this text
    when the caller computed it already (:func:`probability`), else computed here."""
    score = min(1.0, max(0.0, float(inj.score)))
    reasons = list(inj.reasons)
    flagged = bool(inj.flagged)
    if classifier is not None and embedding is not None:
        if p is None:
            p = classifier.probability(embedding, inj)
        fired = threshold < 1.0 and p >= threshold
        reasons.append(f"classifier_p={p:.3f}")
        patterns = bool(inj.flagged)
        if patterns and threshold < 1.0 and p < classifier.floor:
            patterns = False
            reasons.append("vetoed:patterns")
        if patterns:
            reasons.append("fired:patterns")
        if fired:
            reasons.append("fired:classifier")
            score = max(score, min(1.0, p))
        span_fired = False
        if span_p is not None and classifier.span_threshold is not None:
            reasons.append(f"span_p={span_p:.3f}")
            span_fired = threshold < 1.0 and span_p >= classifier.span_threshold
            if span_fired:
                reasons.append("fired:spans")
                score = max(score, min(1.0, span_p))
        flagged = patterns or fired or span_fired
    strong = False
    if flagged:
        strong = strong_evidence(inj, p, span_p, classifier, threshold)
        reasons.append("evidence:strong" if strong else "evidence:doubtful")
    return ChunkFlags(flagged, score, reasons, bool(spam.flagged), strong)


def chunk_flags(piece: str, embedding: np.ndarray | None = None, classifier: GuardClassifier | None = None,
                threshold: float = 1.0,
                embed: Callable[[list[str]], np.ndarray] | None = None) -> ChunkFlags:
    """:func:`decide` over the detectors' verdicts of ``piece`` (cheap, deterministic:
    recomputed on every write, also for chunks whose embedding is reused). With ``embed``
    (the embedder's ``embed_passages``) and a classifier that scores spans, the spans of a
    chunk it finds doubtful (:func:`span_probability`) are embedded and scored too."""
    inj = detectors.detect_injection(piece)
    p = probability(classifier, embedding, inj)
    return decide(inj, detectors.detect_stuffing(piece), embedding, classifier, threshold,
                  span_probability(piece, p, classifier, threshold, embed), p=p)


def probability(classifier: GuardClassifier | None, embedding: np.ndarray | None,
                inj: InjectionVerdict) -> float | None:
    """The classifier's probability for a text (None without a classifier or an embedding):
    computed once, for the span gate and for :func:`decide`."""
    if classifier is None or embedding is None:
        return None
    return classifier.probability(embedding, inj)


def span_texts(piece: str, p: float | None, classifier: GuardClassifier | None, threshold: float) -> list[str]:
    """The spans of ``piece`` to embed and score: none unless the classifier votes
    (``threshold`` < 1), scores spans and finds the whole text (probability ``p``) at least
    as doubtful as its ``span_gate``."""
    if classifier is None or p is None or threshold >= 1.0 or not classifier.wants_spans(p):
        return []
    return spans(piece)


def span_probability(piece: str, p: float | None, classifier: GuardClassifier | None, threshold: float,
                     embed: Callable[[list[str]], np.ndarray] | None) -> float | None:
    """The highest span probability of ``piece`` (None: spans not scored: no ``embed``, or
    :func:`span_texts` has none)."""
    if embed is None:
        return None
    texts = span_texts(piece, p, classifier, threshold)
    if not texts:
        return None
    return classifier.span_probability(np.asarray(embed(texts), dtype=np.float32), texts)


def guard_classifier(embedder) -> GuardClassifier | None:
    """The shipped injection classifier when it fits this embedder's vectors, else None."""
    return classifier_for(getattr(embedder, "name", ""), int(getattr(embedder, "dim", 0) or 0))


@dataclass
class Inspection:
    """What :func:`inspect_documents` found: per text its flags (None: not inspected within
    the budget) and its embedding (None: not embedded in time, or no classifier)."""

    flags: list[ChunkFlags | None]
    embeddings: list[np.ndarray | None]
    # texts the patterns decided alone: their embedding was not back in time (or the embedder
    # failed), so the classifier had no vote; or decided without their spans, not embedded in
    # time (an answer with any is not cached)
    unclassified: int = 0


async def inspect_documents(texts: Sequence[str], budget_s: float, *, classifier: GuardClassifier | None = None,
                            threshold: float = 1.0,
                            embed: Callable[[list[str]], Awaitable[np.ndarray]] | None = None,
                            fatal: tuple[type[BaseException], ...] = (),
                            embed_budget_s: float | None = None,
                            embed_spans: Callable[[list[str]], Awaitable[np.ndarray]] | None = None) -> Inspection:
    """:func:`decide` over each text, off the event loop, within two deadlines started now.

    The patterns run in the detectors' worker thread (:func:`detectors.inspect_documents`)
    for at most ``budget_s``; with a classifier, ``embed`` (an embedder call on the
    embedder's executor, which releases the GIL) embeds the texts meanwhile in batches of
    :data:`EMBED_BATCH` for at most ``embed_budget_s`` (default ``budget_s``), the deadline
    checked before each batch (a batch under way at the deadline is not waited for). Two
    budgets because the patterns hold the GIL beside the event loop and take a millisecond
    a document, while an embedding takes hundreds (bench/results/guard-cost-2026-11-30.md).
    A text is inspected when its pattern verdict is in (``None`` otherwise: not inspected);
    with a classifier and its embedding in time, the verdict is :func:`decide`'s over both;
    without its embedding, the patterns decide alone (counted in ``unclassified``): a late
    embedding costs the classifier's vote on that text, never the text's rank (demoting every
    document of a long request for the embedder's speed would reorder ordinary requests). An
    ``embed`` failure leaves its texts not embedded (logged), except the exception types in
    ``fatal``, which propagate (the tenant's embedder cap: 429, as for any embedding).
    ``embed_spans``: the embedder call for the spans (default ``embed``), so that a caller can
    count the span texts it embeds even when the inspection is interrupted (/v2/rerank
    charges its spans from that count when the request ends).
    """
    n = len(texts)
    if n == 0:
        return Inspection([], [])
    deadline = time.monotonic() + (budget_s if embed_budget_s is None else embed_budget_s)
    patterns = asyncio.ensure_future(detectors.inspect_documents(texts, budget_s))
    vecs: list[np.ndarray | None] = [None] * n
    if classifier is not None and embed is not None:
        try:
            await _embed_until(texts, vecs, embed, deadline, fatal)
        except BaseException:
            patterns.cancel()
            raise
    verdicts = await patterns
    # span-level scoring: the spans of the documents the classifier finds doubtful, embedded
    # after the documents within the same deadline
    wanted: list[list[str]] = [[] for _ in range(n)]
    probs: list[float | None] = [None] * n
    if classifier is not None and embed is not None:
        for i, (v, vec) in enumerate(zip(verdicts, vecs)):
            if v is not None and vec is not None:
                probs[i] = probability(classifier, vec, v[0])
                wanted[i] = span_texts(texts[i], probs[i], classifier, threshold)
    flat = [t for w in wanted for t in w]
    svecs: list[np.ndarray | None] = [None] * len(flat)
    if flat:
        await _embed_until(flat, svecs, embed_spans or embed, deadline, fatal)
    flags: list[ChunkFlags | None] = []
    unclassified = 0
    at = 0
    for text_spans, v, vec, p in zip(wanted, verdicts, vecs, probs):
        got = svecs[at:at + len(text_spans)]
        at += len(text_spans)
        if v is None:
            flags.append(None)
        elif classifier is None or embed is None:
            flags.append(decide(*v))
        elif vec is None:
            flags.append(decide(*v))
            unclassified += 1
        elif text_spans and any(g is None for g in got):
            # its spans not embedded in time: the whole-text classifier and the patterns decide
            flags.append(decide(v[0], v[1], vec, classifier, threshold, p=p))
            unclassified += 1
        else:
            span_p = classifier.span_probability(got, text_spans) if text_spans else None
            flags.append(decide(v[0], v[1], vec, classifier, threshold, span_p, p=p))
    return Inspection(flags, vecs, unclassified)


async def _embed_until(texts: Sequence[str], vecs: list[np.ndarray | None],
                       embed: Callable[[list[str]], Awaitable[np.ndarray]], deadline: float,
                       fatal: tuple[type[BaseException], ...]) -> None:
    """Embed ``texts`` in batches into ``vecs`` until ``deadline``."""
    for start in range(0, len(texts), EMBED_BATCH):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        batch = list(texts[start:start + EMBED_BATCH])
        fut = asyncio.ensure_future(embed(batch))
        try:
            got = await asyncio.wait_for(asyncio.shield(fut), timeout=left)
        except asyncio.TimeoutError:
            # the batch finishes on the embedder's thread; its result is not waited for
            fut.add_done_callback(_consume)
            return
        except fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - the embedder failed: these texts are not inspected
            log.warning("embedding documents for the injection classifier failed: %s", type(exc).__name__)
            return
        for i, row in enumerate(np.asarray(got, dtype=np.float32)):
            vecs[start + i] = row


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
