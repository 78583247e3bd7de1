"""The lexical list weighed with the query language's statistics against main's, which weighs
every term with the tenant's, interleaved on one database.

*new*: ``kb.search_lexical(q, k, k1, b, null, language)`` of this tree (a query in a language
the tenant holds weighed with that language's statistics, kb.corpus_language_stats and
kb.term_language_stats). *old*: ``retrieval/sql/search_lexical.sql`` of ``--rev`` (default
main), rendered and installed under the schema ``kb_old`` (dropped at the end), searching the
same tables and term blocks with the tenant's statistics. Both are given the language the
service detects (``detect_query_language``), detected outside the timing. Each query: one
warm-up call of each version, then the best of 3, the versions' order rotating from query to
query. Queries: ``--per-collection`` questions of each shared collection (their own
languages), in turn, or of ``--collections`` only.

    python bench/language_stats_ab.py --host %2Ftmp%2Fkb-lang3-bench%2Fpg --db kb_bench_100000_1
    python bench/language_stats_ab.py --host %2Ftmp%2Fkb-mixed-lang3%2Fpg --db kb --tenant <uuid> \\
        --collections xquad-el cranfield cacm cisi
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core.language import detect_query_language  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db.layer import render  # noqa: E402
from kb_rerank.eval.measures import load_beir  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DATASETS = ROOT.parent / "shared" / "datasets"


def old_sql(rev: str, app_role: str) -> str:
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/kb_rerank/retrieval/sql/search_lexical.sql"],
                          capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "search_lexical.sql"
        path.write_text(text, encoding="utf-8")
        sql = render(path, embedding_dim=Settings().embedding_dim, app_role=app_role)
    return sql.replace("kb.search_lexical", "kb_old.search_lexical")


def questions(per: int, collections: list[str] | None) -> list[str]:
    """``per`` questions of each collection (the first by id), interleaved."""
    lists = []
    for path in sorted(p for p in DATASETS.iterdir() if p.is_dir()):
        if collections and path.name not in collections:
            continue
        qs = load_beir(path).queries
        lists.append([qs[q] for q in sorted(qs)[:per]])
    return [q for group in zip(*lists) for q in group]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", required=True, help="socket folder, URL-encoded")
    ap.add_argument("--db", required=True)
    ap.add_argument("--app-role", default="cyberos_app")
    ap.add_argument("--tenant", default=None, help="default: the tenant with the most chunks")
    ap.add_argument("--rev", default="main")
    ap.add_argument("--collections", nargs="*", default=None)
    ap.add_argument("--per-collection", type=int, default=20)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--out", default="language-stats-speed")
    ap.add_argument("--timeout-ms", type=int, default=5000,
                    help="a query either version takes longer on is counted and left out of the figures")
    args = ap.parse_args(argv)
    owner = psycopg.connect(f"postgresql://postgres@/{args.db}?host={args.host}", autocommit=True)
    app = psycopg.connect(f"postgresql://{args.app_role}@/{args.db}?host={args.host}", autocommit=True)
    if args.tenant:
        tenant = args.tenant
        n = owner.execute("select n_chunks from kb.corpus_stats where tenant_id = %s", [tenant]).fetchone()[0]
    else:
        tenant, n = owner.execute("select tenant_id, n_chunks from kb.corpus_stats order by n_chunks desc").fetchone()
    langs = owner.execute("select language, n_chunks from kb.corpus_language_stats where tenant_id = %s "
                          "order by n_chunks desc", [tenant]).fetchall()
    app.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
    app.execute(f"set statement_timeout = {int(args.timeout_ms)}")
    owner.execute("drop schema if exists kb_old cascade")
    owner.execute("create schema kb_old")
    owner.execute(f"grant usage on schema kb_old to {args.app_role}, kb_search")
    owner.execute(old_sql(args.rev, args.app_role))
    owner.execute(f"grant execute on all functions in schema kb_old to {args.app_role}, kb_search")
    qs = [(q, detect_query_language(q)) for q in questions(args.per_collection, args.collections)]

    def new(q, lang):
        return app.execute("select chunk_id, score from kb.search_lexical(%s, %s, 1.2, 0.75, null, %s)",
                           [q, args.k, lang]).fetchall()

    def old(q, lang):
        return app.execute("select chunk_id, score from kb_old.search_lexical(%s, %s, 1.2, 0.75, null, %s)",
                           [q, args.k, lang]).fetchall()

    versions = {"new (language statistics)": new, f"old ({args.rev})": old}
    times: dict[str, list[float]] = {v: [] for v in versions}
    differ = 0
    slow: list[str] = []
    try:
        labels = list(versions)
        for i, (q, lang) in enumerate(qs):
            try:
                rows = [versions[v](q, lang) for v in labels]
            except psycopg.errors.QueryCanceled:
                slow.append(q)
                continue
            differ += [r[0] for r in rows[0]] != [r[0] for r in rows[1]]
            for label in labels[i % 2:] + labels[: i % 2]:
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    versions[label](q, lang)
                    best = min(best, (time.perf_counter() - t0) * 1000)
                times[label].append(best)
    finally:
        owner.execute("drop schema if exists kb_old cascade")
    stats = {label: {"p50": float(np.median(t)), "p95": float(np.percentile(t, 95)), "mean": float(np.mean(t))}
             for label, t in times.items()}
    a, b = labels
    ratio = {m: stats[a][m] / stats[b][m] for m in ("p50", "p95", "mean")}
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True,
                         text=True).stdout.strip()
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "db": args.db, "tenant": str(tenant),
           "chunks": n, "languages": {t: int(d) for t, d in langs}, "queries": len(qs), "k": args.k,
           "rev": rev, "timeout_ms": args.timeout_ms, "left_out_slow": slow, "stats": stats,
           "ratio_new_over_old": ratio, "queries_whose_rows_differ": differ}
    lines = [f"{args.db}, tenant {tenant} ({n} chunks; chunks by language: "
             + (", ".join(f"{t} {d}" for t, d in langs) or "none recorded") + f"), {len(qs)} questions "
             f"({args.per_collection} of each of {', '.join(args.collections or ['the shared collections'])}), "
             f"k = {args.k}; best of 3 per query, versions interleaved; ms", "",
             "| version | p50 | p95 | mean |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {s['p50']:.2f} | {s['p95']:.2f} | {s['mean']:.2f} |" for label, s in stats.items()]
    lines += ["", "ratio new / old: " + ", ".join(f"{m} {r:.3f}" for m, r in ratio.items())
              + f"; queries whose rows differ: {differ}",
              f"left out (a version over {args.timeout_ms} ms on its first call): {len(slow)}", ""]
    md = "\n".join(lines)
    print(md)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    (RESULTS / f"{args.out}.md").write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
