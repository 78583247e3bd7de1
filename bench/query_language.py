"""A query's language at a few detection thresholds: right, wrong, or left to the tenant's languages.

Every question of the shared collections (BEIR folders; the language of each is
``bench/quality.py``'s ``collection_language``) goes through
``kb_rerank.core.language.detect_language`` with the query settings' letter minimum and each
confidence threshold of ``--confidence`` (the service's are ``MIN_QUERY_LETTERS`` and
``MIN_QUERY_CONFIDENCE``, ``detect_query_language``). A question is *right* when the answer is
its collection's language, *wrong* when it is another language (the search then analyses it
in that language if the tenant holds it), *undetermined* when no answer comes (the tenant's
languages analyse it, as before query detection). A few keyword queries show where a guess
goes wrong on short text.

Writes ``bench/results/query-language.{md,json}``.

    python bench/query_language.py [--datasets ../shared/datasets/*] [--confidence 0.3 0.5 0.7 0.9]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from kb_rerank.core.language import MIN_QUERY_CONFIDENCE, MIN_QUERY_LETTERS, detect_language  # noqa: E402
from kb_rerank.eval.measures import load_beir  # noqa: E402
from quality import collection_language  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# keyword queries a help desk sees (language, query): short text is where the detector guesses
KEYWORDS = [("en", "reset password"), ("vi", "hoa don dien tu"), ("en", "printer says E-117"),
            ("en", "ERR_402 payment required"), ("de", "Drucker Fehler E-117"), ("vi", "đặt lại mật khẩu"),
            ("en", "how do I export reports to CSV"), ("de", "Häuser")]


def sweep(datasets: list[Path], thresholds: list[float], min_letters: int) -> dict:
    per: dict = {}
    for path in datasets:
        lang = collection_language(path)
        queries = list(load_beir(path).queries.values())
        counts = {}
        for t in thresholds:
            c = Counter()
            wrong_as = Counter()
            for q in queries:
                got = detect_language(q, min_letters=min_letters, min_confidence=t)
                kind = "undetermined" if got is None else "right" if got == lang else "wrong"
                c[kind] += 1
                if kind == "wrong":
                    wrong_as[got] += 1
            counts[str(t)] = {**c, "wrong_as": dict(wrong_as.most_common(5))}
        per[path.name] = {"language": lang, "questions": len(queries), "by_threshold": counts}
        print(f"{path.name}: {counts}", file=sys.stderr, flush=True)
    keywords = {q: {str(t): detect_language(q, min_letters=min_letters, min_confidence=t) for t in thresholds}
                for _, q in KEYWORDS}
    return {"min_letters": min_letters, "thresholds": thresholds, "service": {"min_letters": MIN_QUERY_LETTERS,
            "min_confidence": MIN_QUERY_CONFIDENCE}, "collections": per, "keywords": keywords,
            "keyword_languages": {q: lang for lang, q in KEYWORDS}}


def markdown(res: dict) -> str:
    ts = res["thresholds"]
    out = [f"Query language detection, at least {res['min_letters']} letters (the service: "
           f"{res['service']['min_letters']} letters, confidence {res['service']['min_confidence']}).", "",
           "| collection | questions | " + " | ".join(f"right / wrong / undetermined at {t}" for t in ts) + " |",
           "|---|---:|" + "---:|" * len(ts)]
    total = {str(t): Counter() for t in ts}
    n = 0
    for name, c in res["collections"].items():
        n += c["questions"]
        cells = []
        for t in ts:
            b = c["by_threshold"][str(t)]
            total[str(t)].update({k: b.get(k, 0) for k in ("right", "wrong", "undetermined")})
            cells.append(f"{b.get('right', 0)} / {b.get('wrong', 0)} / {b.get('undetermined', 0)}")
        out.append(f"| {name} ({c['language']}) | {c['questions']} | " + " | ".join(cells) + " |")
    out.append(f"| **all** | {n} | " + " | ".join(
        f"{100 * total[str(t)]['right'] / n:.2f} % / {100 * total[str(t)]['wrong'] / n:.2f} % / "
        f"{100 * total[str(t)]['undetermined'] / n:.2f} %" for t in ts) + " |")
    out += ["", "Keyword queries (their language; the answer at each threshold, - for undetermined):", "",
            "| query | language | " + " | ".join(str(t) for t in ts) + " |", "|---|---|" + "---|" * len(ts)]
    for q, by in res["keywords"].items():
        out.append(f"| {q} | {res['keyword_languages'][q]} | " + " | ".join(by[str(t)] or "-" for t in ts) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="*", type=Path, default=None)
    ap.add_argument("--confidence", nargs="*", type=float, default=[0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--min-letters", type=int, default=MIN_QUERY_LETTERS)
    args = ap.parse_args(argv)
    datasets = args.datasets or sorted(p for p in (ROOT.parent / "shared" / "datasets").iterdir() if p.is_dir())
    res = sweep(datasets, args.confidence, args.min_letters)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "query-language.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    md = markdown(res)
    (RESULTS / "query-language.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
