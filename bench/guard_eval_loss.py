"""What an answer loses to the prompt-injection guard, per labelled collection.

For each BEIR folder: ``kb-rerank eval --mode hybrid`` (:func:`kb_rerank.eval.runs.evaluate_collection`)
with the guarded figures: plain hybrid nDCG@10, hybrid nDCG@10 with the policy applied to the
ranked lists as ``/v1/kb/context`` applies it, and the judged-relevant documents the guard
flags (count, share) and the policy excludes / demotes. One row per collection in
``bench/results/guard-eval-loss.md`` and ``.json``; a run over some collections replaces
their rows and keeps the others'.

Cheap to re-run: the passages and queries come from the eval's embedding cache
(``<KB_DATA_DIR>/embed-cache``) and a collection already loaded into its scratch tenant is
not ingested again; its stored verdicts are re-scored with the current detectors and weights
(``--rescan-guard``: no re-embedding, only the spans of the chunks the classifier finds
doubtful) unless ``--no-rescan``. After retraining the detector:

    KB_DATA_DIR=/tmp/kb-eval OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/guard_eval_loss.py

(all shared collections, one after the other; ``--datasets ../shared/datasets/xquad-vi ...``
for some; ``--guard-policy demote`` to evaluate another policy than the tenants' default.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.eval.runs import evaluate_collection  # noqa: E402
from kb_rerank.guard.classifier import load_shipped  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

RESULTS = ROOT / "bench" / "results"
STEM = "guard-eval-loss"
# the shared collections, in the order of the table
COLLECTIONS = ("cacm", "cisi", "cranfield", "xquad-vi", "xquad-ru", "xquad-tr", "xquad-ar", "xquad-el",
               "xquad-ro", "xquad-hi", "xquad-th")
COMMAND = "KB_DATA_DIR=/tmp/kb-eval OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/guard_eval_loss.py"


def shared_datasets() -> Path | None:
    """``shared/datasets`` beside the checkout (main) or beside its worktrees folder."""
    for base in (ROOT.parent, ROOT.parent.parent):
        d = base / "shared" / "datasets"
        if d.is_dir():
            return d
    return None


def row(res: dict) -> dict:
    g = res["guard"]
    rel = g["relevant"]
    return {
        "dataset": res["dataset"],
        "queries": res["num_queries"],
        "policy": g["policy"],
        "policy_source": g["policy_source"],
        "demote_factor": g["demote_factor"],
        "ndcg@10": res["ndcg@10"],
        "guarded_ndcg@10": g["ndcg@10"],
        "delta_ndcg@10": g["delta_ndcg@10"],
        "queries_changed": g["queries_changed"],
        "ranked": g["ranked"],
        "judged_relevant": rel["judged_relevant"],
        "flagged": rel["flagged"],
        "flagged_share": rel["flagged_share"],
        "excluded": rel["excluded"],
        "demoted": rel["demoted"],
        "spam_flagged": rel["spam_flagged"],
        "flagged_docs": rel["flagged_docs"],
        "guard_scan": res["load"].get("guard_scan"),
        "ingest": res["load"]["ingest"],
        "total_s": round(res["timing"]["total_s"], 1),
        "guard_s": round(res["timing"]["guard_s"], 1),
        "classifier": load_shipped().version,
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def markdown(doc: dict) -> str:
    lines = [
        "# What an answer loses to the guard (hybrid, nDCG@10)",
        "",
        f"Classifier weights {doc['classifier']['version']} (embedder {doc['classifier']['embedder']}, "
        f"threshold {doc['classifier']['threshold']}); demote factor {doc['demote_factor']}. "
        f"Command: `{COMMAND}`.",
        "",
        "| collection | queries | policy | nDCG@10 | under the policy | Δ | judged-relevant flagged | excluded | demoted |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    versions = sorted({r.get("classifier") for r in doc["rows"].values()} - {doc["classifier"]["version"], None})
    if versions:
        lines[2:2] = [f"Some rows were measured with other weights ({', '.join(versions)}): see the JSON.", ""]
    order = {name: i for i, name in enumerate(COLLECTIONS)}
    for r in sorted(doc["rows"].values(), key=lambda r: (order.get(r["dataset"], len(order)), r["dataset"])):
        lines.append(
            f"| {r['dataset']} | {r['queries']} | {r['policy']} | {r['ndcg@10']:.4f} | {r['guarded_ndcg@10']:.4f} "
            f"| {r['delta_ndcg@10']:+.4f} | {r['flagged']}/{r['judged_relevant']} ({100 * r['flagged_share']:.1f}%) "
            f"| {r['excluded']} | {r['demoted']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", type=Path, nargs="*", default=None,
                    help="BEIR folders (default: the shared collections, in the table's order)")
    ap.add_argument("--guard-policy", choices=["exclude", "demote", "allow"], default=None,
                    help="instead of the tenants' policy (the service default, exclude)")
    ap.add_argument("--no-rescan", action="store_true", help="keep the stored verdicts of an earlier ingestion")
    ap.add_argument("--limit-queries", type=int, default=None)
    ap.add_argument("--progress", action="store_true", help="progress bars of the eval")
    ap.add_argument("--out", type=Path, default=RESULTS / STEM, help="output stem (.md and .json are written)")
    args = ap.parse_args(argv)
    datasets = args.datasets
    if not datasets:
        shared = shared_datasets()
        datasets = [shared / n for n in COLLECTIONS if (shared / n).is_dir()] if shared else []
    if not datasets:
        ap.error("no dataset folders given and no shared/datasets folder found")

    from kb_rerank.db.database import migrate

    settings = Settings.from_env()
    migrate(settings)
    clf = load_shipped()
    out_json, out_md = args.out.with_suffix(".json"), args.out.with_suffix(".md")
    doc = {"rows": {}}
    if out_json.is_file():
        doc = json.loads(out_json.read_text(encoding="utf-8"))
    doc.update(
        classifier={"version": clf.version, "embedder": clf.embedder,
                    "threshold": settings.guard_classifier_threshold},
        demote_factor=settings.demote_factor,
        embedder=settings.embedder,
        command=COMMAND,
    )
    out_json.parent.mkdir(parents=True, exist_ok=True)
    for path in datasets:
        print(f"{path}: ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        res = evaluate_collection(settings, path, "hybrid", limit_queries=args.limit_queries,
                                  guard_policy=args.guard_policy, rescan_guard=not args.no_rescan,
                                  progress=args.progress)
        r = row(res)
        if args.limit_queries is not None:
            r["limit_queries"] = args.limit_queries
        doc["rows"][r["dataset"]] = r
        # after each collection, so that an interrupted run keeps what it measured
        out_json.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        out_md.write_text(markdown(doc), encoding="utf-8")
        print(f"{r['dataset']}: nDCG@10 {r['ndcg@10']:.4f}, under {r['policy']} {r['guarded_ndcg@10']:.4f}; "
              f"judged-relevant flagged {r['flagged']}/{r['judged_relevant']}, excluded {r['excluded']}, "
              f"demoted {r['demoted']} ({time.perf_counter() - t0:.0f}s; {r['guard_scan'] or 'no rescan'})",
              file=sys.stderr, flush=True)
    print(markdown(doc))
    print(f"(written {out_md} and {out_json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
