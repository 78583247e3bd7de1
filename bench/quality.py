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
  * ``bm25s stem`` the BM25 people run (BEIR / Anserini style) for the collection's language
    (:func:`collection_language`, ``--language``): :func:`stem_baseline`, Lucene scoring k1 1.2,
    b 0.75. English: bm25s's tokenizer, English stop words and the Snowball English stemmer
    (PyStemmer), as before (row ``bm25s stem (en stop words, Snowball)``). Other languages: the
    language's Snowball stemmer when PyStemmer has one, its stop words (bm25s's list, else
    stopwords-iso), words split as bm25s does but keeping combining marks inside a word
    (Devanagari vowel signs); Thai: pythainlp newmm, Thai stop words; Chinese: jieba;
    Japanese: fugashi (unidic-lite) surface forms; Vietnamese: lower-case syllables,
    stopwords-iso's list, no stemmer (none exists). Rows say which analyser, e.g.
    ``bm25s stem (ru stop words, Snowball russian)``
  * ``dense exact`` exact cosine search in numpy over the same chunk embeddings (same
    embedder, read from the embedding cache), best chunk per document
  * ``rrf(bm25s, dense)`` RRF k=60 over the top 100 of ``bm25s lucene`` and ``dense exact``
  * ``rrf(bm25s stem, dense)`` the textbook hybrid: RRF k=60 over the top 100 of ``bm25s stem``
    and ``dense exact`` (per document); for a language other than English the row names the
    analyser, e.g. ``rrf(bm25s stem (russian), dense) k=60 (textbook)``

Each baseline row also carries ``role`` (``bm25s_stem``, ``dense``, ``rrf_textbook``, ...), a
name that does not change with the language (bench/figures.py reads it).

``--baselines-only`` skips the database (no ``ours`` rows) and writes
``bench/results/quality-baselines-<dataset>.json``; ``--no-dense`` also skips the dense and
RRF rows (no embedding), for collections whose embeddings are not cached.

Metrics per row: nDCG@10, MRR@10, Recall@40 (the candidate pool a cross-encoder reorders)
and Recall@100.

Every method indexes the same document text (``kb_rerank.eval.runs.document_text``: title +
text). ``Δ nDCG`` is the row's nDCG@10 minus the best baseline's.

Dev only (bm25s is in the dev extra). Example, on a scratch data dir:

    KB_DATA_DIR=/tmp/kb-eval kb-rerank migrate
    KB_DATA_DIR=/tmp/kb-eval OPENBLAS_NUM_THREADS=1 python bench/quality.py \\
        --datasets ../shared/datasets/xquad-vi [--limit-queries 50]
    OPENBLAS_NUM_THREADS=1 python bench/quality.py --baselines-only \\
        --datasets ../shared/datasets/xquad-ru ../shared/datasets/xquad-th
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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Callable

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
from kb_rerank.core.settings import Settings  # noqa: E402

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


# --------------------------------------------------------------------------- per-language baselines

# ISO 639-1 code -> PyStemmer (Snowball) algorithm name; used only when Stemmer.algorithms() has it
SNOWBALL = {
    "ar": "arabic", "hy": "armenian", "eu": "basque", "ca": "catalan", "cs": "czech", "da": "danish",
    "nl": "dutch", "en": "english", "eo": "esperanto", "et": "estonian", "fi": "finnish", "fr": "french",
    "de": "german", "el": "greek", "hi": "hindi", "hu": "hungarian", "id": "indonesian", "ga": "irish",
    "it": "italian", "lt": "lithuanian", "ne": "nepali", "no": "norwegian", "nb": "norwegian",
    "fa": "persian", "pl": "polish", "pt": "portuguese", "ro": "romanian", "ru": "russian", "sr": "serbian",
    "st": "sesotho", "es": "spanish", "sv": "swedish", "ta": "tamil", "tr": "turkish", "yi": "yiddish",
}
# languages bm25s ships a stop-word list for (bm25s.tokenization._infer_stopwords)
BM25S_STOPWORDS = frozenset("en de nl fr es pt it ru sv no zh tr ko da".split())
SEGMENTED = {"th": "pythainlp newmm", "zh": "jieba", "ja": "fugashi unidic-lite"}
_EXTRA_NAMES = {"thai": "th", "vietnamese": "vi", "chinese": "zh", "japanese": "ja", "korean": "ko",
                "english": "en", "norwegian": "no", "bokmal": "nb"}
LANGUAGE_CODES = frozenset(SNOWBALL) | frozenset(SEGMENTED) | frozenset(_EXTRA_NAMES.values())
_BM25S_PATTERN = r"(?u)\b\w\w+\b"  # bm25s.tokenize's default token_pattern


def normalise_language(name: str) -> str:
    """'ru', 'RU', 'ru-RU', 'Russian' -> 'ru'; an unknown name is returned lower-cased."""
    n = name.strip().lower().replace("_", "-")
    n = n.split("-")[0] if "-" in n and n.split("-")[0] in LANGUAGE_CODES else n
    if n in LANGUAGE_CODES:
        return n
    by_name = {v: k for k, v in SNOWBALL.items() if k != "nb"} | _EXTRA_NAMES
    return by_name.get(n, n)


_LANGUAGE_LINE = re.compile(r"(?im)^[\s>*_-]*language[*_\s]*[:=][*_\s]*([A-Za-z][A-Za-z_-]*)")


def collection_language(path: str | Path, override: str | None = None) -> str:
    """The language of a BEIR folder: ``override`` (``--language``) when given, else a
    ``Language: xx`` line of its SOURCE.md, else the folder name's suffix when it is a language
    code (``xquad-ru`` -> ``ru``), else English (cranfield, cisi, cacm)."""
    if override:
        return normalise_language(override)
    path = Path(path)
    src = path / "SOURCE.md"
    if src.is_file():
        m = _LANGUAGE_LINE.search(src.read_text(encoding="utf-8", errors="replace"))
        if m and normalise_language(m.group(1)) in LANGUAGE_CODES:
            return normalise_language(m.group(1))
    name = (path.name or path.resolve().name).lower()
    m = re.search(r"[-_.]([a-z]{2,3})$", name)
    if m and m.group(1) in LANGUAGE_CODES:
        return m.group(1)
    return "en"


@lru_cache(maxsize=None)
def _mark_class() -> str:
    """A regex character class of every combining mark (Unicode categories Mn, Mc, Me)."""
    ranges, start, prev = [], None, None
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp)) in ("Mn", "Mc", "Me"):
            if start is None:
                start = cp
            elif cp != prev + 1:
                ranges.append((start, prev))
                start = cp
            prev = cp
    if start is not None:
        ranges.append((start, prev))
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


@lru_cache(maxsize=None)
def word_pattern(min_len: int = 2) -> re.Pattern:
    """bm25s's words (runs of \\w, at least ``min_len``) with combining marks kept inside a word:
    Python's \\w leaves out Devanagari and Thai vowel signs, so bm25s's own pattern cuts
    हिन्दी into 'रत'-like pieces. On text without combining marks it finds what bm25s finds."""
    return re.compile(f"(?:\\w|[{_mark_class()}]){{{min_len},}}")


def fold(word: str) -> str:
    """kb.kb_text's accent folding: NFKD, combining marks (combining class > 0) dropped, đ -> d."""
    t = unicodedata.normalize("NFKD", word)
    return "".join(c for c in t if not unicodedata.combining(c)).replace("đ", "d").replace("Đ", "D")


@lru_cache(maxsize=None)
def stop_words(lang: str) -> tuple[frozenset[str], str]:
    """The stop words users reach for: bm25s's list when it has one for ``lang``, Thai from
    pythainlp, else stopwords-iso (empty when it has none). Returns (words, source)."""
    if lang in BM25S_STOPWORDS:
        from bm25s.tokenization import _infer_stopwords

        return frozenset(_infer_stopwords(lang)), "bm25s"
    if lang == "th":
        from pythainlp.corpus import thai_stopwords

        return frozenset(thai_stopwords()), "pythainlp"
    import stopwordsiso

    if stopwordsiso.has_lang(lang):
        return frozenset(w.lower() for w in stopwordsiso.stopwords(lang)), "stopwords-iso"
    return frozenset(), "none"


def _is_word(token: str) -> bool:
    return any(c.isalnum() for c in token)


@lru_cache(maxsize=None)
def _segmenter(lang: str) -> Callable[[str], list[str]]:
    if lang == "th":
        from pythainlp.tokenize import word_tokenize

        return lambda text: word_tokenize(text, engine="newmm", keep_whitespace=False)
    if lang == "zh":
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)
        return jieba.lcut
    if lang == "ja":
        import fugashi

        tagger = fugashi.Tagger()  # unidic-lite, the dictionary fugashi finds by itself
        return lambda text: [w.surface for w in tagger(text)]
    raise ValueError(lang)


@dataclass(frozen=True)
class Analyser:
    """A baseline's text analysis: split (or segment), lower-case, drop stop words, stem.

    ``analyser(text)`` gives one text's tokens, ``analyser.tokenize(texts)`` a list's, in the order
    bm25s.tokenize applies them (lower, split, stop words on the word as found, then stem)."""

    lang: str
    segmenter: str  # 'bm25s' (its \\w\\w+ pattern), 'words' (the same keeping marks), or SEGMENTED's
    stemmer: str | None  # PyStemmer algorithm
    stopwords: frozenset[str] = field(repr=False)
    stop_source: str = "none"

    @property
    def label(self) -> str:
        """Short: the language name ('russian', 'thai')."""
        if self.stemmer:
            return self.stemmer
        return {"th": "thai", "zh": "chinese", "ja": "japanese", "vi": "vietnamese"}.get(self.lang, self.lang)

    @property
    def description(self) -> str:
        if self.lang == "en" and self.segmenter == "bm25s":
            return "en stop words, Snowball"  # the row name of the English-only days, kept
        parts = [] if self.segmenter in ("bm25s", "words") else [SEGMENTED.get(self.lang, self.segmenter)]
        parts.append(f"{self.lang} stop words" if self.stopwords else "no stop words")
        parts.append(f"Snowball {self.stemmer}" if self.stemmer else "no stemmer")
        return ", ".join(parts)

    def with_stopwords(self, words: frozenset[str], source: str = "custom") -> "Analyser":
        return Analyser(self.lang, self.segmenter, self.stemmer, frozenset(words), source)

    def split(self, text: str) -> list[str]:
        """The words of a text, lower-cased, before stop words and stemming."""
        if self.segmenter == "bm25s":
            return re.findall(_BM25S_PATTERN, text.lower())
        if self.segmenter == "words":
            return word_pattern(2).findall(text.lower())
        return [t for t in (w.strip().lower() for w in _segmenter(self.lang)(text)) if t and _is_word(t)]

    def stem_function(self) -> Callable[[str], str] | None:
        if not self.stemmer:
            return None
        import Stemmer

        return Stemmer.Stemmer(self.stemmer).stemWord

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        stem = self.stem_function()
        cache: dict[str, str] = {}
        out = []
        for text in texts:
            words = [w for w in self.split(text) if w not in self.stopwords]
            if stem is not None:
                words = [cache[w] if w in cache else cache.setdefault(w, stem(w)) for w in words]
            out.append(words)
        return out

    def __call__(self, text: str) -> list[str]:
        return self.tokenize([text])[0]


def stem_baseline(lang: str) -> Analyser:
    """The bm25s analyser users run for ``lang`` (ISO code or name); see the module docstring."""
    lang = normalise_language(lang)
    words, source = stop_words(lang)
    if lang == "en":
        return Analyser("en", "bm25s", "english", words, source)
    if lang in SEGMENTED:
        return Analyser(lang, SEGMENTED[lang], None, words, source)
    import Stemmer

    algo = SNOWBALL.get(lang)
    return Analyser(lang, "words", algo if algo in Stemmer.algorithms() else None, words, source)


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


def evaluate_dataset(path: Path, settings: Settings, limit: int | None, *, language: str | None = None,
                     baselines_only: bool = False, dense: bool = True) -> dict:
    coll = load_beir(path)
    lang = collection_language(path, language)
    analyser = stem_baseline(lang)
    qids = sorted(coll.queries)[: limit if limit else None]
    queries = {q: coll.queries[q] for q in qids}
    qrels = {q: coll.qrels[q] for q in qids}
    embedder = None
    if dense or not baselines_only:
        from kb_rerank.models.embedders import get_embedder

        embedder = CachedEmbedder(get_embedder(settings), embed_cache_dir(settings))
    rows: list[dict] = []

    def score(run):
        return evaluate_run(run, qrels, extra_recall_ks=(POOL_RECALL_K,))

    def add(name, kind, res, seconds, note="", role=None):
        rows.append({"method": name, "kind": kind, **({"role": role} if role else {}),
                     "ndcg@10": res["ndcg@10"], "mrr@10": res["mrr@10"],
                     "recall@40": res["recall@40"], "recall@100": res["recall@100"],
                     "seconds": round(seconds, 2), "note": note,
                     "per_query_ndcg@10": {q: v["ndcg@10"] for q, v in res["per_query"].items()}})
        print(f"  {name}: nDCG@10 {res['ndcg@10']:.4f} ({seconds:.1f}s)", file=sys.stderr, flush=True)

    if not baselines_only:
        fusion = (f"hybrid (depth {settings.fusion_depth}, rrf_k {settings.rrf_k}, "
                  f"w {settings.lexical_weight:g}/{settings.semantic_weight:g})")
        for name, mode, cand in (("lexical", "lexical", None), ("semantic", "semantic", None),
                                 (fusion, "hybrid", None)):
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
    add("bm25s lucene (our analysis)", "baseline", score(lucene), time.perf_counter() - t0, role="bm25s_lucene_ours")

    import bm25s

    t0 = time.perf_counter()
    tok = lambda texts: bm25s.tokenize(texts, stopwords="en", stemmer=None, return_ids=False, show_progress=False)  # noqa: E731
    stock = bm25s_run(doc_ids, tok([d.text for d in docs]), dict(zip(queries, tok(list(queries.values())))),
                      dedup_query=False)
    add("bm25s en-stop", "baseline", score(stock), time.perf_counter() - t0, role="bm25s_en_stop")

    t0 = time.perf_counter()
    stem = bm25s_run(doc_ids, analyser.tokenize([d.text for d in docs]),
                     dict(zip(queries, analyser.tokenize(list(queries.values())))), dedup_query=False)
    add(f"bm25s stem ({analyser.description})", "baseline", score(stem), time.perf_counter() - t0,
        f"language {lang}; stop words: {analyser.stop_source} ({len(analyser.stopwords)})", role="bm25s_stem")

    if dense:
        t0 = time.perf_counter()
        dense_ranking = dense_run(settings, docs, queries, embedder)
        add(f"dense exact ({embedder.name})", "baseline", score(dense_ranking), time.perf_counter() - t0,
            role="dense")

        t0 = time.perf_counter()
        add("rrf(bm25s lucene, dense) k=60", "baseline", score(rrf(lucene, dense_ranking)), time.perf_counter() - t0,
            role="rrf_lucene")
        t0 = time.perf_counter()
        stem_name = "bm25s stem" if lang == "en" else f"bm25s stem ({analyser.label})"
        add(f"rrf({stem_name}, dense) k=60 (textbook)", "baseline", score(rrf(stem, dense_ranking)),
            time.perf_counter() - t0, role="rrf_textbook")

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
        "language": lang,
        "analyser": {"segmenter": analyser.segmenter, "stemmer": analyser.stemmer,
                     "stop_words": analyser.stop_source, "num_stop_words": len(analyser.stopwords)},
        "baselines_only": baselines_only,
        "embedder": embedder.name if embedder else None,
        "candidates": settings.candidates,
        "rrf_k": settings.rrf_k,
        "best_baseline": best["method"],
        "embed_cache": {"hits": embedder.hits, "misses": embedder.misses} if embedder else None,
        "rows": rows,
    }


def markdown(res: dict) -> str:
    head = (f"### {res['dataset']} ({res.get('language', 'en')}; {res['num_docs']} docs, {res['num_queries']} queries"
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
    ap.add_argument("--language", default=None,
                    help="the collections' language (ISO code or name) instead of collection_language()'s")
    ap.add_argument("--baselines-only", action="store_true",
                    help="only the in-process baselines, no database; writes quality-baselines-<dataset>.json")
    ap.add_argument("--no-dense", action="store_true",
                    help="with --baselines-only: lexical baselines only (no embedding, no RRF rows)")
    args = ap.parse_args(argv)
    if args.no_dense and not args.baselines_only:
        ap.error("--no-dense needs --baselines-only (the database rows embed anyway)")
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
        res = evaluate_dataset(path, settings, args.limit_queries, language=args.language,
                               baselines_only=args.baselines_only, dense=not args.no_dense)
        stem = "quality-baselines" if args.baselines_only else "quality"
        out = RESULTS / f"{stem}-{res['dataset']}.json"
        out.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(markdown(res))
        print(f"(written {out.relative_to(ROOT)})\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
