"""Paired A/B timing of kb.search_lexical against its version at other git revisions.

On a shared VM the same query can take 30% longer from one minute to the next, so two
benchmark runs minutes apart do not compare versions. This script installs each revision's
sql/functions/10_search_lexical.sql next to the current one, under another name
(kb.search_lexical_ab<i>, dropped at the end), and times every query with every version in
turn (one warm-up call each, then the best of 3; the warm-up calls' rows are compared: chunk
ids in order and scores to 7 decimals), on one tenant of a database loaded by
bench/search_bench.py, with that benchmark's queries. Other functions (text analysis, the
champion lists) are the current ones for every version.

    python bench/lexical_ab.py --db kb_bench_100000_10 --rev 162dbbf
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parent.parent


def _show(rev: str, rel: str) -> str:
    """A SQL file as of ``rev``: under src/kb_rerank/sql/ since issue 14, sql/ before."""
    for base in ("src/kb_rerank/sql", "sql"):
        r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{base}/{rel}"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout
    raise SystemExit(f"{rel} not found at {rev}")
SIGNATURE = "(text, integer, double precision, double precision)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--rev", action="append", default=[], help="git revision(s) to compare with the working tree")
    ap.add_argument("--tenant", type=int, default=0, help="0 = largest")
    ap.add_argument("--host", default="%2Fwork%2Fkb-bench%2Fpg", help="socket folder, URL-encoded")
    ap.add_argument("--text-from", default="/work/shared/datasets/*/corpus.jsonl")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=20)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    import search_bench as sb

    sents, _ = sb.load_sentences(args.text_from)
    queries = [q for q, _ in sb.tenant_queries(args.tenant, sents, sb.make_centres(), 20 + args.queries)][20:]
    owner = psycopg.connect(f"postgresql://postgres@/{args.db}?host={args.host}", autocommit=True)
    app = psycopg.connect(f"postgresql://cyberos_app@/{args.db}?host={args.host}", autocommit=True)
    tenant, n = owner.execute("select tenant_id, n_chunks from kb.corpus_stats order by n_chunks desc").fetchall()[args.tenant]
    app.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
    names = {"working tree": "kb.search_lexical"}
    for i, rev in enumerate(args.rev):
        sql = _show(rev, "functions/10_search_lexical.sql")
        name = f"search_lexical_ab{i}"
        sql = sql.replace("kb.search_lexical(", f"kb.{name}(").replace("search_lexical.", f"{name}.")
        owner.execute(sql)
        owner.execute(f"grant execute on function kb.{name}{SIGNATURE} to cyberos_app")
        names[rev] = f"kb.{name}"
    times: dict[str, list[float]] = {label: [] for label in names}
    differ: dict[str, int] = {label: 0 for label in names}
    try:
        for q in queries:
            # warm-up call of each version, which also checks that they return the same rows
            rows = {label: app.execute(f"select chunk_id, round(score::numeric, 7) from {fn}(%s, %s)",
                                       [q, args.k]).fetchall()
                    for label, fn in names.items()}
            for label, r in rows.items():
                differ[label] += r != rows["working tree"]
            for label, fn in names.items():
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    app.execute(f"select count(*) from {fn}(%s, %s)", [q, args.k]).fetchone()
                    best = min(best, (time.perf_counter() - t0) * 1000)
                times[label].append(best)
    finally:
        for label, fn in names.items():
            if fn != "kb.search_lexical":
                owner.execute(f"drop function if exists {fn}{SIGNATURE}")
    print(f"{args.db}, tenant {args.tenant} ({n} chunks), {len(queries)} queries, k = {args.k}; "
          "best of 3 per query, versions interleaved; ms")
    print(f"{'version':16s} {'p50':>7s} {'p95':>7s} {'p99':>7s} {'mean':>7s}  queries whose rows differ from the working tree's")
    for label, v in times.items():
        a = np.array(v)
        print(f"{label:16s} {np.median(a):7.2f} {np.percentile(a, 95):7.2f} {np.percentile(a, 99):7.2f} {a.mean():7.2f}"
              f"  {differ[label]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
