"""Ranking quality of our SQL search against in-process baselines, on BEIR-layout folders.

For each dataset folder, one table (Markdown on stdout) and ``bench/results/quality-<dataset>.json``:

ours (through the database, ``kb_rerank.eval.runs.evaluate_collection``):
  * ``lexical``  kb.search_lexical (BM25 in SQL, best chunk per document)
  * ``semantic`` kb.search_semantic (pgvector HNSW, cosine)
  * ``hybrid``   kb.search_hybrid with the production fusion (lists KB_FUSION_DEPTH deep,
                 KB_RRF_K, KB_LEXICAL_WEIGHT / KB_SEMANTIC_WEIGHT), as the service calls it
baselines (same run, in process):
  * ``bm25s lucene`` bm25s BM25(k1=1.2, b=0.75, method='lucene') over our analysis
    imitated in Python: lower-case, NFKD accent folding (combining marks stripped, đ->d),
    split on non-alphanumerics, no stemming; documents keep every word; in a query that
    kb.query_is_english accepts, the 33 English stop words are dropped (unless nothing is
    left); a word repeated in the query counts as often as it occurs (qtf), as in
    kb.query_term_counts
  * ``bm25s en-stop`` bm25s's own tokenizer (\\w\\w+, lower-case) with English stop words,
    no stemmer
  * ``bm25s stem`` the BM25 people run (BEIR / Anserini style): bm25s's tokenizer, English
    stop words and the Snowball English stemmer (PyStemmer), Lucene scoring k1 1.2, b 0.75
  * ``dense exact`` exact cosine search in numpy over the same chunk embeddings (same
    embedder, read from the embedding cache), best chunk per document
  * ``rrf(bm25s, dense)`` RRF k=60 over the top 100 of ``bm25s lucene`` and ``dense exact``
  * ``rrf(bm25s stem, dense)`` the textbook hybrid: RRF k=60 over the top 100 of ``bm25s stem``
    and ``dense exact`` (per document)

Metrics per row: nDCG@10, MRR@10, Recall@40 (the candidate pool a cross-encoder reorders)
and Recall@100.

Every method indexes the same document text (``kb_rerank.eval.runs.document_text``: title +
text). ``Δ nDCG`` is the row's nDCG@10 minus the best baseline's.

Dev only (bm25s is in the dev extra). Example, on a scratch data dir:

    KB_DATA_DIR=/tmp/kb-eval kb-rerank migrate
    KB_DATA_DIR=/tmp/kb-eval OPENBLAS_NUM_THREADS=1 python bench/quality.py \\
        --datasets ../shared/datasets/xquad-vi [--limit-queries 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
import unicodedata
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.eval.measures import evaluate_run, load_beir  # noqa: E402
from kb_rerank.eval.runs import (  # noqa: E402
    POOL_RECALL_K,
    CachedEmbedder,
    embed_cache_dir,
    evaluate_collection,
    passage_texts,
    source_docs,
)
from kb_rerank.settings import Settings  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DEPTH = 100
_SPLIT = re.compile(r"[^\W_]+")


def analyse(text: str) -> list[str]:
    """Python imitation of kb.kb_text (simple parser + unaccent), without code tokens."""
    t = unicodedata.normalize("NFKD", text.lower())
    t = "".join(c for c in t if not unicodedata.combining(c)).replace("đ", "d")
    return _SPLIT.findall(t)


# kb.stop_words_en(), kb.vi_syllable_shape(), kb.query_is_english() in Python
STOP_EN = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                    "there these they this to was will with".split())
_VI_SHAPE = re.compile(r"^(ngh|ng|nh|ch|gh|gi|kh|ph|qu|th|tr|[bcdghklmnprstvx])?[aeiouy]{1,3}(ng|nh|ch|[cmnpt])?$")


def analyse_query(text: str) -> list[str]:
    """:func:`analyse` plus the stop-word rule of kb.query_term_counts."""
    toks = analyse(text)
    english = all(ord(c) < 128 for c in text) and any(
        w in STOP_EN and not _VI_SHAPE.match(w) for w in re.split(r"[^a-z]+", text.lower()))
    if english:
        content = [t for t in toks if t not in STOP_EN]
        if content:
            return content
    return toks


def _topk(scores: np.ndarray, ids: list[str], k: int, *, positive: bool = False) -> list[str]:
    """Ids of the k best scores (ties: lower index first); with positive, only scores > 0."""
    k = min(k, len(ids))
    idx = np.argpartition(-scores, k - 1)[:k]
    idx = idx[np.lexsort((idx, -scores[idx]))]
    return [ids[i] for i in idx if not positive or scores[i] > 0]


def bm25s_run(doc_ids, doc_tokens, queries: dict[str, list[str]], *, dedup_query: bool,
              k1: float = 1.2) -> dict[str, list[str]]:
    import bm25s

    r = bm25s.BM25(k1=k1, b=0.75, method="lucene")
    r.index(doc_tokens, show_progress=False)
    vocab = r.vocab_dict
    run = {}
    for qid, toks in queries.items():
        toks = [t for t in toks if t in vocab and t != ""]
        if dedup_query:
            toks = list(dict.fromkeys(toks))
        run[qid] = _topk(r.get_scores(toks), doc_ids, DEPTH, positive=True) if toks else []
    return run


def dense_run(settings, docs, queries, embedder) -> dict[str, list[str]]:
    rows, owners = [], []
    for j, doc in enumerate(docs):
        texts = passage_texts(doc, settings)
        rows.append(embedder.embed_passages(texts))
        owners.extend([j] * len(texts))
    m = np.concatenate(rows).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    owners = np.asarray(owners)
    ids = [d.source_uri[len("beir:"):] for d in docs]
    run = {}
    for qid, text in queries.items():
        q = embedder.embed_query(text)
        q = q / np.linalg.norm(q)
        sims = m @ q
        best = np.full(len(docs), -np.inf, dtype=np.float32)
        np.maximum.at(best, owners, sims)
        run[qid] = _topk(best, ids, DEPTH)
    return run


def rrf(*runs: dict[str, list[str]], k: int = 60, depth: int = DEPTH) -> dict[str, list[str]]:
    out = {}
    for qid in runs[0]:
        score: dict[str, float] = {}
        for run in runs:
            for rank, d in enumerate(run.get(qid, [])[:depth], 1):
                score[d] = score.get(d, 0.0) + 1.0 / (k + rank)
        out[qid] = sorted(score, key=lambda d: (-score[d], d))
    return out


def evaluate_dataset(path: Path, settings: Settings, limit: int | None) -> dict:
    from kb_rerank.models.embedders import get_embedder

    coll = load_beir(path)
    qids = sorted(coll.queries)[: limit if limit else None]
    queries = {q: coll.queries[q] for q in qids}
    qrels = {q: coll.qrels[q] for q in qids}
    embedder = CachedEmbedder(get_embedder(settings), embed_cache_dir(settings))
    rows: list[dict] = []

    def score(run):
        return evaluate_run(run, qrels, extra_recall_ks=(POOL_RECALL_K,))

    def add(name, kind, res, seconds, note=""):
        rows.append({"method": name, "kind": kind, "ndcg@10": res["ndcg@10"], "mrr@10": res["mrr@10"],
                     "recall@40": res["recall@40"], "recall@100": res["recall@100"],
                     "seconds": round(seconds, 2), "note": note,
                     "per_query_ndcg@10": {q: v["ndcg@10"] for q, v in res["per_query"].items()}})
        print(f"  {name}: nDCG@10 {res['ndcg@10']:.4f} ({seconds:.1f}s)", file=sys.stderr, flush=True)

    fusion = (f"hybrid (depth {settings.fusion_depth}, rrf_k {settings.rrf_k}, "
              f"w {settings.lexical_weight:g}/{settings.semantic_weight:g})")
    for name, mode, cand in (("lexical", "lexical", None), ("semantic", "semantic", None), (fusion, "hybrid", None)):
        t0 = time.perf_counter()
        res = evaluate_collection(settings, path, mode, 10, embedder=embedder, limit_queries=limit,
                                  candidates=cand, progress=sys.stderr.isatty())
        add(name, "ours", res, time.perf_counter() - t0,
            f"{res['timing']['per_query_ms']:.1f} ms/query; load: {res['load']['ingest']}")

    docs = source_docs(coll)
    doc_ids = [d.source_uri[len("beir:"):] for d in docs]
    t0 = time.perf_counter()
    lucene = bm25s_run(doc_ids, [analyse(d.text) for d in docs], {q: analyse_query(t) for q, t in queries.items()},
                       dedup_query=False)
    add("bm25s lucene (our analysis)", "baseline", score(lucene), time.perf_counter() - t0)

    import bm25s

    t0 = time.perf_counter()
    tok = lambda texts: bm25s.tokenize(texts, stopwords="en", stemmer=None, return_ids=False, show_progress=False)  # noqa: E731
    stock = bm25s_run(doc_ids, tok([d.text for d in docs]), dict(zip(queries, tok(list(queries.values())))),
                      dedup_query=False)
    add("bm25s en-stop", "baseline", score(stock), time.perf_counter() - t0)

    import Stemmer

    t0 = time.perf_counter()
    stemmer = Stemmer.Stemmer("english")
    tok_stem = lambda texts: bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, return_ids=False,  # noqa: E731
                                            show_progress=False)
    stem = bm25s_run(doc_ids, tok_stem([d.text for d in docs]), dict(zip(queries, tok_stem(list(queries.values())))),
                     dedup_query=False)
    add("bm25s stem (en stop words, Snowball)", "baseline", score(stem), time.perf_counter() - t0)

    t0 = time.perf_counter()
    dense = dense_run(settings, docs, queries, embedder)
    add(f"dense exact ({embedder.name})", "baseline", score(dense), time.perf_counter() - t0)

    t0 = time.perf_counter()
    add("rrf(bm25s lucene, dense) k=60", "baseline", score(rrf(lucene, dense)), time.perf_counter() - t0)
    t0 = time.perf_counter()
    add("rrf(bm25s stem, dense) k=60 (textbook)", "baseline", score(rrf(stem, dense)), time.perf_counter() - t0)

    best = max((r for r in rows if r["kind"] == "baseline"), key=lambda r: r["ndcg@10"])
    for r in rows:
        r["delta_ndcg@10"] = r["ndcg@10"] - best["ndcg@10"]
    return {
        "dataset": coll.name,
        "path": str(path.resolve()),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "num_queries": len(qids),
        "limit_queries": limit,
        "num_docs": len(docs),
        "embedder": embedder.name,
        "candidates": settings.candidates,
        "rrf_k": settings.rrf_k,
        "best_baseline": best["method"],
        "embed_cache": {"hits": embedder.hits, "misses": embedder.misses},
        "rows": rows,
    }


def markdown(res: dict) -> str:
    head = (f"### {res['dataset']} ({res['num_docs']} docs, {res['num_queries']} queries"
            + (f", first {res['limit_queries']} only" if res["limit_queries"] else "") + ")\n\n")
    lines = ["| method | nDCG@10 | MRR@10 | Recall@40 | Recall@100 | Δ nDCG@10 vs best baseline |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        name = r["method"] if r["kind"] == "ours" else f"*{r['method']}*"
        lines.append(f"| {name} | {r['ndcg@10']:.4f} | {r['mrr@10']:.4f} | {r['recall@40']:.4f} | {r['recall@100']:.4f} "
                     f"| {r['delta_ndcg@10']:+.4f} |")
    return head + "\n".join(lines) + f"\n\nBest baseline: {res['best_baseline']}.\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="*", type=Path, default=None)
    ap.add_argument("--limit-queries", type=int, default=None)
    args = ap.parse_args(argv)
    datasets = args.datasets
    if not datasets:
        shared = ROOT.parent / "shared" / "datasets"
        datasets = sorted(p for p in shared.iterdir() if p.is_dir()) if shared.is_dir() else []
    if not datasets:
        ap.error("no dataset folders given and ../shared/datasets does not exist")
    settings = Settings.from_env()
    RESULTS.mkdir(parents=True, exist_ok=True)
    for path in datasets:
        print(f"{path}:", file=sys.stderr, flush=True)
        res = evaluate_dataset(path, settings, args.limit_queries)
        out = RESULTS / f"quality-{res['dataset']}.json"
        out.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(markdown(res))
        print(f"(written {out.relative_to(ROOT)})\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
