"""Paired A/B timing of the production hybrid search against an older version's, each on its
own database loaded with the same data (``bench/search_bench.py --load-only`` of each revision:
same text, vectors and tenants), so a change of the indexed data (migration 0011's stemmed
field) is compared as users get it.

For each of ``--queries`` queries (words drawn from the largest tenant's chunks, seeded; the
chunk's own vector as the query vector) the two searches are timed in alternating order, one
warm-up call each then the best of 3, as ``cyberos_app`` inside a tenant transaction. The new
side calls this checkout's ``kb.search_hybrid`` (its idempotent SQL layer is applied first)
with the settings' fusion (``Settings().fusion``: method, depth, weights, BM25 k1/b); the base
side calls its own function with ``--base-args`` (default: the production fusion before issue
15, chunk RRF 40 deep, rrf_k 10, weights 1/1). Prints p50 / p95 and their ratios.

    python bench/hybrid_ab.py --host %2Fwork%2Fwt%2Fstem-bench%2Fpg \\
        --base-host %2Fwork%2Fwt%2Fstem-bench-old%2Fpg --db kb_bench_100000_1
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank import sqlfiles  # noqa: E402
from kb_rerank.settings import Settings  # noqa: E402


def connect(host: str, db: str) -> psycopg.Connection:
    conn = psycopg.connect(host=unquote(host), dbname=db, user="postgres", autocommit=True)
    register_vector(conn)
    return conn


def timed(conn, tenant, sql: str, args: list) -> float:
    with conn.transaction():
        conn.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
        conn.execute("set local role cyberos_app")
        conn.execute(sql, args).fetchall()  # warm-up
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            conn.execute(sql, args).fetchall()
            best = min(best, time.perf_counter() - t0)
    return best * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True, help="socket directory of this version's server (url-encoded ok)")
    ap.add_argument("--base-host", required=True, help="socket directory of the older version's server")
    ap.add_argument("--db", required=True)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--base-args", default="40, 10, 'rrf', 1.0, 1.0",
                    help="kb.search_hybrid arguments after (query, vector) on the base side")
    args = ap.parse_args()

    new, old = connect(args.host, args.db), connect(args.base_host, args.db)
    s = Settings()
    with new.transaction():
        sqlfiles.apply_idempotent(new, embedding_dim=s.embedding_dim)
    tenant = new.execute("select tenant_id from kb.chunks group by 1 order by count(*) desc limit 1").fetchone()[0]
    n_chunks = new.execute("select count(*) from kb.chunks where tenant_id = %s", [tenant]).fetchone()[0]
    rows = new.execute("select content, embedding from kb.chunks where tenant_id = %s order by chunk_id limit %s",
                       [tenant, args.queries]).fetchall()
    rnd = random.Random(7)
    queries = []
    for content, emb in rows:
        words = [w for w in content.split() if w.isalpha()]
        q = " ".join(rnd.sample(words, min(4, len(words)))) if words else "invoice"
        queries.append((q, np.asarray(emb.to_numpy() if hasattr(emb, "to_numpy") else emb, dtype=np.float32)))
    f = s.fusion
    new_sql = "select chunk_id from kb.search_hybrid(%s, %s::vector, %s, %s, %s, %s, %s, %s, %s)"
    new_args = [s.fusion_depth, f["rrf_k"], f["fusion"], f["lexical_weight"], f["semantic_weight"], f["k1"], f["b"]]
    old_sql = f"select chunk_id from kb.search_hybrid(%s, %s::vector, {args.base_args})"
    t_new, t_old = [], []
    for i, (q, v) in enumerate(queries):
        sides = [(t_new, new, new_sql, [q, v, *new_args]), (t_old, old, old_sql, [q, v])]
        for acc, conn, sql, a in (sides if i % 2 else sides[::-1]):
            acc.append(timed(conn, tenant, sql, a))

    def pct(xs, p):
        return float(np.percentile(xs, p))

    print(f"tenant of {n_chunks} chunks, {len(queries)} queries; this version: {f['fusion']} {s.fusion_depth} deep "
          f"{f['lexical_weight']}/{f['semantic_weight']}; base: {args.base_args}")
    print(f"this version p50 {pct(t_new, 50):.1f} ms  p95 {pct(t_new, 95):.1f} ms")
    print(f"base         p50 {pct(t_old, 50):.1f} ms  p95 {pct(t_old, 95):.1f} ms")
    print(f"ratio        p50 {pct(t_new, 50) / pct(t_old, 50):.2f}  p95 {pct(t_new, 95) / pct(t_old, 95):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
