"""Helpers for tests and benchmarks (a tiny offline cross-encoder). The runtime never
imports this package (tests/project/test_packaging.py checks it); building a model needs the
``[rerank]`` extra (torch, transformers), imported only when a builder runs.

    from pathlib import Path
    from kb_rerank.testing import build_tiny_cross_encoder

    model_dir = build_tiny_cross_encoder(Path("tiny-cross-encoder"))  # KB_RERANKER_MODEL=tiny-cross-encoder
"""

from kb_rerank.testing.tiny_model import build_random_bge_reranker_v2_m3, build_tiny_cross_encoder

__all__ = ["build_random_bge_reranker_v2_m3", "build_tiny_cross_encoder"]
