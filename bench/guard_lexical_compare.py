"""Compare two lexical detectors' operating points on the same folds, from the out-of-fold
probabilities bench/train_guard_lexical.py saves (``--save-oof``), each with its own single
threshold (its report's pick) and its languages' thresholds chosen at its own precision bar.

    python bench/train_guard_lexical.py --ordinary CORPUS --C 1000 --train-without written_2026-12-07j \\
        --out /tmp/before --save-oof /tmp/oof-before.npz
    python bench/train_guard_lexical.py --ordinary CORPUS --C 1000 --features addressee \\
        --out /tmp/after --save-oof /tmp/oof-after.npz
    python bench/guard_lexical_compare.py /tmp/oof-before-C1000.npz /tmp/before.json 0.95 \\
        /tmp/oof-after-C1000.npz /tmp/after.json 0.99 --out guard-lexical-compare

Prints and writes bench/results/<out>.md: recall on the after-freeze-like sources by language and
kind, the look-alike (hard-negative) texts flagged by kind, the held-out ordinary passages flagged
(worst group), the engineer's own sets out of fold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_guard_lexical as T  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def measure(oof_path: Path, report: Path, precision: float, reserve: dict) -> dict:
    d = np.load(oof_path, allow_pickle=False)
    oof, det, langs, kinds, ordn, y, hard, like, groups = (d[k] for k in
                                                          "oof det langs kinds ordn y hard like groups".split())
    rep = json.loads(report.read_text())
    C = oof_path.stem.rsplit("-C", 1)[1]
    pick = rep["by_C"][str(float(C))]["pick"]
    per = T.language_thresholds(oof, det, langs, kinds, ordn, y, hard, like, pick, reserve, precision)
    pred = oof >= np.array([per.get(g, pick) for g in det])
    c = T.point(pred, langs, kinds, ordn, y, hard, like, groups)
    pos, hn = like & (y == 1), like & (y == 0) & hard
    c.update(pick=pick, per={k: float(v) for k, v in per.items()}, precision_bar=precision,
             recall_n=[int(pred[pos].sum()), int(pos.sum())], hard_n=[int(pred[hn].sum()), int(hn.sum())],
             features=rep.get("features", "base"), train_without=rep.get("train_without", []))
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", nargs=3, metavar=("OOF_A", "REPORT_A", "PRECISION_A"))
    ap.add_argument("b", nargs=3, metavar=("OOF_B", "REPORT_B", "PRECISION_B"))
    ap.add_argument("--out", default=None, help="the report's name under bench/results/")
    args = ap.parse_args()
    res = json.loads((ROOT / "bench" / "results" / "guard-ordinary.json").read_text())
    reserve = {n: {g: fp / k for g, (fp, k) in res[n].items() if k} for n in ("pick_by_lang", "pick_by_kind")}
    a = measure(Path(args.a[0]), Path(args.a[1]), float(args.a[2]), reserve)
    b = measure(Path(args.b[0]), Path(args.b[1]), float(args.b[2]), reserve)
    name = lambda c: f"{c['features']} features" + (f", without {' '.join(c['train_without'])}" if c["train_without"] else "")  # noqa: E731
    md = ["| measure | A: " + name(a) + f", bar {a['precision_bar']} | B: " + name(b) + f", bar {b['precision_bar']} |",
          "|---|---|---|"]
    rows = [("threshold / each language's", f"{a['pick']} / {a['per']}", f"{b['pick']} / {b['per']}"),
            ("ordinary flagged (worst group)", f"{a['ordinary_flagged']} ({a['worst_group']} {100 * a['worst_fpr']:.2f} %)",
             f"{b['ordinary_flagged']} ({b['worst_group']} {100 * b['worst_fpr']:.2f} %)"),
            ("look-alike benign flagged", f"{a['hard_n'][0]}/{a['hard_n'][1]} ({a['hard_fpr']})",
             f"{b['hard_n'][0]}/{b['hard_n'][1]} ({b['hard_fpr']})"),
            ("recall, after-freeze-like sources", f"{a['recall_n'][0]}/{a['recall_n'][1]} ({a['recall_like']})",
             f"{b['recall_n'][0]}/{b['recall_n'][1]} ({b['recall_like']})"),
            ("precision at the after-freeze mix", a["mix_precision"], b["mix_precision"])]
    rows += [(f"recall {g}", a["recall_by_language"].get(g), r) for g, r in b["recall_by_language"].items()]
    rows += [(f"recall {g}", a["recall_by_kind"].get(g), r) for g, r in b["recall_by_kind"].items()]
    rows += [(f"look-alike {g} flagged", f"{a['hard_fpr_by_kind'][g][0]}/{n}", f"{k}/{n}")
             for g, (k, n) in b["hard_fpr_by_kind"].items() if k or a["hard_fpr_by_kind"][g][0]]
    rows += [(f"engineer's {g} (out of fold)", f"{a['engineer'][g][0]}/{n}", f"{k}/{n}")
             for g, (k, n) in b["engineer"].items()]
    md += [f"| {x} | {p} | {q} |" for x, p, q in rows]
    text = "\n".join(md)
    print(text)
    if args.out:
        (ROOT / "bench" / "results" / f"{args.out}.md").write_text(
            "# The lexical detector: two operating points on the same folds\n\n`python bench/guard_lexical_compare.py "
            + " ".join(args.a + args.b) + f" --out {args.out}` (the out-of-fold probabilities of "
            "bench/train_guard_lexical.py --save-oof; see the script's docstring)\n\n" + text + "\n")


if __name__ == "__main__":
    main()
