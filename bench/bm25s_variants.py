"""Which document text and k1 reproduce issue 15's "BM25 + stemming" reference figures.

bm25s (Lucene scoring, b 0.75) with English stop words and the Snowball English stemmer
(PyStemmer), as in bench/quality.py's ``bm25s stem`` baseline, over three document texts:
``ours`` (kb_rerank.eval.runs.document_text: the title dropped where the text already
starts with it, as Cranfield's does), ``title+text`` (BEIR's concatenation: Cranfield's
title then counts twice) and ``text only``; k1 1.2 (ours) and 1.5 (bm25s's default).
Prints nDCG@10 per collection (trec_eval definitions, kb_rerank.eval.measures).

    python bench/bm25s_variants.py [--datasets ../shared/datasets/{cranfield,cisi,cacm}]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def main(argv=None) -> int:
    import bm25s
    import Stemmer
    from quality import bm25s_run  # the baselines' own BM25 run (k1 is what varies here)

    from kb_rerank.eval.measures import evaluate_run, load_beir
    from kb_rerank.eval.runs import document_text

    shared = ROOT.parent / "shared" / "datasets"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", type=Path, default=[shared / n for n in ("cranfield", "cisi", "cacm")])
    args = ap.parse_args(argv)
    texts = {
        "ours": lambda t, x: document_text(t, x),
        "title+text": lambda t, x: f"{t} {x}".strip(),
        "text only": lambda t, x: x or t,
    }
    stemmer = Stemmer.Stemmer("english")

    def tok(items: list[str]) -> list[list[str]]:  # as bench/quality.py's `bm25s stem` baseline
        return bm25s.tokenize(items, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)

    print("| collection | document text | k1 1.2 | k1 1.5 |\n|---|---|---:|---:|")
    for path in args.datasets:
        coll = load_beir(path)
        ids = list(coll.corpus)
        queries = dict(zip(coll.queries, tok(list(coll.queries.values()))))
        for name, make in texts.items():
            docs = tok([make(*coll.corpus[i]) for i in ids])
            row = [evaluate_run(bm25s_run(ids, docs, queries, dedup_query=False, k1=k1), coll.qrels)["ndcg@10"]
                   for k1 in (1.2, 1.5)]
            print(f"| {path.name} | {name} | {row[0]:.4f} | {row[1]:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
