"""IR evaluation (trec_eval definitions) and a BEIR-layout collection loader.

Metric conventions (match ``trec_eval -m ndcg_cut -m recip_rank -m recall``):

* A document is *relevant* when its judgment is > 0. Unjudged documents and
  judgments <= 0 contribute nothing.
* ``ranked`` is taken in the given order (rank 1 first). A document id that
  occurs again further down the list is ignored (first occurrence wins), so a
  document can never be credited twice; later documents keep their positions.
* nDCG@k uses trec_eval's **linear** gain ``gain = rel`` (trec_eval's
  ``ndcg_cut``), **not** the ``2^rel - 1`` exponential gain of Burges et al.
  The two agree for binary judgments. Discount is ``log2(rank + 1)``.
* The ideal DCG is built from *all* judged relevant documents of the query
  (whether or not they were retrieved), sorted by grade, cut at k.
* Every metric is 0.0 for a query without relevant documents; such queries are
  left out of :func:`evaluate_run` averages (as trec_eval does by default).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BeirCollection",
    "evaluate_run",
    "load_beir",
    "mrr_at_k",
    "ndcg_at_k",
    "recall_at_k",
]


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")


def _top_k(ranked: Sequence[str], k: int) -> list[str]:
    """First k distinct document ids, in rank order."""
    seen: set[str] = set()
    out: list[str] = []
    for doc in ranked:
        if doc in seen:
            continue
        seen.add(doc)
        out.append(doc)
        if len(out) == k:
            break
    return out


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k with trec_eval's linear gain.

    ``DCG@k = sum_{i=1..k} rel(d_i) / log2(i + 1)`` where ``rel`` is the graded
    judgment (0 for unjudged / non-positive); ``IDCG@k`` is the same sum over
    all of the query's relevant judgments sorted by grade, descending.
    Note: linear gain ``rel`` (as trec_eval ``ndcg_cut``), not ``2^rel - 1``.
    Returns 0.0 when the query has no relevant document.
    """
    _check_k(k)
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    if not ideal:
        return 0.0
    idcg = math.fsum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    dcg = math.fsum(
        max(qrels.get(doc, 0), 0) / math.log2(i + 2) for i, doc in enumerate(_top_k(ranked, k))
    )
    return dcg / idcg


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """Reciprocal rank of the first document with judgment > 0 within the top k (else 0.0)."""
    _check_k(k)
    for i, doc in enumerate(_top_k(ranked, k)):
        if qrels.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 100) -> float:
    """|relevant docs in the top k| / |docs with judgment > 0| (0.0 when there are none)."""
    _check_k(k)
    n_rel = sum(1 for g in qrels.values() if g > 0)
    if n_rel == 0:
        return 0.0
    hits = sum(1 for doc in _top_k(ranked, k) if qrels.get(doc, 0) > 0)
    return hits / n_rel


def evaluate_run(
    run: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    k: int = 10,
    recall_k: int = 100,
    extra_recall_ks: Sequence[int] = (),
) -> dict[str, Any]:
    """Score a run (query id -> ranked doc ids) against qrels.

    ``extra_recall_ks``: further recall cut-offs, reported as ``recall@{r}`` beside the others
    (e.g. 40: the candidate pool a cross-encoder reorders).

    Evaluated queries are those in ``qrels`` with at least one relevant
    (judgment > 0) document; a query missing from ``run`` scores 0 on every
    metric. Run entries for other queries are ignored.

    Returns::

        {
          "ndcg@{k}": mean, "mrr@{k}": mean, "recall@{recall_k}": mean,
          "num_queries": number of evaluated queries,
          "num_missing": evaluated queries absent from the run,
          "per_query": {qid: {"ndcg@{k}": .., "mrr@{k}": .., "recall@{recall_k}": ..}},
        }

    Means are 0.0 when no query is evaluable.
    """
    _check_k(k)
    _check_k(recall_k)
    for r in extra_recall_ks:
        _check_k(r)
    names = (f"ndcg@{k}", f"mrr@{k}", f"recall@{recall_k}")
    extra = {f"recall@{r}": r for r in extra_recall_ks if r != recall_k}
    per_query: dict[str, dict[str, float]] = {}
    missing = 0
    for qid in sorted(qrels):
        judged = qrels[qid]
        if not any(g > 0 for g in judged.values()):
            continue
        ranked = run.get(qid)
        if ranked is None:
            missing += 1
            ranked = ()
        per_query[qid] = {
            names[0]: ndcg_at_k(ranked, judged, k),
            names[1]: mrr_at_k(ranked, judged, k),
            names[2]: recall_at_k(ranked, judged, recall_k),
            **{name: recall_at_k(ranked, judged, r) for name, r in extra.items()},
        }
    n = len(per_query)
    out: dict[str, Any] = {
        name: (math.fsum(v[name] for v in per_query.values()) / n if n else 0.0) for name in (*names, *extra)
    }
    out["num_queries"] = n
    out["num_missing"] = missing
    out["per_query"] = per_query
    return out


# --------------------------------------------------------------------------- BEIR loader


@dataclass
class BeirCollection:
    """A BEIR-layout test collection held in memory."""

    name: str
    corpus: dict[str, tuple[str, str]] = field(default_factory=dict)  # doc id -> (title, text)
    queries: dict[str, str] = field(default_factory=dict)  # query id -> text
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)  # query id -> doc id -> grade


def _require(path: Path) -> Path:
    if not path.is_file():
        raise ValueError(f"BEIR collection: missing file {path}")
    return path


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or obj.get("_id") is None:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with an '_id'")
            yield lineno, obj


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def load_beir(path: Path, split: str = "test") -> BeirCollection:
    """Load a BEIR-layout folder: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

    * corpus lines: ``{"_id", "title", "text"}`` (missing title/text -> "").
    * queries lines: ``{"_id", "text"}``.
    * qrels: tab-separated ``query-id  corpus-id  score``; a header line
      (non-integer score in the first line) is skipped. A repeated
      (query, doc) pair keeps the last score.
    * Only queries that have at least one qrels row are kept; qrels rows for
      queries absent from ``queries.jsonl`` are dropped. Qrels may name documents
      missing from the corpus (kept: they still count as relevant, like trec_eval).

    Ids are kept as strings. Raises ValueError naming the missing file, or the
    file and line of a malformed entry / duplicate id.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"BEIR collection: {path} is not a directory")
    corpus_path = _require(path / "corpus.jsonl")
    queries_path = _require(path / "queries.jsonl")
    qrels_path = _require(path / "qrels" / f"{split}.tsv")

    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = [c.strip() for c in line.split("\t")]
            if len(cols) < 3:
                raise ValueError(f"{qrels_path}:{lineno}: expected 'query-id<TAB>corpus-id<TAB>score'")
            qid, did, raw = cols[0], cols[1], cols[2]
            try:
                score = int(raw)
            except ValueError:
                if lineno == 1:  # header line, e.g. "query-id  corpus-id  score"
                    continue
                raise ValueError(f"{qrels_path}:{lineno}: score {raw!r} is not an integer") from None
            qrels.setdefault(qid, {})[did] = score

    queries: dict[str, str] = {}
    for lineno, obj in _jsonl(queries_path):
        qid = str(obj["_id"])
        if qid in queries:
            raise ValueError(f"{queries_path}:{lineno}: duplicate query id {qid!r}")
        queries[qid] = _text(obj.get("text"))
    queries = {qid: text for qid, text in queries.items() if qid in qrels}
    qrels = {qid: qrels[qid] for qid in queries}

    corpus: dict[str, tuple[str, str]] = {}
    for lineno, obj in _jsonl(corpus_path):
        did = str(obj["_id"])
        if did in corpus:
            raise ValueError(f"{corpus_path}:{lineno}: duplicate document id {did!r}")
        corpus[did] = (_text(obj.get("title")), _text(obj.get("text")))

    return BeirCollection(name=path.name, corpus=corpus, queries=queries, qrels=qrels)
