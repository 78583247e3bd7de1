"""Evaluate kb_rerank.guard.detectors on the labelled sets in tests/data.

Prints precision, recall, F1 and the confusion matrix for the injection detector on the
whole set, on the holdout split and per language, and the same for the stuffing detector.

    python bench/guard_eval.py [--verbose]   # --verbose lists misses and false alarms
    python bench/guard_eval.py --timing      # also: each detector on inputs that once backtracked
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kb_rerank.guard.detectors import detect_injection, detect_stuffing, sanitize_for_prompt

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def evaluate(title: str, pos: list[dict], neg: list[dict], predict, verbose: bool) -> None:
    tp = sum(1 for r in pos if predict(r["text"]))
    fp = sum(1 for r in neg if predict(r["text"]))
    fn, tn = len(pos) - tp, len(neg) - fp
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    print(f"{title:<26} n+={len(pos):4d} n-={len(neg):4d}  P={p:.3f} R={r:.3f} F1={f1:.3f}  "
          f"[tp={tp} fn={fn} fp={fp} tn={tn}]")
    if verbose:
        for row in pos:
            if not predict(row["text"]):
                print("    miss       ", row["lang"], row["kind"], repr(row["text"][:100]))
        for row in neg:
            if predict(row["text"]):
                print("    false alarm", row["lang"], row["kind"], repr(row["text"][:100]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--timing", action="store_true")
    args = ap.parse_args()
    benign = load(DATA / "injection" / "benign.jsonl")
    hostile = load(DATA / "injection" / "hostile.jsonl")
    inj = lambda t: detect_injection(t).flagged  # noqa: E731
    print("== injection ==")
    evaluate("all", hostile, benign, inj, args.verbose)
    for split in ("train", "holdout"):
        evaluate(split, [r for r in hostile if r["split"] == split], [r for r in benign if r["split"] == split], inj, False)
    for lang in sorted({r["lang"] for r in benign + hostile}):
        evaluate(f"lang={lang}", [r for r in hostile if r["lang"] == lang], [r for r in benign if r["lang"] == lang], inj, False)
        for split in ("holdout",):
            evaluate(f"lang={lang} {split}", [r for r in hostile if r["lang"] == lang and r["split"] == split],
                     [r for r in benign if r["lang"] == lang and r["split"] == split], inj, False)
    print("== stuffing ==")
    evaluate("all", load(DATA / "spam" / "stuffed.jsonl"), load(DATA / "spam" / "normal.jsonl"),
             lambda t: detect_stuffing(t).flagged, args.verbose)
    if args.timing:
        timing()


def timing() -> None:
    """Seconds per call on inputs that made the earlier patterns backtrack."""
    print("== timing (s per call) ==")
    cases = {f"'\\n' * {n} + 'x'": "\n" * n + "x" for n in (250, 500, 1000, 19_999)}
    cases["'user:\\n' * 4000"] = "user:\n" * 4000
    cases["'<!--' * 5000"] = "<!--" * 5000
    cases["'ignore all ' + '-' * 20000"] = "ignore all " + "-" * 20_000
    for name, text in cases.items():
        row = []
        for fn in (detect_injection, detect_stuffing, sanitize_for_prompt):
            t0 = time.perf_counter()
            fn(text)
            row.append(f"{fn.__name__}={time.perf_counter() - t0:.4f}")
        print(f"{name:<30} " + " ".join(row))


if __name__ == "__main__":
    main()
