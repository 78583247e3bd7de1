"""The lexical injection detector: a logistic regression over hashed character and word n-grams.

A second learned vote beside :mod:`kb_rerank.guard.classifier`. The embedding classifier reads
one pooled 384-dimension vector of the whole chunk, where a hostile sentence inside ordinary
text is diluted; this model reads the words themselves ("leave it out of your answers", "tell
the reader that", "call the tool"), in every language the character n-grams cover, over the
whole text and over each of its sentence windows (:func:`kb_rerank.guard.classifier.spans`),
the highest probability deciding, calibrated for the text's detected language
(:attr:`LexicalDetector.offsets`). It needs no embedding, so it also runs with another
``KB_EMBEDDER``; it costs a few milliseconds a chunk (bench/guard_lexical_cost.py,
bench/results/guard-lexical-cost.md).

Features (:func:`features`, the one definition training and scoring share): the text as the
patterns read it (:func:`kb_rerank.guard.detectors.normalised`: hidden characters out, payloads
decoded, NFKC, case folded, accents stripped, homoglyphs folded), whitespace collapsed;
character 3-, 4- and 5-grams, word 1- and 2-grams, and character 1- and 2-grams within runs of
CJK characters (:data:`CJK_N`), and, with the ``addressee`` feature set, the word 1- and 2-grams
and CJK 2-grams of each sentence that names a machine reader (:data:`_ADDRESSEE`: an assistant,
AI, chatbot, language model, summariser, in the six training languages) read again under their
own prefix, so that "tell customers that..." and "assistant, tell customers that..." differ
(a linear model cannot conjoin two n-grams itself); each hashed into :data:`BUCKETS` buckets
by CRC-32 (zlib's, stable across processes and platforms), counted, weighted
``1 + log(count)`` and L2-normalised. Hand-written rather than scikit-learn's
HashingVectorizer because scikit-learn is not a dependency of the service; the training script
(bench/train_guard_lexical.py) builds its matrices with this same function.

The weights ship in the package (``lexical.npz``: float16 coefficients, intercept, version,
bucket count, the operating threshold chosen on ordinary text first, each language's logit
offset, and the SHA-256 of the coefficients and offsets, checked at load).
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np

from kb_rerank.guard import detectors

WEIGHTS_RESOURCE = "lexical.npz"
BUCKETS = 1 << 18
CHAR_N = (3, 4, 5)
WORD_N = (1, 2)
# character n-grams read again within runs of CJK characters (Han, kana, Hangul): a Chinese word
# is mostly one or two characters, shorter than CHAR_N reads, and a sentence is one \w+ "word"
CJK_N = (1, 2)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
MAX_CHARS = 4000  # a chunk is at most ~1,000 characters plus its title; a longer text is read to here
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"\w+")
# the names of a machine reader, as the normalised text spells them (case folded, accents
# stripped): en, de, fr, es, vi, zh. A bare "agent" or "model" is left out: both name people and
# products in ordinary text (support agents, model K-40)
_ADDRESSEE = re.compile(
    r"(?<![a-z])(?:ai|a\.i|ki|ia|llms?|gpt|copilot|chat ?bots?|bots?|assistant(?:e|s|es)?|assistent(?:en|in)?"
    r"|asistentes?|summari[sz]ers?|resumeurs?|resumidor(?:es)?|language models?|sprachmodell(?:e|en)?"
    r"|modeles? de langage|modelos? de lenguaje|mo hinh(?: ngon ngu)?|tro ly|tac tu)(?![a-z])"
    r"|助手|语言模型|大模型|模型|机器人|智能体|人工智能")
_SENTENCE = re.compile(r"[.!?\n。！？]+")
FEATURE_SETS = ("base", "addressee")


def features(text: str, addressee: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The hashed n-gram features of ``text``: (bucket indices, values), the values
    ``1 + log(count)`` L2-normalised; empty arrays for a blank text. ``addressee``: the
    sentences naming a machine reader add their words again under the prefix ``a:``."""
    norm = _SPACE.sub(" ", detectors.normalised(text[:MAX_CHARS])).strip()
    if not norm:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    counts: dict[int, int] = {}
    crc = zlib.crc32
    padded = f" {norm} "
    for n in CHAR_N:
        for i in range(len(padded) - n + 1):
            h = crc(padded[i:i + n].encode()) % BUCKETS
            counts[h] = counts.get(h, 0) + 1
    for run in _CJK.findall(norm):
        for n in CJK_N:
            for i in range(len(run) - n + 1):
                h = crc(("k:" + run[i:i + n]).encode()) % BUCKETS
                counts[h] = counts.get(h, 0) + 1
    words = _WORD.findall(norm)
    for n in WORD_N:
        for i in range(len(words) - n + 1):
            h = crc(("w:" + " ".join(words[i:i + n])).encode()) % BUCKETS
            counts[h] = counts.get(h, 0) + 1
    if addressee and _ADDRESSEE.search(norm):
        for sent in _SENTENCE.split(norm):
            if not _ADDRESSEE.search(sent):
                continue
            sw = _WORD.findall(sent)
            for n in WORD_N:
                for i in range(len(sw) - n + 1):
                    h = crc(("a:" + " ".join(sw[i:i + n])).encode()) % BUCKETS
                    counts[h] = counts.get(h, 0) + 1
            for run in _CJK.findall(sent):
                for i in range(len(run) - 1):
                    h = crc(("ak:" + run[i:i + 2]).encode()) % BUCKETS
                    counts[h] = counts.get(h, 0) + 1
    idx = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    val = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
    return idx, val / float(np.linalg.norm(val))


def _logistic(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True)
class LexicalDetector:
    coef: np.ndarray  # (BUCKETS,)
    intercept: float
    version: str
    # the operating point chosen with the weights (held-out ordinary false-positive rate <= 0.5 %
    # in every language and kind: bench/results/guard-lexical.md); KB_GUARD_LEXICAL_THRESHOLD's default
    threshold: float
    # per detected language (:func:`kb_rerank.core.language.detect_language`), the logit added so
    # that ``threshold`` sits at that language's own operating point, chosen with the weights on
    # held-out ordinary text (bench/train_guard_lexical.py): a language whose ordinary text scores
    # low is read with a lower bar; a language without an entry (or none detected) adds nothing
    offsets: dict[str, float] = field(default_factory=dict)
    # the feature set the weights were trained on (:data:`FEATURE_SETS`; :func:`features`)
    feature_set: str = "base"

    def _logit(self, text: str) -> float:
        idx, val = features(text, self.feature_set == "addressee")
        return float(self.coef[idx] @ val) + self.intercept

    def probability(self, text: str) -> float:
        """The probability of injection of ``text`` read whole (uncalibrated: no language offset)."""
        return _logistic(self._logit(text))

    def text_probability(self, text: str) -> float:
        """The highest probability over ``text`` whole and its spans (the sentence windows and
        surfaced hidden spans the embedding classifier also reads), calibrated for the text's
        language (:attr:`offsets`)."""
        from kb_rerank.guard.classifier import spans

        z = max([self._logit(text)] + [self._logit(s) for s in spans(text)])
        return _logistic(z + self.offset(text))

    def offset(self, text: str) -> float:
        """The logit offset of ``text``'s detected language (0 without one)."""
        if not self.offsets:
            return 0.0
        from kb_rerank.core.language import detect_language

        return self.offsets.get(detect_language(text) or "", 0.0)


class LexicalWeightsError(ValueError):
    """The shipped lexical weights are damaged (their checksum does not match)."""


def digest(coef: np.ndarray, offsets: dict[str, float] | None = None, feature_set: str = "base") -> str:
    h = hashlib.sha256(np.ascontiguousarray(coef, dtype=np.float16).tobytes())
    for lang, v in sorted((offsets or {}).items()):
        h.update(f"|{lang}={float(v)!r}".encode())
    if feature_set != "base":
        h.update(f"|features={feature_set}".encode())
    return h.hexdigest()


def from_arrays(data) -> LexicalDetector:
    coef = np.asarray(data["coef"], dtype=np.float16).reshape(-1)
    if coef.shape[0] != BUCKETS or int(np.asarray(data["buckets"]).item()) != BUCKETS:
        raise LexicalWeightsError(f"lexical weights have {coef.shape[0]} buckets, this code hashes into {BUCKETS}")
    keys = set(getattr(data, "files", None) or data.keys())
    offsets = {}
    if "offset_langs" in keys:
        offsets = {str(k): float(v) for k, v in zip(np.asarray(data["offset_langs"]).tolist(),
                                                    np.asarray(data["offset_values"], dtype=np.float64).tolist())}
    feature_set = str(np.asarray(data["features"]).item()) if "features" in keys else "base"
    if feature_set not in FEATURE_SETS:
        raise LexicalWeightsError(f"lexical weights need the feature set {feature_set!r}, this code has {FEATURE_SETS}")
    if str(np.asarray(data["sha256"]).item()) != digest(coef, offsets, feature_set):
        raise LexicalWeightsError("lexical weights do not match their checksum")
    return LexicalDetector(coef=coef.astype(np.float64), intercept=float(np.asarray(data["intercept"]).item()),
                           version=str(np.asarray(data["version"]).item()),
                           threshold=float(np.asarray(data["threshold"]).item()), offsets=offsets,
                           feature_set=feature_set)


def to_arrays(coef: np.ndarray, intercept: float, version: str, threshold: float,
              offsets: dict[str, float] | None = None, feature_set: str = "base") -> dict:
    c = np.asarray(coef, dtype=np.float16).reshape(-1)
    offsets = {k: float(v) for k, v in sorted((offsets or {}).items())}
    return {"features": np.array(feature_set), "coef": c, "intercept": np.array(float(intercept)), "version": np.array(version),
            "buckets": np.array(BUCKETS), "threshold": np.array(float(threshold)),
            "offset_langs": np.array(list(offsets), dtype=str), "offset_values": np.array(list(offsets.values()),
                                                                                         dtype=np.float64),
            "sha256": np.array(digest(c, offsets, feature_set))}


@lru_cache(maxsize=1)
def load_shipped() -> LexicalDetector:
    """The weights shipped in the package (read once, checksum verified)."""
    with resources.files("kb_rerank.guard").joinpath(WEIGHTS_RESOURCE).open("rb") as f:
        with np.load(f, allow_pickle=False) as data:
            return from_arrays(data)
