"""The learned injection detector over a chunk's embedding (issue 19).

A logistic regression, or one small ReLU hidden layer before it, whichever the shipped
weights hold (``bench/train_guard.py --model``). Runs beside the patterns of
:mod:`kb_rerank.ingest.detectors`, which stay the high-precision layer: a chunk is flagged
when the classifier's probability reaches ``KB_GUARD_CLASSIFIER_THRESHOLD``, or when the
patterns flag it and the probability is not below the weights' ``floor`` (the classifier,
which reads the whole passage, vetoes a pattern hit it finds clearly benign: a security
article quoting "ignore previous instructions"; see :func:`kb_rerank.ingest.verdict.decide`).
The input is the embedding the chunk already has at ingestion (no second embedding) plus the
pattern score and the number of pattern signals: a dot product or two per chunk.

The weights ship inside the package (``guard_classifier.npz``: coefficients with the
feature standardisation folded in, intercept, version, the embedder they were trained on);
``bench/train_guard.py`` rebuilds them from the recorded sources and seed. They apply only
to vectors of that embedder: with another ``KB_EMBEDDER`` the classifier is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from kb_rerank.ingest.detectors import InjectionVerdict

WEIGHTS_RESOURCE = "guard_classifier.npz"


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
    )


@lru_cache(maxsize=1)
def load_shipped() -> GuardClassifier:
    """The weights shipped in the package (read once)."""
    with resources.files("kb_rerank.ingest").joinpath(WEIGHTS_RESOURCE).open("rb") as f:
        with np.load(f, allow_pickle=False) as data:
            return from_arrays(data)


def classifier_for(embedder_name: str, dim: int) -> GuardClassifier | None:
    """The shipped classifier when it was trained on vectors of this embedder, else None."""
    clf = load_shipped()
    if clf.embedder != embedder_name or clf.dim != dim:
        return None
    return clf
