"""What the weak-guess check adds to a lexical search, interleaved on one database.

The service passes a weakly guessed query language only where the tenant's own choice leaves it
out (kb_rerank.retrieval.spec.RetrievalSpec.query_language): one extra statement,
``store.WEAK_GUESS_SQL``, before the search, for weak guesses only. This measures, for the
questions of ``--collections`` whose guess is weak, *search*: ``kb.search_lexical`` given the
language the rule chose, against *check + search*: the check's statement, then the same
search. Each query: one warm-up of each, then the best of 3 of each, the order alternating from
query to query. Prints one line with the word ``ratio``.

    python bench/weak_guess_cost.py --host %2Ftmp%2Fkb-mixed-lang3%2Fpg --db kb --app-role kb_app \\
        --collections xquad-tr xquad-ro --per-collection 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core.language import guess_query_language  # noqa: E402
from kb_rerank.eval.measures import load_beir  # noqa: E402
from kb_rerank.retrieval.store import WEAK_GUESS_SQL  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DATASETS = ROOT.parent / "shared" / "datasets"
SEARCH = "select chunk_id, score from kb.search_lexical(%s, %s, 1.2, 0.75, null, %s)"


def best_of(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", required=True, help="socket folder, URL-encoded")
    ap.add_argument("--db", required=True)
    ap.add_argument("--app-role", default="kb_app")
    ap.add_argument("--tenant", default=None,
                    help="default: the tenant with the most chunks among those holding the first collection's language")
    ap.add_argument("--collections", nargs="+", required=True)
    ap.add_argument("--per-collection", type=int, default=200)
    ap.add_argument("--k", type=int, default=60)
    ap.add_argument("--out", default="weak-guess-cost")
    args = ap.parse_args(argv)
    owner = psycopg.connect(f"postgresql://postgres@/{args.db}?host={args.host}", autocommit=True)
    app = psycopg.connect(f"postgresql://{args.app_role}@/{args.db}?host={args.host}", autocommit=True)
    qs = []
    for name in args.collections:
        queries = load_beir(DATASETS / name).queries
        for qid in sorted(queries)[: args.per_collection]:
            guess = guess_query_language(queries[qid])
            if guess is not None and not guess.sure:
                qs.append((queries[qid], guess.language))
    tenant = args.tenant
    if tenant is None:
        lang = qs[0][1] if qs else "en"
        tenant = owner.execute("select s.tenant_id from kb.corpus_stats s join kb.corpus_language_stats l"
                               " using (tenant_id) where l.language = %s and l.n_chunks > 0"
                               " order by s.n_chunks desc limit 1", [lang]).fetchone()[0]
    n = owner.execute("select n_chunks from kb.corpus_stats where tenant_id = %s", [tenant]).fetchone()[0]
    langs = owner.execute("select language, n_chunks from kb.corpus_language_stats where tenant_id = %s"
                          " order by n_chunks desc", [tenant]).fetchall()
    app.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
    plain, checked, passed = [], [], 0
    for i, (q, guess) in enumerate(qs):
        chosen = app.execute(WEAK_GUESS_SQL, [guess, q, guess]).fetchone()[0]
        passed += chosen is not None

        def search():
            app.execute(SEARCH, [q, args.k, chosen]).fetchall()

        def check_then_search():
            app.execute(WEAK_GUESS_SQL, [guess, q, guess]).fetchone()
            search()

        search(), check_then_search()  # warm-up
        if i % 2:
            plain.append(best_of(search)), checked.append(best_of(check_then_search))
        else:
            checked.append(best_of(check_then_search)), plain.append(best_of(search))
    p = {name: {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)), "mean": float(np.mean(v))}
         for name, v in (("search", plain), ("check_then_search", checked))}
    ratio = {m: p["check_then_search"][m] / p["search"][m] for m in ("p50", "p95", "mean")}
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "db": args.db, "tenant": str(tenant),
           "chunks": n, "languages": langs, "collections": args.collections, "weak_queries": len(qs),
           "weak_guess_passed": passed, "k": args.k, "ms": p, "ratio": ratio}
    line = (f"{len(qs)} weakly guessed questions ({passed} passed on), tenant of {n} chunks: search p50/p95 "
            f"{p['search']['p50']:.2f}/{p['search']['p95']:.2f} ms, check + search "
            f"{p['check_then_search']['p50']:.2f}/{p['check_then_search']['p95']:.2f} ms; "
            f"ratio p50 {ratio['p50']:.3f}, p95 {ratio['p95']:.3f}, mean {ratio['mean']:.3f}")
    print(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    cmd = "python bench/weak_guess_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (RESULTS / f"{args.out}.md").write_text(
        f"# The weak-guess check's cost beside the lexical search ({res['date']})\n\n`{cmd}`\n\n"
        f"Tenant {tenant}: {n} chunks; by language {', '.join(f'{l} {c}' for l, c in langs)}.\n\n{line}\n",
        encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
