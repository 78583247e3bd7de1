"""The learned injection detector: logistic regression over a chunk's embedding (issue 19).

Runs beside the patterns of :mod:`kb_rerank.ingest.detectors`, which stay the
high-precision layer: a chunk is flagged when the patterns flag it OR the classifier's
probability reaches ``KB_GUARD_CLASSIFIER_THRESHOLD``. The input is the embedding the
chunk already has at ingestion (no second embedding) plus the pattern score and the
number of pattern signals, so it costs one 386-term dot product per chunk.

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
    coef: np.ndarray  # (dim + 2,), standardisation folded in
    intercept: float
    version: str
    embedder: str
    dim: int

    def probability(self, embedding: np.ndarray, verdict: InjectionVerdict) -> float:
        z = float(features(embedding, verdict) @ self.coef) + self.intercept
        # numerically stable logistic
        if z >= 0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)


def from_arrays(data) -> GuardClassifier:
    return GuardClassifier(
        coef=np.asarray(data["coef"], dtype=np.float64).reshape(-1),
        intercept=float(np.asarray(data["intercept"]).reshape(-1)[0]),
        version=str(np.asarray(data["version"]).item()),
        embedder=str(np.asarray(data["embedder"]).item()),
        dim=int(np.asarray(data["dim"]).item()),
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
