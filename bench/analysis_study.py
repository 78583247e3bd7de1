"""Which text analysis should our SQL implement, per language? A measurement without a database.

Pure Python: bm25s (BM25 Lucene, k1 1.2, b 0.75, as bench/quality.py's baselines) over every
query of each BEIR folder, one whole ranking per query over the documents (each xquad passage is
one chunk), scored with kb_rerank.eval.measures (the product's eval), nDCG@10. Documents are
``kb_rerank.eval.runs.document_text`` (title + text), as bench/quality.py indexes them. A word
repeated in a query counts as often as it occurs (qtf).

Decisions measured (``fold`` = NFKD, combining marks of combining class > 0 dropped, đ -> d:
what kb.kb_text's unaccent does; ``words`` = lower-case runs of letters/digits with combining
marks kept inside a word, two characters or more, bench/quality.py's ``word_pattern``):

(a) accents and stemming, collections whose language has a Snowball stemmer: ``fold -> stem``
    (fold the word, drop it if it is a folded stop word, stem the folded word) against
    ``stem -> fold`` (drop the word if it is a stop word as typed, stem it as typed, fold the
    stem). Both with the language's stop words (bench/quality.py ``stop_words``) on both sides.
    Reference rows, not candidates: ``stem, no fold`` (the bm25s baseline's analysis) and
    ``fold, no stem``.
(b) stop words, every collection, on the language's bm25s baseline analyser
    (bench/quality.py ``stem_baseline``): ``none``, ``queries only`` (documents keep every
    word; kb.query_term_counts' rule for English today) and ``documents and queries`` (bm25s).
(c) Thai segmentation (no stop words, no stemmer, lower-case): ``whole runs`` (a run of Thai
    letters, marks included, is one token, as PostgreSQL's default parser makes it),
    code-point bigrams and trigrams of each Thai run, grapheme-cluster bigrams (``regex`` \\X
    when installed, else a letter with the combining marks that follow it), pythainlp newmm;
    non-Thai runs stay whole words. Reference: newmm with Thai stop words (the baseline).
(d) Vietnamese accents (words of one character or more, as the SQL parser keeps them; no stop
    words): ``folded + exact`` (today's kb.to_tsv: every syllable folded, each syllable with
    diacritics also as typed; a query syllable is searched as typed; document length = folded
    syllables, kb.doc_length), ``folded only``, ``exact only``; and the same three with the
    queries typed without diacritics (folded), as users often type them.

For (a) and (b) each held-out collection gets the leave-one-collection-out choice: the
candidate with the best mean nDCG@10 over the other collections of the decision. (c) and (d)
are per-language by nature: reported only.

Writes bench/results/analysis-study.json and prints Markdown. Run:

    OPENBLAS_NUM_THREADS=1 python bench/analysis_study.py [--datasets DIR ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import unicodedata
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from kb_rerank.eval.measures import evaluate_run, load_beir  # noqa: E402
from kb_rerank.eval.runs import document_text  # noqa: E402

import quality as Q  # noqa: E402  bench/quality.py

RESULTS = ROOT / "bench" / "results"
DEPTH = Q.DEPTH
K1, B = 1.2, 0.75
COLLECTIONS = ("cranfield", "cisi", "cacm", "xquad-ru", "xquad-tr", "xquad-ar", "xquad-el", "xquad-ro",
               "xquad-hi", "xquad-th", "xquad-vi")


# --------------------------------------------------------------------------- ranking

def bm25_custom(doc_ids: list[str], doc_tokens: list[list[str]], doc_len: list[int],
                queries: dict[str, list[str]]) -> dict[str, list[str]]:
    """BM25 Lucene (bm25s's formula) with a document length given apart from the tokens
    (kb.doc_length counts folded words only, while kb.to_tsv also holds exact forms)."""
    n = len(doc_tokens)
    dl = np.asarray(doc_len, dtype=np.float64)
    norm = K1 * (1 - B + B * dl / dl.mean())
    postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    tmp: dict[str, list[tuple[int, int]]] = {}
    for j, toks in enumerate(doc_tokens):
        for t, c in Counter(toks).items():
            tmp.setdefault(t, []).append((j, c))
    for t, lst in tmp.items():
        postings[t] = (np.fromiter((j for j, _ in lst), dtype=np.int64), np.fromiter((c for _, c in lst), dtype=np.float64))
    run = {}
    for qid, toks in queries.items():
        scores = np.zeros(n)
        for t in toks:  # repeated query words count as often as they occur
            if t not in postings:
                continue
            js, tf = postings[t]
            idf = math.log(1 + (n - len(js) + 0.5) / (len(js) + 0.5))
            scores[js] += idf * tf / (tf + norm[js])
        run[qid] = Q._topk(scores, doc_ids, DEPTH, positive=True) if scores.any() else []
    return run


def bm25(doc_ids, doc_tokens, query_tokens: dict[str, list[str]]) -> dict[str, list[str]]:
    return Q.bm25s_run(doc_ids, doc_tokens, query_tokens, dedup_query=False)


class Collection:
    def __init__(self, path: Path):
        coll = load_beir(path)
        self.name = coll.name
        self.lang = Q.collection_language(path)
        docs = [(did, document_text(t, x)) for did, (t, x) in coll.corpus.items()]
        docs = [(d, t) for d, t in docs if t]  # as kb_rerank.eval.runs.source_docs
        self.doc_ids = [d for d, _ in docs]
        self.doc_texts = [t for _, t in docs]
        self.qids = sorted(coll.queries)
        self.queries = [coll.queries[q] for q in self.qids]
        self.qrels = {q: coll.qrels[q] for q in self.qids}

    def score(self, doc_tokens, query_tokens, doc_len=None) -> float:
        qt = dict(zip(self.qids, query_tokens))
        run = bm25(self.doc_ids, doc_tokens, qt) if doc_len is None else bm25_custom(self.doc_ids, doc_tokens, doc_len, qt)
        return evaluate_run(run, self.qrels)["ndcg@10"]

    def score_analyser(self, fn) -> float:
        return self.score([fn(t) for t in self.doc_texts], [fn(t) for t in self.queries])


# --------------------------------------------------------------------------- (a) fold / stem order

def order_analysers(lang: str) -> dict[str, object]:
    base = Q.stem_baseline(lang)
    stem = base.stem_function()
    stops = base.stopwords
    fstops = frozenset(Q.fold(w) for w in stops)
    pat = Q.word_pattern(2)
    cache: dict[str, str] = {}

    def st(w):
        if w not in cache:
            cache[w] = stem(w)
        return cache[w]

    def fold_stem(text):
        return [st(f) for f in (Q.fold(w) for w in pat.findall(text.lower())) if f and f not in fstops]

    def stem_fold(text):
        return [Q.fold(st(w)) for w in pat.findall(text.lower()) if w not in stops]

    def stem_only(text):
        return [st(w) for w in pat.findall(text.lower()) if w not in stops]

    def fold_only(text):
        return [f for f in (Q.fold(w) for w in pat.findall(text.lower())) if f and f not in fstops]

    return {"fold -> stem": fold_stem, "stem -> fold": stem_fold,
            "ref: stem, no fold": stem_only, "ref: fold, no stem": fold_only}


# --------------------------------------------------------------------------- (c) Thai

def _is_thai(word: str) -> bool:
    return any("\u0e00" <= c <= "\u0e7f" for c in word)


def graphemes(run: str) -> list[str]:
    try:
        import regex

        return regex.findall(r"\X", run)
    except ImportError:  # a letter with the combining marks that follow it
        out: list[str] = []
        for c in run:
            if out and unicodedata.category(c).startswith("M"):
                out[-1] += c
            else:
                out.append(c)
        return out


def ngrams(units: list[str], n: int) -> list[str]:
    if len(units) <= n:
        return ["".join(units)]
    return ["".join(units[i:i + n]) for i in range(len(units) - n + 1)]


def thai_analysers() -> dict[str, object]:
    runs = Q.word_pattern(1).findall
    from pythainlp.tokenize import word_tokenize

    def whole(text):
        return runs(text.lower())

    def cp(n):
        return lambda text: [g for w in runs(text.lower()) for g in (ngrams(list(w), n) if _is_thai(w) else [w])]

    def gr2(text):
        return [g for w in runs(text.lower()) for g in (ngrams(graphemes(w), 2) if _is_thai(w) else [w])]

    def newmm(text):
        return [t for t in (w.strip().lower() for w in word_tokenize(text, engine="newmm", keep_whitespace=False))
                if t and any(c.isalnum() for c in t)]

    base = Q.stem_baseline("th")
    return {"whole runs (PostgreSQL default parser)": whole, "code-point bigrams": cp(2),
            "code-point trigrams": cp(3), "grapheme-cluster bigrams": gr2, "pythainlp newmm": newmm,
            "ref: newmm + Thai stop words (baseline)": base}


# --------------------------------------------------------------------------- (d) Vietnamese

def vietnamese_variants(c: Collection) -> dict[str, float]:
    runs = Q.word_pattern(1).findall
    exact_d = [runs(t.lower()) for t in c.doc_texts]
    fold_d = [[Q.fold(w) for w in ws] for ws in exact_d]
    both_d = [f + [w for w in ws if w != Q.fold(w)] for f, ws in zip(fold_d, exact_d)]
    exact_q = [runs(t.lower()) for t in c.queries]
    fold_q = [[Q.fold(w) for w in ws] for ws in exact_q]
    flen = [len(f) for f in fold_d]
    out = {}
    for qname, q_exact, q_fold in (("queries as typed", exact_q, fold_q), ("queries without diacritics", fold_q, fold_q)):
        out[f"folded + exact (today), {qname}"] = c.score(both_d, q_exact, doc_len=flen)
        out[f"folded + exact, length counts both, {qname}"] = c.score(both_d, q_exact)
        out[f"folded only, {qname}"] = c.score(fold_d, q_fold)
        out[f"exact only, {qname}"] = c.score(exact_d, q_exact)
    return out


# --------------------------------------------------------------------------- leave one collection out

def leave_one_out(table: dict[str, dict[str, float]], candidates: list[str]) -> dict[str, dict]:
    """table[variant][collection] -> for each collection: the candidate best on mean over the others."""
    colls = sorted({c for v in candidates for c in table[v]})
    out = {}
    for held in colls:
        others = [c for c in colls if c != held]
        means = {v: float(np.mean([table[v][c] for c in others])) for v in candidates}  # ties: first candidate
        choice = max(candidates, key=lambda v: (means[v], -candidates.index(v)))
        best = max(candidates, key=lambda v: table[v][held])
        tied = [v for v in candidates if abs(table[v][held] - table[best][held]) < 1e-12]
        out[held] = {"choice": choice, "held_out_ndcg@10": table[choice][held],
                     "best_on_held_out": best if len(tied) == 1 else "tie: " + ", ".join(tied),
                     "best_ndcg@10": table[best][held],
                     "regret": table[best][held] - table[choice][held],
                     "mean_over_others": means}
    return out


# --------------------------------------------------------------------------- report

def md_table(title: str, table: dict[str, dict[str, float]], colls: list[str]) -> str:
    head = f"#### {title}\n\n| variant | " + " | ".join(colls) + " | mean |\n|---|" + "---:|" * (len(colls) + 1)
    lines = [head]
    for v, row in table.items():
        vals = [row.get(c) for c in colls]
        mean = np.mean([x for x in vals if x is not None]) if any(x is not None for x in vals) else None
        cells = [f"{x:.4f}" if x is not None else "–" for x in vals]
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {mean:.4f} |")
    return "\n".join(lines) + "\n"


def md_loo(loo: dict[str, dict]) -> str:
    lines = ["| held out | LOO choice | its nDCG@10 | best there | best nDCG@10 | regret |", "|---|---|---:|---|---:|---:|"]
    for c, r in loo.items():
        lines.append(f"| {c} | {r['choice']} | {r['held_out_ndcg@10']:.4f} | {r['best_on_held_out']} "
                     f"| {r['best_ndcg@10']:.4f} | {r['regret']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="*", type=Path, default=None)
    args = ap.parse_args(argv)
    paths = args.datasets
    if not paths:
        shared = ROOT.parent / "shared" / "datasets"
        if not shared.is_dir():
            shared = Path("/work/shared/datasets")
        paths = [shared / c for c in COLLECTIONS if (shared / c).is_dir()]
    if not paths:
        ap.error("no dataset folders given and ../shared/datasets does not exist")

    t_start = time.perf_counter()
    decisions: dict[str, dict] = {"a_fold_stem_order": {}, "b_stop_words": {}, "c_thai_segmentation": {},
                                  "d_vietnamese_accents": {}}
    meta = {}
    for path in paths:
        c = Collection(path)
        meta[c.name] = {"language": c.lang, "docs": len(c.doc_ids), "queries": len(c.qids)}
        print(f"{c.name} ({c.lang}, {len(c.doc_ids)} docs, {len(c.qids)} queries)", file=sys.stderr, flush=True)
        base = Q.stem_baseline(c.lang)
        if base.stemmer:
            for v, fn in order_analysers(c.lang).items():
                decisions["a_fold_stem_order"].setdefault(v, {})[c.name] = c.score_analyser(fn)
        stopless = base.with_stopwords(frozenset(), "none")
        docs_all = base.tokenize(c.doc_texts)
        docs_none = stopless.tokenize(c.doc_texts)
        q_all = base.tokenize(c.queries)
        q_none = stopless.tokenize(c.queries)
        # a query made only of stop words keeps its words (kb.query_term_counts' rule)
        q_only = [qa if qa else qn for qa, qn in zip(q_all, q_none)]
        b = decisions["b_stop_words"]
        b.setdefault("none", {})[c.name] = c.score(docs_none, q_none)
        b.setdefault("queries only", {})[c.name] = c.score(docs_none, q_only)
        b.setdefault("documents and queries (bm25s)", {})[c.name] = c.score(docs_all, q_all)
        if c.lang == "th":
            for v, fn in thai_analysers().items():
                decisions["c_thai_segmentation"].setdefault(v, {})[c.name] = c.score_analyser(fn)
        if c.lang == "vi":
            for v, x in vietnamese_variants(c).items():
                decisions["d_vietnamese_accents"].setdefault(v, {})[c.name] = x
        for d in decisions.values():
            for v, row in d.items():
                if c.name in row:
                    print(f"  {v}: {row[c.name]:.4f}", file=sys.stderr, flush=True)

    loo_a = leave_one_out(decisions["a_fold_stem_order"], ["fold -> stem", "stem -> fold"]) \
        if decisions["a_fold_stem_order"] else {}
    b_cands = ["none", "queries only", "documents and queries (bm25s)"]
    loo_b = leave_one_out(decisions["b_stop_words"], b_cands) if decisions["b_stop_words"] else {}

    colls = list(meta)
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "metric": "nDCG@10 (kb_rerank.eval.measures.evaluate_run), every query, whole ranking per query",
        "bm25": {"library": "bm25s", "method": "lucene", "k1": K1, "b": B},
        "collections": meta,
        "decisions": decisions,
        "leave_one_out": {"a_fold_stem_order": loo_a, "b_stop_words": loo_b},
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest = RESULTS / "analysis-study.json"
    dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    print("### Analysis study (nDCG@10, bm25s Lucene k1 1.2 b 0.75, all queries)\n")
    a_colls = [c for c in colls if any(c in r for r in decisions["a_fold_stem_order"].values())]
    if a_colls:
        print(md_table("(a) accents and stemming: fold then stem vs stem then fold", decisions["a_fold_stem_order"], a_colls))
        print("Leave-one-collection-out (candidates: fold -> stem, stem -> fold):\n")
        print(md_loo(loo_a))
    print(md_table("(b) stop words (the language's bm25s baseline analyser)", decisions["b_stop_words"], colls))
    print("Leave-one-collection-out (candidates: none, queries only, documents and queries):\n")
    print(md_loo(loo_b))
    for key, title, cl in (("c_thai_segmentation", "(c) Thai segmentation (no stop words unless said)", ["xquad-th"]),
                           ("d_vietnamese_accents", "(d) Vietnamese accents", ["xquad-vi"])):
        if decisions[key]:
            print(md_table(title, decisions[key], [c for c in cl if c in colls]))
    print(f"(written {dest.relative_to(ROOT)}; {out['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
