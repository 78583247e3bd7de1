"""Embedding throughput of the configured embedder (batch call), in passages and tokens per second.

    .venv/bin/python bench/embed_rate.py [--n 32] [--words 190]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.models.embedders import get_embedder  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

WORDS = ("invoice customer payment subscription report export settings account owner webhook "
         "signature tax rate currency refund credit note password security role admin member").split()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--words", type=int, default=190, help="words per passage (~250 tokens at 190)")
    args = p.parse_args()
    settings = Settings.from_env()
    emb = get_embedder(settings)
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(args.words)) for i in range(args.n)]
    tokens = None
    model = getattr(emb, "_model", None)
    if model is not None and hasattr(model, "token_count"):
        tokens = sum(model.token_count(t) for t in texts)
    emb.embed_passages(texts[:2])  # warm-up
    t0 = time.perf_counter()
    emb.embed_passages(texts)
    dt = time.perf_counter() - t0
    q0 = time.perf_counter()
    for _ in range(20):
        emb.embed_query("how do I export invoices to CSV")
    qdt = (time.perf_counter() - q0) / 20
    print(f"embedder={emb.name} passages={args.n} seconds={dt:.2f} passages/s={args.n / dt:.2f}"
          + (f" tokens={tokens} tokens/s={tokens / dt:.0f}" if tokens else "")
          + f" query_ms={qdt * 1000:.1f}")


if __name__ == "__main__":
    main()
