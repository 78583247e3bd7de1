"""Paired A/B timing of kb.search_lexical (and kb.search_hybrid) against other versions.

On a shared VM the same query can take 30% longer from one minute to the next, so two
benchmark runs minutes apart do not compare versions. This script times every query with
every version in turn (one warm-up call each, then the best of 3; the warm-up calls' rows
are compared: chunk ids in order and scores to 7 decimals; the versions' order rotates from query
to query), on one tenant of a database
loaded by bench/search_bench.py, with that benchmark's queries.

Two ways to get the other versions:
  --rev REV        installs REV's retrieval/sql/search_lexical.sql next to the current one,
                   under another name (kb.search_lexical_ab<i>, dropped at the end), in the
                   same database. Other functions (text analysis, the term blocks) are
                   the current ones for every version. For a change of the search alone.
  --base-db NAME   a second database (--base-host: its server) loaded by the older revision's
                   own bench/search_bench.py with the same --sizes/--tenants (same text,
                   vectors and queries), searched with its own functions. For a change of
                   schema or of the indexed data (migration 0011's stemmed lexemes), where the
                   old search must run on the old data. With --hybrid, kb.search_hybrid is
                   timed too (each database's calls its own kb.search_lexical). Rows then
                   differ by design (a stemmed query finds other chunks): counted, not checked.

    python bench/lexical_ab.py --db kb_bench_100000_10 --rev 162dbbf
    python bench/lexical_ab.py --host %2Fwork%2Fwt%2Fstem-bench%2Fpg --db kb_bench_100000_1 \\
        --base-host %2Fwork%2Fwt%2Fstem-bench-old%2Fpg --base-db kb_bench_100000_1 --hybrid
    # the service's hybrid as configured (Settings().fusion) against the base's production one:
    python bench/lexical_ab.py ... --hybrid --production
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
    """A SQL file as of ``rev``: under src/kb_rerank/sql/ in later revisions, sql/ in early ones."""
    for base in ("src/kb_rerank/sql", "sql"):
        r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{base}/{rel}"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout
    raise SystemExit(f"{rel} not found at {rev}")
SIGNATURE = "(text, integer, double precision, double precision)"


def _connect(db: str, host: str, tenant_index: int):
    owner = psycopg.connect(f"postgresql://postgres@/{db}?host={host}", autocommit=True)
    app = psycopg.connect(f"postgresql://kb_app@/{db}?host={host}", autocommit=True)
    tenant, n = owner.execute("select tenant_id, n_chunks from kb.corpus_stats order by n_chunks desc").fetchall()[tenant_index]
    app.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
    return owner, app, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--rev", action="append", default=[], help="git revision(s) to compare with the working tree")
    ap.add_argument("--tenant", type=int, default=0, help="0 = largest")
    ap.add_argument("--host", default="%2Fwork%2Fkb-bench%2Fpg", help="socket folder, URL-encoded")
    ap.add_argument("--base-db", help="database of the older version (loaded by its own search_bench.py)")
    ap.add_argument("--base-host", help="socket folder of --base-db's server, URL-encoded (default --host)")
    ap.add_argument("--hybrid", action="store_true", help="also time kb.search_hybrid (needs --base-db)")
    ap.add_argument("--production", action="store_true",
                    help="with --hybrid: the working tree's hybrid with the settings' fusion (Settings().fusion, "
                         "fusion_depth) instead of the SQL function's defaults, the base's with --base-hybrid-args")
    ap.add_argument("--base-hybrid-args", default="40, 10, 'rrf', 1.0, 1.0",
                    help="with --production: kb.search_hybrid arguments after (query, vector) on the base "
                         "(default: the production fusion before issue 15)")
    ap.add_argument("--text-from", default="/work/shared/datasets/*/corpus.jsonl")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=20)
    args = ap.parse_args(argv)
    if args.hybrid and not args.base_db:
        ap.error("--hybrid needs --base-db")
    sys.path.insert(0, str(ROOT / "bench"))
    import search_bench as sb

    sents, _ = sb.load_sentences(args.text_from)
    queries = sb.tenant_queries(args.tenant, sents, sb.make_centres(), 20 + args.queries)[20:]
    owner, app, n = _connect(args.db, args.host, args.tenant)
    # label -> (connection, SQL of one call with parameters query, vector, k)
    lex = "select chunk_id, round(score::numeric, 7) from {fn}(%s, %s)"
    names = {"working tree": (app, lex.format(fn="kb.search_lexical"))}
    installed = []
    for i, rev in enumerate(args.rev):
        sql = _show(rev, "functions/10_search_lexical.sql")
        name = f"search_lexical_ab{i}"
        sql = sql.replace("kb.search_lexical(", f"kb.{name}(").replace("search_lexical.", f"{name}.")
        owner.execute(sql)
        owner.execute(f"grant execute on function kb.{name}{SIGNATURE} to kb_app")
        names[rev] = (app, lex.format(fn=f"kb.{name}"))
        installed.append(f"kb.{name}")
    base_n = None
    if args.base_db:
        _, base_app, base_n = _connect(args.base_db, args.base_host or args.host, args.tenant)
        names["base"] = (base_app, lex.format(fn="kb.search_lexical"))
        if args.hybrid:
            hyb = "select chunk_id, round(score::numeric, 7) from kb.search_hybrid(%s, %s::vector, {})"
            new_args = base_args = "%s"  # k = --k, the function's own fusion defaults
            if args.production:
                from kb_rerank.core.settings import Settings

                s = Settings()
                f = s.fusion
                new_args = (f"{s.fusion_depth}, {f['rrf_k']}, '{f['fusion']}', {f['lexical_weight']},"
                            f" {f['semantic_weight']}, {f['k1']}, {f['b']}")
                base_args = args.base_hybrid_args
            names["hybrid, working tree"] = (app, hyb.format(new_args))
            names["hybrid, base"] = (base_app, hyb.format(base_args))
    times: dict[str, list[float]] = {label: [] for label in names}
    differ: dict[str, int] = {label: 0 for label in names}

    def params(sql, q, v):
        vec = "[" + ",".join(f"{x:.6f}" for x in v) + "]"
        if "search_hybrid" in sql:
            return [q, vec, args.k] if sql.count("%s") == 3 else [q, vec]
        return [q, args.k]

    try:
        labels = list(names)
        for i, (q, v) in enumerate(queries):
            # warm-up call of each version, which also compares its rows with the working tree's
            rows = {label: conn.execute(sql, params(sql, q, v)).fetchall() for label, (conn, sql) in names.items()}
            for label, r in rows.items():
                ref = rows["hybrid, working tree" if label.startswith("hybrid") else "working tree"]
                differ[label] += r != ref
            # the order of the versions rotates from query to query: on this VM the same function
            # timed first after another's calls is measurably slower (1.2 ms at p50 of 11 ms for
            # two identical copies of kb.search_hybrid, 300 queries), which a fixed order charges
            # to one version
            for label in labels[i % len(labels):] + labels[: i % len(labels)]:
                conn, sql = names[label]
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    conn.execute(sql, params(sql, q, v)).fetchall()
                    best = min(best, (time.perf_counter() - t0) * 1000)
                times[label].append(best)
    finally:
        for fn in installed:
            owner.execute(f"drop function if exists {fn}{SIGNATURE}")
    print(f"{args.db}, tenant {args.tenant} ({n} chunks{f'; base {base_n}' if base_n else ''}), {len(queries)} queries,"
          f" k = {args.k}; best of 3 per query, versions interleaved; ms")
    print(f"{'version':22s} {'p50':>7s} {'p95':>7s} {'p99':>7s} {'mean':>7s}  queries whose rows differ from the working tree's")
    p95 = {}
    for label, t in times.items():
        a = np.array(t)
        p95[label] = np.percentile(a, 95)
        print(f"{label:22s} {np.median(a):7.2f} {p95[label]:7.2f} {np.percentile(a, 99):7.2f} {a.mean():7.2f}"
              f"  {differ[label]}")
    for new, old in (("working tree", "base"), ("hybrid, working tree", "hybrid, base")):
        if old in p95:
            print(f"p95 ratio {new} / {old}: {p95[new] / p95[old]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
