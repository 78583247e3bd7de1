"""The learned injection detector over a chunk's embedding.

A logistic regression, or one small ReLU hidden layer before it, whichever the shipped
weights hold (``bench/train_guard.py --model``). Runs beside the patterns of
:mod:`kb_rerank.guard.detectors`, which stay the high-precision layer: a chunk is flagged
when the classifier's probability reaches ``KB_GUARD_CLASSIFIER_THRESHOLD``, or when the
patterns flag it and the probability is not below the weights' ``floor`` (the classifier,
which reads the whole passage, vetoes a pattern hit it finds clearly benign: a security
article quoting "ignore previous instructions"; see :func:`kb_rerank.guard.verdict.decide`).
The input is the embedding the chunk already has at ingestion plus the pattern score and the
number of pattern signals: a dot product or two per chunk. Span-level scoring (weights from
2026-12-01.2, ``span_threshold``): a hostile clause inside otherwise benign text is diluted
in the whole-chunk embedding, so a chunk the classifier finds at all doubtful (probability
>= ``span_gate``) also has its sentence windows and surfaced hidden spans (:func:`spans`)
embedded and scored, and is flagged when one of them reaches ``span_threshold``
(bench/results/guard-spans.md: measured by leave-one-source-out cross-validation; the
embedder returns no token states, so each span is one more, short, embedding).

The weights ship inside the package (``classifier.npz``: coefficients with the
feature standardisation folded in, intercept, version, the embedder they were trained on);
``bench/train_guard.py`` rebuilds them from the recorded sources and seed. They apply only
to vectors of that embedder: with another ``KB_EMBEDDER`` the classifier is skipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from kb_rerank.guard import detectors
from kb_rerank.guard.detectors import InjectionVerdict

WEIGHTS_RESOURCE = "classifier.npz"

# span-level scoring: a chunk longer than SPAN_MIN_CHARS is also read as windows
# of whole sentences (packed up to SPAN_CHARS characters, no overlap) plus the hidden HTML
# (comments, CSS-hidden elements), code blocks and markdown images in it, each its own span
SPAN_MIN_CHARS = 200
SPAN_CHARS = 160
SPAN_MAX = 8  # spans per chunk, at most
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])|\n+")
_CODE_BLOCK = re.compile(r"```.*?(?:```|$)|~~~.*?(?:~~~|$)", re.DOTALL)
_MD_IMAGE = re.compile(r"!\[[^\]\n]{0,200}\]\([^)\s]{1,500}\)")


def spans(text: str) -> list[str]:
    """The windows of ``text`` the classifier reads beside the whole text: for a text of at
    most :data:`SPAN_MIN_CHARS` characters, none, or its de-obfuscated form
    (:func:`kb_rerank.guard.detectors.deobfuscated`: hidden characters out, payloads
    decoded, homoglyphs folded) when it has one; else its sentences (those of the
    de-obfuscated form, when it has one) packed in order into windows of at most
    :data:`SPAN_CHARS` characters (a longer sentence is its own window, cut at twice that),
    after the hidden HTML, code blocks and markdown images, at most :data:`SPAN_MAX` spans in
    all (the surfaced ones first). Deterministic; shared by training (bench/train_guard.py)
    and scoring."""
    view = detectors.deobfuscated(text)
    if len(text) <= SPAN_MIN_CHARS:
        return [view.strip()[: 2 * SPAN_CHARS]] if view and view.strip() else []
    special = [s for s in detectors._html_comments(text) + detectors._hidden_elements(text) if len(s.strip()) >= 12]
    special += [m.group(0) for m in _CODE_BLOCK.finditer(text)] + [m.group(0) for m in _MD_IMAGE.finditer(text)]
    windows: list[str] = []
    cur = ""
    for sent in (x.strip() for x in _SENTENCE_END.split(view or text)):
        if not sent:
            continue
        if cur and len(cur) + 1 + len(sent) > SPAN_CHARS:
            windows.append(cur)
            cur = ""
        cur = f"{cur} {sent}" if cur else sent
    if cur:
        windows.append(cur)
    out: list[str] = []
    for s in [x.strip()[: 2 * SPAN_CHARS] for x in special] + [w[: 2 * SPAN_CHARS] for w in windows]:
        if s and s not in out and s != text.strip():
            out.append(s)
    return out[:SPAN_MAX]


def features(embedding: np.ndarray, verdict: InjectionVerdict) -> np.ndarray:
    """The classifier's input: the L2-normalised embedding, the pattern score and the
    number of pattern signals (capped at 5, scaled to 0..1). Used by training and by
    scoring alike (one definition)."""
    v = np.asarray(embedding, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(v))
    if norm > 0:
        v = v / norm
    return np.concatenate([v, [float(verdict.score), min(len(verdict.reasons), 5) / 5.0]])


@dataclass(frozen=True)
class GuardClassifier:
    coef: np.ndarray  # (dim + 2,) for a logistic regression, (hidden,) after a hidden layer
    intercept: float
    version: str
    embedder: str
    dim: int
    # one ReLU hidden layer (dim + 2 -> hidden) before the logistic output, or none
    w1: np.ndarray | None = None
    b1: np.ndarray | None = None
    # pattern veto: a pattern hit counts unless the probability is below this (0: never vetoed)
    floor: float = 0.0
    # span-level scoring: a chunk whose probability is at least span_gate has its spans
    # (:func:`spans`) embedded and scored by the same model; it is flagged when the highest
    # span probability reaches span_threshold (None: no span scoring, weights before 2026-12-01.2)
    span_threshold: float | None = None
    span_gate: float = 0.0
    # strong evidence: a text the patterns flag with a probability at or above this is what the
    # default policy excludes (kb_rerank.guard.verdict.strong_evidence; held-out false-positive
    # rate on ordinary text <= 0.1 %: bench/results/guard-ordinary.md); any other flag is
    # doubtful, demoted and reported. None: weights without it (nothing excluded)
    strong_threshold: float | None = None
    # the operating point the weights were chosen at (KB_GUARD_CLASSIFIER_THRESHOLD's default)
    threshold: float | None = None

    def wants_spans(self, p: float) -> bool:
        """Whether a chunk of probability ``p`` has its spans scored."""
        return self.span_threshold is not None and p >= self.span_gate

    def span_probability(self, span_embeddings, span_texts) -> float:
        """The highest probability over the spans (their embeddings, and their texts for the
        pattern features); 0.0 for none."""
        return max((self.probability(e, detectors.detect_injection(t)) for e, t in zip(span_embeddings, span_texts)),
                   default=0.0)

    def probability(self, embedding: np.ndarray, verdict: InjectionVerdict) -> float:
        x = features(embedding, verdict)
        if self.w1 is not None:
            x = np.maximum(x @ self.w1 + self.b1, 0.0)
        z = float(x @ self.coef) + self.intercept
        # numerically stable logistic
        if z >= 0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)


def from_arrays(data) -> GuardClassifier:
    files = set(getattr(data, "files", None) or data.keys())
    hidden = "w1" in files
    return GuardClassifier(
        coef=np.asarray(data["coef"], dtype=np.float64).reshape(-1),
        intercept=float(np.asarray(data["intercept"]).reshape(-1)[0]),
        version=str(np.asarray(data["version"]).item()),
        embedder=str(np.asarray(data["embedder"]).item()),
        dim=int(np.asarray(data["dim"]).item()),
        w1=np.asarray(data["w1"], dtype=np.float64) if hidden else None,
        b1=np.asarray(data["b1"], dtype=np.float64).reshape(-1) if hidden else None,
        floor=float(np.asarray(data["floor"]).item()) if "floor" in files else 0.0,
        span_threshold=float(np.asarray(data["span_threshold"]).item()) if "span_threshold" in files else None,
        span_gate=float(np.asarray(data["span_gate"]).item()) if "span_gate" in files else 0.0,
        strong_threshold=float(np.asarray(data["strong_threshold"]).item()) if "strong_threshold" in files else None,
        threshold=float(np.asarray(data["threshold"]).item()) if "threshold" in files else None,
    )


@lru_cache(maxsize=1)
def load_shipped() -> GuardClassifier:
    """The weights shipped in the package (read once)."""
    with resources.files("kb_rerank.guard").joinpath(WEIGHTS_RESOURCE).open("rb") as f:
        with np.load(f, allow_pickle=False) as data:
            return from_arrays(data)


def classifier_for(embedder_name: str, dim: int) -> GuardClassifier | None:
    """The shipped classifier when it was trained on vectors of this embedder, else None."""
    clf = load_shipped()
    if clf.embedder != embedder_name or clf.dim != dim:
        return None
    return clf
