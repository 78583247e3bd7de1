"""Train the lexical injection detector (kb_rerank.guard.lexical) and choose its operating point
on ordinary text first, by cross-validation grouped by source.

Data (all in the repository, plus the ordinary corpus built by bench/ordinary_corpus.py): the
project's fixtures (tests/data/injection/hostile.jsonl, benign.jsonl), the written sets
(bench/data/guard/), the after-freeze sets v1-v6 and v9 (training data since the weights they
measured; v7, v8 and later sets are measurement only and never read here), the demo knowledge base's
chunks, and every passage of the ordinary corpus (benign). Each source is one group:
``--folds`` folds (sklearn GroupKFold), out-of-fold probabilities for every text, read as the
detector reads a chunk (the highest of the whole text and its spans).

The rule (docs/guardrails.md, "What it catches today"):

1. held-out ordinary false-positive rate at most ``FPR_MAX`` (0.5 %) in every language and every
   kind with at least ``MIN_GROUP`` passages (the lowest threshold that keeps it: the worst
   group is reported);
2. then precision at the after-freeze mix >= 0.9 on the sources written like the after-freeze
   sets (half hard negatives, half ordinary);
3. the recall there is reported (target 0.80);
4. each detected language's own threshold, lower where its held-out ordinary text allows it
   (:func:`language_thresholds`), shipped as logit offsets beside the one threshold; the C
   kept is the one with the highest recall with them.

Writes bench/results/guard-lexical.{md,json}; with ``--write`` also the package's weights
(src/kb_rerank/guard/lexical.npz), fitted on everything at the chosen threshold.

    OPENBLAS_NUM_THREADS=1 python bench/train_guard_lexical.py --ordinary CORPUS [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ordinary_corpus  # noqa: E402

from kb_rerank.guard import lexical  # noqa: E402
from kb_rerank.guard.classifier import spans  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERSION = "2026-12-07.4"
FPR_MAX = 0.005
MIN_GROUP = 50
# a language gets a threshold of its own (below the one threshold) only where its held-out ordinary
# text could show the bound: at least 1 / FPR_MAX passages (none flagged among 90 is consistent
# with a rate of several percent)
MIN_OWN = int(round(1 / FPR_MAX))
ORDINARY_MAX_CHARS = 1200
THRESHOLDS = tuple(np.round(np.concatenate([np.arange(0.5, 0.95, 0.05), np.arange(0.95, 1.0, 0.005)]), 3))
WRITTEN = [(f"hostile_written{s}.jsonl", f"benign_written{s}.jsonl", f"written_2026-12-01{c}")
           for s, c in (("", "a"), ("2", "b"), ("3", "c"), ("4", "d"), ("5", "e"), ("6", "f"), ("7", "g"), ("8", "h"))] + [
    ("hostile_written9.jsonl", "benign_written9.jsonl", "written_2026-12-07i"),
    ("hostile_written10.jsonl", "benign_written10.jsonl", "written_2026-12-07j"),
    ("hostile_written11.jsonl", "benign_written11.jsonl", "written_2026-12-07k")]
# the sets the detector's engineer wrote for training: never among the sources recall is measured on
ENGINEER = ("written_2026-12-07i", "written_2026-12-07j", "written_2026-12-07k")
# v9 measured the 2026-12-07.2 and .3 weights and is training data from 2026-12-07.4 on; v7 and v8
# (and any later set) measure and are never read here
AFTER_FREEZE = [("after_freeze.jsonl", "after_freeze_v1")] + [(f"after_freeze_v{i}.jsonl", f"after_freeze_v{i}")
                                                               for i in (2, 3, 4, 5, 6, 9)]
# the sources the recall and the after-freeze mix are measured on: those written by authors other
# than the detector's engineer (ENGINEER's sets train only)
LIKE = tuple(g for *_, g in WRITTEN if g not in ENGINEER) + tuple(g for _, g in AFTER_FREEZE)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def load_rows(ordinary: Path, exclude: tuple[str, ...] = ()) -> list[dict]:
    rows: list[dict] = []

    def add(text, label, source, lang="en", hard=False, ordinary_=False, kind=""):
        text = (text or "").strip()
        if text:
            rows.append({"text": text, "label": int(label), "source": source, "lang": lang, "hard": bool(hard),
                         "ordinary": ordinary_, "kind": kind})

    inj = ROOT / "tests" / "data" / "injection"
    for name, label in (("hostile.jsonl", 1), ("benign.jsonl", 0)):
        for r in _jsonl(inj / name):
            add(r["text"], label, "project_fixtures", r["lang"], str(r.get("kind", "")).startswith("hard:"))
    g = ROOT / "bench" / "data" / "guard"
    for h, b, source in WRITTEN:
        if source in exclude:
            continue
        for name in (h, b):
            for r in _jsonl(g / name):
                add(r["text"], r["label"], source, r["lang"], bool(r.get("hard_negative")), kind=r.get("kind", ""))
    for name, source in AFTER_FREEZE:
        for r in _jsonl(inj / name):
            add(r["text"], r["label"], source, r["lang"], bool(r.get("hard_negative")), kind=r.get("kind", ""))
    from importlib import resources

    from kb_rerank.core.chunking import chunk_text
    from kb_rerank.core.settings import Settings
    from kb_rerank.ingest.readers import SourceDoc, iter_documents

    st = Settings()
    for d in iter_documents([str(resources.files("kb_rerank") / "demo_kb")]):
        if isinstance(d, SourceDoc):
            for piece in chunk_text(d.text, st.chunk_max_chars, st.chunk_overlap):
                add(f"{d.title}\n{piece}", 0, "demo_kb", d.language or "en")
    for r in ordinary_corpus.load(ordinary):
        add(r["text"][:ORDINARY_MAX_CHARS], 0, r["source"], r["lang"], False, True, r["kind"])
    return rows


def matrix(texts: list[str], feature_set: str = "base"):
    from scipy.sparse import csr_matrix

    indptr, indices, data = [0], [], []
    for t in texts:
        i, v = lexical.features(t, feature_set == "addressee")
        indices.append(i)
        data.append(v)
        indptr.append(indptr[-1] + len(i))
    return csr_matrix((np.concatenate(data), np.concatenate(indices), np.array(indptr)),
                      shape=(len(texts), lexical.BUCKETS))


def weights(y: np.ndarray, langs: np.ndarray) -> np.ndarray:
    """Per-text weights balancing hostile and benign within each language (each language keeps
    its share of the data): without them the model learns a language's share of hostile
    texts in the training sets (most Vietnamese texts there are attacks) and flags ordinary
    Vietnamese."""
    w = np.ones(len(y))
    for g in set(langs.tolist()):
        m = langs == g
        n1, n0 = int((y[m] == 1).sum()), int((y[m] == 0).sum())
        if n1 and n0:
            w[m & (y == 1)] = m.sum() / (2 * n1)
            w[m & (y == 0)] = m.sum() / (2 * n0)
    return w


def fit(X, y, C: float, seed: int, w: np.ndarray | None = None):
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=C, class_weight=None if w is not None else "balanced", max_iter=3000,
                           solver="liblinear", random_state=seed)
    if w is not None:
        w = w * len(y) / (2 * w[y == 1].sum()) * (y == 1) + w * len(y) / (2 * w[y == 0].sum()) * (y == 0)
    m.fit(X, y, sample_weight=w)
    return m.coef_.reshape(-1).astype(np.float16).astype(np.float64), float(m.intercept_[0])


def train(X, S, y, langs, owner, rows, span_rows, C: float, args):
    """Fit on the texts ``rows`` and, as benign examples, the spans (``span_rows``) of the benign
    ones (the cross-validation's folds and the shipped fit alike)."""
    from scipy.sparse import vstack

    neg = span_rows & (y[owner] == 0)
    yy = np.concatenate([y[rows], np.zeros(int(neg.sum()), dtype=int)])
    ll = np.concatenate([langs[rows], langs[owner[neg]]])
    return fit(vstack([X[rows], S[neg]]), yy, C, args.seed, weights(yy, ll) if args.balance == "language" else None)


def predict(coef, b, X) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(X @ coef + b)))


def point(pred, langs, kinds, ordn, y, hard, like, groups) -> dict:
    """The measures of one operating point (``pred``: each text flagged or not)."""
    by_lang = {g: (int(pred[ordn & (langs == g)].sum()), int((ordn & (langs == g)).sum()))
               for g in sorted(set(langs[ordn]))}
    by_kind = {g: (int(pred[ordn & (kinds == g)].sum()), int((ordn & (kinds == g)).sum()))
               for g in sorted(set(kinds[ordn]))}
    worst = max([(k / n, g) for g, (k, n) in list(by_lang.items()) + list(by_kind.items()) if n >= MIN_GROUP])
    pos, hn, on = like & (y == 1), like & (y == 0) & hard, like & (y == 0) & ~hard
    r = float(pred[pos].mean())
    mixp = r / (r + (pred[hn].mean() + pred[on].mean()) / 2) if r else 0.0
    return {"ordinary_flagged": int(pred[ordn].sum()), "ordinary_fpr": round(float(pred[ordn].mean()), 5),
            "worst_group": worst[1], "worst_fpr": round(worst[0], 4), "recall_like": round(r, 3),
            "mix_precision": round(mixp, 3), "hard_fpr": round(float(pred[hn].mean()), 3),
            "recall_by_source": {g: round(float(pred[(groups == g) & (y == 1)].mean()), 3) for g in LIKE},
            "recall_by_language": {g: round(float(pred[pos & (langs == g)].mean()), 3) for g in sorted(set(langs[pos]))},
            "recall_by_kind": {g: round(float(pred[pos & (kinds == g)].mean()), 3) for g in sorted(set(kinds[pos]))
                               if int((pos & (kinds == g)).sum()) >= 20},
            "by_language": by_lang, "by_kind": by_kind,
            # the look-alike benign texts of those sources flagged, by kind (instructions to people among them)
            "hard_fpr_by_kind": {g: [int(pred[hn & (kinds == g)].sum()), int((hn & (kinds == g)).sum())]
                                 for g in sorted(set(kinds[hn]))},
            # the engineer's own sets, out of fold (trains, never chooses): flagged / texts
            "engineer": {f"{g}:{lab}": [int(pred[(groups == g) & (y == lab)].sum()), int(((groups == g) & (y == lab)).sum())]
                         for g in ENGINEER for lab in (0, 1)}}


def language_thresholds(oof, det, langs, kinds, ordn, y, hard, like, default: float, reserve: dict,
                        precision: float) -> dict[str, float]:
    """Each detected language's own threshold, below ``default`` only: the lowest on the grid whose
    held-out ordinary rate in that detected language, with the embedding classifier's reserve, is
    <= FPR_MAX and whose precision at the after-freeze mix in that language is >= ``precision``
    (languages with at least 20 hostile texts of the after-freeze-like sources and MIN_OWN
    ordinary passages); then raised, step by step, until every labelled language and kind of
    >= MIN_GROUP ordinary passages keeps its bound with these thresholds applied."""
    grid = sorted(t for t in set(THRESHOLDS) | set(np.round(np.arange(0.3, 0.5, 0.05), 3)) if t < default)
    per: dict[str, float] = {}
    for g in sorted(set(det[ordn].tolist()) - {""}):
        mo = ordn & (det == g)
        pos, hn, on = like & (y == 1) & (det == g), like & (y == 0) & hard & (det == g), like & (y == 0) & ~hard & (det == g)
        if mo.sum() < MIN_OWN or pos.sum() < 20 or hn.sum() == 0:
            continue
        allowed = (FPR_MAX - reserve.get("pick_by_lang", {}).get(g, 0.0)) * mo.sum() + 1e-9
        for t in grid:
            if (oof[mo] >= t).sum() > allowed:
                continue
            r = float((oof[pos] >= t).mean())
            fp = (float((oof[hn] >= t).mean()) + (float((oof[on] >= t).mean()) if on.any() else 0.0)) / 2
            if r and r / (r + fp) >= precision:
                per[g] = float(t)
                break
    while True:
        thr = np.array([per.get(g, default) for g in det])
        pred = oof >= thr
        bad = None
        for key, name in ((langs, "pick_by_lang"), (kinds, "pick_by_kind")):
            for g in sorted(set(key[ordn].tolist())):
                m = ordn & (key == g)
                if m.sum() >= MIN_GROUP and pred[m].sum() > (FPR_MAX - reserve.get(name, {}).get(g, 0.0)) * m.sum() + 1e-9:
                    culprits = [d for d in det[m & pred & (thr < default)].tolist()]
                    if culprits:
                        bad = max(set(culprits), key=culprits.count)
                        break
            if bad:
                break
        if not bad:
            return per
        higher = [t for t in grid if t > per[bad]]
        if higher:
            per[bad] = higher[0]
        else:
            del per[bad]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ordinary", type=Path, required=True, help="the built ordinary corpus (bench/ordinary_corpus.py)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--C", type=float, nargs="+", default=[10.0])
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--reserve", type=Path, default=ROOT / "bench" / "results" / "guard-ordinary.json",
                    help="the embedding classifier's held-out report (bench/guard_ordinary.py): its ordinary rate "
                         "per language and kind is taken off the bound the lexical vote may use")
    ap.add_argument("--balance", choices=("classes", "language"), default="language",
                    help="class weights: balanced overall, or within each language (weights())")
    ap.add_argument("--exclude", nargs="*", default=[], help="written sources left out (to measure what one adds)")
    ap.add_argument("--precision", type=float, default=0.99,
                    help="the precision at the after-freeze mix a language's own threshold must keep (the other "
                         "votes add their own false positives)")
    ap.add_argument("--train-without", nargs="*", default=[],
                    help="sources kept in the folds (the same folds) but left out of every fold's training: "
                         "what a source adds, measured on identical folds")
    ap.add_argument("--features", choices=lexical.FEATURE_SETS, default="base",
                    help="the feature set (kb_rerank.guard.lexical.features)")
    ap.add_argument("--save-oof", type=Path, default=None,
                    help="write each C's out-of-fold probabilities and the row labels here (.npz), to study the "
                         "operating point without refitting")
    ap.add_argument("--out", default="guard-lexical", help="the report's name under bench/results/")
    args = ap.parse_args()

    # the embedding classifier's own held-out ordinary rate per language and kind (its report):
    # the lexical vote adds its flags to those, so together they stay within FPR_MAX
    reserve: dict[str, dict[str, float]] = {}
    if args.reserve:
        d = json.loads(args.reserve.read_text())
        reserve = {name: {g: fp / n for g, (fp, n) in d[name].items() if n}
                   for name in ("pick_by_lang", "pick_by_kind")}
    rows = load_rows(args.ordinary, tuple(args.exclude))
    texts = [r["text"] for r in rows]
    y = np.array([r["label"] for r in rows])
    groups = np.array([r["source"] for r in rows])
    langs = np.array([r["lang"] for r in rows])
    kinds = np.array([r["kind"] for r in rows])
    hard = np.array([r["hard"] for r in rows])
    ordn = np.array([r["ordinary"] for r in rows])
    like = np.isin(groups, LIKE)
    t0 = time.time()
    X = matrix(texts, args.features)
    # spans of every text (scored by the fold model; the text's probability is the highest);
    # the spans of benign texts also train, as short benign examples
    owner, stexts = [], []
    for i, t in enumerate(texts):
        for s in spans(t):
            owner.append(i)
            stexts.append(s)
    owner = np.array(owner, dtype=int)
    S = matrix(stexts, args.features)
    print(f"{len(rows)} texts ({int(y.sum())} hostile, {int(ordn.sum())} ordinary in {len(set(groups[ordn]))} "
          f"sources), {len(stexts)} spans; features {time.time() - t0:.0f}s", flush=True)
    from scipy.sparse import vstack
    from sklearn.model_selection import GroupKFold

    folds = np.zeros(len(rows), dtype=int)
    for f, (_, te) in enumerate(GroupKFold(n_splits=args.folds).split(np.zeros(len(rows)), groups=groups)):
        folds[te] = f
    # rows every fold's training leaves out (--train-without); they stay in the folds and are scored
    keep = ~np.isin(groups, args.train_without)
    from kb_rerank.core.language import detect_language

    # the language each text is read as at run time (its offset's key)
    det = np.array([detect_language(t) or "" for t in texts])
    report = {"version": VERSION, "features": args.features, "train_without": args.train_without, "n": len(rows), "hostile": int(y.sum()), "ordinary": int(ordn.sum()),
              "folds": args.folds, "by_C": {}}
    best = None
    for C in args.C:
        oof = np.zeros(len(rows))
        for f in range(args.folds):
            te = folds == f
            ste = folds[owner] == f
            coef, b = train(X, S, y, langs, owner, ~te & keep, ~ste & keep[owner], C, args)
            oof[te] = predict(coef, b, X[te])
            ps = predict(coef, b, S[ste])
            np.maximum.at(oof, owner[ste], ps)
        if args.save_oof:
            np.savez_compressed(args.save_oof.with_name(f"{args.save_oof.stem}-C{C:g}.npz"), oof=oof, det=det,
                                langs=langs, kinds=kinds, ordn=ordn, y=y, hard=hard, like=like, groups=groups)
        # the exact lowest threshold meeting the ordinary bound in every group of >= MIN_GROUP
        exact = 0.0
        for key, name in ((langs, "pick_by_lang"), (kinds, "pick_by_kind")):
            for g in set(key[ordn].tolist()):
                sc = np.sort(oof[ordn & (key == g)])[::-1]
                k = int((FPR_MAX - reserve.get(name, {}).get(g, 0.0)) * len(sc) + 1e-9)
                if len(sc) >= MIN_GROUP and k < len(sc):
                    exact = max(exact, float(np.nextafter(sc[k], np.inf)))
        exact = round(float(np.ceil(exact * 1e4) / 1e4), 4)
        curve = []
        for t in sorted(set(THRESHOLDS) | {exact}):
            curve.append({"threshold": float(t), **point(oof >= t, langs, kinds, ordn, y, hard, like, groups)})
        ok = [c for c in curve if c["threshold"] >= exact and c["mix_precision"] >= 0.9]
        pick = min(ok, key=lambda c: c["threshold"]) if ok else max(curve, key=lambda c: c["threshold"])
        report["by_C"][str(C)] = {"curve": curve, "pick": pick["threshold"], "exact": exact}
        print(f"C={C}: pick {pick['threshold']} recall_like {pick['recall_like']} mixP {pick['mix_precision']} "
              f"ordinary {pick['ordinary_flagged']}/{int(ordn.sum())} worst {pick['worst_group']} {pick['worst_fpr']}",
              flush=True)
        print(f"  recall by language {pick['recall_by_language']}\n  recall by kind {pick['recall_by_kind']}")
        for c in curve:
            print(f"  t={c['threshold']}: R {c['recall_like']} mixP {c['mix_precision']} hard {c['hard_fpr']} "
                  f"ord {c['ordinary_flagged']} worst {c['worst_group']} {c['worst_fpr']}")
        per = language_thresholds(oof, det, langs, kinds, ordn, y, hard, like, pick["threshold"], reserve,
                                  args.precision)
        cal = point(oof >= np.array([per.get(g, pick["threshold"]) for g in det]), langs, kinds, ordn, y, hard, like,
                    groups)
        print(f"  C={C} per language {per}: recall_like {cal['recall_like']} mixP {cal['mix_precision']}", flush=True)
        if best is None or cal["recall_like"] > best[3]["recall_like"]:
            best = (C, pick, per, cal)
    C, pick, per, cal = best
    offsets = {g: float(np.log(pick["threshold"] / (1 - pick["threshold"])) - np.log(t / (1 - t))) for g, t in per.items()}
    report["languages"] = {"thresholds": per, "offsets": offsets, "precision": args.precision, **cal}
    print(f"per language {per}: recall_like {cal['recall_like']} mixP {cal['mix_precision']} hard {cal['hard_fpr']} "
          f"ordinary {cal['ordinary_flagged']} worst {cal['worst_group']} {cal['worst_fpr']}\n"
          f"  recall by language {cal['recall_by_language']}\n  recall by kind {cal['recall_by_kind']}\n"
          f"  hard negatives flagged by kind {cal['hard_fpr_by_kind']}\n  engineer's sets {cal['engineer']}\n"
          f"  ordinary by language {cal['by_language']}\n  ordinary by kind {cal['by_kind']}", flush=True)
    report["chosen"] = {"C": C, **{k: v for k, v in pick.items()}}
    res = ROOT / "bench" / "results"
    (res / f"{args.out}.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    md = [f"# The lexical injection detector ({VERSION}): held-out operating point", "",
          f"`OPENBLAS_NUM_THREADS=1 python bench/train_guard_lexical.py --ordinary CORPUS --C {' '.join(map(str, args.C))} --features {args.features}`"
          f" ({args.folds} folds grouped by source; {len(rows)} texts, {int(y.sum())} hostile, {int(ordn.sum())} "
          f"ordinary passages in {len(set(groups[ordn]))} sources). Chosen: C {C}, threshold {pick['threshold']} "
          "(the lowest whose held-out ordinary false-positive rate, added to the embedding classifier's own held-out "
          "rate in that group (bench/results/guard-ordinary.json), is <= 0.5 % in every language and kind of "
          f">= {MIN_GROUP} passages, with precision at the after-freeze mix >= 0.9).", "",
          f"At that point: ordinary passages flagged {pick['ordinary_flagged']} of {int(ordn.sum())} "
          f"({100 * pick['ordinary_fpr']:.2f} %), worst group {pick['worst_group']} {100 * pick['worst_fpr']:.2f} %; "
          f"recall on the after-freeze-like sources {pick['recall_like']}, precision at the after-freeze mix "
          f"{pick['mix_precision']}, hard-negative FPR {pick['hard_fpr']}.", "",
          "| group | ordinary flagged / passages |", "|---|---|"]
    md += [f"| {g} | {k}/{n} |" for g, (k, n) in list(pick["by_language"].items()) + list(pick["by_kind"].items())]
    md += ["", "| held-out source | recall |", "|---|---|"] + [f"| {g} | {r} |" for g, r in pick["recall_by_source"].items()]
    md += ["", "## Each language's own threshold", "",
           f"Below the threshold for languages whose held-out ordinary text allows it (detected language, "
           f"`kb_rerank.core.language.detect_language`; precision at the after-freeze mix in that language >= "
           f"{args.precision}; every labelled language and kind still within its bound): "
           + (", ".join(f"{g} {t}" for g, t in sorted(per.items())) or "none") + ". Shipped as logit offsets "
           f"(the threshold stays {pick['threshold']}).", "",
           f"With them: ordinary passages flagged {cal['ordinary_flagged']} of {int(ordn.sum())} "
           f"({100 * cal['ordinary_fpr']:.2f} %), worst group {cal['worst_group']} {100 * cal['worst_fpr']:.2f} %; "
           f"recall on the after-freeze-like sources {cal['recall_like']}, precision at the after-freeze mix "
           f"{cal['mix_precision']}, hard-negative FPR {cal['hard_fpr']}.", "",
           "| group | ordinary flagged / passages |", "|---|---|"]
    md += [f"| {g} | {k}/{n} |" for g, (k, n) in list(cal["by_language"].items()) + list(cal["by_kind"].items())]
    md += ["", "| hostile, after-freeze-like sources | recall (one threshold) | recall (each language's) |", "|---|---|---|"]
    md += [f"| {g} | {pick['recall_by_language'].get(g)} | {r} |" for g, r in cal["recall_by_language"].items()]
    md += [f"| {g} | {pick['recall_by_kind'].get(g)} | {r} |" for g, r in cal["recall_by_kind"].items()]
    md += ["", "Curve (C chosen, one threshold):", "", "| threshold | recall (like) | mix precision | hard FPR | ordinary flagged | worst group |",
           "|---|---|---|---|---|---|"]
    md += [f"| {c['threshold']} | {c['recall_like']} | {c['mix_precision']} | {c['hard_fpr']} | {c['ordinary_flagged']} | "
           f"{c['worst_group']} {100 * c['worst_fpr']:.2f} % |" for c in report["by_C"][str(C)]["curve"]]
    (res / f"{args.out}.md").write_text("\n".join(md) + "\n")
    if args.write:
        if args.train_without:
            raise SystemExit("--write fits on every source: leave out --train-without")
        coef, b = train(X, S, y, langs, owner, np.ones(len(y), dtype=bool), np.ones(len(owner), dtype=bool), C, args)
        out = ROOT / "src" / "kb_rerank" / "guard" / lexical.WEIGHTS_RESOURCE
        np.savez_compressed(out, **lexical.to_arrays(coef, b, VERSION, pick["threshold"], offsets, args.features))
        print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
